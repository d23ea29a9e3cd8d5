"""QDQ fusion: :func:`fuse_qdq` turns onnxruntime's QDQ patterns into integer ``tessera`` nodes.

A QDQ model (:func:`~.quantize.quantize_static`) computes in float between
``DequantizeLinear`` (DQ) and ``QuantizeLinear`` (Q) nodes; onnxruntime recognises the
patterns and runs its int8 kernels instead. This pass does the same rewrite in the IR:
the fused nodes (domain :data:`DOMAIN`) read and write the stored int8/uint8 tensors and
carry their quantization parameters as attributes (plain floats and ints, numpy arrays
per channel). :mod:`..golden.quantized` evaluates them exactly as onnxruntime does.

Node schemas (``y`` is the output, every ``*_scale`` a positive float32 value, every
``*_zero_point`` an int in its tensor's range; ``y_min``/``y_max`` the stored-value clamp:
the output type's range, narrowed by an absorbed Relu or Clip):

* ``QConv(x, w, [bias])``: 2-D convolution. ``w`` constant ``(O, C/group, kh, kw)`` holding
  the weights minus their zero points (int8, or int16 when that exceeds int8: asymmetric
  uint8 weights), ``bias`` int32 constant ``(O,)``. Attributes x_scale, x_zero_point,
  w_scale (float32 ``(O,)``), w_zero_point (int ``(O,)``, all 0: already subtracted),
  y_scale, y_zero_point, y_min, y_max, strides, pads, dilations, group.
* ``QConvTranspose(x, w, [bias])``: 2-D transposed convolution (:mod:`.qdq_convtranspose`).
* ``QGemm(x, w, [bias])``: dense layer ``x @ w.T``, ``x`` ``(M, K)``, ``w`` constant
  ``(N, K)`` as QConv's (a Gemm's ``transB=0`` or a MatMul's ``(K, N)`` weight is stored
  transposed), ``bias`` int32 ``(N,)``. Attributes as QConv without the geometry.
* ``QAdd(a, b)``: elementwise sum of two same-shape tensors. Attributes a_scale,
  a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point, y_min, y_max.
* ``QMul(a, b)``: elementwise product, ``b`` possibly a constant; ``QMatMul(a, b)``:
  matmul of two activations (both :mod:`.qdq_binary`).
* ``QMaxPool(x)``: 2-D max pooling in the stored domain (the scales and zero points of
  input and output are equal). Attributes kernel_shape, strides, pads, dilations,
  ceil_mode, x_scale, x_zero_point.
* ``QGlobalAveragePool(x)``: attributes x_scale, x_zero_point, y_scale, y_zero_point.
  An AveragePool whose window is the whole image without padding becomes one too:
  onnxruntime runs it with the global kernel.
* ``QAveragePool(x)``: 2-D average pooling as onnxruntime's QLinearAveragePool (float32
  arithmetic on the dequantized values, :mod:`..golden.quantized`). Attributes
  kernel_shape, strides, pads, ceil_mode, count_include_pad, x_scale, x_zero_point,
  y_scale, y_zero_point, y_min, y_max.

Every fused node may carry ``from_uint8 = 1``: :func:`~.qshift.shift_uint8_to_int8`
moved its uint8 tensors to int8 (values and zero points minus 128); see there.

``Flatten`` and ``Reshape`` between a DQ and a Q of equal parameters stay standard ops,
now on the stored tensor; so does a ``Concat`` whose inputs all share its output's
parameters (:mod:`.qdq_concat`).

A pattern is fused only when everything the integer semantics relies on holds; otherwise
it stays as it is (float ops between DQ and Q, which become CPU kernels). Checked: scales
and zero points are constants; activation scales and zero points are per tensor (a
scalar or one element), scales finite and positive, zero points of the quantized
tensor's type (int8/uint8); weights are int8/uint8 constants with one scale and zero
point per output channel (or one for all); biases are int32 constants with zero point 0
and scale ``x_scale * w_scale`` (else the int32 values are not on the accumulator's
scale); intermediate float tensors have a single reader and are no graph output;
convolutions and pools are 2-D without ``auto_pad``; Gemm has ``alpha = beta = 1`` and no
``transA``; QAdd inputs have equal shapes (no broadcasting); global average pools have a
scale in onnxruntime's accepted range; average pools no dilation, no window of padding
only, input and output of one type and the output shape onnxruntime computes.

After fusion, :func:`fuse_qdq` folds the constant DQ chains left (a Mul's scalar, the
weight of a layer that stays float: :func:`~.passes.fold_constant_dequantize`) and moves
uint8 activations to int8 (:func:`~.qshift.shift_uint8_to_int8`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.errors import CompileError

from .graph import Graph, Node
from .qdq_binary import fuse_activation_matmul, fuse_add_constant, fuse_mul
from .qdq_concat import fuse_concat
from .qdq_convtranspose import fuse_conv_transpose
from .qdq_views import fuse_conv, fuse_matmul
from .qsoftmax import fuse_softmax

__all__ = ["DOMAIN", "OPS", "fuse_qdq", "pool_output_size"]

#: The operator domain of the fused integer nodes.
DOMAIN = "tessera"
#: The ops of :data:`DOMAIN` (schemas in the module doc).
OPS = ("QConv", "QConvTranspose", "QGemm", "QAdd", "QMul", "QMatMul", "QMaxPool",
       "QGlobalAveragePool", "QAveragePool", "QSoftmax")

_QTYPES = ("int8", "uint8")
_REL_TOL = 1e-6
#: onnxruntime's QLinearGlobalAveragePool rejects scales outside this range and images of
#: 2**24 pixels or more (MLAS CheckQLinearGlobalAveragePoolScaleAndSize).
_GAP_SCALE_RANGE = (2.0 ** -32, 256.0)
_GAP_MAX_PIXELS = 1 << 24


@dataclass(frozen=True)
class _QParams:
    """Per-tensor quantization parameters of a Q or DQ node."""

    scale: float
    zero_point: int
    dtype: str

    @property
    def range(self) -> tuple[int, int]:
        info = np.iinfo(self.dtype)
        return int(info.min), int(info.max)


@dataclass
class _Output:
    """The Q that ends a pattern and the float nodes (Relu/Clip) absorbed before it."""

    quantize: Node
    params: _QParams
    absorbed: list[Node]
    y_min: int
    y_max: int


def fuse_qdq(graph: Graph) -> int:
    """Rewrite the QDQ patterns of ``graph`` into ``tessera`` integer nodes, in place.

    See the module doc for the patterns, the node schemas and the conditions a pattern
    must meet (it stays unfused otherwise). DequantizeLinear nodes left without readers
    are removed, the constant ones left with readers folded into float constants, and
    uint8 activations moved to int8. Returns the number of patterns rewritten; the
    graph still verifies.
    """
    # Here, not at the top: qshift reads this module's DOMAIN, and the loader of compiled
    # models imports this module for DOMAIN without onnx, which passes needs.
    from .passes import fold_constant_dequantize
    from .qshift import shift_uint8_to_int8

    fused = 0
    for node in list(graph.nodes):
        if not any(n is node for n in graph.nodes):
            continue  # swallowed by an earlier rewrite (a MatMul's Add)
        rewrite = _REWRITES.get(node.op) if not node.domain else None
        if rewrite is not None and rewrite(graph, node):
            fused += 1
    _remove_dead_dequantize(graph)
    fold_constant_dequantize(graph)
    if shift_uint8_to_int8(graph):
        _remove_dead_dequantize(graph)      # the uint8 zero points nobody reads now
    graph.verify()
    return fused


# ------------------------------------------------------------------ parameter checks
def _qparams(graph: Graph, node: Node) -> _QParams | None:
    """The per-tensor parameters of Q/DQ ``node``, or None unless they are constants, the
    scale one finite positive float32 and the zero point one int8/uint8 value."""
    scale, zero_point = _raw_params(graph, node)
    if (scale is None or zero_point is None or scale.size != 1
            or str(zero_point.dtype) not in _QTYPES):
        return None
    return _QParams(float(scale.reshape(())), int(zero_point.reshape(())),
                    str(zero_point.dtype))


def _raw_params(graph: Graph, node: Node) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Scale and zero point constants of a Q/DQ node, or None for what is not valid.

    An omitted zero point is 0 of type uint8 (the ONNX default). A scalar and a
    one-element tensor are the same per-tensor parameter (onnxruntime's quantizer writes
    a bias scale of shape [1] with a zero point of shape [])."""
    scale = graph.const(node.input(1))
    if (scale is None or scale.dtype != np.float32 or not np.all(np.isfinite(scale))
            or not np.all(scale > 0)):
        return None, None
    zp_name = node.input(2)
    zero_point = graph.const(zp_name) if zp_name else np.zeros(scale.shape, np.uint8)
    if zero_point is not None and zero_point.size == scale.size == 1:
        zero_point = zero_point.reshape(scale.shape)
    if zero_point is not None and zero_point.shape != scale.shape:
        raise CompileError(f"{node} has a scale of shape {list(scale.shape)} but a zero point "
                           f"of shape {list(zero_point.shape)}; they must be equal (one value "
                           "per tensor, or one per channel each); fix the model's "
                           "quantization parameters", op=node.name)
    if zero_point is None or str(zero_point.dtype) not in (*_QTYPES, "int32"):
        return scale, None
    return scale, zero_point


