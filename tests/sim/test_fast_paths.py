"""The simulator's fast paths against the plain semantics they replace.

The GEMM as dense matrix products (``sim/nest.py``) against the loop nest run one
operation at a time; the event kernel's same-cycle FIFO against a plain heap of
``(time, sequence)``; the per-stream facts kept across runs; the strided DRAM views of
LOAD and STORE against fancy indexing.
"""
from __future__ import annotations

import heapq

import numpy as np
from hypothesis import assume, given, settings, strategies as st

from tessera.config import PRESETS
from tessera.errors import HazardError
from tessera.isa import Finish, Gemm, Load, MemType, Program, Store, Uop, get_isa
from tessera.sim.datapath import Datapath
from tessera.sim.facts import program_facts
from tessera.sim.kernel import Kernel
from tessera.sim.nest import exact_float
from tessera.sim.registers import DecodedProgram

TINY = PRESETS["tiny"]


def test_exact_float_picks_the_narrowest_exact_type():
    assert exact_float(16, 8, 8) is np.float32            # 16 x 2**14 < 2**24
    assert exact_float(1023, 8, 8) is np.float32
    assert exact_float(1024, 8, 8) is np.float64          # 2**24: float32 could round
    assert exact_float(1 << 20, 16, 16) is np.float64
    assert exact_float(1 << 24, 16, 16) is np.int64       # 2**54: past float64's 53 bits


def _datapath(rng: np.random.Generator) -> Datapath:
    data = Datapath(TINY, Program(TINY, [Finish()]))
    data.inp[:] = rng.integers(-128, 128, data.inp.shape)
    data.wgt[:] = rng.integers(-128, 128, data.wgt.shape)
    data.acc[:] = rng.integers(-(1 << 31), 1 << 31, data.acc.shape, dtype=np.int64)
    return data


def _one_op_at_a_time(data: Datapath, insn: Gemm,
                      uops: list[Uop]) -> tuple[np.ndarray, set[int]]:
    """The GEMM's nest as the ISA describes it, in int64, wrapped to int32 per op: the
    accumulators and the rows written."""
    acc, written = data.acc.astype(np.int64), set()
    for o in range(insn.iter_out):
        for i in range(insn.iter_in):
            for u in uops[insn.uop_begin:insn.uop_end]:
                d = u.dst + o * insn.dst_factor_out + i * insn.dst_factor_in
                s = u.src + o * insn.src_factor_out + i * insn.src_factor_in
                w = u.wgt + o * insn.wgt_factor_out + i * insn.wgt_factor_in
                acc[d] += data.inp[s].astype(np.int64) @ data.wgt[w].astype(np.int64).T
                acc[d] = (acc[d] + (1 << 31)) % (1 << 32) - (1 << 31)
                written.add(d)
    return acc, written


@settings(max_examples=100, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), n_uops=st.integers(1, 6), iter_out=st.integers(1, 4),
       iter_in=st.integers(1, 4), shared_weights=st.booleans(), reuse_rows=st.booleans(),
       factors=st.tuples(*[st.integers(0, 3)] * 6))
def test_gemm_fast_paths_equal_the_loop_nest(seed, n_uops, iter_out, iter_in, shared_weights,
                                             reuse_rows, factors):
    """Dense (rows sharing weights: one product per weight pattern) or general (rows
    summing different numbers of ops, many weight patterns), the accumulators equal the
    one-op-at-a-time nest, wrap-around included."""
    rng = np.random.default_rng(seed)
    data = _datapath(rng)
    d_out, d_in, s_out, s_in, w_out, w_in = factors
    # Rows of the uops 8 apart, iterations on rows of their own or summed into the same.
    # (reuse_rows: every third uop writes the same row, so rows sum different counts.)
    uops = [Uop(dst=8 * (u % 3 if reuse_rows else u), src=int(rng.integers(0, 8)),
                wgt=u if shared_weights else int(rng.integers(0, 8))) for u in range(n_uops)]
    insn = Gemm(uop_begin=0, uop_end=n_uops, iter_out=iter_out, iter_in=iter_in,
                dst_factor_out=d_out * 48 * (d_out % 2), dst_factor_in=d_in * (d_in % 2),
                src_factor_out=s_out, src_factor_in=s_in,
                wgt_factor_out=w_out, wgt_factor_in=w_in)
    assume(8 * n_uops + (iter_out - 1) * insn.dst_factor_out
           + (iter_in - 1) * insn.dst_factor_in < TINY.acc_depth)
    data.uop[:n_uops] = get_isa(TINY).encode_uops(uops).view(data.uop.dtype)
    expected, written = _one_op_at_a_time(data, insn, uops)
    try:
        data.gemm(insn, 0)
    except HazardError:         # rows written too close together: the hardware refuses it
        assume(False)
    np.testing.assert_array_equal(data.acc, expected.astype(np.int32))
    rows = sorted(written)
    np.testing.assert_array_equal(data.out[rows], np.clip(expected[rows], -128, 127))


