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

from dataclasses import dataclass

import numpy as np

from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Instruction, MemType, Opcode

from .acctile import (AluPlan, AluTile, alu_insn, check_acc8_layout, emit_tile_epilogue,
                      plan_alu_tiles, plane_loads, tile_slots)
from .emit import Emitter, Place, TensorInfo
from .epilogue import wrap_int32, emit_param_prologue, plan_epilogue
from tessera.errors import CompileError
from .layout import ActLayout
from .nest import dim
from .ops import ELTWISE_OPS, INT32_MAX, INT32_MIN, Eltwise


@dataclass
class _BOperand:
    """The ``b`` operand: how it enters the ALU and the range of its values."""

    #: ``"none"``, ``"tensor"``, ``"scalar"``, ``"channel"`` or ``"full"`` (module doc).
    kind: str
    range: tuple[int, int] | None = None
    tensor: TensorInfo | None = None
    #: A constant ``b``, broadcast to the shape of ``a``.
    const: np.ndarray | None = None
    #: A scalar held in the ALU immediate, or the epilogue parameter vector holding ``b``.
    imm: int | None = None
    param: int | None = None


def _tensor_b(op: Eltwise, b: TensorInfo, shape: tuple[int, int, int, int], c: HwConfig,
              where: str, int8_range: tuple[int, int]) -> _BOperand:
    """A tensor ``b``; raise unless it broadcasts to ``shape`` in a way the ALU can."""
    N, C, H, W = shape
    check_acc8_layout(b.layout, c, where, b.name)
    bs = b.layout.shape
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
    return _BOperand("tensor", int8_range, tensor=b)


def _constant_b(op: Eltwise, shape: tuple[int, int, int, int], where: str) -> _BOperand:
    """A constant ``b``, classified by how it varies: scalar, per channel or in full."""
    N, C, H, W = shape
    const = np.broadcast_to(np.asarray(op.b, dtype=np.int64), (N, C, H, W))
    if np.any(const < INT32_MIN) or np.any(const > INT32_MAX):
        raise CompileError(f"{where}: constant b must fit int32", op=op.name)
    flat = const.reshape(N, C, -1)
    if np.all(const == const.flat[0]):
        kind = "scalar"
    elif np.all(flat == flat[:1, :, :1]):
        kind = "channel"
    else:
        kind = "full"
    return _BOperand(kind, (int(const.min()), int(const.max())), const=const)


def _result_range(op: str, b: _BOperand, int8_range: tuple[int, int]) -> tuple[int, int]:
    """Value range of ``op(a, b)`` for the epilogue's overflow reasoning."""
    if b.kind == "none":
        return int8_range
    lo8, hi8 = int8_range
    cands = [x * y if op == "mul" else (x + y if op == "add" else x - y if op == "sub"
             else min(x, y) if op == "min" else max(x, y))
             for x in (lo8, hi8) for y in b.range]
    return min(cands), max(cands)


def _pack_full_constant(const: np.ndarray, layout: ActLayout, c: HwConfig) -> np.ndarray:
    """A full constant ``b`` in the accumulator layout of an int32 activation."""
    N, C, H, W = const.shape
    packed = np.zeros((layout.nb, layout.cb, H, W, c.batch, c.block_out), dtype=np.int64)
    padded = np.zeros((layout.nb * c.batch, layout.cb * c.block_out, H, W), dtype=np.int64)
    padded[:N, :C] = const
    packed[:] = padded.reshape(layout.nb, c.batch, layout.cb, c.block_out, H, W) \
        .transpose(0, 2, 4, 5, 1, 3)
    return wrap_int32(packed)