def _dequantized(graph: Graph, name: str) -> tuple[Node, _QParams] | None:
    """The DQ producing activation ``name`` (from a non-constant int8/uint8 tensor, per
    tensor parameters), with its parameters; None otherwise."""
    dq = graph.producer(name)
    if dq is None or dq.op != "DequantizeLinear" or dq.domain:
        return None
    params = _qparams(graph, dq)
    source = graph.value(dq.inputs[0])
    if params is None or source.is_const or source.dtype != params.dtype:
        return None
    return dq, params


def _weight(graph: Graph, name: str, channels: int, axis: int) -> tuple[np.ndarray,
                                                                       np.ndarray] | None:
    """``(centred weight, float32 scale per channel)`` behind the DQ of weight ``name``,
    with ``channels`` output channels along ``axis``; None unless the weight is a constant
    int8/uint8 tensor with one scale and zero point per channel (or one for all).

    The centred weight is ``w - w_zp``, exactly what the integer kernels multiply: int8
    when it fits (always for symmetric weights, int8 or uint8), else int16."""
    dq = graph.producer(name)
    if dq is None or dq.op != "DequantizeLinear" or dq.domain:
        return None
    weight = graph.const(dq.inputs[0])
    scale, zero_point = _raw_params(graph, dq)
    if (weight is None or str(weight.dtype) not in _QTYPES or scale is None
            or zero_point is None or zero_point.dtype != weight.dtype):
        return None
    if scale.size == 1:
        scale, zero_point = (np.full(channels, v.reshape(())) for v in (scale, zero_point))
    elif (scale.shape != (channels,) or dq.attr("axis", 1) % weight.ndim != axis
            or weight.shape[axis] != channels):
        return None
    if weight.dtype == np.int8 and not np.any(zero_point):
        return weight, scale.astype(np.float32)
    along = [1] * weight.ndim
    along[axis] = channels
    centred = weight.astype(np.int16) - zero_point.astype(np.int16).reshape(along)
    fits = centred.min(initial=0) >= -128 and centred.max(initial=0) <= 127
    return centred.astype(np.int8 if fits else np.int16), scale.astype(np.float32)


