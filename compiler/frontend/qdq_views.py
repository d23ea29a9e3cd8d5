"""QDQ layers fused in their 2-D form between views: 1-D convolutions and N-D matmuls.

The integer nodes of :mod:`.qdq` are 2-D: ``QConv`` takes ``N x C x H x W`` images and
``QGemm`` ``M x K`` rows. Two common layers have one more or one fewer axis, and both
are the 2-D layer on a reshaped tensor, which costs nothing (a view of the stored int8
values, placed as ``"view"``):

* a 1-D ``Conv`` (input ``N x C x L``, weight ``O x C/group x k``) is a 2-D one with
  height 1: input ``N x C x 1 x L``, weight ``O x C/group x 1 x k``, pads
  ``[0, begin, 0, end]``, strides/dilations ``[1, s]``/``[1, d]``, the group kept (so
  depthwise and grouped forms follow), its output ``N x O x 1 x L'`` viewed back as
  ``N x O x L'``;
* a ``MatMul`` of an ``... x M x K`` activation by a constant ``K x N`` weight is a dense
  layer over ``prod(...) * M`` rows: the activation viewed as ``rows x K``, the output
  ``rows x N`` viewed back as ``... x M x N``.

:func:`fuse_conv` and :func:`fuse_matmul` rewrite the float QDQ pattern into that form
(a Reshape of the quantized input before a new DequantizeLinear, the weight's constant
reshaped, the tensors up to the QuantizeLinear given the 2-D shapes, a Reshape after it)
and fuse it with :mod:`.qdq`'s rules, which decide as for any 2-D layer; a pattern they
do not take stays as a float 2-D layer between the views, the same function. When the
quantized input is itself a view of a tensor of the needed shape (the output of the
previous lifted layer), the layer reads that tensor: a chain of 1-D convolutions or of
matmuls keeps the 2-D shapes throughout and its accelerator nodes stay in one program.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .graph import Graph, Node

__all__ = ["fuse_conv", "fuse_matmul"]

#: Float nodes between a layer and its QuantizeLinear that the fusion may absorb.
_ACTIVATIONS = ("Relu", "Clip")
_VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def fuse_conv(graph: Graph, conv: Node) -> bool:
    """Fuse a QDQ ``Conv``: 2-D as :mod:`.qdq` does, 1-D as a 2-D one of height 1."""
    from . import qdq
    weight = graph.value(conv.input(1))
    if len(weight.shape) == 3:
        _lift_conv1d(graph, conv)
    return qdq._fuse_conv(graph, conv)


def fuse_matmul(graph: Graph, matmul: Node) -> bool:
    """Fuse a QDQ ``MatMul``: 2-D as :mod:`.qdq` does, an N-D activation by a constant
    2-D weight over its rows."""
    from . import qdq
    x, w = (graph.value(matmul.input(i)) for i in (0, 1))
    if len(x.shape) >= 3 and len(w.shape) == 2:
        _lift_matmul(graph, matmul)
    return qdq._fuse_matmul(graph, matmul)


# ------------------------------------------------------------------------ 1-D conv
def _lift_conv1d(graph: Graph, conv: Node) -> bool:
    """Rewrite 1-D ``conv`` in place into its height-1 2-D form (module doc); False when
    the pattern is not a quantized one (nothing changed)."""
    if conv.attr("auto_pad", "NOTSET") != "NOTSET":
        return False
    x_dq, w_dq = (_dq_of_int8(graph, conv.input(i)) for i in (0, 1))
    chain = _chain_to_quantize(graph, conv, bias_add=False)
    if x_dq is None or w_dq is None or chain is None:
        return False
    n, c, length = graph.value(conv.input(0)).shape
    index = _index(graph, conv)
    conv.inputs[0] = _dequantized_view(graph, x_dq, (n, c, 1, length), index, conv.name)
    w = graph.const(w_dq.inputs[0])
    w_name = graph.unique_name(f"{w_dq.inputs[0]}.2d")
    graph.add_const(w_name, w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]))
    axis = int(w_dq.attr("axis", 1)) % 3       # per-channel weights: the output channels
    conv.inputs[1] = _dequantize_like(graph, w_dq, w_name, _index(graph, conv), axis=axis)
    begin, end = conv.attr("pads", [0, 0])
    conv.attrs.update(kernel_shape=[1, int(w.shape[2])],
                      strides=[1, int(conv.attr("strides", [1])[0])],
                      dilations=[1, int(conv.attr("dilations", [1])[0])],
                      pads=[0, int(begin), 0, int(end)])
    out = graph.value(conv.outputs[0]).shape
    _view_chain_as(graph, chain, (out[0], out[1], 1, out[2]), conv.name)
    return True


# ------------------------------------------------------------------------ N-D matmul
def _lift_matmul(graph: Graph, matmul: Node) -> bool:
    """Rewrite ``matmul`` in place to multiply ``rows x K`` (module doc); False when
    the pattern is not a quantized one (nothing changed)."""
    x_dq, w_dq = (_dq_of_int8(graph, matmul.input(i)) for i in (0, 1))
    chain = _chain_to_quantize(graph, matmul, bias_add=True)
    if x_dq is None or w_dq is None or chain is None:
        return False
    shape = graph.value(matmul.input(0)).shape
    rows = int(np.prod(shape[:-1]))
    matmul.inputs[0] = _dequantized_view(graph, x_dq, (rows, shape[-1]), _index(graph, matmul),
                                         matmul.name)
    _view_chain_as(graph, chain, (rows, graph.value(matmul.outputs[0]).shape[-1]), matmul.name)
    return True


# ------------------------------------------------------------------------ helpers
def _dq_of_int8(graph: Graph, name: str) -> Node | None:
    """The DequantizeLinear producing float ``name`` from an int8/uint8 tensor."""
    dq = graph.producer(name)
    if dq is None or dq.op != "DequantizeLinear" or dq.domain:
        return None
    return dq if graph.value(dq.inputs[0]).dtype in ("int8", "uint8") else None


def _chain_to_quantize(graph: Graph, node: Node, bias_add: bool) -> list[Node] | None:
    """``node``, the nodes after it that the fusion absorbs (with ``bias_add`` an Add
    first, then Relu/Clip) and the QuantizeLinear that ends them, each the only reader of
    the one before (no graph output between); None otherwise."""
    chain = [node]
    while chain[-1].op != "QuantizeLinear":
        name = chain[-1].outputs[0]
        readers = graph.consumers(name)
        if name in graph.outputs or len(readers) != 1 or readers[0].domain:
            return None
        reader = readers[0]
        first_add = bias_add and len(chain) == 1 and reader.op == "Add"
        if not first_add and (reader.op not in (*_ACTIVATIONS, "QuantizeLinear")
                              or reader.inputs[0] != name):
            return None
        chain.append(reader)
    return chain


def _view_chain_as(graph: Graph, chain: Sequence[Node], shape: tuple[int, ...],
                   layer: str) -> None:
    """Give the float tensors of ``chain`` (ending at its QuantizeLinear) ``shape``; the
    QuantizeLinear writes a new tensor of ``shape`` that a Reshape (named after
    ``layer``) views back as the original output."""
    for node in chain[:-1]:
        graph.values[node.outputs[0]].shape = tuple(shape)
    quantize = chain[-1]
    y = quantize.outputs[0]
    value = graph.value(y)
    lifted = graph.unique_name(f"{y}.{len(shape)}d")
    graph.add_value(lifted, shape, value.dtype)
    quantize.outputs[0] = lifted
    _add_reshape(graph, lifted, y, value.shape, _index(graph, quantize) + 1,
                 f"{layer}.output_view")


def _dequantized_view(graph: Graph, dq: Node, shape: tuple[int, ...], index: int,
                      layer: str) -> str:
    """A float tensor of ``shape`` holding what ``dq`` dequantizes: a new DequantizeLinear
    (same parameters) of the quantized tensor viewed as ``shape`` (a Reshape named after
    ``layer``), inserted before node ``index``."""
    source = dq.inputs[0]
    producer = graph.producer(source)
    if graph.value(source).shape == shape:
        viewed = source
    elif (producer is not None and producer.op in _VIEWS and not producer.domain
          and graph.value(producer.inputs[0]).shape == shape):
        viewed = producer.inputs[0]     # the view of a lifted layer's output: undo it
    else:
        viewed = graph.unique_name(f"{source}.{len(shape)}d")
        graph.add_value(viewed, shape, graph.value(source).dtype)
        _add_reshape(graph, source, viewed, shape, index, f"{layer}.input_view")
        index += 1
    return _dequantize_like(graph, dq, viewed, index)


def _dequantize_like(graph: Graph, dq: Node, source: str, index: int, **attrs) -> str:
    """A DequantizeLinear of ``source`` with ``dq``'s parameters (``attrs`` replacing its
    attributes), before node ``index``."""
    out = graph.unique_name(f"{source}.dequantized")
    graph.add_value(out, graph.value(source).shape, graph.value(dq.outputs[0]).dtype)
    graph.add_node("DequantizeLinear", [source, *dq.inputs[1:]], [out],
                   name=graph.unique_name(f"{dq.name}.view"), index=index,
                   **{**dq.attrs, **attrs})
    return out


def _add_reshape(graph: Graph, source: str, target: str, shape: Sequence[int], index: int,
                 name: str) -> None:
    new_shape = graph.unique_name(f"{target}.shape")
    graph.add_const(new_shape, np.asarray(shape, np.int64))
    graph.add_node("Reshape", [source, new_shape], [target],
                   name=graph.unique_name(name), index=index)


def _index(graph: Graph, node: Node) -> int:
    return next(i for i, n in enumerate(graph.nodes) if n is node)
