"""The model zoo: float32 ONNX models built in code from seeded numpy weights.

Nothing is downloaded: every model is generated from ``numpy.random.default_rng(seed)``,
so the same seed gives byte-identical models. Models are NCHW, opset 17, one input
``"input"``, one output ``"logits"``, batch 1 unless ``batch`` says otherwise (the
captioning frame also has recurrent state, ``h``/``c`` in and ``h_out``/``c_out`` out,
named in its metadata: :func:`recurrent_state`)::

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
every node's single output tensor is named after the node (the LSTM's two are the state
outputs), and each residual, separable or inception block's output is ``<block>.out``,
so tests can expose any layer.
"""
from __future__ import annotations

import json
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import onnx
from onnx import helper

from tessera.errors import CLI, PYTHON, CompileError, input_shape_fix

from .quantize import quantize_static
from .zoo_builder import INPUT, IR_VERSION, OPSET, OUTPUT, RECURRENT_STATE, Builder

__all__ = ["INPUT", "IR_VERSION", "OPSET", "OUTPUT", "RECURRENT_STATE", "ZOO",
           "calibration_data", "captioning", "inception", "input_shape", "lenet",
           "mac_count", "mlp", "mobilenet", "parameter_count", "recurrent_state", "resnet18",
           "small_resnet", "to_qdq"]

#: Inputs of each op that hold trainable parameters (PyTorch's ``numel`` count): weights,
#: biases and BatchNormalization's scale and shift, not its running statistics.
_PARAM_INPUTS = {"Conv": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2),
                 "LSTM": (1, 2, 3)}


def _conv_bn(b: Builder, x: str, prefix: str, conv: str, bn: str, cin: int, cout: int,
             kernel: int, stride: int = 1, group: int = 1) -> str:
    """Bias-free convolution followed by its BatchNormalization."""
    x = b.conv(x, f"{prefix}{conv}", cin, cout, kernel, stride, group=group)
    return b.bn(x, f"{prefix}{bn}", cout)


def _basic_block(b: Builder, x: str, prefix: str, cin: int, cout: int, stride: int) -> str:
    """ResNet basic block; the shortcut is a 1x1 projection + BN when the shape changes."""
    y = b.relu(_conv_bn(b, x, prefix, ".conv1", ".bn1", cin, cout, 3, stride), f"{prefix}.relu1")
    y = _conv_bn(b, y, prefix, ".conv2", ".bn2", cout, cout, 3)
    if stride != 1 or cin != cout:
        x = _conv_bn(b, x, prefix, ".downsample.0", ".downsample.1", cin, cout, 1, stride)
    y = b.add(y, x, f"{prefix}.add")
    return b.relu(y, f"{prefix}.relu2", output=f"{prefix}.out")