def _bias(graph: Graph, name: str, channels: int, x_scale: float,
          w_scale: np.ndarray) -> np.ndarray | bool:
    """The int32 bias behind DQ ``name`` as ``(channels,)``; False if it does not qualify.

    Qualifies: a constant int32 tensor of ``channels`` values (shape ``(C,)`` or ``(1,
    C)``), zero point 0 and scale ``x_scale * w_scale`` (per channel, in float32 as the
    quantizer computes it)."""
    dq = graph.producer(name)
    if dq is None or dq.op != "DequantizeLinear" or dq.domain:
        return False
    bias = graph.const(dq.inputs[0])
    scale, zero_point = _raw_params(graph, dq)
    if (bias is None or bias.dtype != np.int32 or bias.size != channels
            or bias.shape not in ((channels,), (1, channels)) or scale is None
            or zero_point is None or np.any(zero_point != 0) or scale.size not in (1, channels)):
        return False
    expected = np.float32(x_scale) * w_scale
    if not np.allclose(np.broadcast_to(scale.reshape(-1), (channels,)), expected,
                       rtol=_REL_TOL, atol=0):
        return False
    return bias.reshape(channels)


def _single_reader(graph: Graph, name: str) -> Node | None:
    """The only node reading float tensor ``name``, or None (several readers, a graph
    output: the float value is needed elsewhere and the pattern cannot swallow it)."""
    readers = graph.consumers(name)
    if name in graph.outputs or len(readers) != 1:
        return None
    return readers[0]


