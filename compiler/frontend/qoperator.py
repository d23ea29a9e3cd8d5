"""The QOperator format read as QDQ: :func:`expand_qoperators`.

onnxruntime's quantizer writes a model in one of two formats. QDQ keeps the float ops
between DequantizeLinear (DQ) and QuantizeLinear (Q) nodes, and onnxruntime fuses each
such pattern into its integer kernel; QOperator writes the integer ops themselves:
``QLinearConv`` and ``QLinearMatMul`` (standard ONNX) and onnxruntime's ``com.microsoft``
ops ``QGemm``, ``QLinearAdd``, ``QLinearMul``, ``QLinearAveragePool``,
``QLinearGlobalAveragePool``, ``QLinearConcat``, ``QLinearSigmoid``,
``QLinearLeakyRelu``. The compiler reads QDQ, so this pass rewrites each QOperator node
into its QDQ equivalent, on the ONNX model before the import checks it::

    QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B)
      ->  Q(Conv(DQ(x, xs, xz), DQ(w, ws, wz), DQ(B, xs * ws, 0)), ys, yz)

Then QDQ fusion (:func:`~.qdq.fuse_qdq`) makes the same integer nodes of it as of a QDQ
model, and what it does not fuse runs as float ops on the CPU. QOperator models also pool
stored values with a standard MaxPool; one whose input is quantized becomes DQ -> MaxPool
-> Q with the input's parameters (exact: max commutes with quantization), which fuses
into QMaxPool as in a QDQ model.

Exactness against onnxruntime 1.31 running the QOperator model
(``tests/compiler/frontend/test_qoperator.py``): onnxruntime computes the expanded model
bit for bit as the QOperator model, for each op above with int8 and uint8 activations,
so the rewrite is exact by construction wherever the compiler reproduces onnxruntime's
QDQ model: the fused QConv, QGemm (from QLinearConv, QLinearMatMul, QGemm), QAdd,
QAveragePool, QGlobalAveragePool, QMaxPool. Of what stays float on the CPU, QLinearConcat
is exact (onnxruntime looks each input up in a table of ``Q(DQ(v))``, the same single
IEEE operations); QLinearSigmoid and QLinearLeakyRelu become onnxruntime's own tables
(:func:`~.qlookup.tabulate_quantized_activations`). QLinearMul's DQ -> Mul -> Q differs
from onnxruntime's x86 kernel, ``rint(f32((a - az)(b - bz)) * f32(as * bs / ys) + yz)``,
on about one operand pair in ten million (by 1), and is otherwise exact.

Node and tensor names: the float op keeps the QOperator node's name (placements and
errors name the user's node); the DQ and Q nodes are ``<node>/DequantizeLinear`` and
``<node>/QuantizeLinear`` (with ``_1``, ``_2``, ... when there are several).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tessera.errors import CompileError

from .upgrade import DEFAULT_DOMAINS

__all__ = ["KEPT_CONTRIB_OPS", "QOPERATOR_OPS", "expand_qoperators"]

_MS = "com.microsoft"
#: onnxruntime ops that stay nodes of their own domain: no QDQ form says what they do
#: (DynamicQuantizeLSTM quantizes its input and state while it runs), and the CPU backend
#: runs them with onnxruntime's arithmetic (``compiler/cpu/lower_rnn.py``).
KEPT_CONTRIB_OPS = frozenset({(_MS, "DynamicQuantizeLSTM")})
#: The first opset whose DequantizeLinear takes a scale per channel (``axis``).
_PER_CHANNEL_OPSET = 13
#: Ops whose output has the element type of their input 0 (to tell the type of a
#: quantized tensor whose zero point a QOperator node omits).
_TYPE_PRESERVING = frozenset({
    "MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity",
    "Slice", "Split", "Concat", "Resize", "Pad", "Gather", "Expand", "Tile",
    "DepthToSpace", "SpaceToDepth"})
#: Ops that move stored values without changing them: their output keeps the
#: quantization parameters of their input.
_VALUE_PRESERVING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


@dataclass(frozen=True)
class _Operand:
    """A quantized input of a QOperator node: the tensor, its scale and zero point
    (``""``: omitted, 0)."""

    tensor: str
    scale: str
    zero_point: str


class _Rewrite:
    """The model being rewritten: fresh names, constants, element types, new nodes."""

    def __init__(self, model: onnx.ModelProto, opset: int) -> None:
        self.graph = model.graph
        self.opset = opset
        self.taken = ({t.name for t in self.graph.initializer}
                      | {i.name for i in self.graph.input}
                      | {o for n in self.graph.node for o in (*n.output, n.name)})
        self.constants = {t.name: t for t in self.graph.initializer}
        for node in self.graph.node:
            if node.op_type == "Constant" and node.attribute[0].name == "value":
                self.constants[node.output[0]] = node.attribute[0].t
        self.types = {v.name: v.type.tensor_type.elem_type
                      for v in (*self.graph.input, *self.graph.value_info, *self.graph.output)}
        self.types.update({name: t.data_type for name, t in self.constants.items()})
        #: Quantized tensors with per-tensor parameters: tensor -> (scale, zero point).
        self.qparams: dict[str, tuple[str, str]] = {}
        self.node: onnx.NodeProto | None = None
        #: What the nodes made for ``node`` are named after.
        self.base = ""

    # ----------------------------------------------------------------- bookkeeping
    def fresh(self, base: str) -> str:
        """A tensor or node name not used yet, derived from ``base``."""
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def add_constant(self, base: str, data: np.ndarray) -> str:
        name = self.fresh(base)
        tensor = numpy_helper.from_array(np.ascontiguousarray(data), name)
        self.graph.initializer.append(tensor)
        self.constants[name] = tensor
        self.types[name] = tensor.data_type
        return name

    def constant(self, name: str, what: str) -> np.ndarray:
        """The value of constant ``name`` (the node's ``what``)."""
        if name not in self.constants:
            raise self.error(f"its {what} {name!r} is not a constant; the compiler reads "
                             "QOperator nodes with constant scales and zero points")
        return numpy_helper.to_array(self.constants[name])

    def error(self, reason: str) -> CompileError:
        node = self.node
        return CompileError(f"{node.op_type} node {node.name!r}: {reason}", op=node.name)

    def start(self, node: onnx.NodeProto) -> None:
        """Make ``node`` the one being rewritten."""
        self.node = node
        self.base = node.name or node.output[0]

    def note(self, node: onnx.NodeProto) -> None:
        """Record what follows from a node kept as it is: the element types of its outputs
        and, for a QuantizeLinear or a reshape of a quantized tensor, the quantization
        parameters of its output."""
        if node.op_type == "QuantizeLinear":
            zp = node.input[2] if len(node.input) > 2 else ""
            self.types[node.output[0]] = self.types.get(zp, TensorProto.UINT8)
            scale = self.constants.get(node.input[1])
            if scale is not None and np.prod(scale.dims) == 1:
                self.qparams[node.output[0]] = (node.input[1], zp)
        elif node.op_type in _VALUE_PRESERVING and node.input[0] in self.qparams:
            self.qparams[node.output[0]] = self.qparams[node.input[0]]
        if node.op_type == "DynamicQuantizeLinear":
            self.types[node.output[0]] = TensorProto.UINT8
        elif node.op_type in _TYPE_PRESERVING and node.input[0] in self.types:
            for out in node.output:
                self.types.setdefault(out, self.types[node.input[0]])

    def element_type(self, tensor: str) -> int:
        if tensor not in self.types:
            raise self.error(f"the element type of its input {tensor!r} is unknown and it "
                             "omits the zero point that would tell it; give the zero point")
        return self.types[tensor]

    # ----------------------------------------------------------------- node makers
    def zero_point(self, operand: _Operand, dtype: int) -> str:
        """The operand's zero point, made explicit (of type ``dtype``) when omitted: a
        DequantizeLinear or QuantizeLinear without one means uint8."""
        if operand.zero_point:
            return operand.zero_point
        shape = self.constant(operand.scale, "scale").shape
        zeros = np.zeros(shape, helper.tensor_dtype_to_np_dtype(dtype))
        return self.add_constant(f"{operand.tensor}_zero_point", zeros)

    def dequantize(self, operand: _Operand, axis: int | None = None) -> tuple[onnx.NodeProto,
                                                                             str]:
        """A DequantizeLinear of ``operand`` (per channel along ``axis`` when its scale
        has several values) and the float tensor it writes."""
        zp = self.zero_point(operand, self.element_type(operand.tensor))
        out = self.fresh(f"{operand.tensor}_dequantized")
        attrs = {}
        if self.constant(operand.scale, "scale").size > 1:
            if axis is None:
                raise self.error(f"the scale {operand.scale!r} of {operand.tensor!r} has "
                                 "several values; this operand takes one (per tensor)")
            if self.opset < _PER_CHANNEL_OPSET:
                raise self.error(f"its scales per channel need opset {_PER_CHANNEL_OPSET} "
                                 f"in QDQ form, the model has opset {self.opset}; convert "
                                 f"the model to opset {_PER_CHANNEL_OPSET} or later")
            attrs["axis"] = axis
        node = helper.make_node("DequantizeLinear", [operand.tensor, operand.scale, zp], [out],
                                name=self.fresh(f"{self.base}/DequantizeLinear"), **attrs)
        self.types[out] = TensorProto.FLOAT
        return node, out

    def quantize(self, value: str, scale: str, zero_point: str, output: str,
                 dtype: int) -> onnx.NodeProto:
        """The QuantizeLinear writing the node's ``output`` of type ``dtype``."""
        zp = self.zero_point(_Operand(output, scale, zero_point), dtype)
        self.types[output] = dtype
        if self.constant(scale, "output scale").size == 1:
            self.qparams[output] = (scale, zp)
        return helper.make_node("QuantizeLinear", [value, scale, zp], [output],
                                name=self.fresh(f"{self.base}/QuantizeLinear"))

    def float_op(self, op: str, inputs: list[str], attrs: dict,
                 output: str | None = None) -> tuple[onnx.NodeProto, str]:
        """The float op in the middle, named as the QOperator node."""
        out = output or self.fresh(f"{self.node.output[0]}_float")
        self.types[out] = TensorProto.FLOAT
        return helper.make_node(op, inputs, [out], name=self.node.name, **attrs), out


# --------------------------------------------------------------------------- the pass
def expand_qoperators(model: onnx.ModelProto) -> int:
    """Rewrite every QOperator node of ``model`` (in place) into DequantizeLinear -> float
    op -> QuantizeLinear (module doc); returns how many it rewrote.

    Raises :class:`~tessera.errors.CompileError` naming the node for a QOperator node the
    compiler cannot take (scales that are not constants, a ``channels_last`` pool, scales
    per channel below opset 13). Other nodes are left as they are, among them
    :data:`KEPT_CONTRIB_OPS`, which have CPU kernels of their own. Call it before the
    model is checked (the ONNX checker does not know the ``com.microsoft`` ops).
    """
    opset = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 0)
    rewrite = _Rewrite(model, opset)
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in model.graph.node:
        expand = _EXPANSIONS.get((_domain(node), node.op_type))
        rewrite.start(node)
        made = None if expand is None else expand(rewrite, node)
        if made is None:
            rewrite.note(node)
            nodes.append(node)
            continue
        nodes.extend(made)
        count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        if not any(o.domain == _MS for o in model.graph.node):
            _drop_opset_import(model, _MS)
    return count


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain in DEFAULT_DOMAINS else node.domain


