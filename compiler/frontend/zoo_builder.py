"""How the zoo builds a model: :class:`Builder` adds nodes and seeded weights and runs
the graph on a probe input in float64 numpy, so BatchNormalization statistics can be
measured as training would; the zoo's models (:mod:`.zoo`) are written with it.
"""
from __future__ import annotations

import json
from typing import Callable, Optional, Sequence

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

__all__ = ["Builder", "INPUT", "IR_VERSION", "OPSET", "OUTPUT", "RECURRENT_STATE"]


OPSET = 17
#: The IR version onnx pairs with opset 17 (onnx 1.12); onnxruntime 1.31 reads it.
IR_VERSION = 8
INPUT = "input"
OUTPUT = "logits"
_BN_EPS = 1e-5
#: The metadata_props key of a model with state carried from one run to the next (an
#: RNN's h and c across video frames): a JSON object ``{state input: output}``, the
#: output of one run being the input of the next.
RECURRENT_STATE = "tessera.recurrent_state"


def _round_bits(x: np.ndarray, bits: int = 16) -> np.ndarray:
    """Round to ``bits`` significant bits."""
    mantissa, exponent = np.frexp(x)
    return np.ldexp(np.round(mantissa * 2.0**bits), exponent - bits)


def _conv2d(x: np.ndarray, w: np.ndarray, stride: int, pad: int, group: int) -> np.ndarray:
    """NCHW convolution of the probe (numpy reference, one tensordot per group)."""
    k = w.shape[-1]
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    cin, cout = w.shape[1], w.shape[0] // group
    out = [np.tensordot(windows[:, g * cin:(g + 1) * cin], w[g * cout:(g + 1) * cout],
                        axes=([1, 4, 5], [1, 2, 3])) for g in range(group)]
    return np.concatenate(out, axis=-1).transpose(0, 3, 1, 2)


