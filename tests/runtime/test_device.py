"""The Device API on every backend: buffers, runs, the DMA firewall, errors and timeouts.

Each test is written once and runs on ``sim``, ``rtl`` and ``pynq`` (the pynq
driver on the simulated board, RTL-backed). Expected values come from numpy or
from the simulator run directly (``tessera.sim.simulate``), never from the
device under test.
"""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from tessera.config import PRESETS
from tessera.errors import (DeviceError, DeviceTimeoutError, FirewallError,
                            MalformedInstructionError, MissingFinishError)
from tessera.isa import Finish, Gemm, Load, MemType, Program, Store, Uop, get_isa
from tessera.kernels.gemm import gemm_program, read_result
from tessera.regmap import ErrorCode
from tessera.runtime import open_device, relocate
from tessera.runtime.memory import PAGE_BYTES
from tessera.sim import simulate

from tests.programs import CONTENTION_TOLERANCE
from tests.rtl import open_backend

TINY = PRESETS["tiny"]
ISA = get_isa(TINY)


@pytest.fixture(scope="module", params=["sim", "rtl", "pynq"])
def device(request):
    dev = open_backend(request.param, TINY)
    yield dev
    dev.close()


@pytest.fixture
def dev(device):
    """The module's device, powered up afresh, with no buffers left from the last test."""
    device.reset()
    for buf in device.buffers:
        buf.free()
    return device


def gemm_case(m=8, n=8, k=8, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (n, k)).astype(np.int8)   # C = A @ B.T
    return a, b, gemm_program(TINY, a, b, epilogue=[("SHR", 7)])


def numpy_gemm_shr(a, b, shift):
    acc = a.astype(np.int64) @ b.astype(np.int64).T
    return np.clip(acc >> shift, -128, 127).astype(np.int8)


# ------------------------------------------------------------------ buffers
def test_buffers_are_page_aligned_disjoint_and_round_trip(dev):
    bufs = [dev.allocate(n, f"b{i}") for i, n in enumerate((1, 4096, 5000, 0))]
    for b in bufs:
        assert b.address % PAGE_BYTES == 0 and b.address > 0
    spans = sorted((b.address, b.address + max(b.size, 1)) for b in bufs)
    assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:]))
    data = np.arange(5000, dtype=np.uint8) * 7
    bufs[2].write(data)
    bufs[2].write(np.array([1, 2, 3], np.int16), offset=10)
    expected = data.copy()
    expected[10:16] = np.array([1, 2, 3], np.int16).view(np.uint8)
    assert np.array_equal(bufs[2].read(), expected)
    assert np.array_equal(bufs[2].read(np.int16, (3,), offset=10), [1, 2, 3])
    assert dev.counters()["live_buffers"] == 4
    bufs[0].free()
    bufs[0].free()                                    # idempotent
    assert dev.counters()["live_buffers"] == 3


def test_buffer_misuse_is_a_clear_error(dev):
    buf = dev.allocate(16, "small")
    with pytest.raises(DeviceError, match=r"cannot write bytes \[10, 26\) of buffer 'small', "
                                          r"which is 16 bytes long"):
        buf.write(np.zeros(16, np.uint8), offset=10)
    with pytest.raises(DeviceError, match="cannot read"):
        buf.read(np.int32, (5,))
    with pytest.raises(DeviceError, match="must not be negative"):
        dev.allocate(-1)
    buf.free()
    with pytest.raises(DeviceError, match="'small' was freed"):
        buf.read()


# --------------------------------------------------------------------- runs
def test_run_program_matches_numpy_and_the_simulator(dev):
    a, b, program = gemm_case(16, 8, 24)
    result = dev.run(program)
    sim = simulate(program)
    assert np.array_equal(read_result(TINY, result.dram, program, 16, 8),
                          numpy_gemm_shr(a, b, 7))
    assert np.array_equal(result.dram, sim.dram[:program.insn_addr])
    assert result.backend == dev.backend
    tolerance = CONTENTION_TOLERANCE * sim.stats.cycles if sim.stats.dram_contended else 0
    assert abs(result.cycles - sim.stats.cycles) <= tolerance
    counters = dev.counters()
    assert counters["last_cycles"] == result.cycles and counters["live_buffers"] == 0


def test_progress_reports_count_up_to_the_final_cycles(dev):
    _, _, program = gemm_case(64, 64, 64)
    seen = []
    result = dev.run(program, progress=seen.append)
    assert seen == sorted(seen) and all(0 <= c <= result.cycles for c in seen)


