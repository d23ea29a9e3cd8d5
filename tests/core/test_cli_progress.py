"""Progress on the long model commands (issue 22): `tessera compile` and `tessera run`
draw their bars when asked (TESSERA_PROGRESS=1, as on a terminal), and check their
arguments before any long work starts."""
from __future__ import annotations

import pytest

from tessera import cli


@pytest.fixture(scope="module")
def mlp_qdq(tmp_path_factory):
    path = tmp_path_factory.mktemp("progress") / "mlp.onnx"
    assert cli.main(["zoo", "export", "mlp", "-o", str(path), "--qdq"]) == 0
    return path


def test_compile_and_run_draw_their_stages(mlp_qdq, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_PROGRESS", "1")
    tsr = tmp_path / "mlp.tsr"
    assert cli.main(["compile", str(mlp_qdq), "-o", str(tsr), "--cpu-targets", "none"]) == 0
    err = capsys.readouterr().err
    assert "compiling mlp.onnx" in err and "100%" in err
    assert cli.main(["run", str(tsr), "--backend", "sim", "-o", str(tmp_path / "y.npz")]) == 0
    out, err = capsys.readouterr()
    assert "running on sim" in err and "100%" in err
    assert "accelerator" in out and "nothing ran on the accelerator" not in out


def test_no_bars_in_a_pipe_unless_asked(mlp_qdq, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TESSERA_PROGRESS", raising=False)
    assert cli.main(["compile", str(mlp_qdq), "-o", str(tmp_path / "m.tsr"),
                     "--cpu-targets", "none"]) == 0
    assert "[===" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["--config", "no-such-preset"], "no-such-preset"),
    (["--cpu-targets", "vax"], "vax"),
])
def test_compile_refuses_bad_arguments_before_compiling(mlp_qdq, tmp_path, capsys,
                                                        monkeypatch, argv, said):
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before checking the arguments")
    monkeypatch.setattr("tessera.compile", no_compile)
    code = cli.main(["compile", str(mlp_qdq), "-o", str(tmp_path / "m.tsr"), *argv])
    assert code == 2 and said in capsys.readouterr().err
