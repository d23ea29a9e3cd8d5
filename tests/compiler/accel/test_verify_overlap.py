"""The verifier and the simulator on the compute module's two units (``overlap``).

Hand-made programs on ``tiny`` (accumulator banks of 64 rows): the verifier
accepts a correct overlap, rejects the unsafe ones with the reason, and the
simulator agrees where it can see the problem at run time.
"""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler import VerificationError, verify_program
from tessera.errors import HazardError
from tessera.isa import ALU_OPS, Alu, Gemm, MemType, Store, Uop
from tessera.sim import simulate

from tests.programs import acc_entries, load, out_bytes, single_shot, store

from tests.compiler.helpers import TINY

BANK = TINY.acc_bank_rows
ADD = ALU_OPS.by_name("ADD").opcode


def _program(*, alu_row: int, gemm_row: int = 0, overlap: bool = True, gemm_push: bool = False,
             store_row: int | None = None):
    """GEMM on ``gemm_row`` (8 rows, one uop) then an ALU ADD imm on ``alu_row`` (8 rows),
    overlapped; stores the 8 rows at ``store_row`` (default ``alu_row``) after the ALU."""
    rng = np.random.default_rng(0)
    acc = acc_entries(TINY, rng.integers(-100, 100, (TINY.acc_depth, 1, TINY.block_out)))
    inp = rng.integers(-5, 5, (8, 1, TINY.block_in)).astype(np.int8)
    wgt = rng.integers(-5, 5, (1, TINY.block_out, TINY.block_in)).astype(np.int8)
    uops = [Uop(dst=gemm_row, src=0, wgt=0), Uop(dst=alu_row)]
    gemm = Gemm(uop_begin=0, uop_end=1, iter_out=8, dst_factor_out=1, src_factor_out=1,
                push_next=gemm_push)
    alu = Alu(alu_op=ADD, use_imm=True, imm=3, uop_begin=1, uop_end=2, iter_out=8,
              dst_factor_out=1, overlap=overlap)
    start = alu_row if store_row is None else store_row
    return single_shot(
        TINY, uops=uops,
        segments={"acc": acc, "inp": inp, "wgt": wgt, "out": out_bytes(TINY, TINY.acc_depth)},
        loads=[load("inp", MemType.INP, x_size=8), load("wgt", MemType.WGT, x_size=1),
               load("acc", MemType.ACC, x_size=TINY.acc_depth)],
        compute=[gemm, alu],
        stores=[store("out", start, x_size=8, y_size=1, sram_base=start)]
        + ([Store(pop_prev=True)] if gemm_push else []))


def test_overlap_on_different_banks_is_verified_and_runs_both_units_at_once():
    program = _program(alu_row=BANK)
    verify_program(program)
    result = simulate(program, trace=True)
    spans = {e.unit: (e.start, e.end) for e in result.trace if e.unit}
    (g0, g1), (a0, _) = spans["gemm"], spans["alu"]
    assert a0 == g0 + 1 and a0 < g1          # the ALU starts the cycle after the GEMM
    serial = simulate(_program(alu_row=BANK, overlap=False))
    assert serial.stats.cycles > result.stats.cycles
    assert np.array_equal(serial.read("out"), result.read("out"))
    assert result.read("out").any()


def test_overlap_on_the_same_bank_is_refused_by_verifier_and_simulator():
    program = _program(alu_row=16)           # rows 16..23: bank 0, like the GEMM's rows 0..7
    with pytest.raises(VerificationError, match="accumulator bank 0.*overlap"):
        verify_program(program)
    with pytest.raises(HazardError, match="bank 0"):
        simulate(program)


def test_overlap_pushing_into_the_queue_of_its_partner_is_refused():
    # the GEMM and the ALU beside it both push into compute->store (a second store pops)
    program = _program(alu_row=BANK, gemm_push=True)
    with pytest.raises(VerificationError, match="compute->store token queue"):
        verify_program(program)
    with pytest.raises(HazardError, match="compute->store"):
        simulate(program)


def test_a_token_from_the_overlapped_alu_does_not_cover_the_gemm_beside_it():
    # The store reads the GEMM's rows but waits only for the ALU's push: the GEMM may
    # still run then. The verifier must see that, unit order alone does not cover it.
    program = _program(alu_row=BANK, store_row=0)
    with pytest.raises(VerificationError, match="GEMM.*unit order"):
        verify_program(program)
    verify_program(_program(alu_row=BANK, store_row=0, overlap=False))
