"""``tensorize_pool2d``: max and average pooling on the tensor ALU.

Per tile, the input window region (without padding) is loaded into scratch
accumulator rows with ``LOAD acc8``. For each kernel tap ``(ky, kx)`` one ALU
instruction (MAX, or ADD for the average) combines the tap's input pixel into
every output pixel *for which the tap is valid*: that set is a rectangle of
output rows and columns, so padding never needs a value (zero would be wrong
for max pooling) and the average's count is exact. A tap valid for every
output pixel of the tile goes first, as a MOV; without one, output rows start
as the smallest input value (max) or zero (average).

The average then rescales by ``scale / count``: with ``count_include_pad``
one REQUANT for the tile; otherwise the output splits into rectangles of
equal count (border rows/columns see fewer taps), one REQUANT each. The
epilogue stages and the store follow.
"""
from __future__ import annotations

import numpy as np

from tessera.isa import ALU_OPS, MemType
from tessera.isa import requant as rq

from .acctile import (AluPlan, alu_insn, alu_tiles, check_acc8_layout, plan_alu_tiles,
                      plane_loads, reset_insn, tile_stores)
from .conv import TensorInfo, emit_epilogue, emit_param_prologue
from .emit import Emitter
from .epilogue import plan_epilogue
from tessera.errors import CompileError
from .layout import ActLayout
from .nest import dim
from .ops import Pool2d


