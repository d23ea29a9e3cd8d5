"""CPU lowerings of the recurrent layers: ONNX LSTM, GRU and RNN (float32) and
onnxruntime's ``com.microsoft`` DynamicQuantizeLSTM (int8/uint8 weights, inputs quantized
per call as onnxruntime does). Each node is one kernel step (:mod:`.rnn`,
:mod:`.rnn_quant`) with the loop over time inside; :data:`RNN_LOWERINGS` maps ``(domain,
op type)`` to its lowering (see :mod:`.lower`).
"""
from __future__ import annotations

import numpy as np

from .lower_plan import LowerFn, NodeLowering, Plan
from .rnn import ACTIVATIONS, DEFAULT_ACTIVATIONS, GATES, RecurrentSpec, build_recurrent
from .rnn_quant import QuantizedWeights, build_dynamic_quantize_lstm

__all__ = ["RNN_LOWERINGS"]

MS_DOMAIN = "com.microsoft"
_DIRECTIONS = {"forward": ("forward",), "reverse": ("reverse",),
               "bidirectional": ("forward", "reverse")}
#: ONNX input positions of the optional inputs after X, W, R.
_OPTIONAL = {"B": 3, "sequence_lens": 4, "initial_h": 5, "initial_c": 6, "P": 7}


def _text(value: object) -> str:
    """A string attribute (onnx gives bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _activations(low: NodeLowering, op: str, directions: int) -> tuple:
    """Per direction, the activations as onnxruntime reads them: names lower-cased,
    alpha/beta taken in order by the activations that use them, else defaults."""
    per_dir = len(DEFAULT_ACTIVATIONS[op])
    names = [_text(n) for n in low.attr("activations", [])] or \
        list(DEFAULT_ACTIVATIONS[op]) * directions
    low.require(len(names) == per_dir * directions,
                f"it has {len(names)} activations; {op} takes {per_dir} per direction "
                f"({per_dir * directions} here)")
    alphas = iter(float(a) for a in low.attr("activation_alpha", []))
    betas = iter(float(v) for v in low.attr("activation_beta", []))
    acts = []
    for name in names:
        key = name.lower()
        low.require(key in ACTIVATIONS, f"activation {name!r} is not one of "
                    f"{', '.join(sorted(ACTIVATIONS))}")
        _, alpha0, beta0, uses_alpha, uses_beta = ACTIVATIONS[key]
        alpha = next(alphas, alpha0) if uses_alpha else 0.0
        beta = next(betas, beta0) if uses_beta else 0.0
        acts.append((key, float(np.float32(alpha)), float(np.float32(beta))))
    return tuple(tuple(acts[d * per_dir:(d + 1) * per_dir]) for d in range(directions))


def _spec(low: NodeLowering, op: str, weight_dtypes: tuple[str, ...]) -> RecurrentSpec:
    """The node's :class:`RecurrentSpec`, its inputs checked."""
    node = low.node
    x = low.spec(node.input(0), ("float32",))
    low.require(len(x.shape) == 3, f"its input X has rank {len(x.shape)}, not 3")
    direction = _text(low.attr("direction", "forward"))
    low.require(direction in _DIRECTIONS, f"direction {direction!r} is not forward, reverse "
                "or bidirectional")
    dirs = _DIRECTIONS[direction]
    layout = int(low.attr("layout", 0))
    low.require(layout in (0, 1), f"layout {layout} is not 0 or 1")
    seq, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    w = low.spec(node.input(1), weight_dtypes)
    low.require(len(w.shape) == 3, f"its W has rank {len(w.shape)}, not 3")
    # W is [D, gates * H, I]; DynamicQuantizeLSTM's is [D, I, 4 * H].
    cell = "LSTM" if op == "DynamicQuantizeLSTM" else op
    rows = w.shape[2] if op == "DynamicQuantizeLSTM" else w.shape[1]
    hidden = int(low.attr("hidden_size", 0)) or rows // GATES[cell]
    low.require(hidden > 0, f"its hidden size is {hidden}")
    clip = low.attr("clip")
    present = {k: bool(node.input(i)) for k, i in _OPTIONAL.items()}
    for key in ("B", "initial_h", "initial_c", "P"):
        if present[key]:
            low.spec(node.input(_OPTIONAL[key]), ("float32",))
    if present["sequence_lens"]:
        low.spec(node.input(4), ("int32",))
    return RecurrentSpec(
        cell, dirs, seq, batch, x.shape[2], hidden, _activations(low, cell, len(dirs)),
        layout=layout, clip=None if clip is None else float(np.float32(clip)),
        input_forget=bool(low.attr("input_forget", 0)),
        linear_before_reset=bool(low.attr("linear_before_reset", 0)),
        has_bias=present["B"], has_seq_lens=present["sequence_lens"],
        has_initial_h=present["initial_h"],
        has_initial_c=present["initial_c"] and cell == "LSTM",
        has_peepholes=present["P"] and cell == "LSTM")


