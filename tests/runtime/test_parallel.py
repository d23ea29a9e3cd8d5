"""Inter-operator parallelism and cross-frame pipelining in the executor, on every
backend: outputs bit-identical to the sequential run, recurrent state carried from frame
to frame, the board projection's schedule, and errors.
"""
from __future__ import annotations

import json
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler import zoo
from tessera.errors import RunError
from tessera.hostmodel import get_host_model
from tessera.runtime.dataflow import run_units
from tessera.runtime.plan import Unit, frame_units, producers
from tessera.schedule import ACCELERATOR, CPU

from tests.programs import device

FEATURES = 32


def recurrent_branchy_model(seed: int = 0) -> onnx.ModelProto:
    """x, h -> h_out = relu(x W) + relu(h U) (accelerator), a softmax of x (CPU, beside
    it), logits = relu(h_out V) + relu(softmax(x) A); h_out is carried to the next frame."""
    rng = np.random.default_rng(seed)

    def weight(name, n, m):
        return numpy_helper.from_array((rng.standard_normal((n, m)) / np.sqrt(n))
                                       .astype(np.float32), name)
    def relu_matmul(a, w, out):   # a ReLU after each product keeps them apart at fusion
        return [helper.make_node("MatMul", [a, w], [f"{out}_mm"], name=f"{out}_mm"),
                helper.make_node("Relu", [f"{out}_mm"], [out], name=out)]
    nodes = [*relu_matmul("x", "W", "xw"), *relu_matmul("h", "U", "hu"),
             helper.make_node("Add", ["xw", "hu"], ["h_out"], name="h_out"),
             helper.make_node("Softmax", ["x"], ["attn"], name="attn", axis=-1),
             *relu_matmul("attn", "A", "ctx"), *relu_matmul("h_out", "V", "hv"),
             helper.make_node("Add", ["hv", "ctx"], ["logits"], name="logits")]
    sig = [1, FEATURES]
    graph = helper.make_graph(
        nodes, "recurrent_branchy",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, sig) for n in ("x", "h")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, sig) for n in ("logits", "h_out")],
        [weight(n, FEATURES, FEATURES) for n in "WUAV"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"tessera.recurrent_state": json.dumps({"h": "h_out"})})
    return model


@pytest.fixture(scope="module")
def model():
    net = recurrent_branchy_model()
    rng = np.random.default_rng(1)
    calibration = [{"x": rng.standard_normal((1, FEATURES)).astype(np.float32),
                    "h": np.abs(rng.standard_normal((1, FEATURES))).astype(np.float32)}
                   for _ in range(8)]
    # A CPU this slow leaves the matrix products to the accelerator at these small sizes.
    slow = get_host_model("cortex-a9").scaled(1000)
    return tessera.compile(net, "tiny", calibration=calibration, host=slow)


def _frames(n: int, seed: int = 3) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, FEATURES)).astype(np.float32)} for _ in range(n)]


def test_the_model_declares_its_state_and_has_both_kinds_of_step(model) -> None:
    assert model.compiled.state == {"h": "h_out"}
    kinds = {p.target for p in model.placements}
    assert {"accelerator", "cpu"} <= kinds


def test_state_survives_the_model_file(model, tmp_path) -> None:
    loaded = tessera.load(model.save(tmp_path / "m.tsr"))
    assert loaded.compiled.state == {"h": "h_out"}


