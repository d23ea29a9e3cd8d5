"""The simulator's data path: on-chip buffers, DRAM and each instruction's effect.

Every instruction's whole loop nest is computed in one batched numpy
operation. Integer semantics follow the hardware exactly: int8 x int8
products summed into int32 accumulators that wrap around on overflow (two's
complement, like the RTL adders; the compiler keeps sums in range), every
accumulator write mirrored into the output buffer saturated to the output
width, ALU results wrapped to the accumulator width unless the op saturates.
"""
from __future__ import annotations

import numpy as np

from tessera.config import HwConfig
from tessera.errors import BoundsError
from tessera.regmap import ErrorCode
from tessera.isa import ALU_OPS, Alu, Gemm, Load, MemType, Program, Store, get_isa
from tessera.isa.intrinsics import saturate, wrap

from .nest import GemmPlan, NestPlanner

_INT = {8: np.int8, 16: np.int16, 32: np.int32}


class Datapath:
    """Buffers and DRAM of one run, with the semantics of every instruction."""

    def __init__(self, config: HwConfig, program: Program, stream: bytes | None = None) -> None:
        self.config = config
        self.isa = get_isa(config)
        c = config
        self.uop = np.zeros(c.uop_depth, dtype=np.dtype(f"<u{self.isa.uop_bytes}"))
        self.inp = np.zeros((c.inp_depth, c.batch, c.block_in), dtype=_INT[c.inp_width])
        self.wgt = np.zeros((c.wgt_depth, c.block_out, c.block_in), dtype=_INT[c.wgt_width])
        self.acc = np.zeros((c.acc_depth, c.batch, c.block_out), dtype=np.int32)
        self.out = np.zeros((c.out_depth, c.batch, c.block_out), dtype=_INT[c.out_width])
        # The ALU table memory, a row of batch x block_out int8 entries per LOAD tbl element.
        self.tbl = np.zeros((c.table_rows, c.batch * c.block_out), dtype=np.int8)
        self.dram = program.dram_image(stream)
        self.segments = [(s.name, s.addr, s.end) for s in program.segments]
        self.gemm_ops = 0
        self.gemm_resets = 0
        self.alu_ops = 0
        self.plans = NestPlanner(config)
        self._out_min, self._out_max = -(1 << (c.out_width - 1)), (1 << (c.out_width - 1)) - 1
        self._buffers = {MemType.UOP: self.uop, MemType.INP: self.inp, MemType.WGT: self.wgt,
                         MemType.ACC: self.acc, MemType.ACC8: self.acc, MemType.OUT: self.out,
                         MemType.TBL: self.tbl}
        self._elem_bytes = {m: self.isa.elem_bytes(m) for m in MemType}
        self._depth = {m: self.isa.depth(m) for m in MemType}

    # ----------------------------------------------------------------- DMA
    def _sram(self, mem: MemType) -> np.ndarray:
        return self._buffers[mem]

    def _dram_rows(self, insn: Load | Store, index: int) -> np.ndarray:
        """The DRAM rows, ``(y_size, x_size * elem)`` bytes, as a view of the DRAM image
        (rows ``x_stride`` elements apart), checked against the segments."""
        eb = self._elem_bytes[insn.mem]
        row, stride = insn.x_size * eb, insn.x_stride * eb
        span = self.isa.dram_span(insn)
        if span is None:
            return np.zeros((insn.y_size, row), dtype=np.uint8)
        lo, hi = span
        if not any(a <= lo and hi <= b for _, a, b in self.segments):
            near = ", ".join(f"{n} [{a:#x}, {b:#x})" for n, a, b in self.segments) or "none"
            raise BoundsError(
                f"DRAM bytes [{lo:#x}, {hi:#x}) are not inside one segment (dram_base="
                f"{insn.dram_base} x {eb} B elements); segments: {near}",
                index=index, where=insn.label, code=ErrorCode.AXI_RESPONSE)
        y = insn.y_size
        if y == 1 or stride == row:
            return self.dram[lo:hi].reshape(y, row)
        if row < stride and lo + y * stride <= self.dram.size:
            return self.dram[lo:lo + y * stride].reshape(y, stride)[:, :row]
        return np.lib.stride_tricks.as_strided(self.dram[lo:hi], (y, row), (stride, 1))

    def _check_sram(self, insn: Load | Store, entries: int, index: int) -> None:
        depth = self._depth[insn.mem]
        if insn.sram_base + entries > depth:
            raise BoundsError(
                f"SRAM entries [{insn.sram_base}, {insn.sram_base + entries}) exceed the "
                f"{insn.mem.label} buffer of {depth} entries", index=index, where=insn.label,
                code=ErrorCode.SRAM_BOUNDS)

    def load(self, insn: Load, index: int) -> None:
        if insn.is_nop:
            return
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        cols = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        self._check_sram(insn, rows * cols, index)
        sram = self._sram(insn.mem)
        raw = np.ascontiguousarray(self._dram_rows(insn, index))
        src_dtype = np.int8 if insn.mem in (MemType.ACC8, MemType.TBL) \
            else sram.dtype.newbyteorder("<")
        data = raw.view(src_dtype).reshape((insn.y_size, insn.x_size) + sram.shape[1:])
        dst = slice(insn.sram_base, insn.sram_base + rows * cols)
        if rows * cols == insn.y_size * insn.x_size:       # no padding
            sram[dst] = data.reshape((rows * cols,) + sram.shape[1:])
        else:
            # Pads: pad_value as a DRAM lane would carry it (wrapped to src_dtype), then widened.
            fill = np.array(insn.pad_value, dtype=np.int64).astype(src_dtype).astype(sram.dtype)
            block = np.full((rows, cols) + sram.shape[1:], fill, dtype=sram.dtype)
            block[insn.y_pad_0:insn.y_pad_0 + insn.y_size,
                  insn.x_pad_0:insn.x_pad_0 + insn.x_size] = data
            sram[dst] = block.reshape((rows * cols,) + sram.shape[1:])
        if sram is self.acc:
            self.out[dst] = saturate(self.acc[dst], self.config.out_width)

    def store(self, insn: Store, index: int) -> None:
        if insn.is_nop:
            return
        self._check_sram(insn, insn.y_size * insn.x_size, index)
        rows = self._dram_rows(insn, index)
        data = self.out[insn.sram_base:insn.sram_base + insn.y_size * insn.x_size]
        raw = np.ascontiguousarray(data.astype(data.dtype.newbyteorder("<"))) \
            .view(np.uint8).reshape(rows.shape)
        if rows.shape[0] > 1 and rows.strides[0] < rows.shape[1]:
            for r in range(rows.shape[0]):     # overlapping rows: the later row wins
                rows[r] = raw[r]
        else:
            rows[...] = raw

    # ------------------------------------------------------------ loop nest
    def _write_acc(self, rows: slice | np.ndarray, values: np.ndarray) -> None:
        # The output buffer first: ``values`` may be a view of acc rows this write changes.
        # (np.minimum/np.maximum: the saturation of ``saturate`` without np.clip's overhead.)
        self.out[rows] = np.maximum(np.minimum(values, self._out_max), self._out_min)
        self.acc[rows] = values

    def _uops(self, insn: Gemm | Alu) -> np.ndarray:
        return self.uop[insn.uop_begin:insn.uop_end]

    def gemm(self, insn: Gemm, index: int) -> frozenset[int]:
        """Run a GEMM; returns the accumulator banks it touched."""
        plan = self.plans.gemm(insn, self._uops(insn), index)
        if insn.reset:
            self.gemm_resets += plan.ops
            self._write_acc(plan.rows, 0)
            return plan.banks
        self.gemm_ops += plan.ops
        if plan.ops:
            sums = self._dense_sums(plan) if plan.groups else self._general_sums(plan)
            rows = plan.rows
            if self.config.acc_width == 32:     # int32 addition wraps as the adders do
                self._write_acc(rows, self.acc[rows] + sums.astype(np.int32))
            else:
                self._write_acc(rows, wrap(self.acc[rows].astype(np.int64) + sums,
                                           self.config.acc_width))
        return plan.banks

    def _dense_sums(self, plan: GemmPlan) -> np.ndarray:
        """Each row's sum as one matrix product per weight group: the row's K input
        entries side by side times the K weight entries stacked (exact, see
        :func:`.nest.exact_float`)."""
        rows, k = plan.src.shape
        b, n_in, n_out = self.inp.shape[1], self.inp.shape[2], self.wgt.shape[1]
        # (rows, K, batch, in) -> (rows, batch, K * in)
        a = self.inp[plan.src].astype(plan.kind).transpose(0, 2, 1, 3).reshape(rows, b, k * n_in)
        if len(plan.groups) == 1:
            w = self._stacked_weights(plan.groups[0].weights, plan.kind)
            return (a.reshape(-1, k * n_in) @ w).reshape(rows, b, n_out).astype(np.int64)
        sums = np.empty((rows, b, n_out), dtype=np.int64)
        for group in plan.groups:
            w = self._stacked_weights(group.weights, plan.kind)
            part = a[group.select]
            sums[group.select] = (part.reshape(-1, k * n_in) @ w).reshape(part.shape[0], b, n_out)
        return sums

    def _stacked_weights(self, entries: np.ndarray, kind: type) -> np.ndarray:
        """Weight entries (K, out, in) as one (K * in, out) matrix."""
        w = self.wgt[entries].astype(kind)
        return w.transpose(0, 2, 1).reshape(-1, w.shape[1])

    def _general_sums(self, plan: GemmPlan) -> np.ndarray:
        """Each op's ``inp[src] @ wgt[w].T``, summed per row (in any order: exact)."""
        prod = np.matmul(self.inp[plan.src].astype(plan.kind),
                         self.wgt[plan.wgt].astype(plan.kind).transpose(0, 2, 1))
        return np.add.reduceat(prod.astype(np.int64), plan.starts, axis=0)

    def alu(self, insn: Alu, index: int) -> frozenset[int]:
        """Run an ALU instruction; returns the accumulator banks it touched."""
        plan = self.plans.alu(insn, self._uops(insn), index)
        if insn.reset:
            self._write_acc(plan.batches[0].dst, 0)
            return plan.banks
        op = ALU_OPS.get(insn.alu_op)
        self.alu_ops += plan.ops
        value = op.imm_to_operand(insn.imm, self.isa.imm_bits) if insn.use_imm else None
        table = self.tbl.reshape(-1) if op.reads_table else None
        for batch in plan.batches:
            operand = self.acc[batch.src] if batch.src is not None else \
                np.full((batch.size,) + self.acc.shape[1:], value, np.int64)
            self._write_acc(batch.dst, op.apply(self.acc[batch.dst], operand,
                                                self.config.acc_width, table=table))
        return plan.banks
