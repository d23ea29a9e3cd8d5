"""Graph passes over the IR (:mod:`.graph`): :func:`fold_batch_norm`, :func:`remove_identity`,
:func:`fold_constant_dequantize`, :func:`chain_sums`, :func:`lift_global_pools`.

Each pass rewrites a :class:`~.graph.Graph` in place, returns how many rewrites it made
and leaves :meth:`~.graph.Graph.verify` true. Tensor names that are graph outputs keep
their names, so a pass never changes a model's interface; the tests check every pass by
running :func:`~.onnx_import.to_onnx` of its result in onnxruntime against the original.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph, Node
from .onnx_import import fold_constants

__all__ = ["chain_sums", "fold_batch_norm", "fold_constant_dequantize", "lift_global_pools",
           "remove_identity"]


# ------------------------------------------------------------------ batch norm folding
def fold_batch_norm(graph: Graph) -> int:
    """Fold each inference ``BatchNormalization`` into the ``Conv`` or ``Gemm`` before it.

    ``y = (conv(x, W) + b - mean) * s + beta`` with ``s = scale / sqrt(var + epsilon)`` is
    ``conv(x, W * s) + (b - mean) * s + beta``: one Conv with scaled weights (per output
    channel) and a new bias, which the Conv gains if it had none. The arithmetic is in
    float64, rounded once to the weights' dtype. A Gemm folds when it is the plain dense
    layer ``A @ B.T + C`` (transB=1, no transA, alpha 1, beta 1 or no C); B's rows scale.

    A BatchNormalization stays (unfolded) when its input comes from another op, when that
    Conv/Gemm output is read elsewhere too or is a graph output, when its parameters or
    the weights are not constants (e.g. behind a DequantizeLinear), in training mode or
    with its running-statistics outputs. Returns the number of BatchNormalizations folded.
    """
    folded = 0
    for bn in [n for n in graph.nodes if n.op == "BatchNormalization"]:
        layer = _foldable_layer(graph, bn)
        if layer is not None:
            _fold(graph, layer, bn)
            folded += 1
    return folded


def _foldable_layer(graph: Graph, bn: Node) -> Node | None:
    """The Conv or Gemm ``bn`` can fold into, or None."""
    params = bn.inputs[1:5]
    if (bn.attr("training_mode", 0) or len(bn.outputs) != 1 or len(params) != 4
            or any(graph.const(p) is None for p in params)):
        return None
    x = bn.inputs[0]
    layer = graph.producer(x)
    if (layer is None or x in graph.outputs or len(layer.outputs) != 1
            or graph.consumers(x) != [bn]):
        return None
    simple = {"Conv": _simple_conv, "Gemm": _simple_gemm}.get(layer.op)
    channels = graph.values[x].shape[1]
    if simple is None or not simple(graph, layer, channels):
        return None
    return layer


def _simple_conv(graph: Graph, conv: Node, channels: int) -> bool:
    weight, bias = graph.const(conv.input(1)), conv.input(2)
    return (_is_float(weight) and weight.shape[0] == channels
            and (not bias or _is_float(graph.const(bias))))


def _simple_gemm(graph: Graph, gemm: Node, channels: int) -> bool:
    weight, bias = graph.const(gemm.input(1)), gemm.input(2)
    plain = (gemm.attr("transB", 0) == 1 and gemm.attr("transA", 0) == 0
             and gemm.attr("alpha", 1.0) == 1.0 and (not bias or gemm.attr("beta", 1.0) == 1.0))
    # A bias broadcast from a scalar or a column cannot hold one value per output.
    bias_ok = not bias or (_is_float(graph.const(bias))
                           and graph.values[bias].shape in ((channels,), (1, channels)))
    return plain and bias_ok and _is_float(weight) and weight.shape[0] == channels


def _is_float(data: np.ndarray | None) -> bool:
    return data is not None and np.issubdtype(data.dtype, np.floating)


def _fold(graph: Graph, layer: Node, bn: Node) -> None:
    """Give ``layer`` the folded weight and bias and ``bn``'s output; drop ``bn``."""
    weight_name, bias_name = layer.input(1), layer.input(2)
    dtype = graph.values[weight_name].dtype
    weight, bias = _folded_parameters(graph, layer, bn)
    if bias_name:
        bias = bias.reshape(graph.values[bias_name].shape)
    # New constants: the old ones may be shared with other layers.
    new_weight = _add_const(graph, f"{layer.name}.weight_bn", weight, dtype)
    new_bias = _add_const(graph, f"{layer.name}.bias_bn", bias, dtype)
    old_output = layer.outputs[0]
    layer.inputs = [layer.inputs[0], new_weight, new_bias]
    layer.outputs = [bn.outputs[0]]
    graph.remove_nodes([bn])
    _forget_unused(graph, [old_output, weight_name, bias_name, *bn.inputs[1:5]])