@pytest.mark.parametrize("backend", ["sim", "rtl", "pynq"])
def test_parallel_runs_and_pipelined_streams_equal_sequential_ones(model, backend) -> None:
    dev = device(backend, model.config)
    frames = _frames(3)
    # The reference: each frame run alone, in order, h carried by hand, on the simulator.
    expected, h = [], np.zeros((1, FEATURES), np.float32)
    for feed in frames:
        out, _ = model.run({**feed, "h": h}, backend="sim")
        expected.append(out)
        h = out["h_out"]
    out, profile = model.run({**frames[0], "h": np.zeros((1, FEATURES), np.float32)},
                             device=dev, parallel=True)
    for name in out:
        np.testing.assert_array_equal(out[name], expected[0][name])
    assert profile.board.parallel and profile.backend == backend
    result = model.stream(frames, device=dev)
    assert len(result.outputs) == 3
    for got, want in zip(result.outputs, expected):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_the_board_projection_overlaps_cpu_work_with_the_accelerator(model) -> None:
    feed = {**_frames(1)[0], "h": np.zeros((1, FEATURES), np.float32)}
    _, seq = model.run(feed)
    _, par = model.run(feed, parallel=True)
    b_seq, b_par = seq.board, par.board
    assert b_seq.latency_seconds == pytest.approx(b_seq.sequential_seconds)
    assert b_par.sequential_seconds == pytest.approx(b_seq.sequential_seconds)
    assert b_par.latency_seconds < b_seq.latency_seconds
    busy = [t for t in b_par.schedule if t.end > t.start]
    softmax = next(t for t in busy if t.name == "attn_QSoftmax")
    assert any(t.start < softmax.end and softmax.start < t.end for t in busy
               if t.name.startswith("accel0")), "the softmax runs beside the first segment"
    assert "projected on the board" in par.table() and b_par.host in par.table()


def test_pipelining_raises_the_projected_frame_rate(model) -> None:
    frames = _frames(4)
    pipelined = model.stream(frames)
    one_by_one = model.stream(frames, pipelined=False)
    assert pipelined.fps > one_by_one.fps
    assert one_by_one.frame_latencies == pytest.approx([one_by_one.frame_latencies[0]] * 4)
    assert "frames/s" in pipelined.table()


def test_stream_errors_name_the_problem(model) -> None:
    frames = _frames(2)
    with pytest.raises(RunError, match="give them only in frame 0"):
        model.stream([frames[0], {**frames[1], "h": np.zeros((1, FEATURES), np.float32)}])
    with pytest.raises(RunError, match="must be a model input"):
        model.stream(frames, state={"logits": "h_out"})
    with pytest.raises(RunError, match="non-empty sequence"):
        model.stream(frames[0])


def test_frame_units_wait_for_producers_state_and_the_frame_before() -> None:
    net = zoo.mlp(hidden=(16,), in_features=32)
    compiled = tessera.compile(net, "tiny", calibration=zoo.calibration_data(net, 2)).compiled
    units = frame_units(compiled, 3)
    n = len(compiled.steps)
    writer = producers(compiled)
    for u_index, u in enumerate(units):
        step = compiled.steps[u.step]
        assert all(d < u_index for d in u.deps)
        assert {u.frame * n + writer[t] for t in step.inputs if t in writer} <= set(u.deps)
        if u.frame:
            assert u_index - n in u.deps             # its own step, one frame earlier


def test_a_failing_unit_stops_the_run_without_hanging() -> None:
    units = [Unit(k, 0, ()) for k in range(6)] + [Unit(6, 0, (0, 2))]
    started = []
    lock = threading.Lock()

    def run(unit: Unit):
        with lock:
            started.append(unit.step)
        if unit.step == 2:
            raise RunError("step 2 failed")
        return unit.step

    with pytest.raises(RunError, match="step 2 failed"):
        run_units(units, lambda u: CPU if u.step % 2 else ACCELERATOR, run, cores=2)
    assert 6 not in started             # its input's writer failed: it never starts


def test_units_run_after_their_dependencies_on_a_pool() -> None:
    order: list[int] = []
    lock = threading.Lock()
    units = [Unit(0, 0, ()), Unit(1, 0, (0,)), Unit(2, 0, (0,)), Unit(3, 0, (1, 2))]

    def run(unit: Unit):
        with lock:
            order.append(unit.step)
        return unit.step * 10

    runs = run_units(units, lambda u: ACCELERATOR if u.step == 1 else CPU, run, cores=2)
    assert [r.result for r in runs] == [0, 10, 20, 30]
    assert order[0] == 0 and order[-1] == 3
    assert runs[1].lane == ACCELERATOR and runs[2].lane.startswith("CPU")


def test_a_tensor_with_two_writers_is_refused(model) -> None:
    from dataclasses import replace
    steps = model.compiled.steps
    cpu = [k for k, s in enumerate(steps) if not hasattr(s, "program")]
    twice = replace(model.compiled, steps=[*steps, steps[cpu[0]]])
    with pytest.raises(RunError, match="is written by steps"):
        producers(twice)
