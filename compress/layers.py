"""The layers of a float ONNX model a pruner may change, and their weights in one
orientation.

A prunable layer is a Conv with ``group`` 1, a Gemm or a 2-D MatMul whose weight (input 1)
is a float initializer used by that node alone. Its weight is handled as ``(O, I, *taps)``
-- the orientation of :mod:`tessera.sparsity`'s blocks -- whatever its layout in the
file: a Gemm with ``transB=0`` and a MatMul keep theirs as ``(K, N)``, the transpose.
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

    def oriented(self, w: np.ndarray) -> np.ndarray:
        """The file's weight array as ``(O, I, *taps)``."""
        return w.T if self.transposed else w

    def stored(self, w: np.ndarray) -> np.ndarray:
        """An ``(O, I, *taps)`` array back in the file's orientation."""
        return np.ascontiguousarray(w.T if self.transposed else w)

    @property
    def reduction_axis(self) -> int:
        """The N:M groups' axis in the file's orientation (:func:`tessera.sparsity.nm_groups`)."""
        return 0 if self.transposed else 1


def node_name(node: onnx.NodeProto) -> str:
    """The name a layer is reported and skipped by."""
    return node.name or f"{node.op_type}:{node.output[0]}"


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _output_sizes(model: onnx.ModelProto,
                  input_shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Element count of every tensor whose shape inference finds static, the inputs of
    ``input_shapes`` taken as that shape (a model with a dynamic batch is sized by the
    samples it is pruned on)."""
    if input_shapes:
        model = _with_input_shapes(model, input_shapes)
    inferred = onnx.shape_inference.infer_shapes(model)
    sizes = {}
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            sizes[v.name] = int(np.prod([d.dim_value for d in dims]))
    return sizes


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
                input_shapes: Mapping[str, Sequence[int]] | None = None) -> list[Layer]:
    """The model's prunable layers in graph order (see the module doc), their MACs for
    inputs of ``input_shapes`` (``{name: shape}``; default: the model's own).

    :class:`CompileError` for a quantized model or a prunable layer with an integer weight.
    """
    quantized = sorted({n.op_type for n in model.graph.node} & QUANTIZED_OPS)
    if quantized:
        raise CompileError(
            f"model {model.graph.name!r} is quantized (it has {', '.join(quantized)} nodes); "
            "the pruner works on float models",
            fix={PYTHON: "prune the float model, then quantize it (tessera.compile does)",
                 CLI: "prune the float model, then compile it with tessera compile"})
    weights = {t.name: t for t in model.graph.initializer}
    uses = Counter(name for node in model.graph.node for name in node.input)
    sizes = _output_sizes(model, input_shapes or {})
    layers = []
    for node in model.graph.node:
        transposed = _layer_kind(node, weights, uses)
        if transposed is None:
            continue
        tensor = weights[node.input[1]]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        if np.dtype(dtype).kind != "f":
            raise CompileError(f"layer {node_name(node)!r} ({node.op_type}) has a {dtype} "
                               "weight; the pruner works on float models", op=node_name(node))
        dims = list(tensor.dims)
        reduction = int(np.prod(dims[1:])) if not transposed else dims[0]
        if node.output[0] not in sizes:
            raise CompileError(f"layer {node_name(node)!r}: its output shape is not static, so "
                               "its work (MACs) is unknown", op=node_name(node),
                               fix={PYTHON: "give the model static shapes (e.g. with "
                                            "onnx.shape_inference)",
                                    CLI: "give the model static shapes"})
        layers.append(Layer(node_name(node), node.op_type, node.input[1], transposed,
                            sizes[node.output[0]] * reduction))
    return layers


def weight_arrays(model: onnx.ModelProto, layers: list[Layer]) -> dict[str, np.ndarray]:
    """``{weight name: array in the file's orientation}`` of the layers."""
    wanted = {layer.weight for layer in layers}
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.name in wanted}
