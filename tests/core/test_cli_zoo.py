"""``tessera zoo`` (list, export), ``tessera bench``, the line saying nothing ran on the
accelerator, and third-party log noise shown only with ``--verbose``."""
from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import onnx
import pytest

from tessera import cli_zoo
from tessera.cli import main
from tessera.cli_output import third_party_output
from tessera.compiler.frontend import zoo


# ------------------------------------------------------------------ zoo
def test_zoo_lists_models_with_parameters_macs_and_inputs(monkeypatch, capsys):
    monkeypatch.setattr(zoo, "ZOO", {name: zoo.ZOO[name] for name in ("mlp", "lenet")})
    assert main(["zoo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["model", "parameters", "MACs", "per", "inference", "inputs",
                                "(name:", "shape)"]
    lenet = zoo.lenet()
    assert lines[2].split() == ["lenet", f"{zoo.parameter_count(lenet):,}",
                                f"{zoo.mac_count(lenet):,}", "input:", "1x1x28x28"]
    assert "tessera zoo export NAME" in lines[-1]


def test_zoo_export_float_and_qdq(tmp_path, capsys):
    out = tmp_path / "lenet.onnx"
    assert main(["zoo", "export", "lenet", "-o", str(out)]) == 0
    assert "float" in capsys.readouterr().out
    ops = {n.op_type for n in onnx.load(out).graph.node}
    assert "Conv" in ops and "QuantizeLinear" not in ops
    assert main(["zoo", "export", "lenet", "-o", str(tmp_path / "q.onnx"), "--qdq"]) == 0
    assert "int8 QDQ" in capsys.readouterr().out
    assert "QuantizeLinear" in {n.op_type for n in onnx.load(tmp_path / "q.onnx").graph.node}


def test_zoo_export_errors(tmp_path, capsys):
    assert main(["zoo", "export", "alexnet"]) == 2
    err = capsys.readouterr().err
    assert "no zoo model 'alexnet'" in err and "lenet" in err and "tessera zoo lists" in err
    assert main(["zoo", "export", "lenet", "-o", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


# ------------------------------------------------------------------ bench
@pytest.fixture
def bench_folder(tmp_path, monkeypatch):
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "quick.py").write_text(textwrap.dedent('''\
        """A quick benchmark: one table.

        More text.
        """
        if __name__ == "__main__":
            print("case  ms")
            print("a     1.0")
        '''))
    (folder / "broken.py").write_text('"""Fails."""\n'
                                      'if __name__ == "__main__":\n    raise SystemExit(3)\n')
    (folder / "tables.py").write_text('"""Shared helpers, not a benchmark."""\n')
    monkeypatch.setattr(cli_zoo, "benchmarks_dir", lambda: folder)
    monkeypatch.delenv("TESSERA_PROGRESS", raising=False)
    return folder


def test_bench_lists_the_scripts(bench_folder, capsys):
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    assert "  quick   A quick benchmark: one table\n" in out and "  broken  Fails\n" in out
    assert "tables" not in out


def test_bench_runs_one_and_prints_its_table(bench_folder, capfd):
    assert main(["bench", "quick"]) == 0
    captured = capfd.readouterr()          # the script's table comes from its own process
    assert "== quick: A quick benchmark" in captured.out and "a     1.0" in captured.out
    assert "bench quick: running at" in captured.err and "bench quick: done in" in captured.err
    assert main(["bench", "--all"]) == 1
    assert "failed: broken" in capfd.readouterr().err


def test_bench_errors(bench_folder, monkeypatch, capsys):
    assert main(["bench", "nope"]) == 2
    assert "no benchmark 'nope'" in capsys.readouterr().err
    monkeypatch.setattr(cli_zoo, "benchmarks_dir", lambda: None)
    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "no benchmarks folder" in err and "source checkout" in err


def test_benchmarks_of_this_checkout_are_found():
    folder = cli_zoo.benchmarks_dir()
    assert folder == Path(__file__).resolve().parents[2] / "benchmarks"
    assert "gemm" in cli_zoo.benchmark_scripts(folder)


# ------------------------------------------------------------------ run, profile
def test_run_says_when_nothing_ran_on_the_accelerator(tmp_path, capsys):
    """mlp's layers do not fit tiny's accumulator: every node on the CPU, said so."""
    path = tmp_path / "mlp.onnx"
    onnx.save(zoo.mlp(), path)
    assert main(["compile", str(path), "--config", "tiny", "--random-calibration", "2",
                 "-o", str(tmp_path / "mlp.tsr")]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "mlp.tsr")]) == 0
    out = capsys.readouterr().out
    assert "nothing ran on the accelerator: no node was placed there (config 'tiny')" in out
    assert "fc1_QGemm (QGemm): does not fit config 'tiny'" in out
    assert main(["profile", str(tmp_path / "mlp.tsr")]) == 0
    out = capsys.readouterr().out
    assert "nothing ran on the accelerator" in out and "time (ms)" in out


# ------------------------------------------------------------------ --verbose
def _record_from(path: str) -> logging.LogRecord:
    return logging.LogRecord("root", logging.WARNING, path, 1, "noise", None, None)


def test_third_party_log_lines_are_hidden_unless_verbose(capsys):
    import onnxruntime
    noisy = str(Path(onnxruntime.__file__).parent / "quantization" / "qdq_quantizer.py")
    root = logging.getLogger()
    seen: list[logging.LogRecord] = []
    keep = logging.Handler()
    keep.emit = seen.append
    root.addHandler(keep)
    try:
        with third_party_output(verbose=False):
            root.handle(_record_from(noisy))
            root.handle(_record_from(__file__))        # not onnxruntime's: passed on
        assert [r.pathname for r in seen] == [__file__]
        assert "1 log line(s) and warning(s) of onnxruntime/onnx hidden; --verbose" in \
            capsys.readouterr().err
        with third_party_output(verbose=True):
            root.handle(_record_from(noisy))
        assert [r.pathname for r in seen] == [__file__, noisy]
        assert capsys.readouterr().err == ""
    finally:
        root.removeHandler(keep)


def test_third_party_warnings_are_hidden_and_others_shown(capsys, monkeypatch):
    import warnings

    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args: shown.append(message))
    noisy = str(Path(onnx.__file__).parent / "helper.py")
    with third_party_output(verbose=False):
        warnings.warn_explicit("onnx noise", UserWarning, noisy, 1)
        warnings.warn_explicit("a warning of ours", UserWarning, __file__, 1)
    assert [str(m) for m in shown] == ["a warning of ours"]
    assert "1 log line(s) and warning(s) of onnxruntime/onnx hidden" in capsys.readouterr().err


def test_a_reader_that_stops_early_ends_the_command_quietly():
    # `tessera zoo | head -1`: the pipe is closed before the table is written
    import subprocess
    import sys
    command = subprocess.Popen([sys.executable, "-c", "import sys; from tessera.cli import "
                                "main; sys.exit(main(['zoo']))"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    command.stdout.close()
    err = command.stderr.read().decode()
    assert command.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err