def test_cycles_hold_while_a_finished_run_copies_out(monkeypatch):
    """The simulator's live count drops to 0 when it returns; CYCLES holds the count until
    STATUS is DONE (a poll in that window once reported 0 after 27,714)."""
    from tessera.sim import registers

    returned, release = threading.Event(), threading.Event()
    simulator_run = registers.Simulator.run

    def run_then_hold(self, program):
        result = simulator_run(self, program)
        returned.set()
        release.wait(10)
        return result

    def report(cycles):
        seen.append(cycles)
        if returned.is_set():
            # The poll after the one that saw the simulator return read CYCLES inside
            # the window: let the run end.
            if polls_after_return:
                release.set()
            polls_after_return.append(cycles)

    monkeypatch.setattr(registers.Simulator, "run", run_then_hold)
    seen, polls_after_return = [], []
    _, _, program = gemm_case(16, 8, 24)
    with open_device("sim", TINY) as sim_dev:
        result = sim_dev.run(program, progress=report)
    assert release.is_set()
    assert seen[-1] == result.cycles == simulate(program).stats.cycles


def test_a_loaded_program_runs_again_writing_only_new_inputs(dev):
    a, b, program = gemm_case(16, 8, 24, seed=1)
    a2 = np.random.default_rng(2).integers(-128, 128, a.shape).astype(np.int8)
    new_a = gemm_program(TINY, a2, b, epilogue=[("SHR", 7)]).segment("a").data
    with dev.load(program) as loaded:
        assert loaded.live and dev.counters()["live_buffers"] == len(program.segments) + 1
        first = loaded.run(read=["c"])
        assert np.array_equal(read_result(TINY, first.dram, program, 16, 8),
                              numpy_gemm_shr(a, b, 7))
        before = dev.counters()
        second = loaded.run({"a": new_a}, read=["c"])
        assert np.array_equal(read_result(TINY, second.dram, program, 16, 8),
                              numpy_gemm_shr(a2, b, 7))
        assert dev.counters()["host_bytes_written"] - before["host_bytes_written"] == new_a.size
        assert not second.dram[program.segment("b").addr:program.segment("b").end].any()
        with pytest.raises(DeviceError, match=r"segment 'a' is \d+ bytes; 3 bytes were given"):
            loaded.run({"a": new_a[:3]})
        with pytest.raises(DeviceError, match="no segment 'weights'; its segments are uops, a"):
            loaded.run(read=["weights"])
    assert not loaded.live and dev.counters()["live_buffers"] == 0
    with pytest.raises(DeviceError, match="buffers were freed .* load it again"):
        loaded.run()


def test_launch_and_wait_on_buffers_the_caller_placed(dev):
    """The low-level path: the caller allocates, relocates, launches and reads back."""
    a, b, program = gemm_case(seed=3)
    bufs = {s.name: dev.allocate(s.size, s.name) for s in program.segments}
    for s in program.segments:
        bufs[s.name].write(s.data)
    insns = relocate(program, {n: buf.address for n, buf in bufs.items()})
    stream = dev.allocate(len(insns) * 16, "stream")
    stream.write(ISA.encode_program(insns))
    dev.launch(stream, buffers=list(bufs.values()))
    assert dev.busy
    with pytest.raises(DeviceError, match="already in progress"):
        dev.launch(stream, buffers=list(bufs.values()))
    done = dev.wait()
    assert not dev.busy and done.instructions == len(insns) and done.cycles > 0
    seg = program.segment("c")
    got = bufs["c"].read()
    sim = simulate(program)
    assert np.array_equal(got, sim.dram[seg.addr:seg.end])
    with pytest.raises(DeviceError, match="nothing to wait for"):
        dev.wait()


def test_program_for_another_config_is_refused(dev):
    program = gemm_program(PRESETS["pynq"], np.zeros((16, 16), np.int8), np.zeros((16, 16), np.int8))
    with pytest.raises(DeviceError, match="built for config 'pynq', this device runs 'tiny'"):
        dev.run(program)


# ----------------------------------------------------------------- firewall
def _launch_raw(dev, insns, buffers):
    stream = dev.allocate(len(insns) * 16, "stream")
    stream.write(ISA.encode_program(insns))
    dev.launch(stream, buffers=buffers)