def _folded_parameters(graph: Graph, layer: Node, bn: Node) -> tuple[np.ndarray, np.ndarray]:
    """The weight and (1-D) bias of ``layer`` followed by ``bn``, in float64."""
    scale, beta, mean, var = (graph.const(p).astype(np.float64) for p in bn.inputs[1:5])
    s = scale / np.sqrt(var + bn.attr("epsilon", 1e-5))
    weight = graph.const(layer.input(1)).astype(np.float64)
    channels = weight.shape[0]
    bias = (graph.const(layer.input(2)).astype(np.float64).reshape(channels)
            if layer.input(2) else np.zeros(channels))
    # Per output channel: axis 0 of a Conv weight (out, in/group, k...) and of Gemm's B.T.
    return weight * s.reshape((channels,) + (1,) * (weight.ndim - 1)), (bias - mean) * s + beta


def _add_const(graph: Graph, base: str, data: np.ndarray, dtype: str) -> str:
    """A new constant named after ``base`` holding ``data`` cast to ``dtype``."""
    name = graph.unique_name(base)
    graph.add_const(name, data.astype(dtype))
    return name


# ------------------------------------------------------------------- identity removal
def remove_identity(graph: Graph) -> int:
    """Remove ``Identity`` and inference ``Dropout`` nodes; their readers read their input.

    When the removed node's output is a graph output, the output keeps its name: the node
    producing the input outputs it instead. The node stays when that is impossible (its
    input is a graph input, a constant or another graph output), as does a Dropout in
    training mode or whose mask output is read. Returns the number of nodes removed.
    """
    removed = 0
    for node in [n for n in graph.nodes if n.op in ("Identity", "Dropout")]:
        if _is_pass_through(graph, node) and _bypass(graph, node):
            removed += 1
    return removed


def _is_pass_through(graph: Graph, node: Node) -> bool:
    """True if ``node`` copies its input to its (single read) output."""
    if node.op == "Identity":
        return True
    # Dropout(data, ratio, training_mode): an identity unless training_mode is true.
    training = node.input(2)
    in_training = bool(training) and (graph.const(training) is None
                                      or bool(graph.const(training)))
    mask = node.outputs[1] if len(node.outputs) > 1 else ""
    mask_read = bool(mask) and (mask in graph.outputs or bool(graph.consumers(mask)))
    return not in_training and not mask_read


def _bypass(graph: Graph, node: Node) -> bool:
    """Rewire the readers of ``node`` to its input and remove it; False if it must stay."""
    source, output = node.inputs[0], node.outputs[0]
    if output not in graph.outputs:
        graph.rename_uses(output, source)
    else:
        producer = graph.producer(source)
        if producer is None or source in graph.outputs:
            return False
        # The graph output's name is the model's interface: the producer takes it over.
        producer.outputs = [output if o == source else o for o in producer.outputs]
        graph.rename_uses(source, output)
    graph.remove_nodes([node])
    _forget_unused(graph, [source, *node.outputs, *node.inputs[1:]])
    return True


def _forget_unused(graph: Graph, names: list[str]) -> None:
    """Drop the values of ``names`` that nothing defines or reads any more."""
    boundary = set(graph.inputs) | set(graph.outputs)
    for name in set(names) - boundary - {""}:
        if name in graph.values and not graph.consumers(name) and graph.producer(name) is None:
            del graph.values[name]


# ------------------------------------------------------------------- Sum as Adds
def chain_sums(graph: Graph) -> int:
    """Rewrite each ``Sum`` of two or more inputs as a chain of ``Add`` nodes,
    ``Sum(a, b, c) = Add(Add(a, b), c)`` (same broadcasting, same left-to-right order).

    Why: onnxruntime's quantizer quantizes ``Add`` (a QLinearAdd, which the accelerator
    runs as QAdd) but leaves a ``Sum`` in float between DequantizeLinear and
    QuantizeLinear, so a float model's residual ``Sum`` (ResNet-50, ShuffleNet as onnx
    ships them) would run on the CPU. Run it before quantization; a quantized model keeps
    its ``Sum``, since onnxruntime's reference computes it in float. The last ``Add``
    takes the ``Sum``'s name and output. Returns the number of Sums rewritten.
    """
    sums = [n for n in graph.nodes if n.op == "Sum" and not n.domain and len(n.inputs) >= 2]
    for node in sums:
        index = graph.nodes.index(node)
        graph.remove_nodes([node])
        out = graph.values[node.outputs[0]]
        left = node.inputs[0]
        for k, right in enumerate(node.inputs[1:], start=1):
            last = k == len(node.inputs) - 1
            if last:
                target, name = out.name, node.name
            else:
                target = graph.unique_name(f"{node.outputs[0]}/partial{k}")
                name = graph.unique_name(f"{node.name}/Add{k}")
                shape = np.broadcast_shapes(graph.values[left].shape,
                                            graph.values[right].shape)
                graph.add_value(target, shape, out.dtype)
            graph.add_node("Add", [left, right], [target], name=name, index=index + k - 1)
            left = target
    return len(sums)