def _check_shapes(low: NodeLowering, spec: RecurrentSpec) -> None:
    """Every input has the shape its role needs (the kernel indexes by them)."""
    node = low.node
    expected = [(0, spec.x_shape())]
    d, gh, h = spec.num_directions, spec.gates * spec.hidden, spec.hidden
    if low.node.op != "DynamicQuantizeLSTM":
        expected += [(1, (d, gh, spec.input_size)), (2, (d, gh, h))]
    expected += [(3, (d, 2 * gh)), (4, (spec.batch,)), (5, spec.state_shape()),
                 (6, spec.state_shape()), (7, (d, 3 * h))]
    for i, shape in expected:
        name = node.input(i)
        if name:
            got = tuple(low.value(name).shape)
            low.require(got == shape, f"its input {i} ({name!r}) has shape {list(got)}; "
                        f"with hidden_size {h}, {d} direction(s) and X of shape "
                        f"{list(spec.x_shape())} it must be {list(shape)}")


def _outputs(low: NodeLowering, spec: RecurrentSpec) -> tuple[str, ...]:
    """The output names: the node's, or temporaries for those it leaves out."""
    names = []
    for k, what in enumerate(("Y", "Y_h", "Y_c")[:len(spec.output_specs())]):
        given = low.node.outputs[k] if k < len(low.node.outputs) else ""
        names.append(given or low.tmp(what))
    return tuple(names)


def _inputs(low: NodeLowering) -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
    """The present inputs among X, W, R, B, sequence_lens, initial_h, initial_c, P (in
    this order, the kernel's), and the constant ones' data."""
    names = tuple(n for n in low.node.inputs[:8] if n)
    constants = {n: low.graph.const(n) for n in names if low.graph.const(n) is not None}
    return names, constants


def _lower_recurrent(low: NodeLowering) -> list[Plan]:
    op = low.node.op
    spec = _spec(low, op, ("float32",))
    _check_shapes(low, spec)
    names, constants = _inputs(low)
    return [Plan(None, names, _outputs(low, spec), lambda: build_recurrent(spec), constants)]


def _lower_dynamic_quantize_lstm(low: NodeLowering) -> list[Plan]:
    """com.microsoft DynamicQuantizeLSTM: W [D, I, 4H] and R [D, H, 4H] constant int8 or
    uint8, their scales and zero points (inputs 8 to 11) constant, per direction or per
    direction and column."""
    spec = _spec(low, "DynamicQuantizeLSTM", ("int8", "uint8"))
    _check_shapes(low, spec)
    d, h = spec.num_directions, spec.hidden
    weights = []
    for k, (rows, what) in enumerate(((spec.input_size, "W"), (h, "R"))):
        data = low.const(low.node.input(1 + k), f"quantized weight {what}")
        low.require(data.shape == (d, rows, 4 * h), f"its {what} has shape "
                    f"{list(data.shape)}, expected {[d, rows, 4 * h]}")
        scale = low.const(low.node.input(8 + 2 * k), f"{what} scale").astype(np.float32)
        zero_point = low.const(low.node.input(9 + 2 * k), f"{what} zero point")
        low.require(scale.shape in ((d,), (d, 4 * h)) and zero_point.shape == scale.shape,
                    f"its {what} scale has shape {list(scale.shape)} and zero point "
                    f"{list(zero_point.shape)}; onnxruntime takes [{d}] or [{d}, {4 * h}] "
                    "for both")
        weights.append(QuantizedWeights.of(data, scale, zero_point))
    names, constants = _inputs(low)
    extra = {low.tmp("w_scale"): weights[0].scales(h), low.tmp("r_scale"): weights[1].scales(h)}
    constants.update(extra)
    y_requested = bool(low.node.outputs and low.node.outputs[0])
    return [Plan(None, names + tuple(extra), _outputs(low, spec),
                 lambda: build_dynamic_quantize_lstm(spec, *weights, y_requested),
                 constants)]


#: (domain, op type) -> lowering.
RNN_LOWERINGS: dict[tuple[str, str], LowerFn] = {
    ("", "LSTM"): _lower_recurrent,
    ("", "GRU"): _lower_recurrent,
    ("", "RNN"): _lower_recurrent,
    (MS_DOMAIN, "DynamicQuantizeLSTM"): _lower_dynamic_quantize_lstm,
}
