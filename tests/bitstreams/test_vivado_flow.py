"""The Vivado board flow (tessera.bitstreams.flow), run under tclsh against the recording stand-in.

There is no Vivado here: ``dry_run`` executes the generated Tcl with every Vivado command
defined by ``bitstreams/vivado_standin.tcl``, which checks options, models IP packaging from the
Verilog's ports, block-design objects and runs, and records what the flow asked for.

Exporting the Verilog of the ``pynq`` and ``zcu104`` presets takes minutes, so the
per-board projects get a Verilog with exactly the export's ports (from the same
``hw.export`` top, without elaborating the design); one test packages a real export of
a small config (about 5 s).
"""
from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from tessera.boards import get_board
from tessera.config import PRESETS
from tessera.errors import ConfigError, HardwareToolError, TesseraError
from tessera.bitstreams import standin
from tessera.hw.synth import export
from tessera.bitstreams.flow import FlowRecord, dry_run, flow_tcl, write_project
from tessera.bitstreams.plan import PS_FLOW
from tessera.hwh import CONTROL_INTERFACE, IP_INSTANCE, IP_VLNV, hwh_xml
from tessera.kernels.gemm import gemm_program
from tessera.regmap import axi_ports, describe
from tessera.sim import simulate

#: Each board with the config the issue builds for it.
FLOWS = [("pynq-z1", "pynq"), ("pynq-z2", "pynq"), ("zcu104", "zcu104")]


def port_verilog(config) -> str:
    """A ``tessera_top`` with the ports of ``hw.export``'s, and nothing inside."""
    top = export._Top(config)
    top._MustUse__used = top.core._MustUse__used = True     # only its ports are wanted
    outputs = {id(port) for port, _, is_output in top.flat if is_output}
    lines = [f"module {export.TOP_NAME}({', '.join(p.name for p in top.ports)});"]
    for port in top.ports:
        width = f"[{len(port) - 1}:0] " if len(port) > 1 else ""
        lines.append(f"  {'output' if id(port) in outputs else 'input'} {width}{port.name};")
    return "\n".join(lines + ["endmodule", ""])


def interfaces_of(config) -> tuple[set[str], set[str]]:
    """The pins and AXI interfaces a packaged tessera_top has (from tessera.regmap)."""
    ports = describe(config)
    pins = {ports["clock"]["port"], ports["reset"]["port"], ports["interrupt"]["port"]}
    return pins, {CONTROL_INTERFACE} | {p.name for p in axi_ports(config)}


@pytest.fixture(scope="module", params=FLOWS, ids=[board for board, _ in FLOWS])
def flow(request, tmp_path_factory):
    """(board, config, project, record) of a dry run of the board's flow."""
    name, preset = request.param
    config = PRESETS[preset]
    directory = tmp_path_factory.mktemp(f"vivado-{name}")
    verilog = directory / "ports.v"
    verilog.write_text(port_verilog(config))
    project = write_project(name, preset, directory / "project", verilog=verilog)
    return get_board(name), config, project, dry_run(project)


# ------------------------------------------------------------------- the block design
def test_project_for_the_board(flow):
    board, _, _, record = flow
    assert (record.part, record.board_part) == (board.part, board.board_part)
    rule, cell, config = record.automations[0]
    assert (rule, cell) == (f"xilinx.com:bd_rule:{board.ps.module}", board.ps.instance)
    assert 'apply_board_preset "1"' in config
    assert record.cells[board.ps.instance].vlnv == board.ps.vlnv
    assert record.validated


def test_every_port_of_our_ip_is_connected(flow):
    board, config, _, record = flow
    ps = board.ps
    assert record.cells[IP_INSTANCE].vlnv == IP_VLNV
    core = record.cores[IP_VLNV]
    pins, interfaces = interfaces_of(config)
    assert (set(core.pins), set(core.interfaces)) == (pins, interfaces)
    assert record.unconnected_ports() == []
    assert "reset_aclk/peripheral_aresetn" in record.net_of(f"{IP_INSTANCE}/aresetn")
    assert record.net_of(f"{IP_INSTANCE}/interrupt") == {f"{IP_INSTANCE}/interrupt",
                                                         f"{ps.instance}/{ps.irq}"}
    assert f"{ps.instance}/{ps.fclk_reset}" in record.net_of("reset_aclk/ext_reset_in")


