"""Bad programs fail with clear errors naming the instruction; nothing hangs."""
import pytest

from tessera.config import PRESETS
from tessera.errors import (BoundsError, DeadlockError, HazardError, MalformedInstructionError,
                            MissingFinishError, ProgramError, ProgramFileError, TesseraError)
from tessera.isa import Alu, Finish, Gemm, Load, MemType, Program, Store, Uop
from tessera.sim import simulate

TINY = PRESETS["tiny"]


def _program(*insns, uops=(Uop(),)):
    p = Program(TINY)
    p.add_uops("uops", list(uops))
    p.add_segment("data", 256)
    p.emit(*insns)
    return p


def test_token_deadlock_names_waiting_module_and_queue():
    p = _program(Load(mem=MemType.INP, x_size=1, pop_next=True, push_next=True),
                 Finish(pop_prev=True))
    with pytest.raises(DeadlockError) as info:
        simulate(p)
    msg = str(info.value)
    assert "load: instruction 0 (LOAD inp) waits for a token on the compute->load token queue" in msg
    assert "compute->load 0/8" in msg


def test_cross_deadlock_between_compute_and_store():
    p = _program(Store(x_size=0, pop_prev=True), Finish(pop_next=True))
    with pytest.raises(DeadlockError, match=r"store: instruction 0 \(STORE out\) waits.*"
                                            r"compute->store"):
        simulate(p)


def test_leftover_tokens_are_reported():
    p = _program(*[Load(mem=MemType.UOP, x_size=0, push_prev=True) for _ in range(3)], Finish())
    assert simulate(p).stats.leftover_tokens == {"compute->load": 3}


def test_full_token_queue_in_deadlock_report():
    # tiny token queues hold 8: the ninth push blocks while compute waits for store.
    p = _program(*[Load(mem=MemType.INP, x_size=0, push_next=True) for _ in range(9)],
                 Finish(pop_prev=True, pop_next=True))
    with pytest.raises(DeadlockError) as info:
        simulate(p)
    msg = str(info.value)
    assert "load: instruction 8 (LOAD inp) waits to push a token into the full load->compute " \
           "token queue (8/8)" in msg
    assert "compute: instruction 9 (FINISH) waits for a token on the store->compute" in msg


def test_missing_finish():
    with pytest.raises(MissingFinishError, match="no FINISH"):
        simulate(_program(Load(mem=MemType.INP, x_size=0)))


def test_finish_with_work_pending():
    p = _program()
    p.emit(Store(x_size=4, dram_base=p.elem_addr("data", MemType.OUT), x_stride=4), Finish())
    with pytest.raises(MissingFinishError, match="store is still running instruction 0"):
        simulate(p)


def test_malformed_flags_and_memory_types():
    with pytest.raises(MalformedInstructionError, match=r"pop_prev is not allowed on a load-module "
                                                        r"instruction \(allowed: pop_next, push_next\) \(instruction 0, LOAD inp\)"):
        simulate(_program(Load(mem=MemType.INP, x_size=0, pop_prev=True), Finish()))
    with pytest.raises(MalformedInstructionError, match="STORE has no zero padding: x_pad_0 must be 0"):
        simulate(_program(Store(x_size=1, x_pad_0=1), Finish()))
    with pytest.raises(MalformedInstructionError, match="STORE has no zero padding: pad_value must be 0, not -128"):
        simulate(_program(Store(x_size=1, pad_value=-128), Finish()))
    with pytest.raises(MalformedInstructionError, match="LOAD cannot write the output buffer"):
        simulate(_program(Load(mem=MemType.OUT), Finish()))
    with pytest.raises(MalformedInstructionError, match="alu_op 12 is not a registered ALU op"):
        simulate(_program(Alu(alu_op=12), Finish()))
    with pytest.raises(MalformedInstructionError, match="uop_end must be at least uop_begin"):
        simulate(_program(Gemm(uop_begin=3, uop_end=1), Finish()))


def test_sram_out_of_range():
    # 2 x 70 entries from 100 > 128-entry input buffer.
    p = _program(Load(mem=MemType.INP, sram_base=100, y_size=1, x_size=30, x_stride=30), Finish())
    with pytest.raises(BoundsError, match=r"SRAM entries \[100, 130\) exceed the inp buffer of 128 "
                                          r"entries \(instruction 0, LOAD inp\)"):
        simulate(p)


def test_dram_out_of_segments():
    p = _program(Load(mem=MemType.INP, dram_base=10_000, x_size=1), Finish())
    with pytest.raises(BoundsError, match=r"DRAM bytes \[0x9c40, 0x9c44\) are not inside one segment"):
        simulate(p)
    # A 2-D access whose rows straddle the end of a segment.
    p = _program(Load(mem=MemType.INP, dram_base=0, y_size=2, x_size=1, x_stride=2000), Finish())
    with pytest.raises(BoundsError, match="segments: uops"):
        simulate(p)


def test_gemm_index_out_of_range_names_iteration():
    p = _program(Load(mem=MemType.UOP, x_size=1),
                 Gemm(uop_end=1, iter_out=200, dst_factor_out=1), Finish(), uops=[Uop(dst=0)])
    with pytest.raises(BoundsError, match=r"accumulator \(dst\) index 128 is past the 128-entry "
                                          r"buffer at iteration \(o=128, i=0, uop=0\) \(instruction 1"):
        simulate(p)


def test_gemm_write_hazard():
    # Two uops writing the same accumulator row back to back.
    p = _program(Load(mem=MemType.UOP, x_size=2),
                 Gemm(uop_end=2), Finish(), uops=[Uop(dst=5, src=0), Uop(dst=5, src=1)])
    with pytest.raises(HazardError, match=r"reads accumulator row 5 at iteration \(o=0, i=0, uop=1\), "
                                          r"only 1 op\(s\) after it was written"):
        simulate(p)


def test_alu_operand_hazard():
    # Row 1 is written by op 0 and read as the operand of op 1.
    p = _program(Load(mem=MemType.UOP, x_size=2),
                 Alu(alu_op=2, uop_end=2), Finish(), uops=[Uop(dst=1, src=0), Uop(dst=2, src=1)])
    with pytest.raises(HazardError, match="ALU ADD operand reads accumulator row 1"):
        simulate(p)


def test_damaged_program_file(tmp_path):
    p = _program(Finish())
    blob = bytearray(p.to_bytes())
    blob[40] ^= 0xFF
    (tmp_path / "bad.tsp").write_bytes(bytes(blob))
    with pytest.raises(ProgramFileError, match="checksum mismatch"):
        Program.load(tmp_path / "bad.tsp")
    with pytest.raises(ProgramFileError, match="bad magic"):
        Program.from_bytes(b"hello world, not a program")
    assert Program.from_bytes(p.to_bytes()) == p


def test_program_config_mismatch():
    from tessera.sim import Simulator
    with pytest.raises(ProgramError, match="built for config 'tiny'"):
        Simulator(PRESETS["pynq"]).run(_program(Finish()))


def test_every_error_is_a_tessera_error():
    for cls in (BoundsError, DeadlockError, HazardError, MissingFinishError, ProgramFileError):
        assert issubclass(cls, TesseraError)
