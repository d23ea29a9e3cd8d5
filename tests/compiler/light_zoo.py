"""The 9 classic CNNs that the onnx package bundles (``onnx/backend/test/data/light``),
as shipped and with random weights, quantized by Tessera or by onnxruntime, compiled,
run on the ``sim`` backend and compared with onnxruntime running the same QDQ model.

The shipped files build every weight as ``ConstantOfShape(0.02)``: equal weights hide
layout and transposition bugs, so :func:`with_random_weights` gives each weight,
bias and batch-norm parameter random values of its shape (He-normal weights, positive
variances, a fixed seed) and makes the logits (the input of the final ``Softmax``) an
output too, since a softmax over 1000 classes quantizes to nearly all zeros.

Used by ``tests/compiler/test_light_zoo.py`` and ``benchmarks/light_zoo.py``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime import quantization as ortq

import tessera
from tessera.compiler.golden.check import int8_agreement, output_scales, reference_outputs

from tests.compiler.qdq_models import Feed, ort_quantize

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
#: The models, smallest compile and run first.
MODELS = ["squeezenet", "inception_v1", "inception_v2", "shufflenet", "bvlc_alexnet",
          "zfnet512", "densenet121", "resnet50", "vgg19"]
INPUT_SHAPE = (1, 3, 224, 224)
#: How a QDQ model is made from the float one: Tessera's own quantization
#: (``tessera.compile(model, calibration=...)``), or onnxruntime's ``quantize_static``
#: (after its ``quant_pre_process``) with its default settings, with uint8 activations,
#: or per channel (from the model converted to opset 13, which per-channel scales need);
#: the QDQ model is then what ``tessera.compile`` is given.
QUANTIZERS: dict[str, dict | None] = {
    "tessera": None,
    "ort-default": {},
    "ort-u8-activations": dict(activation_type=ortq.QuantType.QUInt8),
    "ort-per-channel": dict(per_channel=True),
}
#: The ops of the layers that must run on the accelerator, before and after fusion.
LAYERS = ("Conv", "Gemm", "MatMul")
FUSED_LAYERS = ("QConv", "QGemm")


def shipped(name: str) -> onnx.ModelProto:
    """The model as onnx ships it (opset 9 or so, IR 3, ConstantOfShape weights)."""
    return onnx.load(str(LIGHT / f"light_{name}.onnx"))


def input_name(model: onnx.ModelProto) -> str:
    """The one real input (IR 3 lists the initializers as graph inputs too)."""
    constants = {t.name for t in model.graph.initializer}
    (name,) = [i.name for i in model.graph.input if i.name not in constants]
    return name


# ------------------------------------------------------------------ random weights
def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """``model`` with every float parameter (ConstantOfShape weights and float
    initializers read by a layer, a batch norm or a per-channel Mul/Add) replaced by
    random values of the same shape, the final Softmax's input as an extra output, and
    the initializers no longer listed as graph inputs (IR 4)."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    shapes = _tensor_shapes(out)
    consts = {t.name: t for t in graph.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))
    kept = []
    for node in graph.node:
        role = _role(readers, node.output[0]) if node.op_type == "ConstantOfShape" else None
        if role is None:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(consts[node.input[0]]))
        data = _random_parameter(rng, role, shape, shapes)
        graph.initializer.append(numpy_helper.from_array(data, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unread(graph)
    for tensor in graph.initializer:
        role = _role(readers, tensor.name)
        if role is not None and tensor.data_type == onnx.TensorProto.FLOAT:
            data = _random_parameter(rng, role, tuple(tensor.dims), shapes)
            tensor.CopyFrom(numpy_helper.from_array(data, tensor.name))
    _expose_logits(out, shapes)
    # IR 4: initializers are not graph inputs. onnxruntime's quantizer fails on an IR 3
    # model whose Reshape shapes are graph inputs (ShuffleNet's OC2_DUMMY_*): its
    # pre-processing folds their initializers away and then asks for them as inputs.
    constants = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in constants]
    del graph.input[:]
    graph.input.extend(inputs)
    out.ir_version = max(out.ir_version, 4)
    return out


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Drop the initializers (and their graph inputs) that no node reads any more: the
    shapes of the ConstantOfShape nodes replaced."""
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in read]
    inputs = [i for i in graph.input if i.name in read]
    del graph.initializer[:], graph.input[:]
    graph.initializer.extend(kept)
    graph.input.extend(inputs)


def _tensor_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    return {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in infos}


def _role(readers: Mapping[str, list[tuple[onnx.NodeProto, int]]], name: str
          ) -> tuple[onnx.NodeProto, int] | None:
    """The node and input index that parameter ``name`` ends up in, through
    Unsqueeze/Reshape; None if it is not a parameter (a shape, or read twice)."""
    while True:
        if len(readers.get(name, ())) != 1:
            return None
        node, index = readers[name][0]
        if node.op_type not in ("Unsqueeze", "Reshape") or index != 0:
            break
        name = node.output[0]
    known = {"Conv": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2, 3, 4),
             "Mul": (0, 1), "Add": (0, 1)}
    return (node, index) if index in known.get(node.op_type, ()) else None


def _random_parameter(rng: np.random.Generator, role: tuple[onnx.NodeProto, int],
                      shape: tuple[int, ...], shapes: Mapping[str, tuple[int, ...]]
                      ) -> np.ndarray:
    node, index = role
    size = int(np.prod(shape))
    if node.op_type in ("Conv", "Gemm") and index == 1:
        final = shapes[node.input[1]]
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        fan_in = (int(np.prod(final[1:])) if node.op_type == "Conv"
                  else final[1] if trans_b else final[0])
        data = rng.standard_normal(size) * np.sqrt(2.0 / fan_in)
    elif node.op_type == "Mul" or (node.op_type == "BatchNormalization" and index in (1, 4)):
        data = rng.uniform(0.5, 1.5, size)  # scales and variances: positive
    else:
        data = rng.standard_normal(size) * 0.1  # biases, shifts, means
    return data.astype(np.float32).reshape(shape)


def _expose_logits(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Make the input of a final Softmax a graph output too."""
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "Softmax" and node.output[0] in outputs:
            logits = node.input[0]
            model.graph.output.append(helper.make_tensor_value_info(
                logits, onnx.TensorProto.FLOAT, shapes[logits]))


# --------------------------------------------------------------------- inputs
def samples(model: onnx.ModelProto, n: int, seed: int = 0,
            shape: Sequence[int] = INPUT_SHAPE) -> list[Feed]:
    """``n`` input feeds: even ones standard normal noise, odd ones structured (smooth
    per-channel waves and gradients, like an image, normalised to unit spread)."""
    rng = np.random.default_rng(seed)
    name = input_name(model)
    feeds = []
    for k in range(n):
        if k % 2 == 0:
            x = rng.standard_normal(shape)
        else:
            h, w = np.meshgrid(np.linspace(0, 1, shape[2]), np.linspace(0, 1, shape[3]),
                               indexing="ij")
            x = np.stack([np.sin(2 * np.pi * (rng.uniform(0.5, 4) * h + rng.uniform(0.5, 4) * w)
                                 + rng.uniform(0, 6)) + rng.uniform(-1, 1) * (h - w)
                          for _ in range(shape[1])])[None]
            x = x + 0.1 * rng.standard_normal(shape)
        feeds.append({name: x.astype(np.float32)})
    return feeds


# ------------------------------------------------------------------ the check
@dataclass
class Result:
    """One model compiled, run on ``sim`` and compared with onnxruntime."""

    model: str
    quantizer: str
    nodes: int
    layers_on_accelerator: int
    layers: int
    identical: float
    max_steps: int
    compile_seconds: float
    sim_seconds: float
    #: Layers (the fused graph's nodes) left on the CPU, with the placement's reason.
    layers_on_cpu: tuple[str, ...] = ()
    #: "shipped" (ConstantOfShape(0.02)) or "random" (:func:`with_random_weights`).
    weights: str = "shipped"

    HEADER = (f"{'model':<14}{'weights':<9}{'quantizer':<20}{'nodes':>6}{'accel layers':>14}"
              f"{'identical':>11}{'max LSB':>9}{'compile s':>11}{'sim s':>8}  ok")

    def row(self) -> str:
        """This result as a row under :attr:`HEADER`."""
        layers = f"{self.layers_on_accelerator}/{self.layers}"
        return (f"{self.model:<14}{self.weights:<9}{self.quantizer:<20}{self.nodes:>6}"
                f"{layers:>14}{self.identical:>11.4%}{self.max_steps:>9}"
                f"{self.compile_seconds:>11.1f}{self.sim_seconds:>8.1f}  "
                f"{'yes' if self.accepted else 'NO'}")

    @property
    def accepted(self) -> bool:
        """The acceptance: every layer on the accelerator, >= 99.9% identical, 1 LSB."""
        return (self.layers_on_accelerator == self.layers and not self.layers_on_cpu
                and self.identical >= 0.999 and self.max_steps <= 1)


def quantized(model: onnx.ModelProto, quantizer: str, calibration: Sequence[Feed]
              ) -> onnx.ModelProto:
    """``model`` as ``tessera.compile`` is given it for ``quantizer`` (see QUANTIZERS):
    the float model for "tessera", onnxruntime's QDQ model otherwise."""
    options = QUANTIZERS[quantizer]
    if options is None:
        return model
    if options.get("per_channel") and model.opset_import[0].version < 13:
        # onnxruntime writes per-channel DequantizeLinear with an axis, which needs opset
        # 13; from an opset 9 model it writes an invalid one (which it refuses to run).
        model = onnx.version_converter.convert_version(model, 13)
    return ort_quantize(model, calibration, **options)


def compile_and_compare(name: str, model: onnx.ModelProto, quantizer: str,
                        calibration: Sequence[Feed], feed: Feed) -> Result:
    """Compile ``model`` quantized by ``quantizer`` for "pynq", run ``feed`` on ``sim``
    and compare every output with onnxruntime's on the reference QDQ model."""
    source = quantized(model, quantizer, calibration)
    start = time.perf_counter()
    compiled = tessera.compile(source, "pynq", calibration=list(calibration))
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    outputs, _ = compiled.run(feed, backend="sim")
    sim_seconds = time.perf_counter() - start
    reference = compiled.compiled.reference
    expected, scales = reference_outputs(reference, feed), output_scales(reference)
    agreements = [int8_agreement(outputs[k], expected[k], scales[k]) for k in outputs]
    placements = compiled.compiled.placements
    layers = sum(n.op_type in LAYERS for n in reference.graph.node)
    on_cpu = tuple(f"{p.node} ({p.op}): {p.reason}" for p in placements
                   if p.target != "accelerator" and p.op in (*LAYERS, *FUSED_LAYERS))
    return Result(name, quantizer, len(placements),
                  sum(p.target == "accelerator" and p.op in FUSED_LAYERS for p in placements),
                  layers, min(a.fraction for a in agreements),
                  max(a.max_steps for a in agreements), compile_seconds, sim_seconds, on_cpu)


def run(name: str, quantizer: str, *, random_weights: bool, seed: int = 0,
        calibration_samples: int = 4) -> Result:
    """The whole check for one model and quantizer (shipped or random weights)."""
    model = shipped(name)
    if random_weights:
        model = with_random_weights(model, seed)
    calibration = samples(model, calibration_samples, seed)
    feed = samples(model, 2, seed + 100)[1]
    result = compile_and_compare(name, model, quantizer, calibration, feed)
    result.weights = "random" if random_weights else "shipped"
    return result


#: The marked acceptance runs with random weights (``python -m pytest -m models``), within
#: CI's budget: one quantizer per model, the quantizers spread over them; SqueezeNet with
#: the others runs in the default tests at 64x64. ZFNet-512 (AlexNet's layers) and VGG-19
#: (minutes on ``sim``) run with random weights in ``benchmarks/light_zoo.py`` only, which
#: also runs every other pair.
ACCEPTANCE = [("squeezenet", "ort-u8-activations"), ("inception_v1", "ort-per-channel"),
              ("inception_v2", "ort-default"), ("shufflenet", "tessera"),
              ("bvlc_alexnet", "ort-default"), ("densenet121", "tessera"),
              ("resnet50", "tessera")]


# ------------------------------------------- as a published model (benchmarks/models.py)
@dataclass(frozen=True)
class LightZooModel:
    """A light-zoo CNN with random weights (:func:`with_random_weights`, written once to
    ``folder``) in the interface of ``tests.models.cases.WheelModel``, so that
    ``benchmarks/models.py`` measures it like a published model. Its task check: the
    same top-1 class as the float model (random weights have no meaning to check)."""

    name: str
    folder: Path
    seed: int = 0
    pending = exact_pending = task_pending = None

    @property
    def path(self) -> Path:
        path = self.folder / f"light_{self.name}_random{self.seed}.onnx"
        if not path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            onnx.save(with_random_weights(shipped(self.name), self.seed), str(path))
        return path

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {input_name(shipped(self.name)): INPUT_SHAPE}

    def feeds(self):
        from tests.models.cases import Feeds
        model = shipped(self.name)
        return Feeds(samples(model, 4, self.seed), samples(model, 2, self.seed + 100)[1])

    @staticmethod
    def task(published: list[np.ndarray], ours: list[np.ndarray]) -> tuple[bool, str]:
        theirs, mine = int(np.argmax(published[0])), int(np.argmax(ours[0]))
        return theirs == mine, f"top-1 class {mine} (float model: {theirs})"