def test_masters_reach_their_hp_ports_and_the_ddr(flow):
    board, config, _, record = flow
    ps = board.ps
    props = record.properties(ps.instance)
    for port in axi_ports(config):
        slave = board.slave(port.index)
        assert record.endpoints(IP_INSTANCE, port.name) == [f"{ps.instance}/{slave.name}"]
        address = record.address_of(IP_INSTANCE, port.name)
        assert (address.offset, address.range) == (board.dram.base, board.dram.size)
        assert address.segment.startswith(f"{ps.instance}/")
        assert address.segment.endswith("/" + board.slave_segment(port.index))
        assert props[f"CONFIG.{slave.enable}"] == "1"
        assert props[f"CONFIG.{slave.width}"] == str(port.data_bits)
    used = {port.index for port in axi_ports(config)}
    for index, slave in enumerate(ps.slaves):
        if index not in used:
            assert props[f"CONFIG.{slave.enable}"] == "0"
    assert set(record.masters()) == ({f"{ps.instance}/Data"}
                                     | {f"{IP_INSTANCE}/{p.name}" for p in axi_ports(config)})


def test_register_window_is_where_the_driver_looks(flow):
    board, _, project, record = flow
    address = record.address_of(IP_INSTANCE, CONTROL_INTERFACE)
    assert address.space == f"{board.ps.instance}/Data"
    assert (address.offset, address.range) == (board.registers.base, board.registers.size)
    assert record.endpoints(IP_INSTANCE, CONTROL_INTERFACE) == \
        [f"{board.ps.instance}/{board.ps.master.name}"]
    # The same window as the .hwh the simulated board and the driver read.
    memrange = ET.parse(project.expected_hwh).find(".//MEMRANGE[@INSTANCE='tessera_0']")
    assert int(memrange.get("BASEVALUE"), 16) == address.offset
    assert int(memrange.get("HIGHVALUE"), 16) == address.offset + address.range - 1


def test_clock_from_the_ps_and_a_wizard_only_where_needed(flow):
    board, config, project, record = flow
    ps, clock = board.ps, board.pl_clock(config.clock_mhz)
    props = record.properties(ps.instance)
    assert float(props[f"CONFIG.{ps.fclk_param}"]) == config.clock_mhz
    divisors = {v for k, v in props.items() if "DIVISOR" in k}
    assert divisors == {str(clock.divisor0), str(clock.divisor1)}
    assert any(v == ps.pll.name for v in props.values())
    wizards = [c for c in record.cells.values() if ":clk_wiz:" in c.vlnv]
    aclk = record.net_of(f"{IP_INSTANCE}/aclk")
    if board.name == "zcu104":        # 1500 MHz / 8 = 187.5 MHz: 6% off 200 MHz
        assert len(wizards) == 1
        wizard = wizards[0]
        assert float(wizard.properties["CONFIG.CLKOUT1_REQUESTED_OUT_FREQ"]) == config.clock_mhz
        assert f"{wizard.name}/clk_out1" in aclk
        assert record.net_of(f"{wizard.name}/clk_in1") == {f"{wizard.name}/clk_in1",
                                                           f"{ps.instance}/{ps.fclk}"}
        assert "Clocking Wizard" in project.tcl.read_text()
    else:
        assert wizards == []
        assert f"{ps.instance}/{ps.fclk}" in aclk
        assert "Clocking Wizard" not in project.tcl.read_text()
    # Every AXI clock pin of the PS our design uses runs on aclk.
    assert sum(1 for pin in aclk if pin.startswith(ps.instance + "/")) == \
        1 + len(axi_ports(config)) + (board.name != "zcu104")


def test_ps_parameters_agree_with_the_hwh(flow):
    board, _, project, record = flow
    module = ET.parse(project.expected_hwh).find(f".//MODULE[@INSTANCE='{board.ps.instance}']")
    hwh = {p.get("NAME"): p.get("VALUE") for p in module.find("PARAMETERS")}
    props = {k.removeprefix("CONFIG."): v for k, v in record.properties(board.ps.instance).items()}
    shared = set(props) & set(hwh)
    assert {board.ps.fclk_param, board.ps.master.enable, *dict(board.ps.irq_enable)} <= shared
    assert sum("DIVISOR" in name for name in shared) == 2
    assert {name: props[name] for name in shared} == {name: hwh[name] for name in shared}


