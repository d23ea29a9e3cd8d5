"""The model zoo: float32 ONNX models built in code from seeded numpy weights.

Nothing is downloaded: every model is generated from ``numpy.random.default_rng(seed)``,
so the same seed gives byte-identical models. Models are NCHW, opset 17, one input
``"input"``, one output ``"logits"``, batch 1 unless ``batch`` says otherwise::

    from tessera.compiler import zoo
    model = zoo.resnet18(seed=0)
    calibration = zoo.calibration_data(model)
    golden = zoo.to_qdq(model, calibration)   # onnxruntime's int8 QDQ model

Weights are random, not trained, but shaped like trained ones: convolutions and dense
layers are He-initialised, and every BatchNormalization has gamma ~ N(1, 0.1),
beta ~ N(0, 0.1) and, as running statistics, the mean and variance of the activations it
normalises (measured on a probe input, as training would), so activations keep a unit-ish
scale through deep stacks. The BatchNormalization nodes stay in the float models: folding
them is the compiler's job (and, for the golden reference, onnxruntime's pre-processing in
:func:`to_qdq`).

Layer names follow torchvision where there is a torchvision model (``layer2.0.downsample.0``);
every node's single output tensor is named after the node, and each residual or separable
block's output is ``<block>.out``, so tests can expose any layer.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

from tessera.errors import CompileError, input_shape_fix

from .quantize import quantize_static

OPSET = 17
#: The IR version onnx pairs with opset 17 (onnx 1.12); onnxruntime 1.31 reads it.
IR_VERSION = 8
INPUT = "input"
OUTPUT = "logits"
_BN_EPS = 1e-5

#: Inputs of each op that hold trainable parameters (PyTorch's ``numel`` count): weights,
#: biases and BatchNormalization's scale and shift, not its running statistics.
_PARAM_INPUTS = {"Conv": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2)}


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


class _Builder:
    """Accumulates the nodes and initializers of one model, drawing weights from one RNG.

    It also evaluates the graph lazily, in float64 numpy, on a probe input (standard
    normal, batch 1: the distribution of :func:`calibration_data`), so BatchNormalization
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

    def relu(self, x: str, name: str, output: Optional[str] = None) -> str:
        """ReLU."""
        return self.node("Relu", [x], name, lambda: np.maximum(self.value(x), 0.0), output)

    def relu6(self, x: str, name: str, output: Optional[str] = None) -> str:
        """ReLU6 as Clip, whose bounds are inputs (not attributes) since opset 11."""
        bounds = [self.const(f"{name}.{bound}", np.array(v))
                  for bound, v in (("min", 0.0), ("max", 6.0))]
        return self.node("Clip", [x, *bounds], name, lambda: np.clip(self.value(x), 0.0, 6.0),
                         output)

    def add(self, a: str, b: str, name: str) -> str:
        """Elementwise sum (a residual connection)."""
        return self.node("Add", [a, b], name, lambda: self.value(a) + self.value(b))

    def maxpool(self, x: str, name: str, kernel: int, stride: int, pad: int = 0) -> str:
        """Square max pooling."""
        return self.node("MaxPool", [x], name,
                         lambda: _maxpool2d(self.value(x), kernel, stride, pad),
                         kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)

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

    def model(self, name: str, classes: int) -> onnx.ModelProto:
        """Wrap the nodes into a ModelProto that passes the full checker."""
        shape = self.input_shape
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [shape[0], classes])],
            self.initializers)
        model = helper.make_model(graph, producer_name="tessera.zoo",
                                  opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model


def _conv_bn(b: _Builder, x: str, prefix: str, conv: str, bn: str, cin: int, cout: int,
             kernel: int, stride: int = 1, group: int = 1) -> str:
    """Bias-free convolution followed by its BatchNormalization."""
    x = b.conv(x, f"{prefix}{conv}", cin, cout, kernel, stride, group=group)
    return b.bn(x, f"{prefix}{bn}", cout)


def _basic_block(b: _Builder, x: str, prefix: str, cin: int, cout: int, stride: int) -> str:
    """ResNet basic block; the shortcut is a 1x1 projection + BN when the shape changes."""
    y = b.relu(_conv_bn(b, x, prefix, ".conv1", ".bn1", cin, cout, 3, stride), f"{prefix}.relu1")
    y = _conv_bn(b, y, prefix, ".conv2", ".bn2", cout, cout, 3)
    if stride != 1 or cin != cout:
        x = _conv_bn(b, x, prefix, ".downsample.0", ".downsample.1", cin, cout, 1, stride)
    y = b.add(y, x, f"{prefix}.add")
    return b.relu(y, f"{prefix}.relu2", output=f"{prefix}.out")


def _resnet_layers(b: _Builder, x: str, cin: int, widths: Sequence[int],
                   blocks: Sequence[int]) -> str:
    """Stages ``layer1``, ``layer2``, ...; every stage but the first starts with stride 2."""
    for stage, (width, count) in enumerate(zip(widths, blocks)):
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            x = _basic_block(b, x, f"layer{stage + 1}.{i}", cin, width, stride)
            cin = width
    return x


def mlp(seed: int = 0, in_features: int = 784, hidden: Sequence[int] = (256, 128),
        classes: int = 10, batch: int = 1) -> onnx.ModelProto:
    """Multi-layer perceptron on a ``(batch, in_features)`` input.

    One Gemm + Relu per entry of ``hidden`` (``fc1``, ``fc2``, ...), then Gemm ``fc`` to
    ``classes`` logits. The input is already flat, so there is no Flatten.
    """
    b = _Builder(seed, (batch, in_features))
    x, fin = INPUT, in_features
    for i, width in enumerate(hidden, 1):
        x = b.relu(b.gemm(x, f"fc{i}", fin, width, relu_follows=True), f"relu{i}")
        fin = width
    b.gemm(x, "fc", fin, classes, output=OUTPUT)
    return b.model("mlp", classes)


def lenet(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """LeNet-style CNN on ``(batch, 1, 28, 28)``, 10 classes.

    Twice (unpadded Conv 5x5 with bias, Relu, MaxPool 2x2): 1->20->50 channels and
    28 -> 24 -> 12 -> 8 -> 4 pixels; then Flatten, Gemm 800->500 + Relu, Gemm 500->10.
    """
    b = _Builder(seed, (batch, 1, 28, 28))
    x = INPUT
    for i, (cin, cout) in enumerate(((1, 20), (20, 50)), 1):
        x = b.conv(x, f"conv{i}", cin, cout, 5, pad=0, bias=True)
        x = b.maxpool(b.relu(x, f"relu{i}"), f"pool{i}", 2, 2)
    x = b.flatten(x)
    x = b.relu(b.gemm(x, "fc1", 50 * 4 * 4, 500, relu_follows=True), "relu3")
    b.gemm(x, "fc2", 500, 10, output=OUTPUT)
    return b.model("lenet", 10)


def small_resnet(seed: int = 0, width: int = 16, blocks: Sequence[int] = (1, 1, 1),
                 image: int = 32, classes: int = 10, batch: int = 1) -> onnx.ModelProto:
    """CIFAR-style ResNet on ``(batch, 3, image, image)``.

    Stem conv 3x3 (``width`` channels) + BN + Relu, then one stage per entry of ``blocks``
    with ``width * 2**stage`` channels; stages after the first halve the resolution and
    start with a 1x1 stride-2 projection shortcut. Then GlobalAveragePool, Flatten, Gemm.
    The default (1, 1, 1) is a ResNet-8; (3, 3, 3) is He et al.'s ResNet-20.
    """
    b = _Builder(seed, (batch, 3, image, image))
    x = b.relu(_conv_bn(b, INPUT, "", "conv1", "bn1", 3, width, 3), "relu")
    widths = [width * 2**stage for stage in range(len(blocks))]
    x = _resnet_layers(b, x, width, widths, blocks)
    b.classifier(x, widths[-1], classes)
    return b.model("small_resnet", classes)


def resnet18(seed: int = 0, image: int = 224, classes: int = 1000,
             batch: int = 1) -> onnx.ModelProto:
    """torchvision's ResNet-18 on ``(batch, 3, image, image)``, with its layer names.

    Conv 7x7/2 (64) + BN + Relu, MaxPool 3x3/2 pad 1, layers [2, 2, 2, 2] of basic blocks
    with widths 64, 128, 256, 512 (a 1x1/2 conv + BN downsample in the first block of
    layers 2-4), GlobalAveragePool, Flatten, Gemm 512->classes: 11,689,512 parameters
    and 1.8 GMACs at 224x224 with 1000 classes.
    """
    b = _Builder(seed, (batch, 3, image, image))
    x = b.relu(_conv_bn(b, INPUT, "", "conv1", "bn1", 3, 64, 7, 2), "relu")
    x = b.maxpool(x, "maxpool", 3, 2, pad=1)
    x = _resnet_layers(b, x, 64, (64, 128, 256, 512), (2, 2, 2, 2))
    b.classifier(x, 512, classes)
    return b.model("resnet18", classes)


#: MobileNet v1's depthwise-separable blocks: (output channels, stride) at width 1.0.
_MOBILENET_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                     (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))


def _scaled(channels: int, width: float) -> int:
    """Channels times the width multiplier, rounded to a multiple of 8 (never below 8)."""
    return max(8, int(channels * width + 4) // 8 * 8)


def mobilenet(seed: int = 0, image: int = 96, width: float = 1.0, classes: int = 100,
              batch: int = 1) -> onnx.ModelProto:
    """MobileNet v1 on ``(batch, 3, image, image)``, every activation a ReLU6 (ONNX Clip 0..6).

    Stem conv 3x3/2 (32 channels) + BN + ReLU6, then v1's 13 depthwise-separable blocks
    ``blocks.i`` (depthwise 3x3 with group = channels + BN + ReLU6, pointwise 1x1 + BN +
    ReLU6), five of them stride 2 (32x downsampling in all), then GlobalAveragePool, Flatten,
    Gemm. ``width`` scales every channel count (rounded to multiples of 8).
    """
    b = _Builder(seed, (batch, 3, image, image))
    cin = _scaled(32, width)
    x = b.relu6(_conv_bn(b, INPUT, "", "conv1", "bn1", 3, cin, 3, 2), "relu1")
    for i, (channels, stride) in enumerate(_MOBILENET_BLOCKS):
        p, cout = f"blocks.{i}", _scaled(channels, width)
        x = b.relu6(_conv_bn(b, x, p, ".dw", ".dw_bn", cin, cin, 3, stride, group=cin),
                    f"{p}.dw_relu")
        x = b.relu6(_conv_bn(b, x, p, ".pw", ".pw_bn", cin, cout, 1), f"{p}.pw_relu",
                    output=f"{p}.out")
        cin = cout
    b.classifier(x, cin, classes)
    return b.model("mobilenet", classes)


#: Every zoo model by name; each takes ``seed`` and ``batch`` keywords.
ZOO: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp": mlp, "lenet": lenet, "small_resnet": small_resnet, "resnet18": resnet18,
    "mobilenet": mobilenet,
}


def input_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    """The static shape of the model's (single) input."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return tuple(d.dim_value for d in dims)


def calibration_data(model: onnx.ModelProto, n: int = 8, seed: int = 0,
                     input_shapes: Optional[Mapping[str, Sequence[int]]] = None
                     ) -> list[dict[str, np.ndarray]]:
    """``n`` random input feeds for the model, standard normal in each input's float dtype.

    Standard normal is the range of normalised images (ImageNet's mean/std normalisation
    maps pixels to about [-2.1, 2.6]) and what the He-initialised weights are scaled for.
    ``input_shapes`` (``{name: shape}``) gives the shape of inputs with dynamic dims, as
    for :func:`tessera.compile`; :class:`CompileError` names an input whose shape is still
    not static, or that is not float.
    """
    rng = np.random.default_rng(seed)
    types = _random_input_types(model, dict(input_shapes or {}))
    # float32 draws for every float dtype: the zoo's samples stay what they always were
    return [{name: rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
             for name, (shape, dtype) in types.items()} for _ in range(n)]


def _random_input_types(model: onnx.ModelProto, given: dict[str, Sequence[int]]
                        ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``{input name: (shape, dtype)}`` of the model's inputs (not its initializers, which
    old models list as inputs too), shapes from ``given`` first."""
    weights = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in weights]
    if not inputs:
        raise CompileError(f"model {model.graph.name!r} has no inputs to make samples for: "
                           "the file is empty, truncated or not an ONNX model")
    types = {}
    for value in inputs:
        ttype = value.type.tensor_type
        dtype = (np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type))
                 if ttype.elem_type else None)
        if dtype is None or dtype.kind != "f":
            raise CompileError(f"input {value.name!r} is {dtype or 'not a tensor'}: random "
                               "calibration makes float samples only; give samples of your "
                               "own")
        if value.name in given:
            shape = tuple(int(d) for d in given[value.name])
        elif ttype.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else None
                          for d in ttype.shape.dim)
        else:
            shape = None
        if shape is None or any(d is None or d <= 0 for d in shape):
            known = shape or ()
            example = tuple(d if d and d > 0 else 1 for d in known) or (1, 3, 224, 224)
            raise CompileError(f"input {value.name!r} has dynamic dims (shape "
                               f"{['?' if not d or d <= 0 else d for d in known]}): random "
                               "samples need the sizes you will run",
                               fix=input_shape_fix(value.name, example))
        types[value.name] = (shape, dtype)
    return types


