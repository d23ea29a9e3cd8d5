"""The command line as a new user meets it (issue 15, item 6): the model path after a list
option, calibration files of one sample or a stack, random calibration of the shapes given,
bad files and sizes as one-line errors, advice in the command line's terms, help without a
command."""
import json

import numpy as np
import onnx
import pytest

from tessera.cli import main
from tessera.config import PRESETS
from tessera.cli_inputs import calibration_samples, input_feeds
from tessera.compiler import zoo
from tessera.errors import TesseraError


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """lenet.onnx (input [1, 1, 28, 28]), calibration files and a small_resnet with
    dynamic batch, height and width."""
    d = tmp_path_factory.mktemp("cli")
    model = zoo.lenet()
    onnx.save(model, d / "lenet.onnx")
    samples = [s["input"] for s in zoo.calibration_data(model, 3)]
    np.savez(d / "stack.npz", input=np.stack(samples[:2]))
    np.savez(d / "one.npz", input=samples[2])
    np.save(d / "one.npy", samples[2])
    (d / "corrupt.npz").write_bytes(b"PK\x03\x04 not a zip archive")
    (d / "empty.onnx").write_bytes(b"")
    dyn = zoo.small_resnet()
    for dim, name in zip(dyn.graph.input[0].type.tensor_type.shape.dim, "N?HW"):
        if name != "?":
            dim.dim_param = name
    onnx.save(dyn, d / "dyn.onnx")
    return d, samples


def _tsr_input_shape(path) -> list[int]:
    from tessera.compiler.model import CompiledModel
    return list(CompiledModel.load(path).inputs[0].shape)


def test_model_path_after_list_options_is_the_model(files, capsys):
    d, _ = files
    # The model last, after --calibration (two files, then the flag repeated) and --force-cpu.
    assert main(["compile", "--calibration", str(d / "stack.npz"), str(d / "one.npz"),
                 "--calibration", f"input={d / 'one.npy'}", "-o", str(d / "a.tsr"),
                 "--force-cpu", "pool2_QMaxPool", str(d / "lenet.onnx")]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "kept on the CPU by force_cpu" in out
    assert _tsr_input_shape(d / "a.tsr") == [1, 1, 28, 28]
    # A list option with one word and no model: argparse's usage error, naming the model.
    with pytest.raises(SystemExit) as info:
        main(["compile", "--calibration", str(d / "stack.npz")])
    assert info.value.code == 2
    assert "required: model" in capsys.readouterr().err
    # run: the model after --inputs.
    np.savez(d / "in.npz", input=files[1][0])
    assert main(["run", "--inputs", str(d / "in.npz"), str(d / "a.tsr")]) == 0


def test_calibration_arrays_are_one_sample_or_a_stack(files):
    d, samples = files
    ranks = {"input": 4}
    feeds = calibration_samples([str(d / "stack.npz"), str(d / "one.npz")], ranks)
    assert len(feeds) == 3
    for feed, want in zip(feeds, samples):
        np.testing.assert_array_equal(feed["input"], want)
    assert len(calibration_samples([str(d / "one.npz")], ranks)) == 1
    np.savez(d / "rank2.npz", input=np.zeros((28, 28), np.float32))
    with pytest.raises(TesseraError, match=r"'input' has shape \[28, 28\]; give one sample of "
                                           r"the input's 4 dims, or a stack"):
        calibration_samples([str(d / "rank2.npz")], ranks)
    with pytest.raises(TesseraError, match="one.npz' holds 'input', which is not an input of "
                                           r"the model \(its inputs: other\)"):
        calibration_samples([str(d / "one.npz")], {"other": 4})
    np.savez(d / "two.npz", a=np.zeros((2, 3), np.float32), b=np.zeros((3, 3), np.float32))
    with pytest.raises(TesseraError, match="different numbers of samples"):
        calibration_samples([str(d / "two.npz")], {"a": 1, "b": 1})


def test_random_calibration_takes_the_input_shape_given(files, capsys):
    d, _ = files
    assert main(["compile", str(d / "dyn.onnx"), "--random-calibration", "2",
                 "--input-shape", "input=1,3,16,16", "-o", str(d / "dyn.tsr")]) == 0
    assert _tsr_input_shape(d / "dyn.tsr") == [1, 3, 16, 16]
    capsys.readouterr()
    # Without the shape: which input, and the flag that gives it (not Python's argument).
    assert main(["compile", str(d / "dyn.onnx"), "--random-calibration", "2"]) == 2
    err = capsys.readouterr().err
    assert "input 'input' has dynamic dims (shape ['?', 3, '?', '?'])" in err
    assert "--input-shape input=1,3,1,1" in err and "input_shapes=" not in err


def test_bad_files_and_sizes_are_one_line_errors(files, capsys):
    d, _ = files
    assert main(["compile", str(d / "empty.onnx"), "--random-calibration", "2"]) == 2
    assert "empty.onnx' is empty or not an ONNX model" in capsys.readouterr().err
    assert main(["run", str(d / "lenet.onnx"), "--random-calibration", "1", "--inputs",
                 str(d / "corrupt.npz")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["compile", str(d / "lenet.onnx"), "--calibration",
                 str(d / "corrupt.npz")]) == 2
    assert "corrupt.npz' as .npz or .npy arrays" in capsys.readouterr().err
    for size in ("-5", "0"):
        with pytest.raises(SystemExit) as info:
            main(["demo", "--gemm", "--size", size])
        assert info.value.code == 2
        assert f"argument --size: {size} is not positive" in capsys.readouterr().err
    assert main(["demo", "--gemm", "--size", "24"]) == 2
    assert "GEMM N=24 must be a multiple of 16" in capsys.readouterr().err
    with pytest.raises(TesseraError, match="given twice"):
        input_feeds([str(d / "one.npz"), f"input={d / 'one.npy'}"])


def test_advice_is_in_the_command_line_s_terms(files, capsys):
    d, _ = files
    assert main(["compile", str(d / "lenet.onnx")]) == 2
    err = capsys.readouterr().err
    assert "model 'lenet' is a float model; give --calibration FILE.npz" in err
    assert "--random-calibration N" in err and "calibration=" not in err


def test_without_a_command_help_is_printed(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: tessera") and "compile" in out and "demo" in out
    assert main(["hw"]) == 0
    assert "verilog" in capsys.readouterr().out
    # A command's own function wins over the help default.
    assert main(["isa", "--config", "tiny"]) == 0
    assert "ALU ops" in capsys.readouterr().out


def test_missing_config_file_is_named(tmp_path, capsys):
    assert main(["isa", "--config", str(tmp_path / "board.json")]) == 2
    err = capsys.readouterr().err
    assert f"config file '{tmp_path / 'board.json'}' does not exist" in err
    (tmp_path / "board.json").write_text(json.dumps({"name": "mine"}))
    assert main(["isa", "--config", str(tmp_path / "board.json")]) == 2
    err = capsys.readouterr().err
    assert f"config file {tmp_path / 'board.json'}: fields [" in err and "python -c" in err
    PRESETS["pynq"].replace(name="mine").save(tmp_path / "board.json")
    assert main(["isa", "--config", str(tmp_path / "board.json")]) == 0
    assert "'mine'" in capsys.readouterr().out
