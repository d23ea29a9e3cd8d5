"""The layers of a float ONNX model a pruner may change, and their weights in one
orientation.

A prunable layer is a Conv with ``group`` 1, a Gemm or a 2-D MatMul whose weight (input 1)
is a float initializer used by that node alone. Its weight is handled as ``(O, I, *taps)``
-- the orientation of :mod:`tessera.sparsity`'s blocks -- whatever its layout in the
file: a Gemm with ``transB=0`` and a MatMul keep theirs as ``(K, N)``, the transpose. A
dense layer reading the ``Flatten`` of an image ``(C, H, W)`` is seen as ``(O, C, H, W)``:
the compiler runs it as a convolution whose kernel covers the image
(``compiler/accel/lower.py``'s ``convert_flattened_gemms``, and the CPU kernels likewise),
so its blocks and N:M groups run along the channels at each pixel.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from tessera.errors import CLI, PYTHON, CompileError

__all__ = ["Layer", "QUANTIZED_OPS", "find_layers", "node_name", "weight_arrays"]

#: Ops only a quantized model holds: the pruner works on float models.
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv",
                           "QLinearMatMul", "ConvInteger", "MatMulInteger",
                           "DynamicQuantizeLinear", "QGemm"})


@dataclass(frozen=True)
class Layer:
    """One prunable layer: its node, weight initializer and work."""

    node: str            #: node name (``op:output`` when the node has none)
    op: str              #: Conv, Gemm or MatMul
    weight: str          #: the weight initializer's name
    transposed: bool     #: the file holds the weight as (K, N), not (O, I, ...)
    macs: int            #: multiply-accumulates of one run
    image: tuple[int, ...] | None = None   #: (C, H, W) of a dense layer's flattened input

    def oriented(self, w: np.ndarray) -> np.ndarray:
        """The file's weight array as ``(O, I, *taps)``."""
        w = w.T if self.transposed else w
        return w.reshape(w.shape[0], *self.image) if self.image else w

    def stored(self, w: np.ndarray) -> np.ndarray:
        """An ``(O, I, *taps)`` array back in the file's orientation."""
        w = w.reshape(w.shape[0], -1) if self.image else w
        return np.ascontiguousarray(w.T if self.transposed else w)


