"""The whole accelerator: Amaranth-simulator runs, hardware error reporting,
Verilog export and the ``tessera hw`` commands."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tessera import regmap
from tessera.cli import main
from tessera.config import PRESETS
from tessera.errors import BoundsError, MalformedInstructionError
from tessera.isa import (ALU_OPS, Alu, Finish, Gemm, Load, MemType, Program, Store, Uop, get_isa,
                         module_of)
from tessera.isa.program import SEGMENT_ALIGN
from tessera.regmap import ErrorCode
from tessera.sim import simulate

from tests.fuzz_programs import random_program
from tests.programs import TINY_2LOAD, load, out_bytes, single_shot, store

TINY = PRESETS["tiny"]


def _gemm_program(cfg):
    rng = np.random.default_rng(7)
    inp = rng.integers(-128, 128, (4, cfg.batch, cfg.block_in), dtype=np.int8)
    wgt = rng.integers(-128, 128, (2, cfg.block_out, cfg.block_in), dtype=np.int8)
    return single_shot(
        cfg, uops=[Uop(dst=r, src=r, wgt=r % 2) for r in range(4)],
        segments={"inp": inp, "wgt": wgt, "out": out_bytes(cfg, 8)},
        loads=[load("inp", MemType.INP, x_size=2, y_size=2, x_pad_0=1, y_pad_1=1),
               load("wgt", MemType.WGT, x_size=2)],
        compute=[Gemm(reset=True, uop_end=4, iter_out=2, dst_factor_out=4), Gemm(uop_end=4),
                 Alu(alu_op=ALU_OPS.by_name("MAX").opcode, use_imm=True, imm=0, uop_end=4),
                 Alu(alu_op=ALU_OPS.by_name("ADD").opcode, uop_end=4)],
        stores=[store("out", x_size=8)])


# ------------------------------------------------------- Amaranth simulator tier
@pytest.mark.parametrize("cfg", [TINY, TINY_2LOAD], ids=lambda c: c.name)
@pytest.mark.parametrize("name", ["gemm", "random"])
def test_amaranth_simulation_agrees_with_simulator(name, cfg):
    from tessera.hw.harness.amaranth_sim import run_program

    if name == "gemm":
        program = _gemm_program(cfg)
        sim = simulate(program)
    else:
        program, sim = random_program(cfg, seed=3, family="instructions")
    rtl = run_program(program, max_cycles=5000)
    assert rtl.error == ErrorCode.NONE
    assert np.array_equal(rtl.dram, sim.dram)
    assert rtl.cycles == sim.stats.cycles and not sim.stats.dram_contended


# ------------------------------------------------------------ hardware errors
def _run_raw(program, patch: dict[int, int] | None = None, *, reset: bool = True):
    """Run ``program`` on the long-lived RTL model, instruction words replaced as ``patch``
    says; ``reset=False`` starts it right after the last run, without a reset."""
    from tests.rtl import rtl_sim

    sim = rtl_sim(program.config)
    image = program.dram_image().copy()
    for offset, word in (patch or {}).items():
        at = program.insn_addr + 16 * offset
        image[at:at + 16] = np.frombuffer(word.to_bytes(16, "little"), np.uint8)
    if reset:
        sim.reset()
    sim.write_dram(0, image)
    sim.write_reg("INSN_ADDR", program.insn_addr)
    sim.write_reg("INSN_COUNT", len(program.instructions))
    sim.write_reg("CONTROL", regmap.CONTROL_START)
    sim.run_until_interrupt(10_000)
    assert sim.interrupt, "the RTL must stop (done) after an error, not hang"
    status = sim.read_reg("STATUS")
    return status, ErrorCode(sim.read_reg("ERROR_CODE")), sim.read_reg("ERROR_INDEX")



def _with_finish(first, config=TINY):
    """``first`` then a FINISH that waits for it (through a token when it is not compute's)."""
    p = Program(config)
    p.add_segment("x", 256)
    module = module_of(first)
    if module == "load":
        p.emit(first.replace(push_next=True), Finish(pop_prev=True))
    elif module == "store":
        p.emit(first.replace(push_prev=True), Finish(pop_next=True))
    else:
        p.emit(first, Finish())
    return p


def _error_cases():
    x = SEGMENT_ALIGN   # the first segment's address
    inp_eb = get_isa(TINY).elem_bytes(MemType.INP)
    return {
        # A LOAD inp past the end of the 128-entry input buffer.
        "sram bounds": (Load(mem=MemType.INP, sram_base=TINY.inp_depth - 4, dram_base=x // inp_eb,
                             y_size=1, x_size=9, x_stride=9), ErrorCode.SRAM_BOUNDS, BoundsError),
        # A GEMM whose uop range runs past the uop buffer.
        "uop bounds": (Gemm(uop_begin=TINY.uop_depth - 2, uop_end=TINY.uop_depth + 5),
                       ErrorCode.UOP_BOUNDS, BoundsError),
        # A reset GEMM whose loop walks past the accumulator.
        "index bounds": (Gemm(reset=True, uop_end=1, iter_out=3,
                              dst_factor_out=TINY.acc_depth // 2),
                         ErrorCode.INDEX_BOUNDS, BoundsError),
        # A STORE and a LOAD past the simulated DRAM: the DRAM answers SLVERR.
        "dram write response": (Store(mem=MemType.OUT, dram_base=1 << 28, y_size=1, x_size=1,
                                      x_stride=1), ErrorCode.AXI_RESPONSE, BoundsError),
        "dram read response": (Load(mem=MemType.WGT, dram_base=1 << 24, y_size=1, x_size=1,
                                    x_stride=1), ErrorCode.AXI_RESPONSE, BoundsError),
        # An ALU opcode nothing is registered for.
        "alu op": (Alu(alu_op=ALU_OPS.free_opcodes()[0], uop_end=0), ErrorCode.ALU_OP,
                   MalformedInstructionError),
    }


@pytest.mark.parametrize("case", sorted(_error_cases()))
def test_hardware_stops_with_the_error_the_simulator_raises(case):
    insn, code, sim_error = _error_cases()[case]
    program = _with_finish(insn)
    with pytest.raises(sim_error):
        simulate(program)
    status, got, index = _run_raw(program)
    assert status & regmap.STATUS_ERROR and status & regmap.STATUS_DONE
    assert (got, index) == (code, 0)


def _overlapped_pair(failing: str) -> Program:
    """LOAD uop, a reset GEMM on bank 0, an ALU with overlap on bank 1 beside it, FINISH;
    ``failing`` says which of the two fails: the GEMM (its rows run past the accumulator
    after 32 operations, long after the ALU started) or the ALU (an opcode nothing is
    registered for, at its start)."""
    bank = TINY.acc_bank_rows
    p = Program(TINY)
    p.add_uops("uops", [Uop(dst=0), Uop(dst=bank)])
    rows = TINY.acc_depth // 4 + 8 if failing == "gemm" else 8     # rows 0, 4, 8, ...
    gemm = Gemm(reset=True, uop_begin=0, uop_end=1, iter_out=rows, dst_factor_out=4)
    op = ALU_OPS.free_opcodes()[0] if failing == "alu" else ALU_OPS.by_name("MOV").opcode
    alu = Alu(alu_op=op, use_imm=True, imm=1, uop_begin=1, uop_end=2, iter_out=4,
              dst_factor_out=1, overlap=True)
    p.emit(Load(mem=MemType.UOP, dram_base=p.elem_addr("uops", MemType.UOP), y_size=1,
                x_size=2, x_stride=2), gemm, alu, Finish())
    return p


@pytest.mark.parametrize("failing, code, sim_error, index", [
    ("gemm", ErrorCode.INDEX_BOUNDS, BoundsError, 1),
    ("alu", ErrorCode.ALU_OP, MalformedInstructionError, 2)])
def test_error_index_names_the_failing_unit_s_instruction(failing, code, sim_error, index):
    """With two compute units busy, ERROR_INDEX names the instruction that failed, not the
    one started last."""
    program = _overlapped_pair(failing)
    with pytest.raises(sim_error) as info:
        simulate(program)
    assert info.value.index == index
    status, got, got_index = _run_raw(program)
    assert status & regmap.STATUS_ERROR and (got, got_index) == (code, index)


#: A config without the ALU table memory, and the two instructions that need it.
NO_TABLE = TINY.replace(name="tiny-notable", table_entries=0)


@pytest.mark.parametrize("needs_table, code", [("load tbl", ErrorCode.MEM_TYPE),
                                               ("lut", ErrorCode.ALU_OP)])
def test_no_table_memory_refuses_what_needs_it_as_the_simulator_does(needs_table, code):
    """On a config with ``table_entries = 0`` the hardware has neither the table memory nor
    the LUT op: LOAD tbl and LUT stop it with the simulator's error codes (Amaranth's
    simulator: the one program of the config is not worth a Verilator build)."""
    from tessera.hw.harness.amaranth_sim import run_program

    if needs_table == "load tbl":
        insn = Load(mem=MemType.TBL, dram_base=SEGMENT_ALIGN // 4, y_size=1, x_size=1,
                    x_stride=1)
    else:
        insn = Alu(alu_op=ALU_OPS.by_name("LUT").opcode, use_imm=True, uop_end=0)
    program = _with_finish(insn, NO_TABLE)
    with pytest.raises(MalformedInstructionError) as info:
        simulate(program)
    assert info.value.code == code and info.value.index == 0
    rtl = run_program(program, max_cycles=2000)
    assert rtl.status & regmap.STATUS_ERROR and (rtl.error, rtl.error_index) == (code, 0)


def test_overlapped_pair_runs_without_error():
    from tests.rtl import rtl_sim

    program = _overlapped_pair("none")
    sim = simulate(program)
    status, got, _ = _run_raw(program)
    assert got == ErrorCode.NONE and status == regmap.STATUS_DONE
    assert rtl_sim(TINY).read_reg("CYCLES_LO") == sim.stats.cycles


def test_hardware_refuses_a_reserved_opcode():
    word = 6   # opcode 6 is reserved
    with pytest.raises(MalformedInstructionError, match="opcode 6 is reserved"):
        get_isa(TINY).decode(word, index=1)
    program = _with_finish(Gemm(reset=True, uop_end=0))
    status, got, index = _run_raw(program, {0: get_isa(TINY).encode(Gemm(uop_end=0)), 1: word})
    assert status & regmap.STATUS_ERROR and (got, index) == (ErrorCode.OPCODE, 1)


def test_start_after_an_error_runs_cleanly():
    """A start resets the run state: a good program runs right after a failed one."""
    from tests.rtl import rtl_sim

    insn, code, _ = _error_cases()["sram bounds"]
    assert _run_raw(_with_finish(insn))[1] == code
    good = _gemm_program(TINY)
    status, got, _ = _run_raw(good, reset=False)
    assert got == ErrorCode.NONE and status == regmap.STATUS_DONE
    rtl = rtl_sim(TINY)
    sim = simulate(good)
    image = sim.dram
    assert np.array_equal(rtl.read_dram(0, image.size), image)
    assert rtl.read_reg("CYCLES_LO") == sim.stats.cycles


# ------------------------------------------------------------------- export
def test_verilog_export_names_ports_for_vivado(tmp_path):
    assert main(["hw", "verilog", "--config", "tiny", "-o", str(tmp_path)]) == 0
    text = (tmp_path / "tessera_top.v").read_text()
    desc = json.loads((tmp_path / "tessera_top.json").read_text())
    assert "module tessera_top" in text
    for port in ("aclk", "aresetn", "interrupt", "s_axi_control_awaddr", "s_axi_control_rdata",
                 "m_axi_p0_araddr", "m_axi_p0_rdata", "m_axi_p3_wdata", "m_axi_p3_bready"):
        assert f" {port}" in text or f" {port};" in text, port
    assert "m_axi_p0_awaddr" not in text          # fetch's port only reads
    assert desc["top"] == "tessera_top"
    assert desc["config_id"] == f"{regmap.config_id(TINY):#010x}"
    regs = {r["name"]: r["offset"] for r in desc["control"]["registers"]}
    assert regs == regmap.REG
    assert [p["port"] for p in desc["masters"]] == [f"m_axi_p{i}" for i in range(4)]


def test_rtl_reports_its_config_id():
    from tests.rtl import rtl_sim

    sim = rtl_sim(TINY)
    sim.reset()
    assert sim.read_reg("CONFIG_ID") == regmap.config_id(TINY)
    assert sim.read_reg("VERSION") == regmap.VERSION
    sim.write_reg("INSN_COUNT", 1234)
    assert sim.read_reg("INSN_COUNT") == 1234
