"""``tensorize_eltwise``: elementwise add/sub/mul/min/max (and clip) on the tensor ALU.

Per tile the ``a`` operand is loaded (``LOAD acc8``) straight into the output
rows. The ``b`` operand is

* a tensor: its rows for the tile go into scratch rows; a dimension where
  ``b`` has size 1 (N, H or W) broadcasts by a source stride of zero;
* a constant: a scalar is the ALU immediate when it fits; a per-channel vector
  is one parameter row per channel block (loaded once); anything else is a
  constant int32 tensor loaded per tile with ``LOAD acc``;
* absent: only the epilogue runs (``clip``).

Then one ALU instruction applies the op, the epilogue stages follow, and the
tile is stored.
"""
from __future__ import annotations

import numpy as np

from tessera.isa import ALU_OPS, MemType, Opcode

from .acctile import (AluPlan, alu_insn, alu_tiles, check_acc8_layout, plan_alu_tiles,
                      plane_loads, tile_stores)
from .conv import TensorInfo, _to_int32, emit_epilogue, emit_param_prologue
from .emit import Emitter, Place
from .epilogue import plan_epilogue
from tessera.errors import CompileError
from .layout import ActLayout
from .nest import dim
from .ops import ELTWISE_OPS, INT32_MAX, INT32_MIN, Eltwise