def _valid(o0: int, o1: int, k: int, stride: int, pad: int, size: int) -> tuple[int, int]:
    """Output indices in ``[o0, o1)`` whose input ``o*stride + k - pad`` is in ``[0, size)``."""
    lo = max(o0, -(-(pad - k) // stride))
    hi = min(o1, (size - 1 + pad - k) // stride + 1)
    return lo, max(lo, hi)


def _counts(n_out: int, k: int, stride: int, pad: int, size: int) -> list[int]:
    return [sum(1 for t in range(k) if 0 <= o * stride + t - pad < size) for o in range(n_out)]


def _runs(values: list[int], a: int, b: int) -> list[tuple[int, int, int]]:
    """Maximal runs ``(start, end, value)`` of equal values in ``values[a:b]``."""
    runs = []
    s = a
    for i in range(a + 1, b + 1):
        if i == b or values[i] != values[s]:
            runs.append((s, i, values[s]))
            s = i
    return runs


def tensorize_pool2d(em: Emitter, op: Pool2d, inp: TensorInfo, out: TensorInfo,
                     residuals: dict[str, TensorInfo], *, threads: int = 2,
                     plan: AluPlan | None = None) -> AluPlan:
    """Emit a pooling operator (no tokens; see :mod:`.sync`)."""
    c = em.config
    where = f"pool {op.name!r}"
    check_acc8_layout(inp.layout, c, where, inp.name)
    n, ch, h, w = inp.layout.shape
    _, _, oh, ow = out.layout.shape
    (kh, kw), (sy, sx), (pt, pl, _, _) = op.kernel, op.stride, op.padding
    in_l = ActLayout.of(inp.layout.shape, c, c.block_out)
    out_l = out.layout
    NB, CB = in_l.nb, in_l.cb
    in_lo = -(1 << (c.out_width - 1))
    lo_acc, hi_acc = (in_lo, -in_lo - 1) if op.kind == "max" else (kh * kw * in_lo,
                                                                   kh * kw * (-in_lo - 1))
    if op.kind == "avg":
        rng = (int(np.floor(lo_acc * op.scale)) - 1, int(np.ceil(hi_acc * op.scale)) + 1)
    else:
        rng = (lo_acc, hi_acc)
    ep = plan_epilogue(op.epilogue, channels=ch, config=c, acc_range=rng,
                       where=where)

    # Average scales: one per distinct window count.
    cy, cx = _counts(oh, kh, sy, pt, h), _counts(ow, kw, sx, pl, w)
    scales: dict[int, int] = {}
    if op.kind == "avg":
        counts = {kh * kw} if op.count_include_pad else {a * b for a in set(cy) for b in set(cx)}
        for cnt in sorted(counts):
            s = np.float32(np.float32(op.scale) / np.float32(cnt))
            try:
                m, shf = rq.scale_to_params(s)
            except ValueError as exc:
                raise CompileError(f"{where}: {exc}", op=op.name) from None
            word = int(np.asarray(rq.pack_params(m, shf)).reshape(-1)[0])
            ep.params.append(np.array([word], dtype=np.int64))
            scales[cnt] = len(ep.params) - 1
    n_params = ep.param_rows(CB)

    def in_extent(o_t: int, k: int, s: int) -> int:
        return (o_t - 1) * s + k

    def slot_rows(nb_t, cb_t, oh_t, ow_t):
        out_rows = nb_t * cb_t * oh_t * ow_t
        in_rows = nb_t * cb_t * min(h, in_extent(oh_t, kh, sy)) * min(w, in_extent(ow_t, kw, sx))
        return out_rows + in_rows + (out_rows if ep.residuals else 0)

    if plan is None:
        plan = plan_alu_tiles(where, (NB, CB, oh, ow), c, threads, slot_rows, n_params)
    em.begin_op(op.name)
    (param_base,), param_starts = emit_param_prologue(em, op.name, ep, CB)
    in_elem = em.elem(inp.place, MemType.ACC8)
    out_elem = em.elem(out.place, MemType.OUT)
    slot = slot_rows(plan.nb_t, plan.cb_t, plan.oh_t, plan.ow_t)
    origin, first = em.acc_origin(slot, plan.threads, param_base)
    alu_op = "MAX" if op.kind == "max" else "ADD"
    imm_ok = ALU_OPS.by_name("ADD").imm_to_operand(in_lo, em.isa.imm_bits) == in_lo
    for k, t in enumerate(alu_tiles((NB, CB, oh, ow), plan)):
        base = origin + ((k + first) % plan.threads) * slot
        em.last_acc_rows = (base, base + slot)
        nb_n, cb_n = t.nb1 - t.nb0, t.cb1 - t.cb0
        oh_n, ow_n = t.oy1 - t.oy0, t.ox1 - t.ox0
        px = oh_n * ow_n
        rows = nb_n * cb_n * px
        iy0, iy1 = max(0, t.oy0 * sy - pt), min(h, (t.oy1 - 1) * sy - pt + kh)
        ix0, ix1 = max(0, t.ox0 * sx - pl), min(w, (t.ox1 - 1) * sx - pl + kw)
        ih, iw = iy1 - iy0, ix1 - ix0
        scratch = base + rows + (rows if ep.residuals else 0)
        taps = [(ky, kx, *_valid(t.oy0, t.oy1, ky, sy, pt, h),
                 *_valid(t.ox0, t.ox1, kx, sx, pl, w)) for ky in range(kh) for kx in range(kw)]
        taps = [tap for tap in taps if tap[2] < tap[3] and tap[4] < tap[5]]
        # A tap valid for every output pixel of the tile (the centre one, usually) starts the
        # rows with a MOV at one row per cycle; otherwise they start as the identity of the
        # reduction (a reset, and the smallest value for max).
        covering = next((tap for tap in taps if tap[2:] == (t.oy0, t.oy1, t.ox0, t.ox1)), None)
        insns: list = []
        if covering is not None:
            taps.remove(covering)
            taps.insert(0, covering)
        else:
            insns.append(reset_insn(em, base, rows, where))
            if op.kind == "max":
                if not imm_ok:
                    raise CompileError(f"{where}: the ALU immediate cannot hold {in_lo}",
                                       op=op.name)
                insns.append(alu_insn(em, "ADD", [dim("rows", rows, dst=1)], (base, 0),
                                      use_imm=True, imm=in_lo, where=where))
        insns += plane_loads(em, in_l, in_elem, scratch, t, iy0, iy1, ix0, ix1)
        for tap in taps:
            ky, kx, ya, yb, xa, xb = tap
            dst0 = base + (ya - t.oy0) * ow_n + (xa - t.ox0)
            src0 = scratch + (ya * sy + ky - pt - iy0) * iw + (xa * sx + kx - pl - ix0)
            dims = [dim("nb", nb_n, dst=cb_n * px, src=cb_n * ih * iw),
                    dim("cb", cb_n, dst=px, src=ih * iw),
                    dim("oy", yb - ya, dst=ow_n, src=sy * iw),
                    dim("ox", xb - xa, dst=1, src=sx)]
            insns.append(alu_insn(em, "MOV" if tap is covering else alu_op, dims, (dst0, src0),
                                  use_imm=False, where=where))
        if op.kind == "avg":
            ry = [(t.oy0, t.oy1, kh)] if op.count_include_pad else _runs(cy, t.oy0, t.oy1)
            rx = [(t.ox0, t.ox1, kw)] if op.count_include_pad else _runs(cx, t.ox0, t.ox1)
            for ya, yb, a in ry:
                for xa, xb, b in rx:
                    p = scales[a * b]
                    dims = [dim("nb", nb_n, dst=cb_n * px), dim("cb", cb_n, dst=px),
                            dim("oy", yb - ya, dst=ow_n), dim("ox", xb - xa, dst=1)]
                    dst0 = base + (ya - t.oy0) * ow_n + (xa - t.ox0)
                    insns.append(alu_insn(em, "REQUANT", dims, (dst0, param_base + param_starts[p]),
                                          use_imm=False, where=where))

        def residual_loads(name: str, rbase: int, t=t) -> list:
            rl = ActLayout.of(out_l.shape, c, c.block_out)
            from .acctile import plane_loads as pl_
            return pl_(em, rl, em.elem(residuals[name].place, MemType.ACC8), rbase, t, t.oy0,
                       t.oy1, t.ox0, t.ox1)

        sub: list = []
        saved, em.insns = em.insns, sub
        emit_epilogue(em, ep, acc_base=base, nb_n=nb_n, ob_n=cb_n, pixels=px, ob0=t.cb0,
                      param_base=param_base, param_starts=param_starts,
                      scratch_base=base + rows, residual_loads=residual_loads, where=where)
        em.insns = saved
        insns += sub
        insns += tile_stores(em, out_l, out_elem, base, t)
        em.emit(*insns)
    em.end_op()
    return plan
