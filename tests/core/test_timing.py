"""Single-instruction durations against the formulas of docs/timing.md, computed by hand here."""
import math

import numpy as np
import pytest

from tessera.config import PRESETS
from tessera.isa import Alu, Finish, Gemm, Load, MemType, Program, Store, Uop
from tessera.sim import simulate

PYNQ = PRESETS["pynq"]
TINY = PRESETS["tiny"]


def _run_one(config, insn, *, uops=(Uop(),), data_bytes=1 << 16):
    """Run ``insn`` alone (after a uop load when it is a GEMM/ALU); return its trace event."""
    p = Program(config)
    p.add_uops("uops", list(uops))
    p.add_segment("data", np.arange(data_bytes, dtype=np.uint8))
    if isinstance(insn, (Gemm, Alu)):
        p.emit(Load(mem=MemType.UOP, dram_base=p.elem_addr("uops", MemType.UOP),
                    x_size=len(uops), x_stride=len(uops)))
    if isinstance(insn, (Load, Store)) and not insn.is_nop:
        insn = insn.replace(dram_base=p.elem_addr("data", insn.mem) + insn.dram_base)
    sync = {"load": dict(push_next=True), "store": dict(push_prev=True)}
    from tessera.isa import module_of
    module = module_of(insn)
    p.emit(insn.replace(**sync.get(module, {})))
    p.emit(Finish(pop_prev=module == "load", pop_next=module == "store"))
    result = simulate(p, trace=True)
    (event,) = [e for e in result.trace if e.index == len(p.instructions) - 2]
    return event, result


@pytest.mark.parametrize("x_size, y_size, stride, dram_off, pads, expected", [
    # pynq inp entry 16 B on an 8-byte bus: 2 beats per element, 16 elements = 32 beats.
    (16, 1, 16, 0, (0, 0, 0, 0), 2 + 32 + 32),
    # 3 rows x 4 elements: 8 beats per row.
    (4, 3, 10, 0, (0, 0, 0, 0), 2 + 32 + 3 * 8),
    # Padding: (1+2+1) x (2+4+1) = 28 entries, 8 of data, 20 cycles of zero fill.
    (4, 2, 4, 0, (1, 1, 2, 1), 2 + 20 + 32 + 2 * 8),
])
def test_load_inp_cycles_pynq(x_size, y_size, stride, dram_off, pads, expected):
    insn = Load(mem=MemType.INP, x_size=x_size, y_size=y_size, x_stride=stride, dram_base=dram_off,
                y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3])
    event, _ = _run_one(PYNQ, insn)
    assert event.end - event.start == expected


def test_small_elements_limited_by_sram_writes():
    # tiny inp entries are 4 bytes: two per 8-byte beat, but one SRAM write per cycle.
    event, _ = _run_one(TINY, Load(mem=MemType.INP, x_size=8, y_size=1, x_stride=8))
    assert event.end - event.start == 2 + TINY.dram_latency + 8


def test_unaligned_uop_rows_cost_an_extra_beat():
    # 3 uops (4 B each) from uop element 1: bytes [4, 16) -> 2 beats, 3 SRAM writes -> 3 cycles.
    event, _ = _run_one(PYNQ, Load(mem=MemType.UOP, dram_base=1, x_size=3, y_size=1, x_stride=3))
    assert event.end - event.start == 2 + 32 + 3
    # 1 uop at element 1: bytes [4, 8) -> 1 beat; 2 uops at element 1: [4, 12) -> 2 beats.
    event, _ = _run_one(PYNQ, Load(mem=MemType.UOP, dram_base=1, x_size=2, y_size=1, x_stride=2))
    assert event.end - event.start == 2 + 32 + 2


def test_store_cycles_and_nop():
    event, _ = _run_one(PYNQ, Store(x_size=4, y_size=2, x_stride=8))
    assert event.end - event.start == 2 + 2 * 8 + 32      # data, then the write response
    event, _ = _run_one(PYNQ, Store(x_size=0, y_size=5))
    assert event.end - event.start == 2


@pytest.mark.parametrize("uops, iter_out, iter_in, reset", [(4, 3, 2, False), (1, 1, 1, False),
                                                            (16, 8, 8, True), (3, 1, 1, False)])
def test_gemm_cycles(uops, iter_out, iter_in, reset):
    n = uops * iter_out * iter_in
    insn = Gemm(reset=reset, uop_end=uops, iter_out=iter_out, iter_in=iter_in, dst_factor_out=uops,
                dst_factor_in=uops * iter_out)
    event, _ = _run_one(PYNQ, insn, uops=[Uop(dst=u) for u in range(uops)])
    assert event.end - event.start == 1 + (n - 1) + 3 + 1


@pytest.mark.parametrize("op, use_imm, ii, latency", [
    # The tensor form writes one cycle later than the immediate form (its second read).
    ("MAX", True, 1, 3), ("MAX", False, 2, 4), ("MUL", True, 1, 4), ("REQUANT", False, 2, 7)])