def _out_store(buf_address, x_size=1, offset=0):
    eb = ISA.elem_bytes(MemType.OUT)
    return Store(mem=MemType.OUT, dram_base=buf_address // eb + offset, y_size=1,
                 x_size=x_size, x_stride=x_size, pop_prev=True, push_prev=True)


def _store_program(store):
    """A reset GEMM, then ``store`` of its row, then FINISH (tokens in order)."""
    return [Gemm(reset=True, uop_end=0, push_next=True), store, Finish(pop_next=True)]


def _assert_nothing_ran(dev, sentinel_bufs):
    assert not dev.busy and dev.counters()["runs"] == 0
    assert not dev.status()["running"]
    for buf, data in sentinel_bufs:
        assert np.array_equal(buf.read(), data)


@pytest.fixture
def fresh(dev):
    """The device with its run counter at zero (a new device per test is too slow on RTL)."""
    dev._runs = 0
    return dev


def test_firewall_refuses_a_load_outside_every_buffer(fresh):
    dev = fresh
    out = dev.allocate(4096, "out")
    sentinel = np.full(4096, 0x5A, np.uint8)
    out.write(sentinel)
    eb = ISA.elem_bytes(MemType.WGT)
    far = (out.address + (64 << 20)) // eb           # 64 MiB past the buffer: no buffer there
    insns = [Load(mem=MemType.WGT, dram_base=far, y_size=1, x_size=2, x_stride=2),
             Finish()]
    with pytest.raises(FirewallError, match=r"LOAD wgt reads DRAM bytes .* not inside one "
                                            r"buffer of this run.*\(instruction 0, LOAD wgt\)"):
        _launch_raw(dev, insns, [out])
    _assert_nothing_ran(dev, [(out, sentinel)])


def test_firewall_refuses_a_store_one_element_past_its_buffer(fresh):
    dev = fresh
    eb = ISA.elem_bytes(MemType.OUT)
    out = dev.allocate(4 * eb, "out")
    neighbour = dev.allocate(4096, "neighbour")
    zeros = np.zeros(4096, np.uint8)
    neighbour.write(zeros)
    out.write(np.zeros(4 * eb, np.uint8))
    with pytest.raises(FirewallError, match=r"STORE out writes .*\(instruction 1, STORE out\)"):
        _launch_raw(dev, _store_program(_out_store(out.address, x_size=5)), [out, neighbour])
    _assert_nothing_ran(dev, [(neighbour, zeros)])
    # The same store, 4 elements long, fits and runs.
    _launch_raw(dev, _store_program(_out_store(out.address, x_size=4)), [out])
    dev.wait()


def test_firewall_refuses_a_buffer_not_given_to_the_run(fresh):
    """A live buffer of the device that the launch did not list is off limits."""
    dev = fresh
    mine = dev.allocate(4096, "mine")
    other = dev.allocate(4096, "other")
    with pytest.raises(FirewallError, match="buffers: mine"):
        _launch_raw(dev, _store_program(_out_store(other.address)), [mine])
    _assert_nothing_ran(dev, [])


def test_firewall_refuses_malformed_and_unfinished_streams(fresh):
    dev = fresh
    buf = dev.allocate(4096, "x")
    load_out = Load(mem=MemType.OUT, dram_base=buf.address // ISA.elem_bytes(MemType.OUT),
                    y_size=1, x_size=1, x_stride=1)
    with pytest.raises(MalformedInstructionError, match=r"instruction 0, LOAD out"):
        _launch_raw(dev, [load_out, Finish()], [buf])
    with pytest.raises(MissingFinishError, match="no FINISH"):
        _launch_raw(dev, [Gemm(reset=True, uop_end=0)], [buf])
    stream = dev.allocate(32, "short")
    with pytest.raises(DeviceError, match="3 instructions need 48 bytes"):
        dev.launch(stream, 3)
    _assert_nothing_ran(dev, [])


