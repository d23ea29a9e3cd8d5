"""``tessera hw bitstream``: the project without Vivado, a build with a fake Vivado, the
installed folder and its manifest, failures, and the Vivado report parsers.

The fake ``vivado`` is a Python script put on the PATH: run in batch mode in the project
folder, it prints a log like Vivado's (version line, the flow's commands), writes a
``.bit``, copies the expected ``.hwh`` to where Vivado writes the real one, and writes
utilisation and timing reports in Vivado's text format. ``FAKE_VIVADO`` makes it fail
(``fail``) or miss timing (``timing``).
"""
from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("amaranth")

from tessera.cli import main
from tessera.config import PRESETS, HwConfig
from tessera.errors import ConfigError, HardwareToolError
from tessera.bitstreams import build as hwb
from tessera.bitstreams.build import build_bitstream, install_build
from tessera.bitstreams.reports import parse_timing_summary, parse_utilization, parse_vivado_version
from tessera.bitstreams.flow import write_project
from tessera.progress import Progress
from tessera.regmap import config_id
from tessera.bitstreams import (BIT_NAME, HWH_NAME, MANIFEST_NAME, find_bitstream,
                                        sha256_file)

PYNQ = PRESETS["pynq"]
KEY = f"{config_id(PYNQ):08x}"

UTILIZATION_7SERIES = """\
Copyright 1986-2022 Xilinx, Inc. All Rights Reserved.
-------------------------------------------------------------------------------------
| Tool Version : Vivado v.2023.2 (lin64) Build 4029153 Fri Oct 13 20:13:54 MDT 2023
| Design       : tessera_bd_wrapper
| Device       : 7z020clg400-1
| Design State : Routed
-------------------------------------------------------------------------------------

1. Slice Logic
--------------

+----------------------------+-------+-------+------------+-----------+-------+
|          Site Type         |  Used | Fixed | Prohibited | Available | Util% |
+----------------------------+-------+-------+------------+-----------+-------+
| Slice LUTs                 | 17893 |     0 |          0 |     53200 | 33.63 |
|   LUT as Logic             | 16012 |     0 |          0 |     53200 | 30.10 |
| Slice Registers            | 24310 |     0 |          0 |    106400 | 22.85 |
|   Register as Flip Flop    | 24310 |     0 |          0 |    106400 | 22.85 |
+----------------------------+-------+-------+------------+-----------+-------+

3. Memory
---------

+-------------------+------+-------+------------+-----------+-------+
|     Site Type     | Used | Fixed | Prohibited | Available | Util% |
+-------------------+------+-------+------------+-----------+-------+
| Block RAM Tile    | 98.5 |     0 |          0 |       140 | 70.36 |
|   RAMB36/FIFO*    |   96 |     0 |          0 |       140 | 68.57 |
+-------------------+------+-------+------------+-----------+-------+

4. DSP
------

+----------------+------+-------+------------+-----------+-------+
|    Site Type   | Used | Fixed | Prohibited | Available | Util% |
+----------------+------+-------+------------+-----------+-------+
| DSPs           |  160 |     0 |          0 |       220 | 72.73 |
+----------------+------+-------+------------+-----------+-------+

7. Primitives
-------------

+----------+-------+---------------------+
| Ref Name |  Used | Functional Category |
+----------+-------+---------------------+
| FDRE     | 24000 |        Flop & Latch |
| DSPs     |     9 |        not a summary |
+----------+-------+---------------------+
"""

UTILIZATION_ULTRASCALE = """\
+-------------------------+-------+-------+-----------+-------+
|        Site Type        |  Used | Fixed | Available | Util% |
+-------------------------+-------+-------+-----------+-------+
| CLB LUTs*               | 60000 |     0 |    230400 | 26.04 |
| CLB Registers           | 80000 |     0 |    460800 | 17.36 |
+-------------------------+-------+-------+-----------+-------+
+-------------------+------+-------+-----------+-------+
|     Site Type     | Used | Fixed | Available | Util% |
+-------------------+------+-------+-----------+-------+
| Block RAM Tile    |  200 |     0 |       312 | 64.10 |
| URAM              |   48 |     0 |        96 | 50.00 |
| DSPs              | 1024 |     0 |      1728 | 59.26 |
+-------------------+------+-------+-----------+-------+
"""


