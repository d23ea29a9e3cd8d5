"""The dependency-token pass and the verifier.

Every compiled program passes the verifier (see helpers.compile_and_run); here:
removing any one token, or any matched push/pop pair, from double-buffered
programs is caught; hand-made faulty programs are rejected with the right
reason; the pass reproduces a hand-synchronised kernel's results.
"""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler import (Conv2d, Pool2d, VerificationError, compile_ops,
                              insert_dependency_tokens, requantize, verify_program)
from tessera.isa import Finish, Gemm, Load, MemType, Program, Store, Uop
from tessera.kernels.gemm import GemmPlan, gemm_program, read_result
from tessera.sim import simulate

from tests.compiler.helpers import PYNQ, TINY
from tests.compiler.reference import conv, ort_requant

FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")
MODULE = {"pop_prev": -1, "pop_next": 1, "push_prev": -1, "push_next": 1}


def _double_buffered_program():
    """conv (several tiles, two threads) -> conv -> max pool: on-chip and DRAM hazards,
    carriers; both convolutions software-pipelined (epilogue and bias init on the ALU unit
    beside the GEMMs, ``overlap``), so the tokens include those of the overlapped schedule."""
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (6, 5, 3, 3), dtype=np.int8)
    w2 = rng.integers(-128, 128, (5, 6, 1, 1), dtype=np.int8)
    scale = rng.uniform(1e-4, 2e-3, 6).astype(np.float32)
    ops = [Conv2d("c", "x", "t", w, padding=1, epilogue=requantize(scale, relu=True)),
           Conv2d("c2", "t", "u", w2, epilogue=requantize(scale[:5] * 10)),
           Pool2d("p", "u", "y", "max", 2, 2)]
    compiled = compile_ops(ops, {"x": (1, 5, 6, 7)}, TINY, threads=2)
    assert compiled.program.sync_stats.carriers > 0   # a DRAM dependency went through compute
    assert compiled.plans["c"].pipelined and compiled.plans["c2"].pipelined
    assert compiled.program.sync_stats.overlaps > 20
    return compiled


def _module_index(insn):
    from tessera.isa import module_of
    return {"load": 0, "compute": 1, "store": 2}[module_of(insn)]


def _pairs(program):
    """(push index, pop index, push flag, pop flag) of every token, paired in FIFO order."""
    pushes, pops = {}, {}
    for i, insn in enumerate(program.instructions):
        m = _module_index(insn)
        for f in FLAGS:
            if getattr(insn, f):
                other = m + MODULE[f]
                q = (m, other) if f.startswith("push") else (other, m)
                (pushes if f.startswith("push") else pops).setdefault(q, []).append((i, f))
    out = []
    for q, ps in pushes.items():
        assert len(ps) == len(pops[q])
        out += [(a, b, fa, fb) for (a, fa), (b, fb) in zip(ps, pops[q])]
    return out


def _without(program, edits):
    insns = list(program.instructions)
    for i, flag in edits:
        insns[i] = insns[i].replace(**{flag: False})
    return Program(program.config, insns, program.segments)


def test_removing_any_single_token_flag_is_caught():
    program = _double_buffered_program().program
    verify_program(program)
    flags = [(i, f) for i, insn in enumerate(program.instructions) for f in FLAGS
             if getattr(insn, f)]
    assert len(flags) > 30
    for i, f in flags:
        with pytest.raises(VerificationError, match="token queue gets"):
            verify_program(_without(program, [(i, f)]))


def test_removing_any_token_pair_is_caught():
    """A push/pop pair the pass placed orders a real hazard: without it the verifier objects."""
    program = _double_buffered_program().program
    pairs = _pairs(program)
    assert len(pairs) > 15
    for push, pop, fpush, fpop in pairs:
        broken = _without(program, [(push, fpush), (pop, fpop)])
        with pytest.raises(VerificationError, match="no chain of dependency tokens"):
            verify_program(broken)