class _HeapKernel:
    """The reference order: one heap of (time, sequence) for every callback."""

    def __init__(self) -> None:
        self.now, self.heap, self.seq = 0, [], 0

    def at(self, time, fn, arg=None):
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, fn, arg))

    def run(self):
        while self.heap:
            self.now, _, fn, arg = heapq.heappop(self.heap)
            fn(arg)


@settings(max_examples=50, deadline=None, derandomize=True)
@given(plan=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=40))
def test_same_cycle_fifo_keeps_the_heap_order(plan):
    """Callbacks scheduling callbacks (delay 0: this cycle) run in the same order on the
    kernel as on a plain (time, sequence) heap."""
    def trace(kernel) -> list[tuple[int, int]]:
        order: list[tuple[int, int]] = []
        counter = iter(range(1, 10**6))

        def callback(name: int) -> None:
            order.append((kernel.now, name))
            for delay in plan[name % len(plan)]:
                if len(order) < 300:
                    kernel.at(kernel.now + delay, callback, next(counter))
        kernel.at(0, callback, 0)
        kernel.at(2, callback, 10**6)
        kernel.run()
        return order

    assert trace(Kernel()) == trace(_HeapKernel())


def _dma_program() -> Program:
    prog = Program(TINY)
    data = np.arange(64 * 16, dtype=np.uint8).astype(np.int8)
    prog.add_segment("x", data)
    prog.add_segment("y", 64 * 16)
    base_y = prog.elem_addr("y", MemType.OUT)
    prog.emit(
        # rows 3 entries apart: a strided read
        Load(mem=MemType.INP, sram_base=0, dram_base=prog.elem_addr("x", MemType.INP),
             y_size=4, x_size=2, x_stride=3, push_next=False),
        Store(mem=MemType.OUT, sram_base=0, dram_base=base_y, y_size=3, x_size=4, x_stride=2),
        Finish())
    return prog


def test_strided_dram_rows_equal_fancy_indexing():
    """A strided LOAD reads, and a STORE whose rows overlap writes (the later row wins),
    exactly what byte-index arrays would."""
    prog = _dma_program()
    data = Datapath(TINY, prog)
    load, store = prog.instructions[:2]
    data.load(load, 0)
    eb = get_isa(TINY).elem_bytes(MemType.INP)
    rows = [(load.dram_base + r * load.x_stride) * eb for r in range(load.y_size)]
    expected = np.concatenate([data.dram[a:a + load.x_size * eb] for a in rows])
    np.testing.assert_array_equal(data.inp[:8].view(np.uint8).reshape(-1), expected)

    data.out[:12] = (np.arange(data.out[:12].size) % 100).reshape(data.out[:12].shape)
    image = data.dram.copy()
    ob = get_isa(TINY).elem_bytes(MemType.OUT)
    flat = data.out[:12].view(np.uint8).reshape(3, 4 * ob)
    for r in range(3):
        a = (store.dram_base + r * store.x_stride) * ob
        image[a:a + 4 * ob] = flat[r]
    data.store(store, 1)
    np.testing.assert_array_equal(data.dram, image)


def test_facts_of_a_stream_are_derived_once():
    prog = _dma_program()
    stream = prog.encode_instructions()
    first = program_facts(TINY, stream, prog.instructions)
    assert program_facts(TINY, stream) is first
    assert [f.insn for f in first] == prog.instructions
    assert [f.module for f in first] == ["load", "store", "compute"]


def test_a_decoded_program_gives_its_stream_back_without_encoding():
    prog = _dma_program()
    stream = prog.encode_instructions()
    decoded = DecodedProgram(TINY, stream, list(prog.instructions), prog.segments)
    assert decoded.encode_instructions() is stream