def test_a_relaunched_stream_is_checked_again_once_anything_changed(fresh, monkeypatch):
    """An unchanged stream with the same buffers keeps its verdict (decoding and checking
    a model's stream each run takes long); a write to the stream or other buffers, or a
    stream the run itself may write, is checked afresh."""
    import tessera.runtime.device as device_module

    checks = []
    check = device_module.check_launch
    monkeypatch.setattr(device_module, "check_launch",
                        lambda *a, **k: (checks.append(1), check(*a, **k))[1])
    dev = fresh
    out = dev.allocate(4096, "out")
    other = dev.allocate(4096, "other")
    good = _store_program(_out_store(out.address))
    stream = dev.allocate(len(good) * 16, "stream")
    stream.write(ISA.encode_program(good))
    for _ in range(2):
        dev.launch(stream, buffers=[out])
        dev.wait()
    assert len(checks) == 1
    with pytest.raises(FirewallError, match="buffers: other"):
        dev.launch(stream, buffers=[other])             # other buffers: checked again
    stream.write(ISA.encode_program(_store_program(_out_store(other.address))))
    with pytest.raises(FirewallError, match="buffers: out"):
        dev.launch(stream, buffers=[out])               # rewritten: checked again
    stream.write(ISA.encode_program(good))
    for _ in range(2):
        dev.launch(stream)                              # every live buffer, the stream too
        dev.wait()
    assert len(checks) == 5 and dev.counters()["runs"] == 4


def test_relocation_refuses_a_dma_outside_the_program_segments():
    p = Program(TINY)
    p.add_segment("x", 4096)
    p.emit(Load(mem=MemType.INP, dram_base=(1 << 20), y_size=1, x_size=1, x_stride=1), Finish())
    with pytest.raises(FirewallError, match="not inside one segment of the program"):
        relocate(p, {"x": 1 << 16})


# ------------------------------------------------------------------- errors
def test_a_run_the_accelerator_stops_raises_with_code_and_instruction(dev):
    """An SRAM overrun passes the firewall (DRAM ranges are fine) and is stopped by the
    accelerator: every backend reports SRAM_BOUNDS at instruction 0."""
    p = Program(TINY)
    p.add_segment("x", 4096)
    eb = ISA.elem_bytes(MemType.INP)
    p.emit(Load(mem=MemType.INP, sram_base=TINY.inp_depth - 4, dram_base=p.elem_addr("x", MemType.INP),
                y_size=1, x_size=9, x_stride=9, push_next=True), Finish(pop_prev=True))
    assert 9 * eb <= 4096
    with pytest.raises(DeviceError, match=r"SRAM_BOUNDS .*instruction 0, LOAD inp") as info:
        dev.run(p)
    assert (info.value.code, info.value.index) == (ErrorCode.SRAM_BOUNDS, 0)
    # The device runs the next program normally.
    a, b, program = gemm_case(seed=5)
    assert np.array_equal(read_result(TINY, dev.run(program).dram, program, 8, 8),
                          numpy_gemm_shr(a, b, 7))


def _deadlock_program():
    """A GEMM that waits for a token the load module never sends."""
    p = Program(TINY)
    p.add_uops("u", [Uop()])
    p.emit(Gemm(reset=True, uop_end=1, pop_prev=True), Finish())
    return p


def test_a_deadlocked_run_times_out_or_is_diagnosed(dev):
    program = _deadlock_program()
    if dev.backend == "sim":
        # The simulator sees the deadlock at once and says so through the error registers.
        with pytest.raises(DeviceError, match="SIMULATOR") as info:
            dev.run(program)
        assert info.value.code == ErrorCode.SIMULATOR
        assert "deadlock" in str(info.value).lower()
    else:
        with pytest.raises(DeviceTimeoutError, match="did not finish within 0.5 s"):
            dev.run(program, timeout=0.5)
        assert dev.busy
        dev.reset()
        assert not dev.busy


# ---------------------------------------------------------------- lifecycle
def test_closed_device_refuses_work():
    dev = open_device("sim", TINY)
    buf = dev.allocate(100)
    dev.close()
    assert not buf.live
    with pytest.raises(DeviceError, match="closed"):
        dev.allocate(1)
    dev.close()


def test_pynq_backend_without_a_bitstream_says_what_is_missing():
    with pytest.raises(DeviceError, match="needs the bitstream to load"):
        open_device("pynq", TINY)


def test_unknown_backend_and_config():
    with pytest.raises(DeviceError, match="unknown backend 'fpga': choose one of sim, rtl, pynq"):
        open_device("fpga")
    with pytest.raises(Exception, match="unknown config 'nope'"):
        open_device("sim", "nope")


def test_importing_the_runtime_loads_no_board_or_hardware_packages():
    code = ("import sys, tessera.runtime, tessera.runtime.device; "
            "print(sorted(m for m in ('pynq', 'amaranth', 'llvmlite') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