def tensorize_eltwise(em: Emitter, op: Eltwise, tensors: dict[str, TensorInfo], *,
                      threads: int = 2, plan: AluPlan | None = None) -> AluPlan:
    """Emit an elementwise operator (no tokens; see :mod:`.sync`)."""
    c = em.config
    where = f"eltwise {op.name!r}"
    a, out = tensors[op.a], tensors[op.output]
    check_acc8_layout(a.layout, c, where, a.name)
    N, C, H, W = a.layout.shape
    a_l = ActLayout.of(a.layout.shape, c, c.block_out)
    out_l = out.layout
    NB, CB = a_l.nb, a_l.cb
    lo8, hi8 = -(1 << (c.out_width - 1)), (1 << (c.out_width - 1)) - 1
    b_kind = "none"
    b_tensor = None
    const = None
    if isinstance(op.b, str):
        b_tensor = tensors[op.b]
        check_acc8_layout(b_tensor.layout, c, where, b_tensor.name)
        bs = b_tensor.layout.shape
        for axis, (sa, sb) in enumerate(zip((N, C, H, W), bs)):
            if sb != sa and sb != 1:
                raise CompileError(f"{where}: b {op.b!r} of shape {bs} does not broadcast to "
                                   f"{(N, C, H, W)} (dimension {'NCHW'[axis]})", op=op.name)
        if bs[1] != C:
            raise CompileError(f"{where}: b {op.b!r} must have the {C} channels of a: a tensor "
                               "cannot broadcast across the lanes of a channel block; pass a "
                               "constant instead", op=op.name)
        if bs[0] != N and c.batch > 1:
            raise CompileError(f"{where}: broadcasting over N needs batch 1 (config batch "
                               f"{c.batch} packs images into lanes)", op=op.name)
        b_kind = "tensor"
        b_range = (lo8, hi8)
    elif op.b is not None:
        const = np.broadcast_to(np.asarray(op.b, dtype=np.int64), (N, C, H, W))
        if np.any(const < INT32_MIN) or np.any(const > INT32_MAX):
            raise CompileError(f"{where}: constant b must fit int32", op=op.name)
        flat = const.reshape(N, C, -1)
        if np.all(const == const.flat[0]):
            b_kind = "scalar"
        elif np.all(flat == flat[:1, :, :1]):
            b_kind = "channel"
        else:
            b_kind = "full"
        b_range = (int(const.min()), int(const.max()))
    # Value range of op(a, b) for the epilogue's overflow reasoning.
    if b_kind == "none":
        rng = (lo8, hi8)
    else:
        cands = [x * y if op.op == "mul" else (x + y if op.op == "add" else x - y if op.op == "sub"
                 else min(x, y) if op.op == "min" else max(x, y))
                 for x in (lo8, hi8) for y in b_range]
        rng = (min(cands), max(cands))
    ep = plan_epilogue(op.epilogue, channels=C, config=c, acc_range=rng,
                       where=where)
    alu_name = ELTWISE_OPS.get(op.op, "")
    b_param = None
    b_imm = None
    if b_kind == "scalar":
        v = int(const.flat[0])
        imm_f = em.isa.layouts[Opcode.ALU].field("imm")
        if ALU_OPS.by_name(alu_name).imm_to_operand(v, em.isa.imm_bits) == v and \
                imm_f.lo <= v <= imm_f.hi:
            b_imm = v
        else:
            ep.params.append(np.array([v], dtype=np.int64))
            b_param = len(ep.params) - 1
    elif b_kind == "channel":
        ep.params.append(const[0, :, 0, 0].copy())
        b_param = len(ep.params) - 1
    n_params = ep.param_rows(CB)

    def slot_rows(nb_t, cb_t, oh_t, ow_t):
        rows = nb_t * cb_t * oh_t * ow_t
        extra = rows if b_kind in ("tensor", "full") else 0
        return rows + extra + (rows if ep.residuals else 0)

    if plan is None:
        plan = plan_alu_tiles(where, (NB, CB, H, W), c, threads, slot_rows, n_params)
    em.begin_op(op.name)
    (param_base,), param_starts = emit_param_prologue(em, op.name, ep, CB)
    a_elem = em.elem(a.place, MemType.ACC8)
    out_elem = em.elem(out.place, MemType.OUT)
    if b_kind == "tensor":
        b_l = ActLayout.of(b_tensor.layout.shape, c, c.block_out)
        b_elem = em.elem(b_tensor.place, MemType.ACC8)
    if b_kind == "full":
        full_l = ActLayout.of((N, C, H, W), c, c.block_out)
        packed = np.zeros((full_l.nb, full_l.cb, H, W, c.batch, c.block_out), dtype=np.int64)
        padded = np.zeros((full_l.nb * c.batch, full_l.cb * c.block_out, H, W), dtype=np.int64)
        padded[:N, :C] = const
        packed[:] = padded.reshape(full_l.nb, c.batch, full_l.cb, c.block_out, H, W) \
            .transpose(0, 2, 4, 5, 1, 3)
        seg = em.add_segment(f"{op.name}.b", _to_int32(packed))
        b_elem = em.elem(Place(seg), MemType.ACC)
    slot = slot_rows(plan.nb_t, plan.cb_t, plan.oh_t, plan.ow_t)
    origin, first = em.acc_origin(slot, plan.threads, param_base)
    for k, t in enumerate(alu_tiles((NB, CB, H, W), plan)):
        base = origin + ((k + first) % plan.threads) * slot
        em.last_acc_rows = (base, base + slot)
        nb_n, cb_n = t.nb1 - t.nb0, t.cb1 - t.cb0
        oh_n, ow_n = t.oy1 - t.oy0, t.ox1 - t.ox0
        px = oh_n * ow_n
        rows = nb_n * cb_n * px
        scratch = base + rows
        insns: list = plane_loads(em, a_l, a_elem, base, t, t.oy0, t.oy1, t.ox0, t.ox1)
        if b_kind == "tensor":
            bn, _, bh, bw = b_l.shape
            bt = type(t)(t.nb0 if bn > 1 else 0, t.nb1 if bn > 1 else 1, t.cb0, t.cb1,
                         t.oy0 if bh > 1 else 0, t.oy1 if bh > 1 else 1,
                         t.ox0 if bw > 1 else 0, t.ox1 if bw > 1 else 1)
            insns += plane_loads(em, b_l, b_elem, scratch, bt, bt.oy0, bt.oy1, bt.ox0, bt.ox1)
            bh_n, bw_n = bt.oy1 - bt.oy0, bt.ox1 - bt.ox0
            dims = [dim("nb", nb_n, dst=cb_n * px, src=cb_n * bh_n * bw_n if bn > 1 else 0),
                    dim("cb", cb_n, dst=px, src=bh_n * bw_n),
                    dim("oy", oh_n, dst=ow_n, src=bw_n if bh > 1 else 0),
                    dim("ox", ow_n, dst=1, src=1 if bw > 1 else 0)]
            insns.append(alu_insn(em, alu_name, dims, (base, scratch), use_imm=False,
                                  where=where))
        elif b_kind == "full":
            insns += plane_loads(em, full_l, b_elem, scratch, t, t.oy0, t.oy1, t.ox0, t.ox1,
                                 mem=MemType.ACC)
            insns.append(alu_insn(em, alu_name, [dim("rows", rows, dst=1, src=1)],
                                  (base, scratch), use_imm=False, where=where))
        elif b_kind == "scalar" and b_imm is not None:
            insns.append(alu_insn(em, alu_name, [dim("rows", rows, dst=1)], (base, 0),
                                  use_imm=True, imm=b_imm, where=where))
        elif b_kind in ("scalar", "channel"):
            s = 1 if b_kind == "channel" else 0
            dims = [dim("nb", nb_n, dst=cb_n * px), dim("cb", cb_n, dst=px, src=s),
                    dim("pix", px, dst=1)]
            src0 = param_base + param_starts[b_param] + t.cb0 * s
            insns.append(alu_insn(em, alu_name, dims, (base, src0), use_imm=False, where=where))

        def residual_loads(name: str, rbase: int, t=t) -> list:
            rl = ActLayout.of(out_l.shape, c, c.block_out)
            return plane_loads(em, rl, em.elem(tensors[name].place, MemType.ACC8), rbase, t,
                               t.oy0, t.oy1, t.ox0, t.ox1)

        sub: list = []
        saved, em.insns = em.insns, sub
        emit_epilogue(em, ep, acc_base=base, nb_n=nb_n, ob_n=cb_n, pixels=px, ob0=t.cb0,
                      param_base=param_base, param_starts=param_starts,
                      scratch_base=base + slot - rows if ep.residuals else scratch,
                      residual_loads=residual_loads, where=where)
        em.insns = saved
        insns += sub
        insns += tile_stores(em, out_l, out_elem, base, t)
        em.emit(*insns)
    em.end_op()
    return plan
