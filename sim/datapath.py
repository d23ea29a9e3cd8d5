"""The simulator's data path: on-chip buffers, DRAM and each instruction's effect.

Every instruction's whole loop nest is computed in one batched numpy
operation. Integer semantics follow the hardware exactly: int8 x int8
products summed into int32 accumulators that wrap around on overflow (two's
complement, like the RTL adders; the compiler keeps sums in range), every
accumulator write mirrored into the output buffer saturated to the output
width, ALU results wrapped to the accumulator width unless the op saturates.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tessera.config import HwConfig
from tessera.errors import BoundsError, HazardError
from tessera.regmap import ErrorCode
from tessera.isa import ALU_OPS, Alu, Gemm, Load, MemType, Program, Store, get_isa
from tessera.isa.intrinsics import saturate, wrap
from tessera.timing import gemm_hazard_distance

_INT = {8: np.int8, 16: np.int16, 32: np.int32}


def _previous_write(writes: np.ndarray, reads: np.ndarray) -> np.ndarray:
    """For each position j, the last position i < j with ``writes[i] == reads[j]`` (-1: none)."""
    n = writes.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    pos = np.arange(n, dtype=np.int64)
    keys = np.sort(writes.astype(np.int64) * n + pos)
    hit = np.searchsorted(keys, reads.astype(np.int64) * n + pos, side="left") - 1
    found = keys[np.maximum(hit, 0)]
    ok = (hit >= 0) & (found // n == reads)
    return np.where(ok, found % n, -1)


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

    # ----------------------------------------------------------------- DMA
    def _sram(self, mem: MemType) -> np.ndarray:
        return {MemType.UOP: self.uop, MemType.INP: self.inp, MemType.WGT: self.wgt,
                MemType.ACC: self.acc, MemType.ACC8: self.acc, MemType.OUT: self.out,
                MemType.TBL: self.tbl}[mem]

    def _dram_rows(self, insn: Load | Store, index: int) -> np.ndarray:
        """Byte indices ``(y_size, x_size * elem)`` of the DRAM rows, checked against the segments."""
        eb = self.isa.elem_bytes(insn.mem)
        starts = (insn.dram_base + np.arange(insn.y_size, dtype=np.int64) * insn.x_stride) * eb
        idx = starts[:, None] + np.arange(insn.x_size * eb, dtype=np.int64)[None, :]
        span = self.isa.dram_span(insn)
        if span is not None:
            lo, hi = span
            if not any(a <= lo and hi <= b for _, a, b in self.segments):
                near = ", ".join(f"{n} [{a:#x}, {b:#x})" for n, a, b in self.segments) or "none"
                raise BoundsError(
                    f"DRAM bytes [{lo:#x}, {hi:#x}) are not inside one segment (dram_base="
                    f"{insn.dram_base} x {eb} B elements); segments: {near}",
                    index=index, where=insn.label, code=ErrorCode.AXI_RESPONSE)
        return idx

    def _check_sram(self, insn: Load | Store, entries: int, index: int) -> None:
        depth = self.isa.depth(insn.mem)
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
        raw = self.dram[self._dram_rows(insn, index)]
        src_dtype = np.int8 if insn.mem in (MemType.ACC8, MemType.TBL) \
            else sram.dtype.newbyteorder("<")
        data = raw.view(src_dtype).reshape((insn.y_size, insn.x_size) + sram.shape[1:])
        # Pads: pad_value as a DRAM lane would carry it (wrapped to src_dtype), then widened.
        fill = np.array(insn.pad_value, dtype=np.int64).astype(src_dtype).astype(sram.dtype)
        block = np.full((rows, cols) + sram.shape[1:], fill, dtype=sram.dtype)
        block[insn.y_pad_0:insn.y_pad_0 + insn.y_size, insn.x_pad_0:insn.x_pad_0 + insn.x_size] = data
        dst = slice(insn.sram_base, insn.sram_base + rows * cols)
        sram[dst] = block.reshape((rows * cols,) + sram.shape[1:])
        if sram is self.acc:
            self.out[dst] = saturate(self.acc[dst], self.config.out_width)

    def store(self, insn: Store, index: int) -> None:
        if insn.is_nop:
            return
        self._check_sram(insn, insn.y_size * insn.x_size, index)
        idx = self._dram_rows(insn, index)
        data = self.out[insn.sram_base:insn.sram_base + insn.y_size * insn.x_size]
        self.dram[idx] = np.ascontiguousarray(data.astype(data.dtype.newbyteorder("<"))) \
            .view(np.uint8).reshape(idx.shape)

    # ------------------------------------------------------------ loop nest
    def _loop_indices(self, insn: Gemm | Alu, index: int,
                      with_wgt: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if insn.uop_end > self.config.uop_depth:
            raise BoundsError(f"uop_end {insn.uop_end} exceeds the uop buffer of "
                              f"{self.config.uop_depth} entries", index=index, where=insn.label,
                              code=ErrorCode.UOP_BOUNDS)
        dst_u, src_u, wgt_u = self.isa.decode_uop_fields(self.uop[insn.uop_begin:insn.uop_end])
        o = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
        i = np.arange(insn.iter_in, dtype=np.int64)[None, :, None]

        def nest(base: np.ndarray, f_out: int, f_in: int) -> np.ndarray:
            return (base[None, None, :] + o * f_out + i * f_in).reshape(-1)

        dst = nest(dst_u, insn.dst_factor_out, insn.dst_factor_in)
        src = nest(src_u, insn.src_factor_out, insn.src_factor_in)
        wgt = nest(wgt_u, insn.wgt_factor_out, insn.wgt_factor_in) if with_wgt else None
        return dst, src, wgt

    def _check_indices(self, insn: Gemm | Alu, index: int, name: str, values: np.ndarray,
                       depth: int) -> None:
        bad = np.nonzero(values >= depth)[0]
        if bad.size:
            raise BoundsError(
                f"{name} index {int(values[bad[0]])} is past the {depth}-entry buffer at "
                f"{self._op_position(insn, int(bad[0]))}", index=index, where=insn.label,
                code=ErrorCode.INDEX_BOUNDS)

    @staticmethod
    def _op_position(insn: Gemm | Alu, op: int) -> str:
        uops = insn.uop_end - insn.uop_begin
        o, rest = divmod(op, insn.iter_in * uops)
        i, u = divmod(rest, uops)
        return f"iteration (o={o}, i={i}, uop={insn.uop_begin + u})"

    def _check_hazard(self, insn: Gemm | Alu, index: int, dst: np.ndarray, reads: np.ndarray,
                      distance: int, what: str) -> np.ndarray:
        prev = _previous_write(dst, reads)
        gap = np.arange(dst.size) - prev
        bad = np.nonzero((prev >= 0) & (gap < distance))[0]
        if bad.size:
            j = int(bad[0])
            raise HazardError(
                f"{what} reads accumulator row {int(reads[j])} at "
                f"{self._op_position(insn, j)}, only {int(gap[j])} op(s) after it was written "
                f"at {self._op_position(insn, int(prev[j]))}; the pipeline needs {distance}: "
                "reorder the uops or loops so writes to a row are further apart",
                index=index, where=insn.label)
        return prev

    def _write_acc(self, rows: np.ndarray, values: np.ndarray) -> None:
        self.acc[rows] = values
        self.out[rows] = saturate(values, self.config.out_width)

    def _banks(self, *rows: np.ndarray) -> frozenset[int]:
        """The accumulator banks ``rows`` fall in."""
        return frozenset(int(b) for r in rows for b in np.unique(r // self.config.acc_bank_rows))

    def gemm(self, insn: Gemm, index: int) -> frozenset[int]:
        """Run a GEMM; returns the accumulator banks it touched."""
        dst, src, wgt = self._loop_indices(insn, index, with_wgt=True)
        c = self.config
        self._check_indices(insn, index, "accumulator (dst)", dst, c.acc_depth)
        banks = self._banks(dst)
        if insn.reset:
            self.gemm_resets += dst.size
            self._write_acc(dst, 0)
            return banks
        self._check_indices(insn, index, "input (src)", src, c.inp_depth)
        self._check_indices(insn, index, "weight", wgt, c.wgt_depth)
        self._check_hazard(insn, index, dst, dst, gemm_hazard_distance(), "GEMM")
        self.gemm_ops += dst.size
        if dst.size == 0:
            return banks
        prod = self._products(src, wgt)
        rows, inverse = np.unique(dst, return_inverse=True)
        if rows.size == dst.size:             # every op writes its own row
            sums = np.empty_like(prod)
            sums[inverse] = prod
        else:                                  # ops of one row summed, in any order: exact
            order = np.argsort(inverse, kind="stable")
            starts = np.flatnonzero(np.r_[True, np.diff(inverse[order]) != 0])
            sums = np.add.reduceat(prod[order], starts, axis=0)
        self._write_acc(rows, wrap(self.acc[rows].astype(np.int64) + sums, c.acc_width))
        return banks

    def _products(self, src: np.ndarray, wgt: np.ndarray) -> np.ndarray:
        """Each op's ``inp[src] @ wgt[w].T`` as int64. A float32 matmul (BLAS) is exact
        while every dot product stays below 2**24 in magnitude (int8 operands over a
        block of up to 1,024 lanes); wider operands take the int64 product. The
        accumulator then wraps to int32 as the hardware adder does."""
        c = self.config
        bound = c.block_in << (c.inp_width - 1) << (c.wgt_width - 1)
        kind = np.float32 if bound < (1 << 24) else np.int64
        prod = np.matmul(self.inp[src].astype(kind), self.wgt[wgt].astype(kind).transpose(0, 2, 1))
        return prod.astype(np.int64)

    def alu(self, insn: Alu, index: int) -> frozenset[int]:
        """Run an ALU instruction; returns the accumulator banks it touched."""
        dst, src, _ = self._loop_indices(insn, index, with_wgt=False)
        c = self.config
        self._check_indices(insn, index, "accumulator (dst)", dst, c.acc_depth)
        if insn.reset:
            self._write_acc(dst, 0)
            return self._banks(dst)
        op = ALU_OPS.get(insn.alu_op)
        distance = op.timing.hazard_distance(insn.use_imm)
        prev = np.full(dst.size, -1, dtype=np.int64)
        if op.timing.reads_dst:
            prev = self._check_hazard(insn, index, dst, dst, distance, f"ALU {op.name}")
        banks = self._banks(dst)
        if not insn.use_imm:
            self._check_indices(insn, index, "accumulator (src)", src, c.acc_depth)
            banks |= self._banks(src)
            prev = np.maximum(prev, self._check_hazard(insn, index, dst, src, distance,
                                                       f"ALU {op.name} operand"))
            operand: Callable[[slice], np.ndarray] = lambda s: self.acc[src[s]]
        else:
            value = op.imm_to_operand(insn.imm, self.isa.imm_bits)
            operand = lambda s: np.full((s.stop - s.start,) + self.acc.shape[1:], value, np.int64)
        self.alu_ops += dst.size
        # Ops that read a row an earlier op of this instruction wrote must see the
        # new value: split the nest into batches with no such dependency inside.
        start = 0
        for j in np.nonzero(prev >= 0)[0]:
            if prev[j] >= start:
                self._alu_batch(op, dst, operand, slice(start, int(j)))
                start = int(j)
        self._alu_batch(op, dst, operand, slice(start, dst.size))
        return banks

    def _alu_batch(self, op, dst: np.ndarray, operand, s: slice) -> None:
        if s.stop > s.start:
            rows = dst[s]
            table = self.tbl.reshape(-1) if op.reads_table else None
            self._write_acc(rows, op.apply(self.acc[rows], operand(s), self.config.acc_width,
                                           table=table))