# ------------------------------------------------------------ global pools as 2-D
def lift_global_pools(graph: Graph) -> int:
    """View the input of each GlobalMaxPool/GlobalAveragePool of rank 3 or 5+ as
    ``N x C x S x 1`` (``S`` the product of its spatial dims), pool that, and view the
    ``N x C x 1 x 1`` result back as the node's output shape (all 1s past ``C``).

    Why: the pools' kernels (CPU and accelerator) take NCHW images, and a global pool
    only reads each channel's values as one run, whatever the spatial rank (magika pools
    ``N x C x L`` sequences). The views are free (placed as ``view``). Returns the
    number of pools lifted.
    """
    pools = [n for n in graph.nodes if n.op in ("GlobalMaxPool", "GlobalAveragePool")
             and not n.domain and len(graph.value(n.inputs[0]).shape) not in (0, 1, 2, 4)]
    for node in pools:
        source, out = graph.value(node.inputs[0]), graph.value(node.outputs[0])
        n, c, *spatial = source.shape
        image = _add_view(graph, node, source.name, (n, c, int(np.prod(spatial)), 1),
                          before=True)
        pooled = graph.unique_name(f"{node.outputs[0]}/2d")
        graph.add_value(pooled, (n, c, 1, 1), out.dtype)
        node.inputs[0], node.outputs[0] = image, pooled
        _add_view(graph, node, pooled, out.shape, before=False, target=out.name)
    return len(pools)


def _add_view(graph: Graph, node: Node, source: str, shape: tuple[int, ...], *,
              before: bool, target: str | None = None) -> str:
    """A Reshape of ``source`` to ``shape`` just before or after ``node``; its output."""
    dtype = graph.value(source).dtype
    target = target or graph.unique_name(f"{source}/as{len(shape)}d")
    if target not in graph.values or graph.values[target].shape != tuple(shape):
        graph.add_value(target, shape, dtype)
    dims = _add_const(graph, f"{target}/shape", np.array(shape), "int64")
    index = graph.nodes.index(node) + (0 if before else 1)
    graph.add_node("Reshape", [source, dims], [target],
                   name=graph.unique_name(f"{node.name}/{'in' if before else 'out'}_view"),
                   index=index)
    return target


# ------------------------------------------------------- constant dequantize folding
def fold_constant_dequantize(graph: Graph) -> int:
    """Fold each DequantizeLinear or QuantizeLinear whose inputs are all constants into a
    constant, then every node that thereby reads only constants (:func:`fold_constants`),
    until none is left.

    Import keeps them (:func:`~.onnx_import.fold_constants` does not fold Q/DQ), so that
    QDQ fusion (:func:`~.qdq.fuse_qdq`) finds int8 weights and int32 biases behind their
    DQ. What fusion leaves is a constant the float ops need as floats: the scalar of a
    ``Mul`` by 0.5, the weight of a layer that stays float. The value is onnxruntime's:
    DequantizeLinear is ``f32(q - zp) * scale``, QuantizeLinear ``rint(x / scale) + zp``
    saturated, in float32, per tensor or along ``axis``. Returns the number of Q/DQ
    nodes folded.
    """
    total = 0
    while True:
        doomed = [n for n in graph.nodes if n.op in _QDQ and not n.domain
                  and all(graph.values[i].is_const for i in n.inputs if i)]
        if not doomed:
            return total
        for node in doomed:
            data = _quantize_linear(graph, node) if node.op == "QuantizeLinear" \
                else _dequantize_linear(graph, node)
            value = graph.values[node.outputs[0]]
            graph.add_value(value.name, value.shape, value.dtype, data)
        graph.remove_nodes(doomed)
        total += len(doomed)
        fold_constants(graph)
        _forget_unused(graph, [i for n in doomed for i in n.inputs])


_QDQ = ("QuantizeLinear", "DequantizeLinear")


def _qdq_params(graph: Graph, node: Node, ndim: int, zp_dtype: str) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """Scale and zero point of Q/DQ ``node``, shaped to broadcast along its ``axis`` over
    a tensor of rank ``ndim`` (an omitted zero point is 0 of ``zp_dtype``)."""
    scale = graph.const(node.input(1)).astype(np.float32)
    zp = graph.const(node.input(2)) if node.input(2) else np.zeros(scale.shape, zp_dtype)
    if scale.size == 1:
        return scale.reshape(()), zp.reshape(())
    shape = [1] * ndim
    shape[node.attr("axis", 1) % ndim] = scale.size
    return scale.reshape(shape), zp.reshape(shape)


def _dequantize_linear(graph: Graph, node: Node) -> np.ndarray:
    q = graph.const(node.inputs[0])
    scale, zp = _qdq_params(graph, node, q.ndim, str(q.dtype))
    return (q.astype(np.int64) - zp.astype(np.int64)).astype(np.float32) * scale


def _quantize_linear(graph: Graph, node: Node) -> np.ndarray:
    x = graph.const(node.inputs[0]).astype(np.float32)
    scale, zp = _qdq_params(graph, node, x.ndim, "uint8")
    info = np.iinfo(zp.dtype)
    q = np.rint(x / scale).astype(np.float64) + zp.astype(np.float64)
    return np.clip(q, info.min, info.max).astype(zp.dtype)
