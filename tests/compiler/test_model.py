"""Whole models: tessera.compile / Model.run / save / load against onnxruntime.

Every zoo model but the full ResNet-18 (benchmarks/resnet18.py runs that one) is quantized
with calibration data, compiled and run; its int8 outputs are compared with onnxruntime
running the same QDQ model with its int8 kernels.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import tessera
from tessera.compiler import zoo
from tessera.compiler.golden.check import int8_agreement, output_scales, reference_outputs
from tessera.compiler.model import CompiledModel
from tessera.hostmodel import get_host_model
from tessera.compiler.frontend.qdq import OPS as FUSED_OPS
from tessera.errors import CompileError, ProgramFileError, TesseraError
from tessera.modelfile import FORMAT_VERSION, MAGIC
from tessera.errors import RunError
from tessera.runtime.executor import Model

from tests.programs import RTL_CONFIGS, device


def _compile(name: str, config: str = "pynq", **options) -> tuple[Model, dict]:
    model = zoo.ZOO[name]()
    compiled = tessera.compile(model, config, calibration=zoo.calibration_data(model), **options)
    return compiled, zoo.calibration_data(model, 1, seed=7)[0]


def _assert_matches_onnxruntime(model: Model, outputs: dict, feed: dict) -> None:
    reference = reference_outputs(model.compiled.reference, feed)
    scales = output_scales(model.compiled.reference)
    for name, ours in outputs.items():
        agree = int8_agreement(ours, reference[name], scales[name])
        assert agree.fraction >= 0.999 and agree.max_steps <= 1, (name, str(agree))


@pytest.fixture(scope="module")
def lenet():
    return _compile("lenet")


@pytest.mark.parametrize("name", ["mlp", "lenet", "small_resnet", "mobilenet"])
def test_zoo_model_matches_onnxruntime(name: str) -> None:
    model, feed = _compile(name)
    outputs, profile = model.run(feed, backend="sim")
    _assert_matches_onnxruntime(model, outputs, feed)
    # Every node is placed with a reason; the integer ones on the accelerator, with estimates.
    for p in model.placements:
        assert p.reason
        if p.op in FUSED_OPS and p.target == "accelerator":
            assert p.accel_seconds > 0 and p.cpu_seconds > 0
    assert {p.target for p in model.placements if p.op in FUSED_OPS} == {"accelerator"}
    assert len(model.compiled.accel_steps) == 1
    assert profile.accel_cycles > 0
    accel = [x for x in profile.layers if x.placement == "accelerator"]
    assert sum(x.cycles or 0 for x in accel) == profile.accel_cycles
    # A max pool run in its convolution's tiles has no cycles of its own, and says where.
    for before, x in zip(accel, accel[1:]):
        assert (x.cycles is None) == (x.kind.endswith(f"(in {before.name})")), x
    model.close()


def test_placement_follows_the_cost_model() -> None:
    model, feed = _compile("mlp")
    assert {p.target for p in model.placements if p.op == "QGemm"} == {"accelerator"}
    assert all(" vs " in p.reason for p in model.placements if p.op == "QGemm")
    # On a host 100x faster, three small dense layers are not worth a launch.
    fast_host, _ = _compile("mlp", host=get_host_model("cortex-a9").scaled(0.01))
    assert {p.target for p in fast_host.placements if p.op == "QGemm"} == {"cpu"}
    assert not fast_host.compiled.accel_steps
    outputs, profile = fast_host.run(feed)
    _assert_matches_onnxruntime(fast_host, outputs, feed)
    assert profile.accel_cycles == 0 and profile.cpu_seconds > 0


def test_cpu_kernels_and_their_constants_survive_save_and_load(tmp_path) -> None:
    model, feed = _compile("mlp", host=get_host_model("cortex-a9").scaled(0.01))
    assert any(s.constants for s in model.compiled.steps if hasattr(s, "constants"))
    loaded = tessera.load(model.save(tmp_path / "mlp.tsr"))
    a, _ = model.run(feed)
    b, _ = loaded.run(feed)
    np.testing.assert_array_equal(a["logits"], b["logits"])


def test_nodes_forced_to_the_cpu_split_the_program(lenet) -> None:
    model, feed = lenet
    pools = [p.node for p in model.placements if p.op == "QMaxPool"]
    split, _ = _compile("lenet", force_cpu=pools)
    assert len(split.compiled.accel_steps) == 3
    assert all(p.target == "cpu" and "force_cpu" in p.reason
               for p in split.placements if p.node in pools)
    outputs, profile = split.run(feed)
    _assert_matches_onnxruntime(split, outputs, feed)
    whole, _ = model.run(feed)
    np.testing.assert_array_equal(outputs["logits"], whole["logits"])
    assert profile.cpu_seconds > 0
    split.close()


def test_save_and_load_round_trip(lenet, tmp_path) -> None:
    model, feed = lenet
    path = model.save(tmp_path / "lenet.tsr")
    loaded = tessera.load(path)
    assert loaded.config == model.config
    assert [p.to_dict() for p in loaded.placements] == [p.to_dict() for p in model.placements]
    a, _ = model.run(feed)
    b, _ = loaded.run(feed)
    np.testing.assert_array_equal(a["logits"], b["logits"])
    # Saving the loaded model again gives the same file.
    again = loaded.save(tmp_path / "again.tsr")
    assert CompiledModel.load(again).to_modelfile() == loaded.compiled.to_modelfile()
    loaded.close()


def test_damaged_model_files_are_clear_errors(lenet, tmp_path) -> None:
    model, _ = lenet
    blob = bytearray(model.compiled.to_modelfile().to_bytes())
    cases = {
        "flipped": blob[:-200] + bytes([blob[-200] ^ 0xFF]) + blob[-199:],
        "truncated": blob[:len(blob) // 2],
        "version": blob[:len(MAGIC)] + (FORMAT_VERSION + 1).to_bytes(2, "little")
                   + blob[len(MAGIC) + 2:],
        "empty": b"",
    }
    messages = {}
    for name, data in cases.items():
        path = tmp_path / f"{name}.tsr"
        path.write_bytes(bytes(data))
        with pytest.raises(ProgramFileError) as info:
            tessera.load(path)
        messages[name] = str(info.value)
    assert "damaged" in messages["flipped"]
    assert "truncated" in messages["truncated"]
    assert "version" in messages["version"]


def test_a_modelfile_that_is_not_a_model_is_refused(tmp_path) -> None:
    from tessera.config import get_config
    from tessera.modelfile import ModelFile
    path = tmp_path / "other.tsr"
    ModelFile({"kind": "something else"}, get_config("pynq")).save(path)
    with pytest.raises(ProgramFileError, match="not a compiled model"):
        tessera.load(path)


def test_wrong_inputs_are_clear_errors(lenet) -> None:
    model, feed = lenet
    x = feed["input"]
    with pytest.raises(RunError, match="shape"):
        model.run({"input": x[:, :, :20]})
    with pytest.raises(RunError, match="dtype"):
        model.run({"input": x.astype(np.float64)})
    with pytest.raises(RunError, match="was not given"):
        model.run({})
    with pytest.raises(RunError, match="unknown input"):
        model.run({"input": x, "other": x})
    with pytest.raises(RunError, match="NaN"):
        model.run({"input": np.full_like(x, np.nan)})
    assert issubclass(RunError, TesseraError)


def test_malformed_and_unsupported_models_are_clear_errors() -> None:
    with pytest.raises(CompileError):
        tessera.compile(b"not an onnx model")
    float_model = zoo.lenet()
    with pytest.raises(CompileError, match="calibration"):
        tessera.compile(float_model)
    # An op with neither an accelerator lowering nor a CPU kernel.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"], name="the_det")], "g",
                              [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="the_det"):
        tessera.compile(model, calibration=[{"x": np.ones((2, 4, 4), np.float32)}])


def test_layers_that_do_not_fit_the_config_fall_back_to_the_cpu() -> None:
    model, feed = _compile("lenet", "tiny")
    misfits = [p for p in model.placements if "does not fit" in p.reason]
    assert misfits and all(p.target == "cpu" for p in misfits)
    outputs, _ = model.run(feed)
    _assert_matches_onnxruntime(model, outputs, feed)
    model.close()


def test_a_fallback_compiles_only_what_it_changed(monkeypatch) -> None:
    """Eight layers of this MobileNet do not fit ``tiny``: each is found by a failed
    compile and placed on the CPU, and only the segments that fallback changed compile
    again (the graph is not recompiled per misfit). The result is the program a placement
    with those nodes on the CPU from the start gives."""
    import tessera.compiler.model as model_module
    net = zoo.mobilenet(image=32, width=0.5)
    calibration = zoo.calibration_data(net, 2)
    compiled_segments: list[tuple[str, ...]] = []
    real = model_module.compile_ops

    def counting(ops, *args, **kwargs):
        program = real(ops, *args, **kwargs)
        compiled_segments.append(tuple(op.name for op in ops))
        return program
    monkeypatch.setattr(model_module, "compile_ops", counting)
    fallback = tessera.compile(net, "tiny", calibration=calibration)
    misfits = [p.node for p in fallback.placements if "does not fit" in p.reason]
    assert len(misfits) >= 2
    assert len(compiled_segments) == len(set(compiled_segments))
    direct = tessera.compile(net, "tiny", calibration=calibration, force_cpu=misfits)
    assert [p.target for p in direct.placements] == [p.target for p in fallback.placements]
    for a, b in zip(fallback.compiled.accel_steps, direct.compiled.accel_steps, strict=True):
        assert a.program.program == b.program.program


@pytest.mark.parametrize("backend", ["sim", "rtl", "pynq"])
def test_one_model_runs_on_every_backend(backend: str) -> None:
    config = RTL_CONFIGS[0]
    model, feed = _compile("lenet", config)
    other = zoo.calibration_data(model.compiled.reference, 1, seed=8)[0]
    expected = [Model(model.compiled).run(x, backend="sim")[0] for x in (feed, other)]
    dev = device(backend, model.config)
    buffers_before = dev.counters()["live_buffers"]
    outputs, profile = model.run(feed, device=dev)
    np.testing.assert_array_equal(outputs["logits"], expected[0]["logits"])
    _assert_matches_onnxruntime(model, outputs, feed)
    assert profile.backend == backend and profile.accel_cycles > 0
    # The program stays loaded: later runs write only the input segment, and what one run
    # leaves in the arena, the outputs or the on-chip buffers does not reach the next.
    (step,) = model.compiled.accel_steps
    cp = step.program
    input_bytes = sum(cp.program.segment(cp.tensors[n].place.segment).size
                      for n in cp.device_inputs)
    assert input_bytes < sum(s.size for s in cp.program.segments) / 2
    resident = dev.counters()
    for x, want in zip((other, feed), expected[::-1]):
        before = dev.counters()["host_bytes_written"]
        outputs, _ = model.run(x, device=dev)
        np.testing.assert_array_equal(outputs["logits"], want["logits"])
        assert dev.counters()["host_bytes_written"] - before == input_bytes
    assert dev.counters()["live_buffers"] == resident["live_buffers"] > buffers_before
    model.close()
    assert dev.counters()["live_buffers"] == buffers_before


def test_profile_outputs(lenet, tmp_path) -> None:
    model, feed = lenet
    _, profile = model.run(feed)
    table = profile.table()
    assert "conv1_QConv" in table and "accelerator:" in table
    png = profile.write_timeline(tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import json
    trace = json.loads(profile.write_perfetto(tmp_path / "t.json").read_text())
    assert any(e.get("name") == "conv1_QConv" for e in trace["traceEvents"])
    d = profile.to_dict()
    assert d["accel_cycles"] == profile.accel_cycles


def test_compiled_models_print_their_placement(lenet) -> None:
    model, _ = lenet
    text = model.summary()
    assert "input_QuantizeLinear" in text and "accelerator" in text
    assert repr(model).startswith("Model(")


def test_loading_and_running_needs_no_compiler_dependencies(lenet, tmp_path) -> None:
    # A board has numpy, llvmlite and the runtime, not onnx, onnxruntime or amaranth.
    import subprocess
    import sys
    model, feed = lenet
    path = model.save(tmp_path / "lenet.tsr")
    np.save(tmp_path / "x.npy", feed["input"])
    expected, _ = model.run(feed)
    np.save(tmp_path / "want.npy", expected["logits"])
    script = f"""
import sys
for blocked in ("onnx", "onnxruntime", "amaranth", "pynq"):
    sys.modules[blocked] = None
import numpy as np
import tessera
model = tessera.load({str(path)!r})
out, profile = model.run(np.load({str(tmp_path / 'x.npy')!r}))
assert np.array_equal(out["logits"], np.load({str(tmp_path / 'want.npy')!r}))
assert profile.accel_cycles > 0
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_model_loads_its_program_again_when_the_device_lost_it(lenet) -> None:
    model, feed = lenet
    want, _ = model.run(feed)
    dev = model.device("sim")
    for buf in dev.buffers:
        buf.free()
    got, _ = model.run(feed)
    np.testing.assert_array_equal(got["logits"], want["logits"])
    assert dev.counters()["live_buffers"] > 0


def test_runs_report_progress_in_cycles(lenet) -> None:
    model, feed = lenet
    calls = []
    _, profile = model.run(feed, progress=lambda *a: calls.append(a))
    assert calls[-1] == ("done", 1, 1)
    cycles = [done for name, done, total in calls[:-1]]
    assert all(name == "accel0" and 0 <= done <= total for name, done, total in calls[:-1])
    assert cycles == sorted(cycles) and all(c <= profile.accel_cycles for c in cycles)