def _maxpool2d(x: np.ndarray, kernel: int, stride: int, pad: int) -> np.ndarray:
    """NCHW max pooling of the probe; padding never wins, as in ONNX."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    windows = sliding_window_view(x, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
    return windows.max(axis=(4, 5))


class Builder:
    """Accumulates the nodes and initializers of one model, drawing weights from one RNG.

    It also evaluates the graph lazily, in float64 numpy, on a probe input (standard
    normal, batch 1: the distribution of :func:`.zoo.calibration_data`), so BatchNormalization
    statistics can be those of the activations they normalise, as in a trained network.
    """

    def __init__(self, seed: int, input_shape: Sequence[int]) -> None:
        self.rng = np.random.default_rng(seed)
        self.input_shape = list(input_shape)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        #: Every initializer as stored (float32) but widened to float64, for the probe.
        self.params: dict[str, np.ndarray] = {}
        # A separate stream, so the weights do not depend on whether the probe is drawn;
        # batch 1 so they do not depend on ``batch`` either.
        probe_shape = (1, *input_shape[1:])
        self._forward: dict[str, Callable[[], np.ndarray]] = {
            INPUT: lambda: np.random.default_rng([seed, 1]).standard_normal(probe_shape)}
        self._values: dict[str, np.ndarray] = {}

    def value(self, name: str) -> np.ndarray:
        """The probe's value of a tensor, computed on first use."""
        if name not in self._values:
            self._values[name] = self._forward[name]()
        return self._values[name]

    def const(self, name: str, value: np.ndarray) -> str:
        """Add a float32 initializer; return its name."""
        value = np.asarray(value, np.float32)
        self.initializers.append(numpy_helper.from_array(value, name))
        self.params[name] = value.astype(np.float64)
        return name

    def node(self, op: str, inputs: Sequence[str], name: str,
             forward: Optional[Callable[[], np.ndarray]] = None, output: Optional[str] = None,
             **attrs) -> str:
        """Add a node whose output is named ``output`` or after the node; return the output.

        ``forward`` computes the output's probe value; only nodes upstream of a
        BatchNormalization need one.
        """
        output = output or name
        self.nodes.append(helper.make_node(op, list(inputs), [output], name=name, **attrs))
        if forward is not None:
            self._forward[output] = forward
        return output

    def he(self, shape: tuple[int, ...], fan_in: int, gain: float = 2.0) -> np.ndarray:
        """He-normal weights; gain 2 keeps the second moment through a ReLU, 1 through none."""
        return self.rng.normal(0.0, np.sqrt(gain / fan_in), shape)

    def bias(self, n: int, fan_in: int) -> np.ndarray:
        """PyTorch's default bias init: small but not zero, so the bias path is exercised."""
        bound = 1.0 / np.sqrt(fan_in)
        return self.rng.uniform(-bound, bound, n)

    def conv(self, x: str, name: str, cin: int, cout: int, kernel: int, stride: int = 1, *,
             group: int = 1, pad: Optional[int] = None, bias: bool = False) -> str:
        """Square convolution, padded ``kernel // 2`` unless ``pad`` says otherwise."""
        fan_in = cin // group * kernel * kernel
        inputs = [x, self.const(f"{name}.weight",
                                self.he((cout, cin // group, kernel, kernel), fan_in))]
        if bias:
            inputs.append(self.const(f"{name}.bias", self.bias(cout, fan_in)))
        pad = kernel // 2 if pad is None else pad

        def forward() -> np.ndarray:
            y = _conv2d(self.value(x), self.params[inputs[1]], stride, pad, group)
            return y + self.params[inputs[2]][:, None, None] if bias else y
        return self.node("Conv", inputs, name, forward, kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=[pad] * 4, group=group)

    def bn(self, x: str, name: str, channels: int) -> str:
        """BatchNormalization with gamma ~ N(1, 0.1), beta ~ N(0, 0.1) and, as running
        statistics, the probe's per-channel mean and variance of ``x`` (what training
        converges to), rounded to 16 bits so that float64 rounding differences between
        BLAS builds practically never change the stored float32s.
        """
        probe = self.value(x)
        # A channel the probe never excites would get variance 0 and an exploding scale.
        var = np.maximum(probe.var(axis=(0, 2, 3)), 1e-3)
        stats = {"weight": self.rng.normal(1.0, 0.1, channels),
                 "bias": self.rng.normal(0.0, 0.1, channels),
                 "running_mean": _round_bits(probe.mean(axis=(0, 2, 3))),
                 "running_var": _round_bits(var)}
        inputs = [x] + [self.const(f"{name}.{key}", v) for key, v in stats.items()]

        def forward() -> np.ndarray:
            gamma, beta, mean, var = (self.params[i][:, None, None] for i in inputs[1:])
            return (self.value(x) - mean) / np.sqrt(var + _BN_EPS) * gamma + beta
        return self.node("BatchNormalization", inputs, name, forward, epsilon=_BN_EPS)

    def int64(self, name: str, values: Sequence[int]) -> str:
        """An int64 Constant node (axes, shapes): not an initializer, so the initializers
        stay the float32 weights; return its output."""
        return self.node("Constant", [], name,
                         value=numpy_helper.from_array(np.asarray(values, np.int64), name))

    def relu(self, x: str, name: str, output: Optional[str] = None) -> str:
        """ReLU."""
        return self.node("Relu", [x], name, lambda: np.maximum(self.value(x), 0.0), output)

    def relu6(self, x: str, name: str, output: Optional[str] = None) -> str:
        """ReLU6 as Clip, whose bounds are inputs (not attributes) since opset 11."""
        bounds = [self.const(f"{name}.{bound}", np.array(v))
                  for bound, v in (("min", 0.0), ("max", 6.0))]
        return self.node("Clip", [x, *bounds], name, lambda: np.clip(self.value(x), 0.0, 6.0),
                         output)

    def add(self, a: str, b: str, name: str, output: Optional[str] = None) -> str:
        """Elementwise sum (a residual connection)."""
        return self.node("Add", [a, b], name, lambda: self.value(a) + self.value(b), output)

    def maxpool(self, x: str, name: str, kernel: int, stride: int, pad: int = 0) -> str:
        """Square max pooling."""
        return self.node("MaxPool", [x], name,
                         lambda: _maxpool2d(self.value(x), kernel, stride, pad),
                         kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)

    def concat(self, parts: Sequence[str], name: str, output: Optional[str] = None) -> str:
        """Concatenation along the channels."""
        return self.node("Concat", parts, name,
                         lambda: np.concatenate([self.value(p) for p in parts], axis=1),
                         output, axis=1)

    def flatten(self, x: str) -> str:
        """Flatten to (batch, features)."""
        return self.node("Flatten", [x], "flatten", axis=1)

    def gemm(self, x: str, name: str, fin: int, fout: int, *, relu_follows: bool = False,
             output: Optional[str] = None) -> str:
        """Dense layer ``x @ W.T + b`` with W stored (out, in), as PyTorch exports it."""
        weight = self.const(f"{name}.weight",
                            self.he((fout, fin), fin, gain=2.0 if relu_follows else 1.0))
        bias = self.const(f"{name}.bias", self.bias(fout, fin))
        return self.node("Gemm", [x, weight, bias], name, output=output, transB=1)

    def classifier(self, x: str, features: int, classes: int) -> str:
        """GlobalAveragePool, Flatten, Gemm to the logits."""
        x = self.flatten(self.node("GlobalAveragePool", [x], "avgpool"))
        return self.gemm(x, "fc", features, classes, output=OUTPUT)

    def model(self, name: str, classes: int, *,
              state: Sequence[tuple[str, str, Sequence[int]]] = ()) -> onnx.ModelProto:
        """Wrap the nodes into a ModelProto that passes the full checker.

        ``state`` lists recurrent state as ``(input, output, shape)``: each is a float
        input and output of the model besides ``input`` and ``logits``, and the pairs are
        recorded in the metadata under :data:`RECURRENT_STATE`.
        """
        shape = self.input_shape
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
             for n, s in [(INPUT, shape)] + [(i, s) for i, _, s in state]],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
             for n, s in [(OUTPUT, [shape[0], classes])] + [(o, s) for _, o, s in state]],
            self.initializers)
        model = helper.make_model(graph, producer_name="tessera.zoo",
                                  opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        if state:
            helper.set_model_props(model, {RECURRENT_STATE: json.dumps(
                {i: o for i, o, _ in state})})
        onnx.checker.check_model(model, full_check=True)
        return model