def _output(graph: Graph, node: Node) -> _Output | None:
    """Follow ``node``'s output through optional Relu/Clip nodes to a per-tensor Q."""
    absorbed: list[Node] = []
    bounds: list[tuple[float, float]] = []
    current = node
    while True:
        reader = _single_reader(graph, current.outputs[0])
        if reader is None or reader.domain:
            return None
        if reader.op == "QuantizeLinear":
            break
        activation = _activation_bounds(graph, reader)
        if activation is None:
            return None
        absorbed.append(reader)
        bounds.append(activation)
        current = reader
    params = _qparams(graph, reader)
    if params is None or reader.inputs[0] != current.outputs[0]:
        return None
    y_min, y_max = params.range
    for lo, hi in bounds:
        # Quantization is monotonic, so Q(clip(v, lo, hi)) = clip(Q(v), Q(lo), Q(hi)).
        y_min, y_max = max(y_min, _quantize(lo, params)), min(y_max, _quantize(hi, params))
    if y_min > y_max:
        return None
    return _Output(reader, params, absorbed, y_min, y_max)


def _activation_bounds(graph: Graph, node: Node) -> tuple[float, float] | None:
    """(lo, hi) of a Relu or a Clip with constant scalar bounds; None for anything else."""
    if node.op == "Relu":
        return 0.0, np.inf
    if node.op != "Clip":
        return None
    bounds = []
    for index, default in ((1, -np.inf), (2, np.inf)):
        name = node.input(index)
        data = graph.const(name) if name else np.array(default)
        if data is None or data.size != 1:
            return None
        bounds.append(float(data.reshape(())))
    return bounds[0], bounds[1]


def _quantize(value: float, params: _QParams) -> int:
    """``value`` quantized as onnxruntime's QuantizeLinear does (float32 division, RNE,
    saturation); infinities saturate."""
    lo, hi = params.range
    if np.isinf(value):
        return lo if value < 0 else hi
    q = np.rint(np.float32(value) / np.float32(params.scale)) + params.zero_point
    return int(np.clip(q, lo, hi))


def _output_attrs(out: _Output) -> dict:
    return {"y_scale": out.params.scale, "y_zero_point": out.params.zero_point,
            "y_min": out.y_min, "y_max": out.y_max}


# ------------------------------------------------------------------------- rewriting
def _replace(graph: Graph, doomed: list[Node], out: _Output, op: str, inputs: list[str],
             attrs: dict, base: str) -> None:
    """Put a ``tessera`` node writing ``out``'s Q output where that Q was; drop ``doomed``,
    the absorbed nodes, the Q and the float tensors between them."""
    y = out.quantize.outputs[0]
    index = _index(graph, out.quantize)
    graph.add_node(op, inputs, [y], name=graph.unique_name(f"{base}_{op}"), index=index,
                   domain=DOMAIN, **attrs)
    dropped = [*doomed, *out.absorbed, out.quantize]
    graph.remove_nodes(dropped)
    for node in dropped:
        for name in node.outputs:
            if name != y:
                graph.values.pop(name, None)


def _index(graph: Graph, node: Node) -> int:
    # By identity: Node equality compares attributes, which may hold numpy arrays.
    return next(i for i, n in enumerate(graph.nodes) if n is node)


