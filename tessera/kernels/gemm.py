"""A blocked int8 GEMM written directly in the ISA, with virtual threads.

``C = epilogue(A @ B.T)`` for ``A`` (M x K) and ``B`` (N x K) int8, stored as
int8 (saturating). The output is cut into ``tile_m x tile_n`` tiles; with two
virtual threads, consecutive tiles use alternate halves of the input, weight
and accumulator buffers, so loading tile s+1 and storing tile s-1 overlap
computing tile s. Dependency tokens order the modules:

* load pushes "data ready" to compute after a tile's loads, and waits for
  compute's "buffer free" before reusing a half;
* compute pushes "buffer free" back to load after the tile's GEMM, and
  "result ready" to store after the epilogue; it waits for store's "output
  free" before resetting a half of the accumulator;
* at the end every queue is drained so the program leaves no token behind.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..config import HwConfig
from ..errors import ProgramError
from ..isa import ALU_OPS, Alu, Finish, Gemm, Load, MemType, Program, Store, Uop, get_isa
from ..isa.intrinsics import saturate, wrap
from ..timing import COMPUTE_SETUP_CYCLES, DMA_SETUP_CYCLES, GEMM_LATENCY


@dataclass(frozen=True)
class GemmPlan:
    """Tile sizes (in buffer entries: ``tile_m`` row blocks of ``batch`` rows, ``tile_n``
    column blocks of ``block_out`` columns) and the virtual-thread count."""

    tile_m: int
    tile_n: int
    threads: int


def blocked_layout(matrix: np.ndarray, rows_per_block: int, cols_per_block: int) -> np.ndarray:
    """``(R, C)`` -> ``(R/r, C/c, r, c)``: the buffer-entry layout of a matrix in DRAM."""
    r, c = matrix.shape
    return matrix.reshape(r // rows_per_block, rows_per_block, c // cols_per_block,
                          cols_per_block).transpose(0, 2, 1, 3).copy()


def unblocked(blocks: np.ndarray) -> np.ndarray:
    """Inverse of :func:`blocked_layout`."""
    rb, cb, r, c = blocks.shape
    return blocks.transpose(0, 2, 1, 3).reshape(rb * r, cb * c)


def estimate_cycles(config: HwConfig, plan: GemmPlan, m: int, n: int, k: int,
                    epilogue_ops: int = 0) -> int:
    """An analytic cycle estimate of :func:`gemm_program` under ``plan`` (no simulation).

    A step's loads may start once the step ``threads`` earlier has finished
    computing (its buffer half is free); its compute starts once its loads and
    the previous compute are done. Store and fetch are assumed hidden, except
    the last store.
    """
    c = config
    mb, nb, kb = m // c.batch, n // c.block_out, k // c.block_in
    tm, tn, vt = plan.tile_m, plan.tile_n, plan.threads
    dma = DMA_SETUP_CYCLES + c.dram_latency
    drain = COMPUTE_SETUP_CYCLES + GEMM_LATENCY + 1
    compute = tm * tn * (kb + 1 + epilogue_ops) + (2 + epilogue_ops) * drain
    inp = tm * kb * c.inp_entry_bytes // c.bus_bytes + dma
    wgt = tn * kb * c.wgt_entry_bytes // c.bus_bytes + dma
    store = tm * tn * c.out_entry_bytes // c.bus_bytes + dma
    load_end: list[int] = []
    compute_end: list[int] = []
    weights_in = [None] * vt
    for s, n0 in enumerate(n0 for n0 in range(0, nb, tn) for _ in range(0, mb, tm)):
        load = inp + (wgt if weights_in[s % vt] != n0 else 0)
        weights_in[s % vt] = n0
        free = compute_end[s - vt] if s >= vt else 0
        load_end.append(max(load_end[-1] if load_end else 0, free) + load)
        compute_end.append(max(load_end[-1], compute_end[-1] if compute_end else 0) + compute)
        if vt == 1:  # one buffer: the store must drain before the next load
            compute_end[-1] += store
            load_end[-1] = compute_end[-1]
    return compute_end[-1] + (store if vt > 1 else 0)


def _check_gemm(config: HwConfig, m: int, n: int, k: int, threads: int) -> None:
    """:class:`ProgramError` unless M, N, K are positive multiples of the config's blocks
    and ``threads`` is 1 or 2."""
    for name, size, block in (("M", m, config.batch), ("N", n, config.block_out),
                              ("K", k, config.block_in)):
        if size <= 0:
            raise ProgramError(f"GEMM {name}={size} must be positive")
        if size % block:
            raise ProgramError(f"GEMM {name}={size} must be a multiple of {block} for config "
                               f"{config.name!r} (its {config.batch}x{config.block_in}x"
                               f"{config.block_out} core)")
    if threads not in (1, 2):
        raise ProgramError(f"threads must be 1 or 2, not {threads}")


def plan_gemm(config: HwConfig, m: int, n: int, k: int, threads: int = 2,
              epilogue_ops: int = 0) -> GemmPlan:
    """The tiling with the lowest :func:`estimate_cycles` among those that fit the buffers."""
    c = config
    _check_gemm(c, m, n, k, threads)
    mb, nb, kb = m // c.batch, n // c.block_out, k // c.block_in
    candidates = [GemmPlan(tm, tn, threads)
                  for tn in range(1, nb + 1) if nb % tn == 0
                  for tm in range(1, mb + 1) if mb % tm == 0
                  if threads * tm * kb <= c.inp_depth and threads * tn * kb <= c.wgt_depth
                  and threads * tm * tn <= c.acc_depth and tm * tn >= GEMM_LATENCY
                  and threads * tn <= c.uop_depth and max(tm, kb) < 1 << c.loop_bits]
    if not candidates:
        raise ProgramError(f"a {m}x{n}x{k} GEMM does not fit config {c.name!r} with "
                           f"{threads} virtual thread(s): one row of K={k} needs {kb} input "
                           f"entries and one column {kb} weight entries")
    return min(candidates, key=lambda p: (estimate_cycles(c, p, m, n, k, epilogue_ops),
                                          -p.tile_m * p.tile_n))


def gemm_program(config: HwConfig, a: np.ndarray, b: np.ndarray, *,
                 epilogue: Sequence[tuple[str, int]] = (), threads: int = 2,
                 plan: GemmPlan | None = None) -> Program:
    """A program computing ``C = epilogue(A @ B.T)`` into segment ``"c"`` (int8, blocked).

    ``epilogue`` lists ALU ops with immediates, e.g. ``[("SHR", 8), ("MAX", 0)]``.
    Read the result with :func:`read_result`.
    """
    c = config
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or b.ndim != 2:
        raise ProgramError(f"A and B must be matrices; A has shape {list(a.shape)}, B "
                           f"{list(b.shape)}")
    m, k = a.shape
    n, k2 = b.shape
    if k != k2:
        raise ProgramError(f"A is {m}x{k} but B is {n}x{k2}: inner dimensions differ")
    _check_gemm(c, m, n, k, threads)
    plan = plan or plan_gemm(c, m, n, k, threads, len(epilogue))
    tm, tn, vt = plan.tile_m, plan.tile_n, plan.threads
    mb, nb, kb = m // c.batch, n // c.block_out, k // c.block_in

    prog = Program(c)
    # Each thread's uops: one per column block of the tile, rooted in its buffer halves.
    uops = [Uop(dst=t * tm * tn + u, src=t * tm * kb, wgt=(t * tn + u) * kb)
            for t in range(vt) for u in range(tn)]
    prog.add_uops("uops", uops)
    prog.add_segment("a", blocked_layout(a.astype(np.int8), c.batch, c.block_in))
    prog.add_segment("b", blocked_layout(b.astype(np.int8), c.block_out, c.block_in))
    prog.add_segment("c", m * n * c.out_width // 8)
    a_base, b_base = prog.elem_addr("a", MemType.INP), prog.elem_addr("b", MemType.WGT)
    c_base = prog.elem_addr("c", MemType.OUT)
    ops = [(ALU_OPS.by_name(name), imm) for name, imm in epilogue]

    prog.emit(Load(mem=MemType.UOP, dram_base=prog.elem_addr("uops", MemType.UOP),
                   y_size=1, x_size=len(uops), x_stride=len(uops)))
    weights_in = [None] * vt
    steps = [(n0, m0) for n0 in range(0, nb, tn) for m0 in range(0, mb, tm)]
    for s, (n0, m0) in enumerate(steps):
        t = s % vt
        reuse = s >= vt
        loads = [Load(mem=MemType.INP, sram_base=t * tm * kb, dram_base=a_base + m0 * kb,
                      y_size=tm, x_size=kb, x_stride=kb)]
        if weights_in[t] != n0:
            loads.insert(0, Load(mem=MemType.WGT, sram_base=t * tn * kb, dram_base=b_base + n0 * kb,
                                 y_size=tn, x_size=kb, x_stride=kb))
            weights_in[t] = n0
        loads[0] = loads[0].replace(pop_next=reuse)
        loads[-1] = loads[-1].replace(push_next=True)
        prog.emit(*loads)

        # Loop order k (out), rows (in), column blocks (uops): a row is written
        # again only tm * tn ops later, beyond the GEMM pipeline's hazard distance.
        nest = dict(uop_begin=t * tn, uop_end=(t + 1) * tn)
        per_row = dict(nest, iter_out=1, iter_in=tm, dst_factor_in=tn)
        compute = [Gemm(reset=True, pop_prev=True, pop_next=reuse, **per_row),
                   Gemm(iter_out=kb, iter_in=tm, dst_factor_in=tn, src_factor_out=1,
                        src_factor_in=kb, wgt_factor_out=1, push_prev=True, **nest)]
        compute += [Alu(alu_op=op.opcode, use_imm=True, imm=imm, **per_row) for op, imm in ops]
        compute[-1] = compute[-1].replace(push_next=True)
        prog.emit(*compute)
        prog.emit(Store(mem=MemType.OUT, sram_base=t * tm * tn, dram_base=c_base + m0 * nb + n0,
                        y_size=tm, x_size=tn, x_stride=nb, pop_prev=True, push_prev=True))

    # Drain: load takes back its last free-buffer tokens, compute its last
    # output-free tokens: one per thread that ran (fewer steps than threads: fewer).
    drain = min(len(steps), vt)
    for v in range(drain):
        prog.emit(Load(mem=MemType.INP, x_size=0, pop_next=True, push_next=v == drain - 1))
    for _ in range(drain - 1):
        prog.emit(Load(mem=MemType.UOP, x_size=0, pop_next=True))
    prog.emit(Finish(pop_prev=True, pop_next=True))
    return prog


def read_result(config: HwConfig, dram_or_result, program: Program, m: int, n: int) -> np.ndarray:
    """The ``M x N`` output matrix of a :func:`gemm_program` run."""
    dram = getattr(dram_or_result, "dram", dram_or_result)
    dtype = {8: np.int8, 16: np.int16, 32: np.int32}[config.out_width]
    blocks = program.read(dram, "c", dtype, (m // config.batch, n // config.block_out,
                                             config.batch, config.block_out))
    return unblocked(blocks)


def reference_gemm(config: HwConfig, a: np.ndarray, b: np.ndarray,
                   epilogue: Sequence[tuple[str, int]] = ()) -> np.ndarray:
    """numpy golden model: wrapping GEMM, the epilogue ops, saturation to the output width."""
    acc = wrap(a.astype(np.int64) @ b.astype(np.int64).T, config.acc_width)
    imm_bits = get_isa(config).imm_bits
    for name, imm in epilogue:
        op = ALU_OPS.by_name(name)
        acc = op.apply(acc, np.full_like(acc, op.imm_to_operand(imm, imm_bits)), config.acc_width)
    return saturate(acc, config.out_width)