class _EltwiseLowering:
    """Per-call state of :func:`tensorize_eltwise`: the operands, the epilogue and, once
    :meth:`emit` starts, where the parameter rows and the operands are."""

    def __init__(self, em: Emitter, op: Eltwise, tensors: dict[str, TensorInfo]) -> None:
        c = em.config
        self.em, self.op, self.tensors = em, op, tensors
        self.where = f"eltwise {op.name!r}"
        self.a, self.out = tensors[op.a], tensors[op.output]
        check_acc8_layout(self.a.layout, c, self.where, self.a.name)
        self.shape = self.a.layout.shape
        self.a_l = self.a.layout.view(c.block_out)
        int8_range = (-(1 << (c.out_width - 1)), (1 << (c.out_width - 1)) - 1)
        if isinstance(op.b, str):
            self.b = _tensor_b(op, tensors[op.b], self.shape, c, self.where, int8_range)
        elif op.b is not None:
            self.b = _constant_b(op, self.shape, self.where)
        else:
            self.b = _BOperand("none")
        self.ep = plan_epilogue(op.epilogue, channels=self.shape[1], config=c,
                                acc_range=_result_range(op.op, self.b, int8_range),
                                where=self.where)
        self.alu_name = ELTWISE_OPS.get(op.op, "")
        self._place_constant_b()

    def _place_constant_b(self) -> None:
        """A scalar ``b`` is the ALU immediate when it fits; else it, or a per-channel ``b``,
        becomes a parameter vector (after the epilogue's)."""
        b, ep, isa = self.b, self.ep, self.em.isa
        if b.kind == "scalar":
            v = int(b.const.flat[0])
            imm_f = isa.layouts[Opcode.ALU].field("imm")
            if ALU_OPS.by_name(self.alu_name).imm_to_operand(v, isa.imm_bits) == v and \
                    imm_f.lo <= v <= imm_f.hi:
                b.imm = v
            else:
                ep.params.append(np.array([v], dtype=np.int64))
                b.param = len(ep.params) - 1
        elif b.kind == "channel":
            ep.params.append(b.const[0, :, 0, 0].copy())
            b.param = len(ep.params) - 1

    def slot_rows(self, nb_t: int, cb_t: int, oh_t: int, ow_t: int) -> int:
        """Accumulator rows of a tile: its output rows, then ``b``'s rows (a tensor or full
        constant) and the epilogue's scratch groups."""
        rows = nb_t * cb_t * oh_t * ow_t
        extra = rows if self.b.kind in ("tensor", "full") else 0
        return rows + extra + rows * len(self.ep.scratch_groups)

    def plan_tiles(self, threads: int) -> AluPlan:
        """The largest tiles whose ``threads`` slots fit beside the parameter rows."""
        _, _, H, W = self.shape
        return plan_alu_tiles(self.where, (self.a_l.nb, self.a_l.cb, H, W), self.em.config,
                              threads, self.slot_rows, self.ep.param_rows(self.a_l.cb))

    def emit(self, plan: AluPlan) -> None:
        """Emit the operator: parameter rows, then per tile the op, the epilogue, the store."""
        em, op, ep = self.em, self.op, self.ep
        _, _, H, W = self.shape
        em.begin_op(op.name)
        (self.param_base,), self.param_starts = emit_param_prologue(em, op.name, ep,
                                                                    self.a_l.cb)
        self.a_elem = em.elem(self.a.place, MemType.ACC8)
        out_elem = em.elem(self.out.place, MemType.OUT)
        self.b_layout, self.b_elem = self._b_source()
        slot = self.slot_rows(plan.nb_t, plan.cb_t, plan.oh_t, plan.ow_t)
        for t, base in tile_slots(em, (self.a_l.nb, self.a_l.cb, H, W), plan, slot,
                                  self.param_base):
            rows = t.rows
            em.emit(*self._op_insns(t, base, scratch=base + rows))
            emit_tile_epilogue(em, ep, t, base, param_base=self.param_base,
                               param_starts=self.param_starts,
                               scratch_base=base + slot - rows * len(ep.scratch_groups),
                               scratch_stride=rows,
                               out_layout=self.out.layout, out_elem=out_elem,
                               residuals=self.tensors, where=self.where)
        em.end_op()

    def _b_source(self) -> tuple[ActLayout | None, int | None]:
        """Layout and DRAM element address of a tensor ``b``, or of a full constant (added
        as a segment of its own)."""
        c, em, b = self.em.config, self.em, self.b
        if b.kind == "tensor":
            return (b.tensor.layout.view(c.block_out),
                    em.elem(b.tensor.place, MemType.ACC8))
        if b.kind == "full":
            layout = ActLayout.of(self.shape, c, c.block_out)
            seg = em.add_segment(f"{self.op.name}.b", _pack_full_constant(b.const, layout, c))
            return layout, em.elem(Place(seg), MemType.ACC)
        return None, None

    def _op_insns(self, t: AluTile, base: int, scratch: int) -> list[Instruction]:
        """Load ``a``'s rows of tile ``t`` into the slot at ``base`` and apply the op with
        ``b`` (whose rows, if it has any, load into ``scratch``)."""
        em, b, where, name = self.em, self.b, self.where, self.alu_name
        insns: list[Instruction] = plane_loads(em, self.a_l, self.a_elem, base, t,
                                               t.oy0, t.oy1, t.ox0, t.ox1)
        if b.kind == "tensor":
            insns += self._tensor_b_insns(t, base, scratch)
        elif b.kind == "full":
            insns += plane_loads(em, self.b_layout, self.b_elem, scratch, t, t.oy0, t.oy1,
                                 t.ox0, t.ox1, mem=MemType.ACC)
            insns.append(alu_insn(em, name, [dim("rows", t.rows, dst=1, src=1)],
                                  (base, scratch), use_imm=False, where=where))
        elif b.kind == "scalar" and b.imm is not None:
            insns.append(alu_insn(em, name, [dim("rows", t.rows, dst=1)], (base, 0),
                                  use_imm=True, imm=b.imm, where=where))
        elif b.kind in ("scalar", "channel"):
            nb_n, cb_n, px = t.nb1 - t.nb0, t.cb1 - t.cb0, t.pixels
            s = 1 if b.kind == "channel" else 0
            dims = [dim("nb", nb_n, dst=cb_n * px), dim("cb", cb_n, dst=px, src=s),
                    dim("pix", px, dst=1)]
            src0 = self.param_base + self.param_starts[b.param] + t.cb0 * s
            insns.append(alu_insn(em, name, dims, (base, src0), use_imm=False, where=where))
        return insns

    def _tensor_b_insns(self, t: AluTile, base: int, scratch: int) -> list[Instruction]:
        """Load the rows of a tensor ``b`` that tile ``t`` needs into ``scratch`` and apply
        the op; a dimension where ``b`` has size 1 broadcasts by a source stride of zero."""
        em, b_l = self.em, self.b_layout
        bn, _, bh, bw = b_l.shape
        bt = AluTile(t.nb0 if bn > 1 else 0, t.nb1 if bn > 1 else 1, t.cb0, t.cb1,
                     t.oy0 if bh > 1 else 0, t.oy1 if bh > 1 else 1,
                     t.ox0 if bw > 1 else 0, t.ox1 if bw > 1 else 1)
        insns: list[Instruction] = plane_loads(em, b_l, self.b_elem, scratch, bt,
                                               bt.oy0, bt.oy1, bt.ox0, bt.ox1)
        nb_n, cb_n = t.nb1 - t.nb0, t.cb1 - t.cb0
        oh_n, ow_n = t.oy1 - t.oy0, t.ox1 - t.ox0
        px, bpx = t.pixels, bt.pixels
        dims = [dim("nb", nb_n, dst=cb_n * px, src=cb_n * bpx if bn > 1 else 0),
                dim("cb", cb_n, dst=px, src=bpx),
                dim("oy", oh_n, dst=ow_n, src=bt.ox1 - bt.ox0 if bh > 1 else 0),
                dim("ox", ow_n, dst=1, src=1 if bw > 1 else 0)]
        insns.append(alu_insn(em, self.alu_name, dims, (base, scratch), use_imm=False,
                              where=self.where))
        return insns


def tensorize_eltwise(em: Emitter, op: Eltwise, tensors: dict[str, TensorInfo], *,
                      threads: int = 2, plan: AluPlan | None = None) -> AluPlan:
    """Emit an elementwise operator (no tokens; see :mod:`.sync`)."""
    lowering = _EltwiseLowering(em, op, tensors)
    if plan is None:
        plan = lowering.plan_tiles(threads)
    lowering.emit(plan)
    return plan