def _add_weight(graph: Graph, base: str, weight: np.ndarray) -> str:
    name = graph.unique_name(base)
    graph.add_const(name, np.ascontiguousarray(weight))
    return name


def _stored_weight(graph: Graph, name: str, weight: np.ndarray, base: str) -> str:
    """The constant holding ``weight``, the centred weight behind the DQ of ``name``: the
    DQ's own input when centring changed nothing, else a new constant."""
    source = graph.producer(name).inputs[0]
    if graph.const(source) is weight:
        return source
    return _add_weight(graph, f"{base}.weight_q", weight)


def _fuse_conv(graph: Graph, conv: Node) -> bool:
    x = _dequantized(graph, conv.input(0))
    w_shape = graph.value(conv.input(1)).shape
    if x is None or len(w_shape) != 4 or conv.attr("auto_pad", "NOTSET") != "NOTSET":
        return False
    channels = w_shape[0]
    weight = _weight(graph, conv.input(1), channels, 0)
    out = _output(graph, conv)
    if weight is None or out is None:
        return False
    x_dq, x_params = x
    _, w_scale = weight
    bias = _bias(graph, conv.input(2), channels, x_params.scale, w_scale) if conv.input(2) \
        else None
    if bias is False:
        return False
    inputs = [x_dq.inputs[0], _stored_weight(graph, conv.input(1), weight[0], conv.name)]
    if bias is not None:
        inputs.append(_add_weight(graph, f"{conv.name}.bias_q", bias))
    attrs = {"x_scale": x_params.scale, "x_zero_point": x_params.zero_point,
             "w_scale": w_scale, "w_zero_point": np.zeros(channels, np.int64),
             **_output_attrs(out),
             "strides": list(conv.attr("strides", [1, 1])),
             "pads": list(conv.attr("pads", [0, 0, 0, 0])),
             "dilations": list(conv.attr("dilations", [1, 1])),
             "group": int(conv.attr("group", 1))}
    _replace(graph, [conv], out, "QConv", inputs, attrs, conv.name)
    return True


def _fuse_gemm(graph: Graph, gemm: Node) -> bool:
    if (gemm.attr("transA", 0) or gemm.attr("alpha", 1.0) != 1.0
            or gemm.attr("beta", 1.0) != 1.0):
        return False
    trans_b = bool(gemm.attr("transB", 0))
    return _fuse_dense(graph, gemm, [gemm], gemm.input(2), trans_b, gemm)


def _fuse_matmul(graph: Graph, matmul: Node) -> bool:
    """MatMul, or MatMul + Add of an int32 bias (``Add(matmul, DQ(bias))``)."""
    reader = _single_reader(graph, matmul.outputs[0])
    if reader is not None and reader.op == "Add" and not reader.domain:
        others = [i for i in reader.inputs if i != matmul.outputs[0]]
        if len(others) == 1:
            return _fuse_dense(graph, matmul, [matmul, reader], others[0], False, reader)
    return _fuse_dense(graph, matmul, [matmul], "", False, matmul)


def _fuse_dense(graph: Graph, first: Node, nodes: list[Node], bias_name: str, trans_b: bool,
                last: Node) -> bool:
    """A dense layer ``first`` (Gemm or MatMul; weight ``(N, K)`` if ``trans_b`` else
    ``(K, N)``) ending at ``last``, with optional int32 bias ``bias_name``."""
    x = _dequantized(graph, first.input(0))
    w_shape = graph.value(first.input(1)).shape
    if x is None or len(graph.value(first.input(0)).shape) != 2 or len(w_shape) != 2:
        return False
    axis = 0 if trans_b else 1
    channels = w_shape[axis]
    weight = _weight(graph, first.input(1), channels, axis)
    out = _output(graph, last)
    if weight is None or out is None:
        return False
    x_dq, x_params = x
    w, w_scale = weight
    bias = _bias(graph, bias_name, channels, x_params.scale, w_scale) if bias_name else None
    if bias is False:
        return False
    # The accelerator's Dense takes (out, in) weights.
    w_name = (_stored_weight(graph, first.input(1), w, first.name) if trans_b
              else _add_weight(graph, f"{first.name}.weight_q", w.T))
    inputs = [x_dq.inputs[0], w_name]
    if bias is not None:
        inputs.append(_add_weight(graph, f"{first.name}.bias_q", bias))
    attrs = {"x_scale": x_params.scale, "x_zero_point": x_params.zero_point,
             "w_scale": w_scale, "w_zero_point": np.zeros(channels, np.int64),
             **_output_attrs(out)}
    _replace(graph, nodes, out, "QGemm", inputs, attrs, first.name)
    return True


