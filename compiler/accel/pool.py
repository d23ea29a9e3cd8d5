"""``tensorize_pool2d``: max, sum and average pooling on the tensor ALU.

Per tile, the input window region (without padding) is loaded into scratch
accumulator rows with ``LOAD acc8``. For each kernel tap ``(ky, kx)`` one ALU
instruction (MAX, or ADD for the average) combines the tap's input pixel into
every output pixel *for which the tap is valid*: that set is a rectangle of
output rows and columns, so padding never needs a value (zero would be wrong
for max pooling) and the average's count is exact. A tap valid for every
output pixel of the tile goes first, as a MOV; without one, output rows start
as the smallest input value (max) or zero (sum, average). A global pool is one
tap per input pixel, each an ADD of one row per channel block: the sums are
row adds on the ALU, and the zero point and rescale stay in the epilogue
(``sum``).

The average then rescales by ``scale / count``: with ``count_include_pad``
one REQUANT for the tile; otherwise the output splits into rectangles of
equal count (border rows/columns see fewer taps), one REQUANT each. The
epilogue stages and the store follow.
"""
from __future__ import annotations

import numpy as np

from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Instruction, MemType
from tessera.isa import requant as rq

from .acctile import (AluPlan, AluTile, alu_insn, check_acc8_layout, emit_tile_epilogue,
                      plan_alu_tiles, plane_loads, reset_insn, tile_slots)
from .emit import Emitter, TensorInfo
from .epilogue import emit_param_prologue, plan_epilogue
from tessera.errors import CompileError
from .layout import ActLayout
from .nest import dim
from .ops import Pool2d

#: A kernel tap ``(ky, kx)`` with the output rows ``[ya, yb)`` and columns ``[xa, xb)`` of a
#: tile it is valid for: ``(ky, kx, ya, yb, xa, xb)``.
Tap = tuple[int, int, int, int, int, int]


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


def _in_extent(o_t: int, k: int, s: int) -> int:
    """Input rows (columns) a run of ``o_t`` output rows reads."""
    return (o_t - 1) * s + k


