"""The pynq backend on the simulated PYNQ board, the .hwh it reads and the board facts.

The RTL-backed board (config ``tiny``) is built once for the module and shares the
Verilator build of ``tiny`` with the other RTL tests; the simulator-backed boards are
cheap and made per test.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

pynq = pytest.importorskip("pynq")

from pynq.pl_server.hwh_parser import _HWHUltrascale, _HWHZynq
from pynqmetadata.frontends import Metadata
from pynqmetadata.views.runtime import RuntimeMetadataParser

from tessera.boards import BOARDS, get_board
from tessera.config import PRESETS
from tessera.errors import ConfigError, DeviceError, DeviceTimeoutError
from tessera.hwh import IP_INSTANCE, IP_VLNV, hwh_xml
from tessera.isa import Finish, Load, MemType, Program
from tessera.kernels.gemm import gemm_program
from tessera.regmap import REG, REGISTERS, VERSION, ErrorCode, config_id
from tessera.runtime import open_device
from tessera.runtime.pynq_device import PynqDevice
from tessera.runtime.pynq_sim import open_simulated_pynq, simulated_board
from tessera.sim import simulate

from tests.programs import CONTENTION_TOLERANCE

TINY = PRESETS["tiny"]
_LEGACY_PARSERS = {"processing_system7": _HWHZynq, "zynq_ultra_ps_e": _HWHUltrascale}


@pytest.fixture(scope="module")
def rtl_board(tmp_path_factory):
    """A PYNQ-Z2 whose FPGA holds ``tiny``'s RTL (the Verilator model)."""
    pytest.importorskip("amaranth")
    with simulated_board(TINY, directory=tmp_path_factory.mktemp("rtl-board")) as board:
        yield board


def gemm(config, m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k))
    b = rng.integers(-128, 128, (n, k))
    return gemm_program(config, a, b, epilogue=[("SHR", 6), ("MAX", 0)])


def deadlock(config):
    """A compute instruction that pops a token nobody pushes, then FINISH."""
    program = Program(config)
    program.add_segment("x", 64)
    program.emit(Load(mem=MemType.ACC, x_size=0, pop_prev=True), Finish())
    return program


def assert_matches_simulator(result, program):
    sim = simulate(program)
    np.testing.assert_array_equal(result.dram, sim.dram[:program.insn_addr])
    if sim.stats.dram_contended:
        assert abs(result.cycles - sim.stats.cycles) <= CONTENTION_TOLERANCE * sim.stats.cycles
    else:
        assert result.cycles == sim.stats.cycles


def active_device():
    """pynq's active device, read without making pynq probe for one."""
    return vars(pynq.Device).get("_active_device")


# ------------------------------------------------------------------ .hwh and boards
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_hwh_gives_our_ip_at_the_board_address(name, tmp_path):
    board = BOARDS[name]
    config = PRESETS[board.preset]
    path = tmp_path / "design.hwh"
    path.write_text(hwh_xml(config, board))

    parser = RuntimeMetadataParser(Metadata(input=str(path)))
    ip = parser.ip_dict[IP_INSTANCE]
    assert ip["type"] == IP_VLNV
    assert (ip["phys_addr"], ip["addr_range"]) == (board.registers.base, board.registers.size)
    assert ip["parameters"]["CONFIG_ID"] == f"{config_id(config):#010x}"
    assert {r: v["address_offset"] for r, v in ip["registers"].items()} == \
        {r.name: r.offset for r in REGISTERS}
    clock = board.pl_clock(config.clock_mhz)
    assert parser.clock_dict[0]["enable"] == 1
    assert parser.clock_dict[0]["frequency"] == pytest.approx(clock.mhz)

    legacy = _LEGACY_PARSERS[board.ps.module](hwh_data=path.read_text())
    ip = legacy.ip_dict[IP_INSTANCE]
    assert (ip["type"], ip["phys_addr"], ip["addr_range"]) == \
        (IP_VLNV, board.registers.base, board.registers.size)
    assert (legacy.clock_dict[0]["divisor0"], legacy.clock_dict[0]["divisor1"]) == \
        (clock.divisor0, clock.divisor1)
    assert f"{IP_INSTANCE}/interrupt" in legacy.interrupt_pins


def test_board_facts():
    for board in BOARDS.values():
        assert board.registers.base in board.ps.master_window
        assert board.registers.high in board.ps.master_window
        board.check(PRESETS[board.preset])
    assert get_board("pynq-z2").pl_clock(100.0).mhz == 100.0
    get_board("pynq-z1").check(TINY)
    with pytest.raises(ConfigError, match="part"):
        hwh_xml(PRESETS["zcu104"], "pynq-z2")
    with pytest.raises(ConfigError, match="HP ports"):
        get_board("pynq-z2").check(PRESETS["pynq"].replace(bus_bytes=16))
    with pytest.raises(ConfigError, match="unknown board"):
        get_board("zedboard")


