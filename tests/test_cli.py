import json
import subprocess
import sys


from tessera.cli import main


def test_demo_runs_bit_exact(capsys):
    assert main(["demo", "--size", "64"]) == 0
    out = capsys.readouterr().out
    assert "result check against numpy: bit-exact" in out
    assert "utilisation" in out and "compute" in out


def test_demo_writes_a_perfetto_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["demo", "--config", "tiny", "--size", "16", "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    # GEMM and ALU instructions get a track per compute unit
    assert names == {"fetch", "load", "compute", "store", "compute.gemm", "compute.alu"}
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] > 0 for e in spans)
    assert any(e["name"] == "FINISH" for e in spans)


def test_isa_table(capsys):
    assert main(["isa", "--config", "pynq"]) == 0
    out = capsys.readouterr().out
    assert "x_pad_1            118:115      4  [0, 15]" in out
    assert "pad_value          126:119      8  [-128, 127]" in out
    assert "imm                127:111     17  [-65536, 65535]" in out
    assert "REQUANT=7" in out


def test_asm_disasm_round_trip(tmp_path, capsys):
    from tessera.config import PRESETS
    from tessera.isa import Program
    from tessera.kernels.gemm import gemm_program
    import numpy as np

    rng = np.random.default_rng(0)
    prog = gemm_program(PRESETS["tiny"], rng.integers(-9, 9, (8, 8), dtype=np.int8),
                        rng.integers(-9, 9, (8, 8), dtype=np.int8), epilogue=[("SHR", 2)])
    prog.save(tmp_path / "p.tsp")
    assert main(["disasm", str(tmp_path / "p.tsp"), "-o", str(tmp_path / "p.s")]) == 0
    text = (tmp_path / "p.s").read_text()
    assert any(line.startswith("GEMM") and " reset " in line for line in text.splitlines())
    assert "ALU.SHR" in text
    assert main(["asm", str(tmp_path / "p.s"), "-o", str(tmp_path / "q.tsp")]) == 0
    assert (tmp_path / "q.tsp").read_bytes() == (tmp_path / "p.tsp").read_bytes()
    assert Program.load(tmp_path / "q.tsp") == prog
    capsys.readouterr()
    assert main(["sim", str(tmp_path / "q.tsp"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gemm_ops"] == 8 * 8 * 8 // 16


def test_errors_are_one_line_messages(tmp_path, capsys):
    assert main(["demo", "--config", "nonsense"]) == 2
    assert "error: unknown config 'nonsense'" in capsys.readouterr().err
    (tmp_path / "bad.s").write_text("FINISH\n")
    assert main(["asm", str(tmp_path / "bad.s")]) == 2
    assert "config" in capsys.readouterr().err
    assert main(["sim", str(tmp_path / "missing.tsp")]) == 2
    assert "cannot read program file" in capsys.readouterr().err


def test_console_script_entry_point():
    out = subprocess.run([sys.executable, "-m", "tessera.cli", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("tessera ")