def _fuse_add(graph: Graph, add: Node) -> bool:
    if len(add.inputs) != 2:
        return False
    a, b = (_dequantized(graph, name) for name in add.inputs)
    shapes = {graph.value(name).shape for name in add.inputs}
    if a is None or b is None or len(shapes) != 1:
        return False
    out = _output(graph, add)
    if out is None:
        return False
    (a_dq, a_params), (b_dq, b_params) = a, b
    attrs = {"a_scale": a_params.scale, "a_zero_point": a_params.zero_point,
             "b_scale": b_params.scale, "b_zero_point": b_params.zero_point,
             **_output_attrs(out)}
    _replace(graph, [add], out, "QAdd", [a_dq.inputs[0], b_dq.inputs[0]], attrs, add.name)
    return True


def _fuse_max_pool(graph: Graph, pool: Node) -> bool:
    x = _dequantized(graph, pool.input(0))
    if (x is None or len(pool.outputs) != 1 or len(graph.value(pool.input(0)).shape) != 4
            or pool.attr("auto_pad", "NOTSET") != "NOTSET" or pool.attr("storage_order", 0)):
        return False
    out = _output(graph, pool)
    # Max commutes with the stored values only when both sides share scale and zero point.
    if out is None or out.absorbed or out.params != x[1]:
        return False
    kernel = list(pool.attr("kernel_shape"))
    attrs = {"kernel_shape": kernel, "strides": list(pool.attr("strides", [1, 1])),
             "pads": list(pool.attr("pads", [0, 0, 0, 0])),
             "dilations": list(pool.attr("dilations", [1, 1])),
             "ceil_mode": int(pool.attr("ceil_mode", 0)),
             "x_scale": x[1].scale, "x_zero_point": x[1].zero_point}
    _replace(graph, [pool], out, "QMaxPool", [x[0].inputs[0]], attrs, pool.name)
    return True


def _fuse_global_average_pool(graph: Graph, pool: Node) -> bool:
    x = _dequantized(graph, pool.input(0))
    shape = graph.value(pool.input(0)).shape
    out = _output(graph, pool) if x is not None and len(shape) == 4 else None
    if out is None or out.absorbed:
        return False
    return _replace_by_global_pool(graph, pool, x, out, shape)


def _replace_by_global_pool(graph: Graph, pool: Node, x: tuple[Node, _QParams], out: _Output,
                            shape: tuple[int, ...]) -> bool:
    """``pool`` (a global average over ``shape``'s image) as a QGlobalAveragePool, if
    onnxruntime accepts its scale and size."""
    pixels = shape[2] * shape[3]
    scale = np.float32(x[1].scale) / (np.float32(out.params.scale) * np.float32(pixels))
    if (pixels >= _GAP_MAX_PIXELS or not _GAP_SCALE_RANGE[0] <= scale < _GAP_SCALE_RANGE[1]
            or out.params.dtype != x[1].dtype):
        return False
    attrs = {"x_scale": x[1].scale, "x_zero_point": x[1].zero_point,
             "y_scale": out.params.scale, "y_zero_point": out.params.zero_point}
    _replace(graph, [pool], out, "QGlobalAveragePool", [x[0].inputs[0]], attrs, pool.name)
    return True