def test_zcu104_load_module_reads_over_hp1_and_hpc0():
    """The zcu104 preset's fifth DRAM port is the PS's HPC0 (its slave GP0), with its own
    DDR segment; a board refuses a port it has no slave for."""
    board, config = get_board("zcu104"), PRESETS["zcu104"]
    assert [board.slave(p).name for p in config.ports_of("load")] == \
        ["S_AXI_HP1_FPD", "S_AXI_HPC0_FPD"]
    assert (board.slave_segment(1), board.slave_segment(4)) == ("HP1_DDR_LOW", "HPC0_DDR_LOW")
    assert get_board("pynq-z1").slave_segment(2) == "HP2_DDR_LOWOCM"
    with pytest.raises(ConfigError, match="uses DRAM port 6, board zcu104 has 6 slave ports"):
        board.check(config.replace(dram_ports=7, module_ports=(0, (1, 6), 2, 3)))
    with pytest.raises(ConfigError, match="uses DRAM port 4, board pynq-z2 has 4 slave ports"):
        get_board("pynq-z2").check(PRESETS["pynq"].replace(dram_ports=5,
                                                           module_ports=(0, (1, 4), 2, 3)))


# ----------------------------------------------------------------- simulated board
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_overlay_on_simulated_board(name):
    board_facts = BOARDS[name]
    config = PRESETS[board_facts.preset]
    before = active_device()
    with simulated_board(config, board=name, model="sim") as board:
        assert active_device() is board
        assert "placeholder" in board.bitstream.read_text()
        overlay = pynq.Overlay(str(board.bitstream))
        ip = overlay.ip_dict[IP_INSTANCE]
        assert (ip["type"], ip["phys_addr"]) == (IP_VLNV, board_facts.registers.base)
        assert pynq.ps.Clocks.fclk0_mhz == pytest.approx(board_facts.pl_clock(
            config.clock_mhz).mhz)
        mmio = pynq.MMIO(ip["phys_addr"], ip["addr_range"])
        assert mmio.read(REG["VERSION"]) == VERSION
        buf = pynq.allocate(shape=(100,), dtype=np.uint8)
        assert buf.device_address % 4096 == 0
        buf.freebuffer()
        assert board.allocator.used == 0
    assert active_device() is before


def test_run_on_rtl_board(rtl_board):
    program = gemm(TINY, 8, 8, 16)
    with open_device("pynq", TINY, bitstream=rtl_board.bitstream) as dev:
        assert isinstance(dev, PynqDevice)
        assert_matches_simulator(dev.run(program), program)


def test_run_on_sim_board():
    config = PRESETS["pynq"]
    program = gemm(config, 16, 32, 64)
    with open_simulated_pynq(config, model="sim") as dev:
        assert_matches_simulator(dev.run(program), program)
        board = dev.board
    assert board.allocator.used == 0


def test_bitstream_for_another_config_is_refused(rtl_board):
    tiny_b2 = TINY.replace(batch=2, name="tiny-b2")
    with pytest.raises(DeviceError, match="CONFIG_ID .* 'tiny-b2'"):
        PynqDevice(tiny_b2, bitstream=rtl_board.bitstream)


def test_missing_files(tmp_path):
    missing = tmp_path / "nowhere.bit"
    with pytest.raises(DeviceError, match=f"bitstream {missing} does not exist"):
        PynqDevice(TINY, bitstream=missing)
    lonely = tmp_path / "lonely.bit"
    lonely.write_text("no .hwh beside me")
    with pytest.raises(DeviceError, match="no hardware handoff .*lonely.hwh"):
        PynqDevice(TINY, bitstream=lonely)


def test_ip_missing_from_hwh(tmp_path):
    with simulated_board(TINY, model="sim", directory=tmp_path / "board") as board:
        other = tmp_path / "other.bit"
        shutil.copy(board.bitstream, other)
        hwh = board.bitstream.with_suffix(".hwh").read_text()
        other.with_suffix(".hwh").write_text(hwh.replace(IP_VLNV, "acme.com:ip:other:1.0"))
        with pytest.raises(DeviceError, match="no Tessera accelerator.*tessera_0 "
                                              r"\(acme.com:ip:other:1.0\)"):
            PynqDevice(TINY, bitstream=other)
        with pytest.raises(DeviceError, match="no IP named 'accel'.*processing_system7_0"):
            PynqDevice(TINY, bitstream=other, ip_name="accel")
        with PynqDevice(TINY, bitstream=other, ip_name=IP_INSTANCE) as dev:
            assert dev.status() == {"done": False, "error": False, "running": False}


def test_deadlock_times_out_on_rtl_board(rtl_board):
    with PynqDevice(TINY, bitstream=rtl_board.bitstream) as dev:
        with pytest.raises(DeviceTimeoutError, match="did not finish within 0.3 s"):
            dev.run(deadlock(TINY), timeout=0.3)
        assert dev.status()["running"]
        assert len(dev.buffers) == 2            # the hung run keeps its buffers
        dev.reset()
        assert not dev.status()["running"]
        program = gemm(TINY, 4, 4, 8, seed=1)
        assert_matches_simulator(dev.run(program), program)
        assert rtl_board.allocator.used > 0
    assert rtl_board.allocator.used == 0       # close() freed them


def test_deadlock_reported_by_simulator_model():
    config = PRESETS["pynq"]
    with open_simulated_pynq(config, model="sim") as dev:
        with pytest.raises(DeviceError, match="SIMULATOR") as info:
            dev.run(deadlock(config))
        assert (info.value.code, info.value.index) == (ErrorCode.SIMULATOR, 0)


def test_imports_stay_light():
    checks = {
        "import tessera.runtime, tessera.runtime.pynq_device": ("pynq",),
        "import tessera.boards, tessera.hwh": ("pynq", "amaranth"),
    }
    for code, heavy in checks.items():
        probe = f"{code}; import sys; print([m for m in {heavy!r} if m in sys.modules])"
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True).stdout
        assert out.strip() == "[]", (code, out)
