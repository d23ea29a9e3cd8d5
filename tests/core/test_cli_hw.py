"""``tessera hw verilog|resources|bitstream``: stage lines with the elapsed time while the
long work runs, arguments checked before it starts, resource reports cached.

Synthesis is a fake yosys (a script printing yosys's pass headers and writing the stat
file) so the stage parsing and the cache are tested in a second; the real log format is
checked in tests/hw/synth/test_resource_stages.py.
"""
from __future__ import annotations

import sys
import textwrap
from types import SimpleNamespace

import pytest

pytest.importorskip("amaranth")

from tessera.cli import main  # noqa: E402
from tessera.hw.synth import export, resources  # noqa: E402

FAKE_YOSYS = textwrap.dedent('''\
    import json, sys
    from pathlib import Path
    assert sys.argv[1:] == ["-v", "2", "-s", "synth.ys"], sys.argv
    runs = Path(sys.argv[0]).with_suffix(".runs")
    runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
    print("1. Executing Verilog-2005 frontend: design.v")
    print("2. Executing SYNTH_XILINX pass.")
    print("2.4. Executing PROC pass (convert processes to netlists).")
    print("2.4.1. Executing PROC_CLEAN pass (remove empty switches from decision trees).")
    print("3.29. Executing ABC9 pass.")
    Path("stat.json").write_text(json.dumps({"design": {"num_cells_by_type":
        {"LUT6": 100, "FDRE": 50, "DSP48E1": 2, "RAMB18E1": 1}}}))
''')


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """A fake yosys (counting its runs) and a Verilog export that reports its stages
    without elaborating anything; the cache in tmp_path."""
    script = tmp_path / "fake_yosys.py"
    script.write_text(FAKE_YOSYS)
    monkeypatch.setattr(resources, "_yosys_command", lambda yosys: [sys.executable, str(script)])

    def fake_verilog(config, progress=None):
        for stage in export.EXPORT_STAGES:
            progress(stage)
        return "module tessera_top; endmodule\n"
    monkeypatch.setattr(export, "verilog", fake_verilog)
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TESSERA_PROGRESS", raising=False)
    return SimpleNamespace(runs=lambda: len(script.with_suffix(".runs").read_text())
                           if script.with_suffix(".runs").exists() else 0)


def _refuse_long_work(monkeypatch):
    """Make the Verilog export and synthesis fail the test if they start."""
    def refuse(*args, **kwargs):
        raise AssertionError("long work started before the arguments were checked")
    monkeypatch.setattr(export, "verilog", refuse)
    monkeypatch.setattr(export, "write", refuse)
    monkeypatch.setattr(resources, "synthesize", refuse)


def test_resources_prints_yosys_passes_as_stages_then_caches(fake_tools, capsys):
    assert main(["hw", "resources", "--config", "tiny"]) == 0
    out, err = capsys.readouterr()
    stages = [line.split(": ", 1)[1] for line in err.splitlines()]
    label = "hw resources 'tiny' on xc7z020clg400-1"
    assert all(line.startswith(label) for line in err.splitlines())
    assert [s.rsplit(" at ", 1)[0] for s in stages[:-1]] == [
        *export.EXPORT_STAGES, "yosys synth_xilinx",
        "yosys proc (convert processes to netlists)", "yosys abc9"]
    assert stages[-1].startswith("done in ")
    assert "(synthesised now)" in out and "DSP" in out and fake_tools.runs() == 1
    # the second call is the cached report, no synthesis and no stage lines
    assert main(["hw", "resources", "--config", "tiny"]) == 0
    out2, err2 = capsys.readouterr()
    assert "cached" in out2 and "--no-cache" in out2 and err2 == ""
    assert out2.splitlines()[1:] == out.splitlines()[1:] and fake_tools.runs() == 1
    # --no-cache synthesises again; another part is another entry
    assert main(["hw", "resources", "--config", "tiny", "--no-cache"]) == 0
    assert fake_tools.runs() == 2
    assert main(["hw", "resources", "--config", "tiny", "--part", "xczu3eg"]) == 0
    assert fake_tools.runs() == 3 and "on xczu3eg" in capsys.readouterr().out