def parameter_count(model: onnx.ModelProto) -> int:
    """Trainable parameters as PyTorch counts them: Conv and Gemm weights and biases and
    BatchNormalization's scale and shift (not its running statistics)."""
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    return sum(sizes[node.input[i]] for node in model.graph.node
               for i in _PARAM_INPUTS.get(node.op_type, ()) if i < len(node.input))


def mac_count(model: onnx.ModelProto) -> int:
    """Multiply-accumulates of one forward pass: its Conv and (``transB=1``) Gemm nodes."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.output]}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    # Each output element sums the product of a weight row: (in channels / group) x
    # kernel for a Conv weight (out, in / group, kh, kw), in features for a Gemm's (out, in).
    return sum(int(np.prod(shapes[node.output[0]])) * int(np.prod(weights[node.input[1]][1:]))
               for node in model.graph.node if node.op_type in ("Conv", "Gemm"))


def to_qdq(model: onnx.ModelProto, calibration: Sequence[dict[str, np.ndarray]],
           per_channel: bool = True, symmetric_activations: bool = False) -> onnx.ModelProto:
    """onnxruntime's static int8 QDQ quantization of ``model``: the compiler's golden reference.

    :func:`tessera.compiler.frontend.quantize.quantize_static` (see it for the scheme: BN folded by
    onnxruntime's pre-processing, MinMax calibration, int8 activations asymmetric unless
    ``symmetric_activations``, int8
    weights symmetric and per output channel unless ``per_channel`` is False, int32
    biases). Run the result with the session config entry ``session.qdqisint8allowed = 1``
    so onnxruntime's int8 kernels (not float fallbacks) run.
    """
    return quantize_static(model, calibration, per_channel=per_channel,
                           symmetric_activations=symmetric_activations)