def _drop_opset_import(model: onnx.ModelProto, domain: str) -> None:
    kept = [o for o in model.opset_import if o.domain != domain]
    del model.opset_import[:]
    model.opset_import.extend(kept)


def _operand(node: onnx.NodeProto, first: int) -> _Operand:
    """The (tensor, scale, zero point) triple of ``node`` from input ``first``."""
    inputs = [*node.input, "", "", ""]
    return _Operand(inputs[first], inputs[first + 1], inputs[first + 2])


def _optional(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


def _attributes(node: onnx.NodeProto, drop: tuple[str, ...] = ()) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute
            if a.name not in drop}


def _output_type(rewrite: _Rewrite, zero_point: str, source: str) -> int:
    """A QOperator node's output type: its zero point's, else its input's (the ops'
    type constraint T)."""
    return rewrite.types.get(zero_point) or rewrite.element_type(source)


# ------------------------------------------------------------------ the expansions
def _expand_conv(rewrite: _Rewrite, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """QLinearConv: the weight per output channel (axis 0), the int32 bias on the
    accumulator's scale ``x_scale * w_scale``."""
    x, w = _operand(node, 0), _operand(node, 3)
    dq_x, x_float = rewrite.dequantize(x)
    dq_w, w_float = rewrite.dequantize(w, axis=0)
    made, inputs = [dq_x, dq_w], [x_float, w_float]
    bias = _optional(node, 8)
    if bias:
        scale = (np.float32(rewrite.constant(x.scale, "input scale").reshape(()))
                 * rewrite.constant(w.scale, "weight scale").astype(np.float32))
        dq_b, b_float = _dequantize_bias(rewrite, bias, scale)
        made.append(dq_b)
        inputs.append(b_float)
    conv, y_float = rewrite.float_op("Conv", inputs, _attributes(node))
    y_scale, y_zp = node.input[6], _optional(node, 7)
    out_type = _output_type(rewrite, y_zp, x.tensor)
    return [*made, conv, rewrite.quantize(y_float, y_scale, y_zp, node.output[0], out_type)]


def _dequantize_bias(rewrite: _Rewrite, bias: str,
                     scale: np.ndarray) -> tuple[onnx.NodeProto, str]:
    """DequantizeLinear of an int32 bias with ``scale`` (one, or one per channel) and
    zero point 0."""
    scale = np.asarray(scale, np.float32).reshape(-1)
    if scale.size == 1:
        scale = scale.reshape(())
    scale_name = rewrite.add_constant(f"{bias}_scale", scale)
    zp_name = rewrite.add_constant(f"{bias}_zero_point", np.zeros(scale.shape, np.int32))
    return rewrite.dequantize(_Operand(bias, scale_name, zp_name), axis=0)


def _expand_matmul(rewrite: _Rewrite, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """QLinearMatMul: ``a`` per tensor or per row (axis -2), ``b`` per tensor or per
    column (axis -1)."""
    a, b = _operand(node, 0), _operand(node, 3)
    dq_a, a_float = rewrite.dequantize(a, axis=-2)
    dq_b, b_float = rewrite.dequantize(b, axis=-1)
    matmul, y_float = rewrite.float_op("MatMul", [a_float, b_float], {})
    y_zp = _optional(node, 7)
    out_type = _output_type(rewrite, y_zp, a.tensor)
    return [dq_a, dq_b, matmul,
            rewrite.quantize(y_float, node.input[6], y_zp, node.output[0], out_type)]


def _expand_qgemm(rewrite: _Rewrite, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """com.microsoft QGemm: ``alpha * A' @ B' + C'``; B per output channel; the int32
    ``C`` on the scale ``alpha * a_scale * b_scale``; the output quantized when the node
    has ``y_scale``, else float."""
    attrs = _attributes(node)
    alpha, trans_b = float(attrs.get("alpha", 1.0)), int(attrs.get("transB", 0))
    a, b = _operand(node, 0), _operand(node, 3)
    dq_a, a_float = rewrite.dequantize(a)
    dq_b, b_float = rewrite.dequantize(b, axis=0 if trans_b else 1)
    made, inputs = [dq_a, dq_b], [a_float, b_float]
    bias = _optional(node, 6)
    if bias:
        scale = (np.float32(alpha) * np.float32(rewrite.constant(a.scale, "A scale")
                                                .reshape(()))
                 * rewrite.constant(b.scale, "B scale").astype(np.float32))
        dq_c, c_float = _dequantize_bias(rewrite, bias, scale)
        made.append(dq_c)
        inputs.append(c_float)
    gemm_attrs = {"alpha": alpha, "beta": 1.0, "transA": int(attrs.get("transA", 0)),
                  "transB": trans_b}
    y_scale = _optional(node, 7)
    if not y_scale:
        gemm, _ = rewrite.float_op("Gemm", inputs, gemm_attrs, output=node.output[0])
        return [*made, gemm]
    gemm, y_float = rewrite.float_op("Gemm", inputs, gemm_attrs)
    y_zp = _optional(node, 8)
    out_type = _output_type(rewrite, y_zp, a.tensor)
    return [*made, gemm, rewrite.quantize(y_float, y_scale, y_zp, node.output[0], out_type)]


def _binary(op: str) -> Callable[[_Rewrite, onnx.NodeProto], list[onnx.NodeProto]]:
    """QLinearAdd, QLinearMul: ``(A, As, Az, B, Bs, Bz, Cs, Cz)``."""
    def expand(rewrite: _Rewrite, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        a, b = _operand(node, 0), _operand(node, 3)
        dq_a, a_float = rewrite.dequantize(a)
        dq_b, b_float = rewrite.dequantize(b)
        binary, y_float = rewrite.float_op(op, [a_float, b_float], {})
        y_zp = _optional(node, 7)
        out_type = _output_type(rewrite, y_zp, a.tensor)
        return [dq_a, dq_b, binary,
                rewrite.quantize(y_float, node.input[6], y_zp, node.output[0], out_type)]
    return expand


def _unary(op: str) -> Callable[[_Rewrite, onnx.NodeProto], list[onnx.NodeProto]]:
    """QLinearSigmoid, QLinearLeakyRelu, QLinearAveragePool, QLinearGlobalAveragePool:
    ``(X, Xs, Xz, Ys, Yz)``, the op's attributes but ``channels_last``."""
    def expand(rewrite: _Rewrite, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        attrs = _attributes(node, drop=("channels_last",))
        if _attributes(node).get("channels_last", 0):
            raise rewrite.error("channels_last (NHWC) pooling is not supported; quantize "
                                "the NCHW model")
        x = _operand(node, 0)
        dq_x, x_float = rewrite.dequantize(x)
        unary, y_float = rewrite.float_op(op, [x_float], attrs)
        y_zp = _optional(node, 4)
        out_type = _output_type(rewrite, y_zp, x.tensor)
        return [dq_x, unary,
                rewrite.quantize(y_float, node.input[3], y_zp, node.output[0], out_type)]
    return expand


def _expand_concat(rewrite: _Rewrite, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """com.microsoft QLinearConcat: ``(Ys, Yz, X0, X0s, X0z, X1, ...)``."""
    operands = [_operand(node, i) for i in range(2, len(node.input), 3)]
    if not operands or (len(node.input) - 2) % 3:
        raise rewrite.error("its inputs are not (tensor, scale, zero point) triples after "
                            "the output's scale and zero point")
    made, inputs = [], []
    for operand in operands:
        dq, value = rewrite.dequantize(operand)
        made.append(dq)
        inputs.append(value)
    concat, y_float = rewrite.float_op("Concat", inputs, _attributes(node))
    y_zp = node.input[1]
    out_type = _output_type(rewrite, y_zp, operands[0].tensor)
    return [*made, concat,
            rewrite.quantize(y_float, node.input[0], y_zp, node.output[0], out_type)]


def _expand_max_pool(rewrite: _Rewrite, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """A standard MaxPool on a quantized tensor (QOperator models pool the stored values):
    DQ -> MaxPool -> Q with the input's parameters, the pattern QDQ fusion makes QMaxPool
    of (max commutes with the monotonic quantization, so this is exact). None (left as
    it is) for a MaxPool of a float tensor, or with an Indices output."""
    params = rewrite.qparams.get(node.input[0])
    if params is None or len(node.output) != 1:
        return None
    x = _Operand(node.input[0], *params)
    dq_x, x_float = rewrite.dequantize(x)
    pool, y_float = rewrite.float_op("MaxPool", [x_float], _attributes(node))
    out_type = rewrite.element_type(node.input[0])
    return [dq_x, pool, rewrite.quantize(y_float, *params, node.output[0], out_type)]


#: (domain, op type) -> the expansion into DQ -> float op -> Q (None: node kept).
_EXPANSIONS: dict[tuple[str, str], Callable[[_Rewrite, onnx.NodeProto],
                                            list[onnx.NodeProto] | None]] = {
    ("", "QLinearConv"): _expand_conv,
    ("", "QLinearMatMul"): _expand_matmul,
    (_MS, "QGemm"): _expand_qgemm,
    (_MS, "QLinearAdd"): _binary("Add"),
    (_MS, "QLinearMul"): _binary("Mul"),
    (_MS, "QLinearAveragePool"): _unary("AveragePool"),
    (_MS, "QLinearGlobalAveragePool"): _unary("GlobalAveragePool"),
    (_MS, "QLinearSigmoid"): _unary("Sigmoid"),
    (_MS, "QLinearLeakyRelu"): _unary("LeakyRelu"),
    (_MS, "QLinearConcat"): _expand_concat,
    ("", "MaxPool"): _expand_max_pool,
}
#: The QOperator ops :func:`expand_qoperators` rewrites, as (domain, op type).
QOPERATOR_OPS = frozenset(_EXPANSIONS) - {("", "MaxPool")}