def timing_report(wns: float, tns: float, whs: float = 0.021) -> str:
    failing = 0 if wns >= 0 else 12
    verdict = ("All user specified timing constraints are met." if wns >= 0 and whs >= 0
               else "Timing constraints are not met.")
    return textwrap.dedent(f"""\
        ------------------------------------------------------------------------------------
        | Design Timing Summary
        | ---------------------
        ------------------------------------------------------------------------------------

            WNS(ns)      TNS(ns)  TNS Failing Endpoints  TNS Total Endpoints      WHS(ns)      THS(ns)  THS Failing Endpoints  THS Total Endpoints     WPWS(ns)     TPWS(ns)  TPWS Failing Endpoints  TPWS Total Endpoints
            -------      -------  ---------------------  -------------------      -------      -------  ---------------------  -------------------     --------     --------  ----------------------  --------------------
        {wns:11.3f}  {tns:11.3f}  {failing:21d}  {52134:19d}  {whs:11.3f}        0.000                      0                52134        3.750        0.000                       0                 25032


        {verdict}
        """)


# ------------------------------------------------------------------ the fake Vivado
FAKE_VIVADO = r'''#!{python}
"""A stand-in for `vivado -mode batch -source build.tcl`, run in the project folder: the
project flow of tessera.bitstreams.flow (launch_runs synth_1, then impl_1 up to write_bitstream,
whose commands appear only in the runs' runme.log), its reports and its outputs."""
import os, shutil, sys, time
from pathlib import Path

args = sys.argv[1:]
assert args[:2] == ["-mode", "batch"], args
source = Path(args[args.index("-source") + 1])
assert source.is_file(), source
log_name = args[args.index("-log") + 1] if "-log" in args else "vivado.log"
mode = os.environ.get("FAKE_VIVADO", "ok")
log = open(log_name, "w")


def say(*lines, stream=sys.stdout):
    for line in lines:
        print(line, file=stream, flush=True)
        log.write(line + "\n")
        log.flush()


def run(name, *commands):
    folder = Path("vivado", "tessera.runs", name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runme.log").write_text("".join("Command: " + c + "\n" for c in commands))
    time.sleep(0.05)


say("", "****** Vivado v2023.2 (64-bit)",
    "  **** SW Build 4029153 on Fri Oct 13 20:13:54 MDT 2023", "",
    "# Start of session at: Tue Nov 21 10:00:00 2023", "source " + source.name,
    "# create_project -force tessera vivado -part {part}",
    "# launch_runs synth_1 -jobs $jobs")
run("synth_1", "synth_design -top tessera_wrapper -part {part}")
if mode == "fail":
    say("ERROR: [Synth 8-439] module 'tessera_top' not found",
        "ERROR: [Common 17-69] Command failed: Synthesis failed - please see the console or "
        "run log file for details", stream=sys.stderr)
    say("INFO: [Common 17-206] Exiting Vivado at Tue Nov 21 10:01:00 2023...")
    sys.exit(1)
say("[Tue Nov 21 10:10:00 2023] synth_1 finished", "wait_on_run: Time (s): elapsed = 00:10:00",
    "# launch_runs impl_1 -to_step write_bitstream -jobs $jobs")
run("impl_1", "opt_design", "place_design", "route_design",
    "write_bitstream -force tessera_wrapper.bit")
say("[Tue Nov 21 10:40:00 2023] impl_1 finished", "# open_run impl_1",
    "# report_utilization -file [file join $reports_dir utilization.rpt]")
reports = Path("{reports}")
reports.mkdir(parents=True, exist_ok=True)
(reports / "utilization.rpt").write_text({util!r})
(reports / "utilization_hierarchical.rpt").write_text("| Instance | Module | Total LUTs |\n")
(reports / "timing_summary.rpt").write_text({timing_bad!r} if mode.startswith("timing")
                                            else {timing_ok!r})
if mode == "timing":
    # what build.tcl's tessera_fail does when timing fails
    say("ERROR: [tessera] timing failed at 100 MHz: WNS -0.735 ns (setup), WHS 0.021 ns "
        "(hold); see reports/timing_summary.rpt.", stream=sys.stderr)
    sys.exit(1)
Path("{bit}").parent.mkdir(parents=True, exist_ok=True)
Path("{bit}").write_bytes(b"\x00\x09\x0f\xf0 fake bitstream " * 64)
shutil.copyfile("{expected_hwh}", "{hwh}")
say("tessera: wrote out/tessera.bit and tessera.hwh (WNS 0.412 ns, WHS 0.021 ns)",
    "INFO: [Common 17-206] Exiting Vivado at Tue Nov 21 10:42:00 2023...")
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """A project written once (the Verilog export takes most of a minute)."""
    return write_project("pynq-z2", PYNQ, tmp_path_factory.mktemp("probe") / "project")


@pytest.fixture(scope="module")
def layout(probe):
    """Where the project's files are, relative to its folder."""
    d = Path(probe.directory)
    return {name: Path(getattr(probe, name)).relative_to(d).as_posix()
            for name in ("tcl", "verilog", "bitstream", "hwh", "expected_hwh", "reports")}


@pytest.fixture(autouse=True)
def reuse_verilog(request, monkeypatch):
    """Projects of the pynq preset copy the probe's Verilog instead of exporting it again."""
    if "probe" not in request.fixturenames and "layout" not in request.fixturenames:
        return
    probe = request.getfixturevalue("probe")
    from tessera.bitstreams import flow
    write = flow.write_project

    def write_project_fast(board, config, directory, **kw):
        if config == PYNQ and "verilog" not in kw:
            kw["verilog"] = probe.verilog
        return write(board, config, directory, **kw)
    monkeypatch.setattr(flow, "write_project", write_project_fast)


@pytest.fixture
def bits(tmp_path, monkeypatch):
    """TESSERA_BITSTREAMS pointing into tmp_path, so nothing lands in the checkout."""
    root = tmp_path / "bits"
    monkeypatch.setenv("TESSERA_BITSTREAMS", str(root))
    return root


@pytest.fixture
def no_vivado(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture
def fake_vivado(tmp_path, monkeypatch, layout):
    """A fake ``vivado`` alone on the PATH; its path."""
    if os.name == "nt":
        pytest.skip("the fake vivado is a script with a shebang")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vivado"
    exe.write_text(FAKE_VIVADO.format(
        python=sys.executable, part=PYNQ.part, bit=layout["bitstream"], hwh=layout["hwh"],
        expected_hwh=layout["expected_hwh"], reports=layout["reports"],
        util=UTILIZATION_7SERIES, timing_ok=timing_report(0.412, 0.0),
        timing_bad=timing_report(-0.735, -48.2)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.delenv("FAKE_VIVADO", raising=False)
    return exe


# ------------------------------------------------------------------ without Vivado
def test_without_vivado_the_project_is_left_ready(tmp_path, bits, no_vivado, capsys, layout):
    out = tmp_path / "proj"
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--config", "pynq",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert len(printed.splitlines()) == 1
    assert printed.startswith(f"Vivado is not on the PATH: the ready-to-run project is in {out}; "
                              "run `vivado -mode batch -source build.tcl` there, then "
                              "`tessera hw bitstream --board pynq-z2 --config pynq --install "
                              f"{out}`")
    assert str(bits / "pynq-z2" / KEY) in printed
    for name in ("tcl", "verilog", "expected_hwh"):
        assert (out / layout[name]).is_file(), name
    assert layout["tcl"] == "build.tcl"
    assert list(out.glob("README*")), "the project has no README"
    assert not bits.exists()                   # nothing installed


def test_library_call_without_vivado_returns_the_message(tmp_path, bits, no_vivado, probe):
    result = build_bitstream("pynq-z2", "pynq", output=tmp_path / "p")
    assert not result.built and result.installed is None and result.bitstream is None
    assert "Vivado is not on the PATH" in result.message
    assert result.project is not None and result.project_dir == tmp_path / "p"


def test_a_config_that_is_not_a_preset_is_kept_with_the_project(tmp_path, bits, no_vivado,
                                                                 monkeypatch):
    from tessera.bitstreams import flow
    other = PRESETS["tiny"].replace(name="tiny-b2", batch=2)
    written = []
    # the Verilog export is not what this test is about
    monkeypatch.setattr(flow, "write_project",
                        lambda board, config, directory: written.append(config) or
                        flow.VivadoProject(Path(directory), Path(directory) / "build.tcl",
                                             *(Path(directory) / n for n in "vbhet"),
                                             board=board, config=config))
    (tmp_path / "p").mkdir()
    result = build_bitstream("pynq-z2", other, output=tmp_path / "p")
    saved = tmp_path / "p" / hwb.CONFIG_NAME
    assert f"--config {saved} --install {tmp_path / 'p'}" in result.message
    assert HwConfig.load(saved) == other == written[0]


def test_config_that_does_not_fit_the_board(tmp_path, no_vivado, capsys):
    with pytest.raises(ConfigError, match="part"):
        build_bitstream("pynq-z2", "zcu104", output=tmp_path / "p")
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--config", "zcu104",
                 "-o", str(tmp_path / "q")]) == 2
    assert "tessera hw: error: config 'zcu104' targets part" in capsys.readouterr().err


def test_explicit_vivado_that_does_not_exist(tmp_path, no_vivado):
    with pytest.raises(HardwareToolError, match="Vivado executable .*nowhere/vivado not found"):
        build_bitstream("pynq-z2", "pynq", output=tmp_path / "p",
                        vivado=tmp_path / "nowhere" / "vivado")


# ------------------------------------------------------------------ with a fake Vivado
def check_installed(folder: Path, layout, project: Path) -> dict:
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    assert manifest["config_id"] == KEY and folder.name == KEY
    assert manifest["config_name"] == "pynq" and manifest["config"] == PYNQ.to_dict()
    assert (manifest["board"], manifest["part"]) == ("pynq-z2", "xc7z020clg400-1")
    assert manifest["clock_mhz"] == 100.0 and manifest["pl_clock_mhz"] == 100.0
    assert manifest["vivado_version"] == "2023.2"
    assert manifest["started"] and manifest["finished"]
    assert (folder / BIT_NAME).read_bytes() == (project / layout["bitstream"]).read_bytes()
    assert (folder / HWH_NAME).read_text() == (project / layout["expected_hwh"]).read_text()
    assert manifest["sha256"] == {BIT_NAME: sha256_file(folder / BIT_NAME),
                                  HWH_NAME: sha256_file(folder / HWH_NAME)}
    assert manifest["resources"] == {
        "LUT": {"used": 17893, "available": 53200, "percent": 33.63},
        "FF": {"used": 24310, "available": 106400, "percent": 22.85},
        "BRAM": {"used": 98.5, "available": 140, "percent": 70.36},
        "DSP": {"used": 160, "available": 220, "percent": 72.73},
    }
    assert manifest["timing"]["met"] is True
    assert manifest["timing"]["wns_ns"] == 0.412 and manifest["timing"]["tns_ns"] == 0
    for name in ("utilization.rpt", "utilization_hierarchical.rpt", "timing_summary.rpt",
                 "vivado.log"):
        assert f"reports/{name}" in manifest["reports"]
        assert (folder / "reports" / name).is_file()
    return manifest


def test_build_installs_the_bitstream(tmp_path, bits, fake_vivado, layout):
    calls = []
    result = build_bitstream("pynq-z2", PYNQ, output=tmp_path / "proj",
                             progress=lambda stage, done, total: calls.append((stage, done, total)))
    folder = bits / "pynq-z2" / KEY
    assert result.built and result.installed == folder
    assert result.message == f"installed the bitstream of config 'pynq' for pynq-z2 in {folder}"
    manifest = check_installed(folder, layout, tmp_path / "proj")
    assert manifest == result.manifest
    # the stages come from Vivado's output (launch_runs) and the runs' runme.log
    # (write_bitstream runs inside impl_1): in order, each once, then done
    assert calls[0] == ("synthesis", 0, 3) and calls[-1] == ("write_bitstream", 3, 3)
    assert ("write_bitstream", 2, 3) in calls
    assert [done for _, done, _ in calls] == sorted({done for _, done, _ in calls})
    # the runtime finds what was installed
    assert find_bitstream(PYNQ) == folder / BIT_NAME
    assert find_bitstream(PYNQ, "pynq-z2") == result.bitstream


def test_build_advances_a_progress_bar(tmp_path, bits, fake_vivado):
    stream = io.StringIO()
    bar = Progress(3, "vivado", stream=stream, enabled=True, unit="stages")
    build_bitstream("pynq-z2", PYNQ, output=tmp_path / "proj", progress=bar,
                    install_root=tmp_path / "elsewhere")
    assert bar.done == 3 and not bar.closed     # a bar the caller gave stays the caller's
    bar.close()
    assert "100% 3/3 stages" in stream.getvalue()
    assert (tmp_path / "elsewhere" / "pynq-z2" / KEY / BIT_NAME).is_file()


def test_rebuild_replaces_the_installed_folder(tmp_path, bits, fake_vivado):
    build_bitstream("pynq-z2", PYNQ, output=tmp_path / "proj", progress=False)
    folder = bits / "pynq-z2" / KEY
    (folder / "stale.txt").write_text("from the last build")
    build_bitstream("pynq-z2", PYNQ, output=tmp_path / "proj", progress=False)
    assert not (folder / "stale.txt").exists()
    assert sorted(p.name for p in (bits / "pynq-z2").iterdir()) == [KEY]   # no leftovers


def test_cli_build_with_vivado(tmp_path, bits, fake_vivado, capsys, layout):
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--config", "pynq",
                 "-o", str(tmp_path / "proj")]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == ("installed the bitstream of config 'pynq' for pynq-z2 in "
                                    f"{bits / 'pynq-z2' / KEY}")
    assert "hw bitstream pynq-z2: Vivado synthesis at" in captured.err    # stage lines
    check_installed(bits / "pynq-z2" / KEY, layout, tmp_path / "proj")


def test_vivado_failure_names_the_log(tmp_path, bits, fake_vivado, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_VIVADO", "fail")
    proj = tmp_path / "proj"
    with pytest.raises(HardwareToolError) as info:
        build_bitstream("pynq-z2", PYNQ, output=proj, progress=False)
    message = str(info.value)
    assert f"Vivado failed (exit status 1) in {proj}: see {proj / 'vivado.log'}" in message
    assert "ERROR: [Synth 8-439] module 'tessera_top' not found | ERROR: [Common 17-69]" in message
    assert "\n" not in message
    assert not bits.exists()
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--config", "pynq",
                 "-o", str(proj)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "hw bitstream pynq-z2: Vivado synthesis at" in err[1]          # stage lines
    assert err[-2].startswith("hw bitstream pynq-z2: stopped after")
    assert err[-1].startswith("tessera hw: error: Vivado failed (exit status 1)")


def test_missed_timing_is_not_installed(tmp_path, bits, fake_vivado, monkeypatch):
    # build.tcl stops with exit code 1 when timing fails
    monkeypatch.setenv("FAKE_VIVADO", "timing")
    with pytest.raises(HardwareToolError, match=r"exit status 1.*ERROR: \[tessera\] timing "
                                                "failed at 100 MHz"):
        build_bitstream("pynq-z2", PYNQ, output=tmp_path / "proj", progress=False)
    # and should a flow not stop, the timing report is read before installing
    monkeypatch.setenv("FAKE_VIVADO", "timing-silent")
    with pytest.raises(HardwareToolError, match=r"misses timing at 100 MHz \(WNS -0.735 ns, "
                                                r"TNS -48.2 ns.*timing_summary.rpt.*"
                                                "lower clock_mhz"):
        build_bitstream("pynq-z2", PYNQ, output=tmp_path / "proj", progress=False)
    assert not bits.exists()


def test_install_a_project_built_elsewhere(tmp_path, bits, layout, monkeypatch, capsys,
                                           fake_vivado):
    proj = tmp_path / "proj"
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path))              # no vivado here
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--config", "pynq",
                 "-o", str(proj)]) == 0
    assert "Vivado is not on the PATH" in capsys.readouterr().out
    with pytest.raises(HardwareToolError, match="no bitstream at .*Vivado has not run in .*"
                                                "run `vivado -mode batch -source build.tcl`"):
        install_build(proj, "pynq-z2", PYNQ)
    # "on the machine with Vivado": the command the message gives, in the project folder
    subprocess.run([str(fake_vivado), "-mode", "batch", "-source", "build.tcl"], cwd=proj,
                   check=True, capture_output=True, env={**os.environ, "PATH": path})
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--config", "pynq",
                 "--install", str(proj)]) == 0
    folder = bits / "pynq-z2" / KEY
    assert capsys.readouterr().out.strip().endswith(f"in {folder}")
    manifest = check_installed(folder, layout, proj)
    # the times come from the Vivado log
    assert (manifest["started"], manifest["finished"]) == ("2023-11-21T10:00:00",
                                                            "2023-11-21T10:42:00")
    # a project written for another config is refused
    with pytest.raises(HardwareToolError, match="config id 0x.*not 'tiny'"):
        install_build(proj, "pynq-z2", "tiny")
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--install",
                 str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_install_paths_match_the_project_layout(layout):
    paths = hwb._project_paths(Path("/p"))
    for name in ("bitstream", "hwh", "expected_hwh", "reports"):
        assert paths[name] == Path("/p") / layout[name], name


def test_stages_from_a_non_project_flow_log(tmp_path):
    seen = []
    report = hwb._StageReporter(None, lambda stage, done, total: seen.append(done), False)
    follower = hwb._StageFollower(tmp_path, report)
    for line in ["Command: synth_design -top t", "Command: opt_design", "Command: place_design",
                 "report_utilization: synth_design summary", "Command: write_bitstream -force x",
                 "Command: route_design"]:
        follower.line(line)
    assert seen == [0, 1, 2]
    # a run log is read in whole lines, each once; one older than the build is not read
    run = tmp_path / "vivado" / "p.runs" / "impl_1"
    run.mkdir(parents=True)
    (run / "runme.log").write_text("Command: write_bitstream -force old.bit\n")
    os.utime(run / "runme.log", (1e9, 1e9))
    follower = hwb._StageFollower(tmp_path, report)
    seen.clear()
    follower.poll()
    assert seen == []
    (run / "runme.log").write_text("Command: opt_design\nCommand: write_bit")
    follower.poll()
    follower.poll()
    assert seen == [1]
    with open(run / "runme.log", "a") as f:
        f.write("stream -force x.bit\n")
    follower.poll()
    assert seen == [1, 2]


# ------------------------------------------------------------------ parsers
def test_parse_utilization_7series_and_ultrascale():
    assert parse_utilization(UTILIZATION_7SERIES) == {
        "LUT": {"used": 17893, "available": 53200, "percent": 33.63},
        "FF": {"used": 24310, "available": 106400, "percent": 22.85},
        "BRAM": {"used": 98.5, "available": 140, "percent": 70.36},
        "DSP": {"used": 160, "available": 220, "percent": 72.73},
    }
    got = parse_utilization(UTILIZATION_ULTRASCALE)
    assert got["LUT"] == {"used": 60000, "available": 230400, "percent": 26.04}
    assert got["URAM"]["used"] == 48 and got["DSP"]["available"] == 1728
    assert parse_utilization("no tables here") == {}


def test_parse_timing_summary():
    met = parse_timing_summary(timing_report(0.412, 0.0))
    assert met == {"wns_ns": 0.412, "tns_ns": 0, "whs_ns": 0.021, "ths_ns": 0,
                   "failing_endpoints": 0, "failing_hold_endpoints": 0, "met": True}
    missed = parse_timing_summary(timing_report(-0.735, -48.2))
    assert missed["met"] is False and missed["wns_ns"] == -0.735
    assert missed["failing_endpoints"] == 12
    assert parse_timing_summary(timing_report(0.5, 0.0, whs=-0.01))["met"] is False
    # no constraints, no summary: never "met"
    assert parse_timing_summary("There are no user specified timing constraints.")["met"] is False


def test_parse_vivado_version():
    assert parse_vivado_version("****** Vivado v2023.2 (64-bit)\n") == "2023.2"
    assert parse_vivado_version("# Vivado v2022.1.2 (64-bit)") == "2022.1.2"
    assert parse_vivado_version("no version") is None


def test_last_errors_fall_back_to_the_tail():
    assert hwb._last_errors(["a\n", "\n", "b\n", "c\n", "d\n"]) == "b | c | d"
    assert hwb._last_errors([]) == "(the log is empty)"