def test_builds_reports_and_outputs(flow):
    _, _, project, record = flow
    assert ("synth_1", "") in record.runs
    assert ("impl_1", "write_bitstream") in record.runs
    waited = [e["args"][0] for e in record.commands if e["cmd"] == "wait_on_run"]
    assert waited == ["synth_1", "impl_1"]
    reports = {cmd: path for cmd, path in record.reports}
    assert set(reports) == {"report_utilization", "report_timing_summary"}
    assert all(path.startswith(f"{project.reports.name}/") for _, path in record.reports)
    copies = {dst: src for src, dst in record.copies}
    bit = project.bitstream.relative_to(project.directory).as_posix()
    hwh = project.hwh.relative_to(project.directory).as_posix()
    assert copies[bit].endswith(".bit") and "impl_1" in copies[bit]
    assert copies[hwh].endswith(".hwh") and "/hw_handoff/" in copies[hwh]
    assert project.bitstream.parent == project.hwh.parent
    assert project.bitstream.stem == project.hwh.stem        # what pynq.Overlay pairs
    assert any(f.endswith("_wrapper.v") for f in record.files_added)
    assert copies["ip/tessera_top"] == "tessera_top.v"        # packaged, not a module reference
    assert "tessera: wrote" in record.stdout
    # Placeholders stay in the dry run's folder.
    assert not project.bitstream.exists() and not (project.directory / "vivado").exists()


def test_write_project_folder(flow):
    board, config, project, _ = flow
    assert project.board == board.name and project.config == config
    assert project.tcl.read_text() == flow_tcl(board.name, config.name)
    assert project.verilog.read_text() == port_verilog(config)
    assert "vivado -mode batch -source build.tcl" in (project.directory / "README.txt").read_text()


# ---------------------------------------------------------------------- the .hwh
def test_expected_hwh_is_tessera_hwh(flow):
    board, config, project, _ = flow
    assert project.expected_hwh.read_bytes() == hwh_xml(config, board).encode()
    root = ET.parse(project.expected_hwh).getroot()
    assert root.find(f".//MODULE[@INSTANCE='{IP_INSTANCE}']").get("VLNV") == IP_VLNV


def test_simulated_board_loads_expected_hwh(flow, tmp_path):
    pytest.importorskip("pynq")
    from tessera.runtime.pynq_device import PynqDevice
    from tessera.runtime.pynq_sim import open_simulated_pynq

    board, config, project, _ = flow
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (8, 2 * config.block_in))
    b = rng.integers(-128, 128, (config.block_out, 2 * config.block_in))
    program = gemm_program(config, a, b, epilogue=[("SHR", 6), ("MAX", 0)])
    # open_simulated_pynq writes its own .bit/.hwh pair and takes no .hwh path: pair its
    # placeholder bitstream with the project's expected .hwh and open that on the board.
    with open_simulated_pynq(config, board=board.name, model="sim") as sim:
        bit = tmp_path / project.bitstream.name
        shutil.copyfile(sim.board.bitstream, bit)
        shutil.copyfile(project.expected_hwh, bit.with_suffix(".hwh"))
        with PynqDevice(config, bitstream=bit) as dev:
            assert (dev.ip["phys_addr"], dev.ip["addr_range"]) == \
                (board.registers.base, board.registers.size)
            result = dev.run(program)
    np.testing.assert_array_equal(result.dram, simulate(program).dram[:program.insn_addr])


# ------------------------------------------------------------------------- errors
def test_config_that_does_not_fit_the_board(tmp_path):
    with pytest.raises(ConfigError, match="targets part xczu7ev.*pynq-z2 has xc7z020"):
        flow_tcl("pynq-z2", "zcu104")
    with pytest.raises(ConfigError, match="part"):
        write_project("pynq-z2", "zcu104", tmp_path / "nope", verilog=tmp_path / "x.v")
    assert not (tmp_path / "nope").exists()
    with pytest.raises(ConfigError, match="HP ports of board pynq-z1 take"):
        flow_tcl("pynq-z1", PRESETS["pynq"].replace(bus_bytes=16))
    with pytest.raises(ConfigError, match="unknown board"):
        flow_tcl("zedboard", "pynq")