def _resnet_layers(b: Builder, x: str, cin: int, widths: Sequence[int],
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
    b = Builder(seed, (batch, in_features))
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
    b = Builder(seed, (batch, 1, 28, 28))
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
    b = Builder(seed, (batch, 3, image, image))
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
    b = Builder(seed, (batch, 3, image, image))
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
    b = Builder(seed, (batch, 3, image, image))
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


#: The captioning encoder's fused-MBConv blocks: (output channels, stride, expansion).
_FUSED_BLOCKS = ((16, 1, 1), (24, 2, 4), (24, 1, 4), (40, 2, 4), (40, 1, 4), (40, 1, 4),
                 (80, 2, 4), (80, 1, 4), (80, 1, 4), (112, 1, 4), (112, 1, 4), (192, 2, 4),
                 (192, 1, 4))


def _fused_mbconv_encoder(b: Builder, width: float, head: int) -> tuple[str, int]:
    """Stem conv 3x3/2 (32) + BN + Relu, then the :data:`_FUSED_BLOCKS` ``blocks.i``
    (``expand``: conv 3x3 with the block's stride to ``expansion x`` the input channels +
    BN + Relu; ``project``: conv 1x1 + BN; a residual Add when the shape is kept), then
    ``head`` conv 1x1 + BN + Relu; returns the head's output and channels."""
    cin = _scaled(32, width)
    x = b.relu(_conv_bn(b, INPUT, "", "conv1", "bn1", 3, cin, 3, 2), "relu1")
    for i, (channels, stride, expansion) in enumerate(_FUSED_BLOCKS):
        p, cout, mid = f"blocks.{i}", _scaled(channels, width), cin * expansion
        y = b.relu(_conv_bn(b, x, p, ".expand", ".expand_bn", cin, mid, 3, stride),
                   f"{p}.expand_relu")
        y = _conv_bn(b, y, p, ".project", ".project_bn", mid, cout, 1)
        residual = stride == 1 and cin == cout
        x, cin = (b.add(y, x, f"{p}.add", output=f"{p}.out") if residual else y), cout
    head = _scaled(head, width)
    return b.relu(_conv_bn(b, x, "", "head", "head_bn", cin, head, 1), "head_relu"), head


def _lstm_step(b: Builder, x: str, fin: int, hidden: int, state: tuple[str, str],
               state_out: tuple[str, str]) -> None:
    """One ONNX LSTM (forward, seq_len of ``x``) named ``lstm``, PyTorch's init
    (uniform +-1/sqrt(hidden)) for W (1, 4H, fin), R (1, 4H, H) and B (1, 8H); initial
    (h, c) from ``state``, final (Y_h, Y_c) into ``state_out``; Y is not produced."""
    bound = 1.0 / np.sqrt(hidden)
    w, r, bias = (b.const(f"lstm.{key}", b.rng.uniform(-bound, bound, shape))
                  for key, shape in (("W", (1, 4 * hidden, fin)),
                                     ("R", (1, 4 * hidden, hidden)), ("B", (1, 8 * hidden))))
    b.nodes.append(helper.make_node("LSTM", [x, w, r, bias, "", *state], ["", *state_out],
                                    name="lstm", hidden_size=hidden))


def captioning(seed: int = 0, image: int = 224, width: float = 1.0, head: int = 512,
               embed: int = 256, hidden: int = 256, vocab: int = 1000,
               batch: int = 1) -> onnx.ModelProto:
    """One video frame of a captioning model (the IIS seed's workload): a CNN encoder,
    then one step of an LSTM decoder whose state comes from the previous frame.

    The encoder on ``input`` ``(batch, 3, image, image)`` is MobileNet-like, but of
    fused-MBConv blocks (EfficientNet-EdgeTPU's, for accelerators that run depthwise
    convolutions slowly, as ours does at 1/16 efficiency): dense 3x3 and 1x1
    convolutions only (:func:`_fused_mbconv_encoder`; ``width`` scales the channels).
    Then GlobalAveragePool, Flatten, Gemm ``embed`` to ``embed`` features, Unsqueeze to
    a sequence of one step, and LSTM ``lstm`` (``hidden`` units) from the state inputs
    ``h`` and ``c`` ``(1, batch, hidden)``; its Y_h and Y_c are the outputs ``h_out`` and
    ``c_out``, and Y_h squeezed through Gemm ``fc`` gives the ``vocab`` word scores
    ``logits``. The metadata records ``{"h": "h_out", "c": "c_out"}`` under
    :data:`RECURRENT_STATE`. At the defaults (ImageNet's 224 pixels): 727 MMACs, the
    decoder's (LSTM and word scores) 0.78 M of them, so that the encoder of one frame
    outlasts the decoder step of the frame before (on the accelerator and a PYNQ board's
    CPU), as in the IIS seed's pipeline.
    Images below 96 pixels leave the last blocks too few pixels to measure their
    BatchNormalization statistics on, and the activations blow up.
    """
    b = Builder(seed, (batch, 3, image, image))
    x, channels = _fused_mbconv_encoder(b, width, head)
    x = b.flatten(b.node("GlobalAveragePool", [x], "avgpool"))
    x = b.gemm(x, "embed", channels, embed)
    axes = b.int64("axes", [0])
    x = b.node("Unsqueeze", [x, axes], "embed.unsqueeze")
    _lstm_step(b, x, embed, hidden, ("h", "c"), ("h_out", "c_out"))
    x = b.node("Squeeze", ["h_out", axes], "lstm.squeeze")
    b.gemm(x, "fc", hidden, vocab, output=OUTPUT)
    state = [(i, o, (1, batch, hidden)) for i, o in (("h", "h_out"), ("c", "c_out"))]
    return b.model("captioning", vocab, state=state)


#: GoogLeNet's inception blocks by stage (torchvision's names and widths): 1x1, 3x3
#: reduce, 3x3, 5x5 reduce, 5x5, pool projection.
_GOOGLENET_STAGES = (
    (("3a", (64, 96, 128, 16, 32, 32)), ("3b", (128, 128, 192, 32, 96, 64))),
    (("4a", (192, 96, 208, 16, 48, 64)), ("4b", (160, 112, 224, 24, 64, 64)),
     ("4c", (128, 128, 256, 24, 64, 64)), ("4d", (112, 144, 288, 32, 64, 64)),
     ("4e", (256, 160, 320, 32, 128, 128))),
    (("5a", (256, 160, 320, 32, 128, 128)), ("5b", (384, 192, 384, 48, 128, 128))),
)


def _basic_conv(b: Builder, x: str, name: str, cin: int, cout: int, kernel: int,
                stride: int = 1) -> str:
    """torchvision's BasicConv2d: ``<name>.conv`` (no bias) + ``<name>.bn`` + Relu."""
    return b.relu(_conv_bn(b, x, name, ".conv", ".bn", cin, cout, kernel, stride),
                  f"{name}.relu")


def _inception_block(b: Builder, x: str, name: str, cin: int,
                     widths: Sequence[int]) -> tuple[str, int]:
    """Four branches concatenated along the channels into ``<name>.out``: 1x1; 1x1 -> 3x3;
    1x1 -> 5x5 (GoogLeNet's paper; torchvision has a 3x3 there); MaxPool 3x3/1 -> 1x1."""
    c1, r3, c3, r5, c5, pool = widths
    p = f"{name}.branch"
    one = _basic_conv(b, x, f"{p}1", cin, c1, 1)
    three = _basic_conv(b, _basic_conv(b, x, f"{p}2.0", cin, r3, 1), f"{p}2.1", r3, c3, 3)
    five = _basic_conv(b, _basic_conv(b, x, f"{p}3.0", cin, r5, 1), f"{p}3.1", r5, c5, 5)
    pooled = _basic_conv(b, b.maxpool(x, f"{p}4.0", 3, 1, pad=1), f"{p}4.1", cin, pool, 1)
    return b.concat([one, three, five, pooled], f"{name}.concat", f"{name}.out"), \
        c1 + c3 + c5 + pool


def inception(seed: int = 0, image: int = 96, width: float = 1.0,
              stages: Sequence[int] = (2, 2, 1), classes: int = 100,
              batch: int = 1) -> onnx.ModelProto:
    """GoogLeNet (Inception v1) on ``(batch, 3, image, image)`` with torchvision's names.

    Stem ``conv1`` 7x7/2, ``maxpool1`` 3x3/2, ``conv2`` 1x1, ``conv3`` 3x3, ``maxpool2``
    3x3/2 (each conv a :func:`_basic_conv`; torchvision's ceil_mode pools as padding 1,
    the same sizes on even inputs), then the first ``stages[k]`` inception blocks of
    GoogLeNet's stages 3, 4 and 5 (``inception3a``, ...; :func:`_inception_block`) with
    ``maxpool3``/``maxpool4`` 3x3/2 between stages, GlobalAveragePool, Flatten, Gemm
    ``fc``. ``width`` scales every channel count (rounded to multiples of 8); ``stages``
    (2, 5, 2) is the whole GoogLeNet. At the defaults: 205 MMACs; as for
    :func:`captioning`, ``image`` should be at least 96.
    """
    b = Builder(seed, (batch, 3, image, image))
    c1, c2, c3 = (_scaled(c, width) for c in (64, 64, 192))
    x = b.maxpool(_basic_conv(b, INPUT, "conv1", 3, c1, 7, 2), "maxpool1", 3, 2, pad=1)
    x = _basic_conv(b, _basic_conv(b, x, "conv2", c1, c2, 1), "conv3", c2, c3, 3)
    x, cin = b.maxpool(x, "maxpool2", 3, 2, pad=1), c3
    for stage, (blocks, count) in enumerate(zip(_GOOGLENET_STAGES, stages)):
        if stage:
            x = b.maxpool(x, f"maxpool{stage + 2}", 3, 2, pad=1)
        for name, widths in blocks[:count]:
            x, cin = _inception_block(b, x, f"inception{name}", cin,
                                      [_scaled(c, width) for c in widths])
    b.classifier(x, cin, classes)
    return b.model("inception", classes)


#: Every zoo model by name; each takes ``seed`` and ``batch`` keywords.
ZOO: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp": mlp, "lenet": lenet, "small_resnet": small_resnet, "resnet18": resnet18,
    "mobilenet": mobilenet, "captioning": captioning, "inception": inception,
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
    not static, or that is not float. Recurrent state inputs (:func:`recurrent_state`)
    get the tanh of the draws instead: the range of an LSTM's h (its c is of that scale).
    """
    rng = np.random.default_rng(seed)
    types = _random_input_types(model, dict(input_shapes or {}))
    state = recurrent_state(model)

    def draw(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        # float32 draws for every float dtype: the zoo's samples stay what they always were
        x = rng.standard_normal(shape, dtype=np.float32)
        return (np.tanh(x) if name in state else x).astype(dtype, copy=False)
    return [{name: draw(name, shape, dtype) for name, (shape, dtype) in types.items()}
            for _ in range(n)]


def recurrent_state(model: onnx.ModelProto) -> dict[str, str]:
    """``{state input: output carried to the next run}`` from the model's
    :data:`RECURRENT_STATE` metadata; empty for a model without one.
    :class:`CompileError` if the entry is not such a JSON object over the model's inputs
    and outputs."""
    entry = next((p.value for p in model.metadata_props if p.key == RECURRENT_STATE), None)
    if entry is None:
        return {}
    try:
        state = json.loads(entry)
    except json.JSONDecodeError:
        state = None
    inputs = {v.name for v in model.graph.input}
    outputs = {v.name for v in model.graph.output}
    if not (isinstance(state, dict) and all(
            i in inputs and isinstance(o, str) and o in outputs for i, o in state.items())):
        example = json.dumps({"h": "h_out"})
        raise CompileError(
            f"model {model.graph.name!r} has metadata {RECURRENT_STATE}={entry!r}, which is "
            "not a JSON object mapping state inputs to the outputs carried to the next run "
            f"(inputs {sorted(inputs)}, outputs {sorted(outputs)})",
            fix={PYTHON: "set it with onnx.helper.set_model_props(model, "
                         f"{{{RECURRENT_STATE!r}: {example!r}}}) or remove it",
                 CLI: f"correct or remove the model's metadata_props entry {RECURRENT_STATE}"})
    return state


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
    """Multiply-accumulates of one forward pass: its Conv, (``transB=1``) Gemm and LSTM
    nodes (an LSTM's gate matrix products, not its elementwise gate arithmetic), in a
    float model or its QDQ form."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input,
                        *inferred.graph.output]}
    # a weight's shape from its initializer, or (a QDQ model's dequantized weight) inferred
    weights = {**shapes, **{t.name: list(t.dims) for t in model.graph.initializer}}
    total = 0
    for node in model.graph.node:
        if node.op_type in ("Conv", "Gemm"):
            # Each output element sums the product of a weight row: (in channels / group)
            # x kernel for a Conv weight (out, in / group, kh, kw), in features for a
            # Gemm's (out, in).
            total += int(np.prod(shapes[node.output[0]])) * int(np.prod(weights[node.input[1]][1:]))
        elif node.op_type == "LSTM":
            # Per step and batch row, W (D, 4H, I) and R (D, 4H, H) each times a vector.
            steps, rows = shapes[node.input[0]][:2]
            total += steps * rows * sum(int(np.prod(weights[node.input[i]])) for i in (1, 2))
    return total