def test_pass_reproduces_a_hand_synchronised_kernel():
    """Strip the hand-written GEMM kernel's tokens and no-ops; the pass re-derives them."""
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (64, 64), dtype=np.int8)
    b = rng.integers(-128, 128, (64, 64), dtype=np.int8)
    hand = gemm_program(PYNQ, a, b, epilogue=[("SHR", 7)], plan=GemmPlan(16, 2, 2))
    insns = [i.replace(pop_prev=False, pop_next=False, push_prev=False, push_next=False)
             for i in hand.instructions if not (isinstance(i, Load) and i.is_nop)]
    auto = insert_dependency_tokens(Program(PYNQ, insns, hand.segments))
    verify_program(auto)
    r_hand, r_auto = simulate(hand), simulate(auto)
    expected = ((a.astype(np.int64) @ b.astype(np.int64).T) >> 7).clip(-128, 127)
    np.testing.assert_array_equal(read_result(PYNQ, r_auto, auto, 64, 64), expected)
    np.testing.assert_array_equal(read_result(PYNQ, r_hand, hand, 64, 64), expected)
    assert r_auto.stats.cycles <= r_hand.stats.cycles
    assert r_auto.stats.leftover_tokens == {}


def _tiny_program(*insns, uops=(Uop(0, 0, 0),)):
    p = Program(TINY)
    p.add_uops("uops", list(uops))
    p.add_segment("a", np.ones(64, np.int8))
    p.add_segment("c", 64)
    p.emit(Load(mem=MemType.UOP, dram_base=p.elem_addr("uops", MemType.UOP),
                x_size=len(uops), x_stride=len(uops)))
    base = {"a": p.elem_addr("a", MemType.INP), "c": p.elem_addr("c", MemType.OUT)}
    p.emit(*[i(base) if callable(i) else i for i in insns])
    return p


def test_verifier_reports_unordered_raw():
    p = _tiny_program(lambda b: Load(mem=MemType.INP, dram_base=b["a"], x_size=4, x_stride=4),
                      Gemm(uop_end=1), lambda b: Store(dram_base=b["c"], x_size=1, x_stride=1),
                      Finish())
    with pytest.raises(VerificationError, match=r"instruction 2 \(GEMM\) must start after it "
                                                r"finishes, instruction 1 \(LOAD inp\)"):
        verify_program(p)
    fixed = insert_dependency_tokens(p)
    verify_program(fixed)
    assert simulate(fixed).stats.leftover_tokens == {}


def test_verifier_reports_deadlock():
    # Compute waits for load, load waits for compute: a cycle.
    p = _tiny_program(lambda b: Load(mem=MemType.INP, dram_base=b["a"], x_size=4, x_stride=4,
                                     pop_next=True, push_next=True),
                      Gemm(uop_end=1, pop_prev=True, push_prev=True), Finish())
    with pytest.raises(VerificationError, match="deadlocks: load: instruction 1"):
        verify_program(p)


def test_verifier_reports_uop_hazard():
    p = _tiny_program(Gemm(uop_end=2), Finish(), uops=(Uop(0, 0, 0), Uop(0, 1, 0)))
    with pytest.raises(VerificationError, match="reads accumulator row 0 only 1 op"):
        verify_program(p)


def test_verifier_requires_finish_last():
    p = _tiny_program(Finish(), Gemm(uop_end=1))
    with pytest.raises(VerificationError, match="must end with FINISH"):
        verify_program(p)


def test_token_queue_depth_and_command_queues_are_respected():
    """tiny has 8-deep token and command queues: a long compiled program still completes,
    and the verifier's untimed run agrees with the simulator."""
    rng = np.random.default_rng(9)
    x = rng.integers(-128, 128, (1, 8, 12, 12), dtype=np.int8)
    w = rng.integers(-128, 128, (8, 8, 3, 3), dtype=np.int8)
    scale = rng.uniform(1e-4, 1e-3, 8).astype(np.float32)
    compiled = compile_ops([Conv2d("c", "x", "y", w, padding=1, epilogue=requantize(scale))],
                           {"x": x.shape}, TINY)
    assert len(compiled.program.instructions) > 5 * TINY.cmd_queue_depth
    assert sum(compiled.program.sync_stats.tokens.values()) > 2 * TINY.token_queue_depth
    verify_program(compiled.program)
    out, result = compiled.run({"x": x})
    np.testing.assert_array_equal(out["y"], ort_requant(conv(x, w, pads=(1, 1, 1, 1)), scale))