def test_an_edit_elsewhere_finds_the_same_verilog_synthesised_before(fake_tools, capsys,
                                                                      monkeypatch):
    """A source changed (the sources key misses) but this design's Verilog did not."""
    from tessera.hw.harness import verilator_build
    assert main(["hw", "resources", "--config", "tiny"]) == 0 and fake_tools.runs() == 1
    real = verilator_build.source_key
    monkeypatch.setattr(verilator_build, "source_key", lambda c: real(c) + " edited")
    assert main(["hw", "resources", "--config", "tiny"]) == 0
    assert "the same Verilog was synthesised before" in capsys.readouterr().out
    assert fake_tools.runs() == 1
    assert main(["hw", "resources", "--config", "tiny"]) == 0      # now cached by sources
    assert "same sources and yosys" in capsys.readouterr().out and fake_tools.runs() == 1


def test_resources_checks_part_and_config_first(monkeypatch, capsys):
    _refuse_long_work(monkeypatch)
    assert main(["hw", "resources", "--config", "tiny", "--part", "xc7z045"]) == 2
    err = capsys.readouterr().err
    assert "unknown part 'xc7z045'" in err and "--part xc7z020" in err
    assert main(["hw", "resources", "--config", "tiny", "--part", "ice40"]) == 2
    assert "no synth_xilinx family" in capsys.readouterr().err
    assert main(["hw", "resources", "--config", "no-such-preset"]) == 2
    assert "unknown config 'no-such-preset'" in capsys.readouterr().err


def test_verilog_prints_its_stages(tmp_path, capsys, monkeypatch):
    """One real export of tiny (about 10 s)."""
    monkeypatch.delenv("TESSERA_PROGRESS", raising=False)
    assert main(["hw", "verilog", "--config", "tiny", "-o", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert f"wrote {tmp_path / 'tessera_top.v'}" in out
    assert "module tessera_top" in (tmp_path / "tessera_top.v").read_text()
    lines = err.splitlines()
    assert [ln.split(": ", 1)[1].rsplit(" at ", 1)[0] for ln in lines[:-1]] == \
        list(export.EXPORT_STAGES)
    assert lines[-1].startswith("hw verilog 'tiny': done in ")


def test_verilog_checks_config_and_output_first(tmp_path, monkeypatch, capsys):
    _refuse_long_work(monkeypatch)
    assert main(["hw", "verilog", "--config", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["hw", "verilog", "--config", "tiny", "-o", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and "-o DIR" in err


def test_bitstream_prints_stages(tmp_path, monkeypatch, capsys):
    from tessera.bitstreams import build

    def fake_build(board, config, *, output, vivado, progress):
        for stage in build.STAGES:
            progress(stage, build.STAGES.index(stage), len(build.STAGES))
        return SimpleNamespace(message="installed")
    monkeypatch.setattr(build, "build_bitstream", fake_build)
    monkeypatch.delenv("TESSERA_PROGRESS", raising=False)
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--config", "pynq",
                 "-o", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    stages = [ln.split(": ", 1)[1].rsplit(" at ", 1)[0] for ln in err.splitlines()[:-1]]
    assert stages == ["exporting the Verilog and writing the Vivado project",
                      "Vivado synthesis", "Vivado implementation", "Vivado write_bitstream"]
    assert err.splitlines()[-1].startswith("hw bitstream pynq-z2: done in ")
    assert out.strip() == "installed"


def test_bitstream_checks_board_and_config_first(tmp_path, monkeypatch, capsys):
    from tessera.bitstreams import build
    monkeypatch.setattr(build, "build_bitstream", lambda *a, **k: pytest.fail("started"))
    assert main(["hw", "bitstream", "--board", "pynq-z2", "--config", "zcu104"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessera hw: error: config 'zcu104' targets part")   # no stage line
    with pytest.raises(SystemExit):
        main(["hw", "bitstream", "--board", "no-such-board"])
    assert "invalid choice: 'no-such-board'" in capsys.readouterr().err
