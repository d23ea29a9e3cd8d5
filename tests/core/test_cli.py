import json
import subprocess
import sys


from tessera.cli import main


def test_gemm_demo_runs_bit_exact(capsys):
    assert main(["demo", "--gemm", "--size", "64"]) == 0
    out = capsys.readouterr().out
    assert "result check against numpy: bit-exact" in out
    assert "utilisation" in out and "compute" in out


def test_gemm_demo_writes_a_perfetto_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["demo", "--gemm", "--config", "tiny", "--size", "16", "--trace",
                 str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    # GEMM and ALU instructions get a track per compute unit
    assert names == {"fetch", "load", "compute", "store", "compute.gemm", "compute.alu"}
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] > 0 for e in spans)
    assert any(e["name"] == "FINISH" for e in spans)


def test_model_demo_checks_against_onnxruntime(tmp_path, capsys):
    png = tmp_path / "t.png"
    assert main(["demo", "--model", "lenet", "--timeline", str(png)]) == 0
    out = capsys.readouterr().out
    assert "logits vs onnxruntime: 10/10 int8 values identical" in out
    assert "conv1_QConv" in out and "projected latency" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_compile_run_profile_commands(tmp_path, capsys):
    import numpy as np
    import onnx

    from tessera.compiler import zoo

    model = zoo.lenet()
    onnx.save(model, tmp_path / "lenet.onnx")
    samples = zoo.calibration_data(model, 4)
    np.savez(tmp_path / "cal.npz", input=np.stack([s["input"] for s in samples]))
    assert main(["compile", str(tmp_path / "lenet.onnx"), "--calibration",
                 str(tmp_path / "cal.npz"), "-o", str(tmp_path / "lenet.tsr")]) == 0
    out = capsys.readouterr().out
    assert "conv1_QConv" in out and "accelerator" in out and "wrote" in out
    np.savez(tmp_path / "in.npz", input=samples[0]["input"])
    assert main(["run", str(tmp_path / "lenet.tsr"), "--inputs", str(tmp_path / "in.npz"),
                 "-o", str(tmp_path / "out.npz")]) == 0
    logits = np.load(tmp_path / "out.npz")["logits"]
    assert logits.shape == (1, 10)
    ours, _ = __import__("tessera").load(tmp_path / "lenet.tsr").run(samples[0])
    np.testing.assert_array_equal(logits, ours["logits"])
    capsys.readouterr()
    trace = tmp_path / "p.json"
    assert main(["profile", str(tmp_path / "lenet.tsr"), "--inputs", str(tmp_path / "in.npz"),
                 "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "conv2_QConv" in out and "cycles / bound" in out and "GEMM use (%)" in out
    assert json.loads(trace.read_text())["traceEvents"]
    # Bad input files and shapes are one-line errors.
    np.savez(tmp_path / "bad.npz", input=np.zeros((1, 1, 5, 5), np.float32))
    assert main(["run", str(tmp_path / "lenet.tsr"), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "shape" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.tsr")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "junk.onnx").write_bytes(b"junk")
    assert main(["compile", str(tmp_path / "junk.onnx")]) == 2
    assert "error" in capsys.readouterr().err


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
    assert main(["demo", "--gemm", "--config", "nonsense"]) == 2
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