def node_name(node: onnx.NodeProto) -> str:
    """The name a layer is reported and skipped by."""
    return node.name or f"{node.op_type}:{node.output[0]}"


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _static_shapes(model: onnx.ModelProto,
                   input_shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor whose shape inference finds static, the inputs of
    ``input_shapes`` taken as that shape (a model with a dynamic batch is sized by the
    samples it is pruned on)."""
    if input_shapes:
        model = _with_input_shapes(model, input_shapes)
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = tuple(d.dim_value for d in dims)
    return shapes


def _flattened_image(model: onnx.ModelProto, node: onnx.NodeProto, uses: Counter,
                     shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    """``(C, H, W)`` when a dense layer's input is the ``Flatten`` (axis 1) of an image that
    nothing else reads -- the form the compiler runs as a convolution over the image."""
    if node.op_type not in ("Gemm", "MatMul"):
        return None
    flatten = next((n for n in model.graph.node if node.input[0] in n.output), None)
    if flatten is None or flatten.op_type != "Flatten" or _attribute(flatten, "axis", 1) != 1:
        return None
    image = shapes.get(flatten.input[0])
    return image[1:] if image is not None and len(image) == 4 and \
        uses[flatten.output[0]] == 1 else None


def _with_input_shapes(model: onnx.ModelProto,
                       input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for v in copy.graph.input:
        if v.name in input_shapes:
            shape = v.type.tensor_type.shape
            shape.ClearField("dim")
            for d in input_shapes[v.name]:
                shape.dim.add().dim_value = int(d)
    return copy


def _layer_kind(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto],
                uses: Counter) -> bool | None:
    """Whether the node's weight is transposed ((K, N)), or None when it is not prunable."""
    if len(node.input) < 2 or node.input[1] not in weights or uses[node.input[1]] != 1:
        return None
    rank = len(weights[node.input[1]].dims)
    if node.op_type == "Conv" and _attribute(node, "group", 1) == 1 and rank >= 3:
        return False
    if node.op_type == "Gemm" and rank == 2:
        return not _attribute(node, "transB", 0)
    if node.op_type == "MatMul" and rank == 2:
        return True
    return None


def find_layers(model: onnx.ModelProto,
                feed: Mapping[str, np.ndarray] | None = None) -> list[Layer]:
    """The model's prunable layers in graph order (see the module doc), their MACs for
    inputs of ``feed``'s shapes (default: the model's own). Shapes come from ONNX shape
    inference; those it cannot find (behind a computed Reshape, say) from one onnxruntime
    run of ``feed``.

    :class:`CompileError` for a quantized model or a prunable layer with an integer weight.
    """
    _check_float_model(model)
    weights = {t.name: t for t in model.graph.initializer}
    uses = Counter(name for node in model.graph.node for name in node.input)
    nodes = [(node, t) for node in model.graph.node
             if (t := _layer_kind(node, weights, uses)) is not None]
    shapes = _static_shapes(model, {k: np.shape(v) for k, v in (feed or {}).items()})
    wanted = {n for node, _ in nodes for n in (node.output[0], *_producer_inputs(model, node))}
    if wanted - set(shapes) and feed:
        shapes.update(_measured_shapes(model, feed, sorted(wanted - set(shapes))))
    return [_layer(model, node, transposed, weights[node.input[1]], uses, shapes)
            for node, transposed in nodes]


def _check_float_model(model: onnx.ModelProto) -> None:
    quantized = sorted({n.op_type for n in model.graph.node} & QUANTIZED_OPS)
    if quantized:
        raise CompileError(
            f"model {model.graph.name!r} is quantized (it has {', '.join(quantized)} nodes); "
            "the pruner works on float models",
            fix={PYTHON: "prune the float model, then quantize it (tessera.compile does)",
                 CLI: "prune the float model, then compile it with tessera compile"})


def _producer_inputs(model: onnx.ModelProto, node: onnx.NodeProto) -> list[str]:
    """The inputs of the node producing ``node``'s first input (a Flatten's image)."""
    producer = next((n for n in model.graph.node if node.input[0] in n.output), None)
    return list(producer.input[:1]) if producer is not None else []


def _measured_shapes(model: onnx.ModelProto, feed: Mapping[str, np.ndarray],
                     names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The shapes of tensors ``names`` in one onnxruntime run of ``feed``."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names
                              if n not in outputs)
    session = ort.InferenceSession(probe.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    known = {o.name for o in session.get_outputs()}
    names = [n for n in names if n in known]
    return {n: tuple(a.shape) for n, a in zip(names, session.run(names, dict(feed)))}


def _layer(model: onnx.ModelProto, node: onnx.NodeProto, transposed: bool,
           tensor: onnx.TensorProto, uses: Counter,
           shapes: Mapping[str, tuple[int, ...]]) -> Layer:
    """One prunable layer (errors for an integer weight or an unknown output shape)."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    if np.dtype(dtype).kind != "f":
        raise CompileError(f"layer {node_name(node)!r} ({node.op_type}) has a {dtype} "
                           "weight; the pruner works on float models", op=node_name(node))
    dims = list(tensor.dims)
    reduction = int(np.prod(dims[1:])) if not transposed else dims[0]
    if node.output[0] not in shapes:
        raise CompileError(f"layer {node_name(node)!r}: its output shape is not static, so "
                           "its work (MACs) is unknown", op=node_name(node),
                           fix={PYTHON: "pass calibration= feeds (their run gives the shapes)",
                                CLI: "give --calibration FILE.npz (its run gives the shapes)"})
    return Layer(node_name(node), node.op_type, node.input[1], transposed,
                 int(np.prod(shapes[node.output[0]])) * reduction,
                 _flattened_image(model, node, uses, shapes))


def weight_arrays(model: onnx.ModelProto, layers: list[Layer]) -> dict[str, np.ndarray]:
    """``{weight name: array in the file's orientation}`` of the layers."""
    wanted = {layer.weight for layer in layers}
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.name in wanted}