def test_tcl_errors_surface_with_the_tcl_message(flow, tmp_path):
    _, _, project, _ = flow
    with pytest.raises(HardwareToolError, match=r"create_project: unknown option -prt .*"
                                                r"\(build.tcl line 2: create_project"):
        dry_run("# a typo\ncreate_project -prt xc7z020clg400-1 demo\n")
    with pytest.raises(HardwareToolError, match="set_property: takes a name, a value"):
        dry_run("create_project demo\nset_property board_part [current_project]\n")
    broken = tmp_path / "broken"
    shutil.copytree(project.directory, broken)
    tcl = broken / "build.tcl"
    tcl.write_text(tcl.read_text().replace(f"{IP_INSTANCE}/aclk]", f"{IP_INSTANCE}/clk]"))
    with pytest.raises(HardwareToolError, match=f"no pin {IP_INSTANCE}/clk "):
        dry_run(broken)
    tcl.write_text(project.tcl.read_text().replace("update_ip_catalog -rebuild", ""))
    with pytest.raises(HardwareToolError, match=f"{IP_VLNV} is not in the IP catalog"):
        dry_run(broken)
    assert issubclass(HardwareToolError, TesseraError)


def test_flow_stops_with_a_clear_message(flow):
    board, config, project, _ = flow
    with pytest.raises(HardwareToolError, match=rf"exit code 1\): timing failed at "
                                                rf"{config.clock_mhz:g} MHz: WNS -0.321 ns"):
        dry_run(project, answers={"STATS.WNS": "-0.321"})
    actual = f"CONFIG.{PS_FLOW[board.ps.module].pl0_actual}"
    with pytest.raises(HardwareToolError, match="PL clock 0 runs at 123.4 MHz"):
        dry_run(project, answers={actual: "123.4"})
    with pytest.raises(HardwareToolError, match=f"board files of {board.board_part}"):
        dry_run(project, answers={"@board_parts": ""})


def test_interpreter(flow, monkeypatch):
    _, _, project, _ = flow
    with pytest.raises(HardwareToolError, match="not found"):
        dry_run(project, tclsh="/nonexistent/tclsh")
    pytest.importorskip("tkinter")
    # No tclsh on the PATH: Python's own Tcl runs the flow.
    monkeypatch.setattr(standin.shutil, "which", lambda name: None)
    record = dry_run(project)
    assert isinstance(record, FlowRecord) and record.unconnected_ports() == []


# ----------------------------------------------------------------- a real export
#: A config small enough to export in seconds, with a 32-bit bus, a port both read and
#: written, and one HP port unused.
MICRO = PRESETS["tiny"].replace(
    name="micro", block_in=2, block_out=2, uop_depth=16, inp_depth=16, wgt_depth=16,
    acc_depth=16, out_depth=16, cmd_queue_depth=2, token_queue_depth=2, loop_bits=4,
    bus_bytes=4, dram_ports=3, module_ports=(0, 1, 2, 2))


def test_real_export_is_packaged_and_connected(tmp_path):
    """A config through hw.export.write: the Verilog Amaranth writes, not a port list."""
    board = get_board("pynq-z1")
    project = write_project(board, MICRO, tmp_path / "micro")
    assert (project.directory / "tessera_top.json").is_file()
    record = dry_run(project)
    pins, interfaces = interfaces_of(MICRO)
    core = record.cores[IP_VLNV]
    assert (set(core.pins), set(core.interfaces)) == (pins, interfaces)
    assert interfaces == {CONTROL_INTERFACE, "m_axi_p0", "m_axi_p1", "m_axi_p2"}
    assert record.unconnected_ports() == []
    props = record.properties(board.ps.instance)
    assert props[f"CONFIG.{board.slave(2).width}"] == "32"
    assert props[f"CONFIG.{board.slave(3).enable}"] == "0"
    assert record.endpoints(IP_INSTANCE, "m_axi_p2") == \
        [f"{board.ps.instance}/{board.slave(2).name}"]
    # The port-list Verilog the other tests use declares the same ports.
    stub = dry_run(write_project(board, MICRO, tmp_path / "stub",
                                 verilog=_write(tmp_path / "ports.v", port_verilog(MICRO))))
    ports = stub.cores[IP_VLNV]
    assert (set(ports.pins), set(ports.interfaces)) == (set(core.pins), set(core.interfaces))


def _write(path, text):
    path.write_text(text)
    return path
