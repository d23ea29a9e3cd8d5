"""The software-pipelined convolution: the epilogue of tile k-1 and the bias init of tile k+1
on the ALU unit beside the GEMMs of tile k (``overlap``), and the bias as a MOV init.

Every compiled program here is also checked by the verifier (helpers.compile_and_run).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tessera.compiler import (Bias, Clip, Conv2d, Dense, Requant, Shift, VerificationError,
                              compile_ops, insert_dependency_tokens, requantize, verify_program)
from tessera.compiler.accel.verify import overlap_partner
from tessera.isa import ALU_OPS, Alu, Finish, Gemm, Load, MemType, Program, Store, Uop
from tessera.sim import simulate

from tests.compiler.helpers import PYNQ, TINY, compile_and_run
from tests.compiler.reference import conv, ort_requant, sat8, wrap32

MOV = ALU_OPS.by_name("MOV").opcode


def _overlapping(trace) -> list[tuple]:
    """(GEMM event, ALU event) pairs that run at the same time."""
    gemms = [e for e in trace if e.unit == "gemm" and e.end > e.start + 1]
    alus = [e for e in trace if e.unit == "alu"]
    return [(g, a) for g in gemms for a in alus if a.start < g.end and g.start < a.end]


def _c4_like(rng, hw=28):
    """A 1x1 stride-2 layer with IC=64 (ResNet's C4 shape, smaller): the GEMM needs 4 cycles
    per output row, as many as the epilogue (MOV bias 1, REQUANT 2, ReLU 1)."""
    x = rng.integers(-128, 128, (1, 64, hw, hw), dtype=np.int8)
    w = rng.integers(-64, 64, (128, 64, 1, 1), dtype=np.int8)
    bias = rng.integers(-20000, 20000, 128)
    scale = rng.uniform(2e-4, 2e-3, 128).astype(np.float32)
    op = Conv2d("c", "x", "y", w, stride=2, epilogue=requantize(scale, relu=True, bias=bias))
    expected = ort_requant(conv(x, w, (2, 2)) + bias[None, :, None, None], scale, 0, True)
    return op, x, expected


def test_pipelined_conv_runs_the_epilogue_beside_the_gemms():
    op, x, expected = _c4_like(np.random.default_rng(0))
    out, result, compiled = compile_and_run([op], {"x": x}, PYNQ)
    np.testing.assert_array_equal(out["y"], expected)
    plan = compiled.plans["c"]
    assert plan.pipelined
    stats = compiled.program.sync_stats
    assert stats.overlaps > 10 and stats.overlaps_cleared == 0
    # both units busy at once, in the simulator's trace
    traced = simulate(compiled.bind({"x": x}), trace=True)
    pairs = _overlapping(traced.trace)
    assert len(pairs) > 10
    assert {a.name for _, a in pairs} >= {"ALU MOV", "ALU REQUANT"}
    # the accumulator rows start at the bias: no GEMM reset, no bias GEMM operations
    assert result.stats.gemm_resets == 0
    macs = 64 * 128 * 14 * 14
    assert result.stats.gemm_ops == macs // (PYNQ.block_in * PYNQ.block_out)
    # the same tiling without the pipeline (init, GEMMs, epilogue one after the other)
    serial = compile_ops([op], {"x": x.shape}, PYNQ,
                         plans={"c": replace(plan, pipeline=False, est_cycles=0)})
    assert not serial.plans["c"].pipelined
    s_out, s_result = serial.run({"x": x})
    np.testing.assert_array_equal(s_out["y"], expected)
    assert result.stats.cycles < 0.8 * s_result.stats.cycles


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["extreme", "scalar-row", "scalar-imm"])
def test_mov_bias_init_is_bit_exact(config, threads, kind):
    """Any int32 bias (a per-channel row, one broadcast row, or the immediate) initialises the
    accumulator by MOV; acc + bias wraps like int32."""
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, (2, 9, 10, 11), dtype=np.int8)
    w = rng.integers(-128, 128, (20, 9, 3, 3), dtype=np.int8)
    bias = {"extreme": np.where(np.arange(20) % 2, 2**31 - 1 - np.arange(20),
                                -2**31 + np.arange(20)),
            "scalar-row": np.full(20, 123456), "scalar-imm": np.full(20, -77)}[kind]
    op = Conv2d("c", "x", "y", w, padding=1, epilogue=(Bias(bias), Shift(20, rounding=False),
                                                               Clip(-100, 90)))
    out, result, compiled = compile_and_run([op], {"x": x}, config, threads=threads)
    acc = wrap32(conv(x, w, pads=(1, 1, 1, 1)) + bias[None, :, None, None])
    np.testing.assert_array_equal(out["y"], sat8(np.clip(acc >> 20, -100, 90)))
    movs = [i for i in compiled.program.instructions if isinstance(i, Alu) and i.alu_op == MOV]
    # tiny's immediate holds 32 bits; pynq's 16 do not hold 123456 (then a parameter row, and
    # its copy into the other bank when pipelined, are tensor MOVs too)
    imm = kind == "scalar-imm" or (kind == "scalar-row" and config is TINY)
    assert movs and {i.use_imm for i in movs} == {imm}
    assert result.stats.gemm_resets == 0


def test_dense_one_row_replicas_start_at_the_bias():
    """A one-row dense layer cycles its terms over replica rows: replica 0 starts at the bias,
    the others at zero, an ADD sums them (pipelined on pynq)."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 300), dtype=np.int8)
    w = rng.integers(-128, 128, (200, 300), dtype=np.int8)
    bias = rng.integers(-2**30, 2**30, 200)
    scale = rng.uniform(1e-5, 1e-4, 200).astype(np.float32)
    op = Dense("fc", "x", "y", w, epilogue=(Bias(bias), Requant(scale)))
    out, _, compiled = compile_and_run([op], {"x": x}, PYNQ)
    acc = wrap32(x.astype(np.int64) @ w.astype(np.int64).T + bias)
    np.testing.assert_array_equal(out["y"][:, :, 0, 0], ort_requant(acc, scale, ndim=2))


def _gemm_then_alu(alu_row: int) -> Program:
    """A GEMM on rows 0..7, then an ALU ADD marked overlap on rows ``alu_row..+7``, then a
    store of the ALU's rows; no tokens."""
    p = Program(TINY)
    p.add_uops("uops", [Uop(0, 0, 0), Uop(alu_row, 0, 0)])
    rng = np.random.default_rng(0)
    p.add_segment("inp", rng.integers(-5, 5, (8, TINY.block_in)).astype(np.int8))
    p.add_segment("wgt", rng.integers(-5, 5, (TINY.block_out, TINY.block_in)).astype(np.int8))
    p.add_segment("out", 8 * TINY.block_out)
    p.emit(Load(mem=MemType.UOP, dram_base=p.elem_addr("uops", MemType.UOP), x_size=2,
                x_stride=2),
           Load(mem=MemType.INP, dram_base=p.elem_addr("inp", MemType.INP), x_size=8,
                x_stride=8),
           Load(mem=MemType.WGT, dram_base=p.elem_addr("wgt", MemType.WGT), x_size=1,
                x_stride=1),
           Gemm(uop_begin=0, uop_end=1, iter_out=8, dst_factor_out=1, src_factor_out=1),
           Alu(alu_op=ALU_OPS.by_name("ADD").opcode, use_imm=True, imm=3, uop_begin=1,
               uop_end=2, iter_out=8, dst_factor_out=1, overlap=True),
           Store(sram_base=alu_row, dram_base=p.elem_addr("out", MemType.OUT), x_size=8,
                 x_stride=8),
           Finish())
    return p


@pytest.mark.parametrize("alu_row, kept", [(TINY.acc_bank_rows, True), (16, False), (0, False)])
def test_token_pass_keeps_safe_overlap_and_clears_the_rest(alu_row, kept):
    """Other bank: the ALU runs beside the GEMM. Same bank (16) or the GEMM's own rows (0): the
    pass clears the flag, so the ALU waits for the GEMM."""
    program = insert_dependency_tokens(_gemm_then_alu(alu_row))
    stats = program.sync_stats
    assert (stats.overlaps, stats.overlaps_cleared) == ((1, 0) if kept else (0, 1))
    verify_program(program)
    result = simulate(program, trace=True)
    assert bool(_overlapping(result.trace)) == kept
    assert result.stats.leftover_tokens == {}


def test_overlap_flags_the_compiler_leaves_clear_are_needed():
    """Setting ``overlap`` on any GEMM/ALU of a pipelined program that runs without it, where
    it would have an instruction to run beside, is caught by the verifier (the first GEMM of a
    tile waits for its init, the last tile's epilogue for its GEMMs)."""
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (1, 32, 12, 12), dtype=np.int8)
    w = rng.integers(-128, 128, (48, 32, 3, 3), dtype=np.int8)
    op = Conv2d("c", "x", "y", w, padding=1,
                epilogue=requantize(rng.uniform(1e-4, 1e-3, 48).astype(np.float32),
                                    relu=True, bias=rng.integers(-999, 999, 48)))
    compiled = compile_ops([op], {"x": x.shape}, PYNQ)
    assert compiled.plans["c"].pipelined
    program = compiled.program
    insns = program.instructions
    flipped = 0
    for i, insn in enumerate(insns):
        if not isinstance(insn, (Gemm, Alu)) or insn.overlap or insn.op_count == 0:
            continue
        trial = list(insns)
        trial[i] = insn.replace(overlap=True)
        if overlap_partner(trial, i) is None:
            continue
        flipped += 1
        with pytest.raises(VerificationError):
            verify_program(Program(program.config, trial, program.segments))
    assert flipped >= 4