def _fuse_average_pool(graph: Graph, pool: Node) -> bool:
    """DQ -> AveragePool -> Q, which onnxruntime runs as QLinearAveragePool."""
    x = _dequantized(graph, pool.input(0))
    shape = graph.value(pool.input(0)).shape
    if (x is None or len(shape) != 4 or len(pool.outputs) != 1
            or pool.attr("auto_pad", "NOTSET") != "NOTSET"
            or any(d != 1 for d in pool.attr("dilations", [1, 1]))):
        return False      # QLinearAveragePool ignores dilations: onnxruntime would differ
    out = _output(graph, pool)
    if out is None or out.absorbed or out.params.dtype != x[1].dtype:
        return False
    kernel = [int(k) for k in pool.attr("kernel_shape")]
    pads = [int(p) for p in pool.attr("pads", [0, 0, 0, 0])]
    if kernel == list(shape[2:]) and not any(pads):
        # onnxruntime's QLinearAveragePool runs such a pool with its global kernel.
        return _replace_by_global_pool(graph, pool, x, out, shape)
    strides = [int(v) for v in pool.attr("strides", [1, 1])]
    ceil_mode = int(pool.attr("ceil_mode", 0))
    size = tuple(pool_output_size(shape[2 + i], pads[i], pads[i + 2], kernel[i], strides[i],
                                  ceil_mode) for i in range(2))
    if (any(p >= k for p, k in zip(pads, kernel * 2))
            or graph.value(out.quantize.outputs[0]).shape[2:] != size):
        return False
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "ceil_mode": ceil_mode,
             "count_include_pad": int(pool.attr("count_include_pad", 0)),
             "x_scale": x[1].scale, "x_zero_point": x[1].zero_point, **_output_attrs(out)}
    _replace(graph, [pool], out, "QAveragePool", [x[0].inputs[0]], attrs, pool.name)
    return True


def pool_output_size(size: int, begin: int, end: int, extent: int, stride: int,
                     ceil_mode: int) -> int:
    """Output size of a pooling dimension as ONNX and onnxruntime define it (``extent`` the
    dilated window); a ceil_mode window must start inside the input or the begin
    padding."""
    span = size + begin + end - extent
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + begin:
        out -= 1
    return out


def _pass_through(graph: Graph, node: Node) -> bool:
    """Flatten/Reshape between a DQ and a Q of equal parameters: run it on the stored
    tensor (it only moves values)."""
    x = _dequantized(graph, node.input(0))
    out = _output(graph, node) if x is not None else None
    if out is None or out.absorbed or out.params != x[1]:
        return False
    y = out.quantize.outputs[0]
    index = _index(graph, out.quantize)
    graph.add_node(node.op, [x[0].inputs[0], *node.inputs[1:]], [y],
                   name=graph.unique_name(f"{node.name}_q"), index=index, **node.attrs)
    graph.remove_nodes([node, out.quantize])
    graph.values.pop(node.outputs[0], None)
    return True


# 1-D convolutions and N-D matmuls: their 2-D forms between views (.qdq_views).
_REWRITES = {"Conv": fuse_conv, "Gemm": _fuse_gemm,
             "MatMul": lambda g, n: fuse_activation_matmul(g, n) or fuse_matmul(g, n),
             "Add": lambda g, n: _fuse_add(g, n) or fuse_add_constant(g, n),
             "Mul": fuse_mul, "MaxPool": _fuse_max_pool,
             "GlobalAveragePool": _fuse_global_average_pool, "AveragePool": _fuse_average_pool,
             "Flatten": _pass_through, "Reshape": _pass_through,
             "ConvTranspose": fuse_conv_transpose, "Softmax": fuse_softmax,
             "Concat": fuse_concat}


def _remove_dead_dequantize(graph: Graph) -> None:
    """Drop DequantizeLinear nodes nobody reads, and the constants only they read."""
    while True:
        used = set(graph.outputs) | {i for n in graph.nodes for i in n.inputs}
        dead = [n for n in graph.nodes if n.op == "DequantizeLinear" and not n.domain
                and not any(o in used for o in n.outputs)]
        if not dead:
            break
        graph.remove_nodes(dead)
        for node in dead:
            for name in node.outputs:
                graph.values.pop(name, None)
    used = set(graph.outputs) | {i for n in graph.nodes for i in n.inputs}
    for name in [n for n, v in graph.values.items() if v.is_const and n not in used]:
        del graph.values[name]