def to_qdq(model: onnx.ModelProto, calibration: Sequence[dict[str, np.ndarray]],
           per_channel: bool = True, symmetric_activations: bool = False) -> onnx.ModelProto:
    """onnxruntime's static int8 QDQ quantization of ``model``: the compiler's golden reference.

    :func:`tessera.compiler.frontend.quantize.quantize_static` (see it for the scheme: BN folded by
    onnxruntime's pre-processing, MinMax calibration, int8 activations asymmetric unless
    ``symmetric_activations``, int8
    weights symmetric and per output channel unless ``per_channel`` is False, int32
    biases). Run the result with the session config entry ``session.qdqisint8allowed = 1``
    so onnxruntime's int8 kernels (not float fallbacks) run. ``model``'s metadata_props
    (e.g. :data:`RECURRENT_STATE`) are kept.
    """
    qdq = quantize_static(model, calibration, per_channel=per_channel,
                          symmetric_activations=symmetric_activations)
    # The recurrent state must reach the compiler; onnxruntime 1.31's quantizer keeps the
    # metadata_props, but nothing in its API promises to, so they are carried over here.
    helper.set_model_props(qdq, {**{p.key: p.value for p in model.metadata_props},
                                 **{p.key: p.value for p in qdq.metadata_props}})
    return qdq