class _PoolLowering:
    """Per-call state of :func:`tensorize_pool2d`: the geometry, the epilogue (with the
    average's scale parameters) and, once :meth:`emit` starts, the parameter rows."""

    def __init__(self, config: HwConfig, op: Pool2d, in_shape: tuple[int, int, int, int]
                 ) -> None:
        c = self.config = config
        self.op = op
        self.where = f"pool {op.name!r}"
        _, ch, self.h, self.w = in_shape
        _, _, self.oh, self.ow = op.output_shape(in_shape)
        (self.kh, self.kw), (self.sy, self.sx), (self.pt, self.pl, _, _) = \
            op.kernel, op.stride, op.padding
        self.in_l = ActLayout.of(in_shape, c, c.block_out)
        self.in_lo = -(1 << (c.out_width - 1))
        self.ep = plan_epilogue(op.epilogue, channels=ch, config=c,
                                acc_range=self._acc_range(), where=self.where)
        self.cy = _counts(self.oh, self.kh, self.sy, self.pt, self.h)
        self.cx = _counts(self.ow, self.kw, self.sx, self.pl, self.w)
        self.scales = self._avg_scales() if op.kind == "avg" else {}

    def _acc_range(self) -> tuple[int, int]:
        """Bounds of the pooled values before the epilogue (the average's after rescaling)."""
        in_lo, taps = self.in_lo, self.kh * self.kw
        if self.op.kind == "max":
            return in_lo, -in_lo - 1
        lo_acc, hi_acc = taps * in_lo, taps * (-in_lo - 1)
        if self.op.kind == "sum":
            return lo_acc, hi_acc
        return (int(np.floor(lo_acc * self.op.scale)) - 1,
                int(np.ceil(hi_acc * self.op.scale)) + 1)

    def _avg_scales(self) -> dict[int, int]:
        """The average's parameter (packed ``scale / count``) per distinct window count:
        count -> index of its parameter vector."""
        op = self.op
        counts = ({self.kh * self.kw} if op.count_include_pad
                  else {a * b for a in set(self.cy) for b in set(self.cx)})
        scales: dict[int, int] = {}
        for cnt in sorted(counts):
            s = np.float32(np.float32(op.scale) / np.float32(cnt))
            try:
                m, shf = rq.scale_to_params(s)
            except ValueError as exc:
                raise CompileError(f"{self.where}: {exc}", op=op.name) from None
            word = int(np.asarray(rq.pack_params(m, shf)).reshape(-1)[0])
            self.ep.params.append(np.array([word], dtype=np.int64))
            scales[cnt] = len(self.ep.params) - 1
        return scales

    def slot_rows(self, nb_t: int, cb_t: int, oh_t: int, ow_t: int) -> int:
        """Accumulator rows of a tile: its output rows, the epilogue's scratch groups and
        its input window."""
        out_rows = nb_t * cb_t * oh_t * ow_t
        in_rows = nb_t * cb_t * min(self.h, _in_extent(oh_t, self.kh, self.sy)) * \
            min(self.w, _in_extent(ow_t, self.kw, self.sx))
        return out_rows + in_rows + out_rows * len(self.ep.scratch_groups)

    def plan_tiles(self, threads: int) -> AluPlan:
        """The largest tiles whose ``threads`` slots fit beside the parameter rows."""
        return plan_alu_tiles(self.where, (self.in_l.nb, self.in_l.cb, self.oh, self.ow),
                              self.config, threads, self.slot_rows,
                              self.ep.param_rows(self.in_l.cb))

    def emit(self, em: Emitter, inp: TensorInfo, out: TensorInfo,
             residuals: dict[str, TensorInfo], plan: AluPlan) -> None:
        """Emit the operator: parameter rows, then per tile the pooling, the epilogue and
        the store."""
        self.em, self.inp, self.out, self.residuals = em, inp, out, residuals
        self.in_l = inp.layout.view(self.config.block_out)   # as stored (same blocks)
        op, ep = self.op, self.ep
        em.begin_op(op.name)
        (self.param_base,), self.param_starts = emit_param_prologue(em, op.name, ep,
                                                                    self.in_l.cb)
        self.in_elem = em.elem(self.inp.place, MemType.ACC8)
        out_elem = em.elem(self.out.place, MemType.OUT)
        slot = self.slot_rows(plan.nb_t, plan.cb_t, plan.oh_t, plan.ow_t)
        for t, base in tile_slots(em, (self.in_l.nb, self.in_l.cb, self.oh, self.ow), plan,
                                  slot, self.param_base):
            em.emit(*self._pool_insns(t, base))
            emit_tile_epilogue(em, ep, t, base, param_base=self.param_base,
                               param_starts=self.param_starts, scratch_base=base + t.rows,
                               scratch_stride=t.rows, out_layout=self.out.layout, out_elem=out_elem,
                               residuals=self.residuals, where=self.where)
        em.end_op()

    def _pool_insns(self, t: AluTile, base: int) -> list[Instruction]:
        """Pool tile ``t`` into the slot at ``base``: start its rows, load the input window
        into scratch rows, one ALU instruction per tap, then the average's rescale."""
        rows = t.rows
        iy0, iy1, ix0, ix1 = self._input_window(t)
        scratch = base + rows * (1 + len(self.ep.scratch_groups))
        taps, covering = self._taps(t)
        insns: list[Instruction] = [] if covering is not None else self._start_rows(base, rows)
        insns += plane_loads(self.em, self.in_l, self.in_elem, scratch, t, iy0, iy1, ix0, ix1)
        reduce = "MAX" if self.op.kind == "max" else "ADD"
        for tap in taps:
            insns.append(self._tap_insn(t, tap, "MOV" if tap is covering else reduce, base,
                                        scratch, (iy0, ix0, iy1 - iy0, ix1 - ix0)))
        if self.op.kind == "avg":
            insns += self._rescale_insns(t, base)
        return insns

    def _input_window(self, t: AluTile) -> tuple[int, int, int, int]:
        """The input rows ``[iy0, iy1)`` and columns ``[ix0, ix1)`` tile ``t`` reads (the
        padding has no rows)."""
        iy0 = max(0, t.oy0 * self.sy - self.pt)
        iy1 = min(self.h, (t.oy1 - 1) * self.sy - self.pt + self.kh)
        ix0 = max(0, t.ox0 * self.sx - self.pl)
        ix1 = min(self.w, (t.ox1 - 1) * self.sx - self.pl + self.kw)
        return iy0, iy1, ix0, ix1

    def _taps(self, t: AluTile) -> tuple[list[Tap], Tap | None]:
        """The taps valid for some output pixel of ``t`` and the one valid for all of them,
        if any (then first in the list)."""
        taps = [(ky, kx, *_valid(t.oy0, t.oy1, ky, self.sy, self.pt, self.h),
                 *_valid(t.ox0, t.ox1, kx, self.sx, self.pl, self.w))
                for ky in range(self.kh) for kx in range(self.kw)]
        taps = [tap for tap in taps if tap[2] < tap[3] and tap[4] < tap[5]]
        # A tap valid for every output pixel of the tile (the centre one, usually) starts the
        # rows with a MOV at one row per cycle; otherwise they start as the identity of the
        # reduction (:meth:`_start_rows`).
        covering = next((tap for tap in taps if tap[2:] == (t.oy0, t.oy1, t.ox0, t.ox1)), None)
        if covering is not None:
            taps.remove(covering)
            taps.insert(0, covering)
        return taps, covering

    def _start_rows(self, base: int, rows: int) -> list[Instruction]:
        """Start the tile's rows as the identity of the reduction: a reset, and for max the
        smallest input value."""
        em, where, in_lo = self.em, self.where, self.in_lo
        insns: list[Instruction] = [reset_insn(em, base, rows, where)]
        if self.op.kind == "max":
            if ALU_OPS.by_name("ADD").imm_to_operand(in_lo, em.isa.imm_bits) != in_lo:
                raise CompileError(f"{where}: the ALU immediate cannot hold {in_lo}",
                                   op=self.op.name)
            insns.append(alu_insn(em, "ADD", [dim("rows", rows, dst=1)], (base, 0),
                                  use_imm=True, imm=in_lo, where=where))
        return insns

    def _tap_insn(self, t: AluTile, tap: Tap, op_name: str, base: int, scratch: int,
                  window: tuple[int, int, int, int]) -> Instruction:
        """ALU ``op_name`` of ``tap``'s input pixels (of the window ``(iy0, ix0, ih, iw)``
        loaded at ``scratch``) into the output rows from ``base`` it is valid for."""
        ky, kx, ya, yb, xa, xb = tap
        iy0, ix0, ih, iw = window
        nb_n, cb_n, ow_n, px = t.nb1 - t.nb0, t.cb1 - t.cb0, t.ox1 - t.ox0, t.pixels
        dst0 = base + (ya - t.oy0) * ow_n + (xa - t.ox0)
        src0 = (scratch + (ya * self.sy + ky - self.pt - iy0) * iw
                + (xa * self.sx + kx - self.pl - ix0))
        dims = [dim("nb", nb_n, dst=cb_n * px, src=cb_n * ih * iw),
                dim("cb", cb_n, dst=px, src=ih * iw),
                dim("oy", yb - ya, dst=ow_n, src=self.sy * iw),
                dim("ox", xb - xa, dst=1, src=self.sx)]
        return alu_insn(self.em, op_name, dims, (dst0, src0), use_imm=False, where=self.where)

    def _rescale_insns(self, t: AluTile, base: int) -> list[Instruction]:
        """The average's REQUANT by ``scale / count``: one for the tile with
        ``count_include_pad``, else one per rectangle of equal window count."""
        op = self.op
        nb_n, cb_n, ow_n, px = t.nb1 - t.nb0, t.cb1 - t.cb0, t.ox1 - t.ox0, t.pixels
        ry = [(t.oy0, t.oy1, self.kh)] if op.count_include_pad else _runs(self.cy, t.oy0, t.oy1)
        rx = [(t.ox0, t.ox1, self.kw)] if op.count_include_pad else _runs(self.cx, t.ox0, t.ox1)
        insns: list[Instruction] = []
        for ya, yb, a in ry:
            for xa, xb, b in rx:
                p = self.scales[a * b]
                dims = [dim("nb", nb_n, dst=cb_n * px), dim("cb", cb_n, dst=px),
                        dim("oy", yb - ya, dst=ow_n), dim("ox", xb - xa, dst=1)]
                dst0 = base + (ya - t.oy0) * ow_n + (xa - t.ox0)
                insns.append(alu_insn(self.em, "REQUANT", dims,
                                      (dst0, self.param_base + self.param_starts[p]),
                                      use_imm=False, where=self.where))
        return insns


def tensorize_pool2d(em: Emitter, op: Pool2d, inp: TensorInfo, out: TensorInfo,
                     residuals: dict[str, TensorInfo], *, threads: int = 2,
                     plan: AluPlan | None = None) -> AluPlan:
    """Emit a pooling operator (no tokens; see :mod:`.sync`)."""
    check_acc8_layout(inp.layout, em.config, f"pool {op.name!r}", inp.name)
    lowering = _PoolLowering(em.config, op, inp.layout.shape)
    if plan is None:
        plan = lowering.plan_tiles(threads)
    lowering.emit(em, inp, out, residuals, plan)
    return plan


def pool_fits(op: Pool2d, in_shape: tuple[int, int, int, int], config: HwConfig, *,
              threads: int = 2) -> bool:
    """Whether ``op``'s smallest tile (one pixel of one channel block, with its input
    window) fits ``threads`` accumulator slots beside its parameter rows."""
    try:
        _PoolLowering(config, op, in_shape).plan_tiles(threads)
    except CompileError:
        return False
    return True