def test_alu_cycles(op, use_imm, ii, latency):
    from tessera.isa import ALU_OPS
    rows = 8
    insn = Alu(alu_op=ALU_OPS.by_name(op).opcode, use_imm=use_imm, uop_end=1, iter_out=rows,
               dst_factor_out=1, src_factor_out=1)
    uops = [Uop(dst=0, src=rows)]
    event, _ = _run_one(PYNQ, insn, uops=uops)
    assert event.end - event.start == 1 + (rows - 1) * ii + latency + 1


def test_first_instruction_waits_for_fetch():
    # Fetch reads the 2-instruction stream (4 beats) after the latency, dispatches
    # instruction 0 in the next cycle, and it starts one cycle later.
    event, result = _run_one(PYNQ, Load(mem=MemType.INP, x_size=0))
    assert event.start == 32 + 4 + 1
    # FINISH (dispatched meanwhile) pops the load's token as it ends, then takes 1 cycle.
    assert result.stats.cycles == event.end + 1


def test_fetch_reads_in_burst_chunks():
    # pynq: 16 beats x 8 B = 128 B = 8 instructions per chunk.
    p = Program(PYNQ)
    p.emit(*[Store(x_size=0) for _ in range(18)], Store(x_size=0, push_prev=True),
           Finish(pop_next=True))
    result = simulate(p)
    fetch = result.stats.modules["fetch"]
    chunks = [8, 8, 4]
    assert fetch.wait_dram == 32 * len(chunks)
    assert fetch.busy == sum(2 * c for c in chunks) + 20


def test_shared_port_halves_bandwidth():
    """Two long transfers on one shared port take about twice as long as one alone."""
    cfg = PYNQ.replace(name="one-port", dram_ports=1, module_ports=(0, 0, 0, 0))

    def program(both):
        p = Program(cfg)
        p.add_segment("a", np.ones(1 << 16, np.uint8))
        p.add_segment("b", 1 << 16)
        p.emit(Load(mem=MemType.INP, dram_base=p.elem_addr("a", MemType.INP), x_size=2048,
                    x_stride=2048, push_next=True))
        if both:
            p.emit(Store(dram_base=p.elem_addr("b", MemType.OUT), x_size=2048, x_stride=2048))
        p.emit(Finish(pop_prev=True))
        return simulate(p, trace=True)

    alone = program(False).trace[0]
    shared = program(True).trace
    load = next(e for e in shared if e.name == "LOAD inp")
    beats = 2048 * 2
    assert alone.end - alone.start == 2 + 32 + beats
    # Both flows overlap for most of their length at half the rate each.
    assert load.end - load.start > 2 + 32 + 1.8 * beats
    assert load.end - load.start <= 2 + 32 + 2 * beats + 2


def test_ddr_limit_throttles_all_ports():
    cfg = PYNQ.replace(name="slow-ddr", ddr_bytes_per_cycle=4.0)
    p = Program(cfg)
    p.add_segment("a", np.ones(1 << 14, np.uint8))
    p.emit(Load(mem=MemType.INP, dram_base=0, x_size=1024, x_stride=1024, push_next=True),
           Finish(pop_prev=True))
    event = next(e for e in simulate(p, trace=True).trace if e.name == "LOAD inp")
    # 2048 beats of 8 B at 4 B/cycle: twice the port-limited time.
    assert event.end - event.start == 2 + 32 + math.ceil(2048 * 8 / 4)


ZCU104 = PRESETS["zcu104"]


@pytest.mark.parametrize("mem, x_size, y_size, ports", [
    (MemType.WGT, 9, 2, 2),      # 64 beats an entry: 32 on each of the two load ports
    (MemType.INP, 9, 2, 2),      # 2 beats an entry: one on each port, one entry a cycle
    (MemType.ACC8, 9, 2, 1),     # the compute module's: one port
])
def test_load_over_two_ports_streams_twice_the_beats(mem, x_size, y_size, ports):
    """zcu104's load module reads over HP1 and HPC0: a LOAD inp/wgt streams a beat on each
    per cycle (docs/timing.md, "LOAD and STORE"); the simulator takes that time."""
    assert ZCU104.ports_of("load") == (1, 4)
    event, _ = _run_one(ZCU104, Load(mem=mem, x_size=x_size, y_size=y_size, x_stride=x_size))
    beats_per_entry = {MemType.WGT: 64, MemType.INP: 2, MemType.ACC8: 2}[mem]
    data = y_size * max(x_size * beats_per_entry // ports, x_size)
    assert event.end - event.start == 2 + ZCU104.dram_latency + data


def test_one_load_port_config_times_as_before():
    one = ZCU104.replace(name="zcu104-one-load-port", dram_ports=4, module_ports=(0, 1, 2, 3))
    event, _ = _run_one(one, Load(mem=MemType.WGT, x_size=3, y_size=1, x_stride=3))
    assert event.end - event.start == 2 + one.dram_latency + 3 * 64
