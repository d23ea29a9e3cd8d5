"""CPU lowerings of the elementwise math ops (domain ""): activations, arithmetic,
rounding, comparisons, Where, and the per-channel normalisations (standalone
BatchNormalization, InstanceNormalization, LRN); :data:`MATH_LOWERINGS` maps each op type to
its lowering (see :mod:`.lower`).

Each op is one fused elementwise kernel (one pass over memory) written as an
:class:`~.elementwise.E` expression with onnxruntime's (CPU provider) formula and order of
operations, so results of exactly rounded operations are bit-identical to it (Add, Mul,
Div, Max, HardSigmoid, LeakyRelu, Round, Sum, Mean, BatchNormalization, comparisons...).
Transcendentals (Exp, Log, Erf, Tanh, Pow, ...) are the vectorised polynomials of
:mod:`.irutil` and :mod:`.fmath`, within a few ulp of the correctly rounded result, as
onnxruntime's are: the two agree to a few ulp, not bit for bit.

Integer forms: int8, uint8, int16, int32 and int64 for Add, Sub, Mul, Div, Max, Min, Clip,
Relu, Abs, Sign, the comparisons and Where; int8, int32 and int64 for Neg; int32 for
PRelu. Integer arithmetic wraps and integer Div truncates toward zero, as onnxruntime's
kernels do. Where and Equal also take bool.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..cpu import (CpuKernel, E, TensorSpec, build_lrn, fused_elementwise, layer_norm, maximum,
                   minimum)
from .elementwise import where
from .lower_plan import LowerFn, NodeLowering, Operands, Plan, single_step

__all__ = ["MATH_LOWERINGS"]

NUMERIC = ("float32", "int8", "uint8", "int16", "int32", "int64")
SIGNED = ("float32", "int8", "int32", "int64")
INTEGER = ("int8", "uint8", "int16", "int32", "int64")
FLOAT = ("float32",)

Attr = Callable[[str, Any], Any]


# ------------------------------------------------------------------ generic shapes
def _unary(fn: Callable[[E], E], dtypes: Sequence[str] = NUMERIC) -> LowerFn:
    """Relu, Sigmoid, Tanh, Exp, Neg, Abs, ...: ``fn`` of the input."""
    def lower(low: NodeLowering) -> list[Plan]:
        ops = Operands()
        x = ops.tensor(low, low.node.input(0), dtypes)
        out = low.output()
        return [ops.plan(fn(x), out.name, out.shape, out.dtype)]
    return lower


def _activation(fn: Callable[[E, Attr], E]) -> LowerFn:
    """A float32 activation with attributes: ``fn(x, attr)``, ``attr(key, default)``
    reading the node's (float attributes are float32 in ONNX, and so are the
    expression's constants)."""
    def lower(low: NodeLowering) -> list[Plan]:
        ops = Operands()
        x = ops.tensor(low, low.node.input(0), FLOAT)
        out = low.output()
        return [ops.plan(fn(x, low.attr), out.name, out.shape, out.dtype)]
    return lower


def _fold(low: NodeLowering, fn: Callable[[E, E], E], dtypes: Sequence[str]
          ) -> tuple[Operands, E, int]:
    """The node's inputs folded left to right with ``fn`` (onnxruntime's order for the
    variadic ops), with numpy broadcasting; returns the operands, the expression and the
    number of inputs."""
    names = [n for n in low.node.inputs if n]
    low.require(bool(names), "it has no inputs")
    ops = Operands()
    terms = [ops.tensor(low, n, dtypes) for n in names]
    expr = terms[0]
    for term in terms[1:]:
        expr = fn(expr, term)
    return ops, expr, len(names)


def _binary(fn: Callable[[E, E], E], dtypes: Sequence[str] = NUMERIC) -> LowerFn:
    """Add, Sub, Mul, the comparisons and the variadic Sum, Max, Min (folded pairwise),
    with numpy broadcasting."""
    def lower(low: NodeLowering) -> list[Plan]:
        ops, expr, _ = _fold(low, fn, dtypes)
        out = low.output()
        return [ops.plan(expr, out.name, out.shape, out.dtype)]
    return lower


def _div(low: NodeLowering) -> list[Plan]:
    """IEEE division for float32, C's truncating division for integers."""
    integer = low.input(0).dtype in INTEGER
    return _binary(E.trunc_div if integer else (lambda x, y: x / y))(low)


def _mean(low: NodeLowering) -> list[Plan]:
    """The sum in input order times 1/n (rounded to float32), as onnxruntime does."""
    ops, expr, n = _fold(low, lambda x, y: x + y, FLOAT)
    out = low.output()
    expr = expr * float(np.float32(1) / np.float32(n)) if n > 1 else expr
    return [ops.plan(expr, out.name, out.shape, out.dtype)]


def _clip(low: NodeLowering) -> list[Plan]:
    ops = Operands()
    expr = ops.tensor(low, low.node.input(0), NUMERIC)
    # np.clip's order (max, then min), which is onnxruntime's too.
    if low.node.input(1):
        expr = maximum(expr, ops.tensor(low, low.node.input(1), NUMERIC))
    if low.node.input(2):
        expr = minimum(expr, ops.tensor(low, low.node.input(2), NUMERIC))
    out = low.output()
    return [ops.plan(expr, out.name, out.shape, out.dtype)]


def _where(low: NodeLowering) -> list[Plan]:
    ops = Operands()
    cond = ops.tensor(low, low.node.input(0), ("bool",))
    a, b = (_typed(low, ops, low.node.input(i), (*NUMERIC, "bool")) for i in (1, 2))
    out = low.output()
    return [ops.plan(where(cond, a, b), out.name, out.shape, out.dtype)]


def _typed(low: NodeLowering, ops: Operands, name: str, dtypes: Sequence[str]) -> E:
    """Like ``Operands.tensor``, but a one-element constant keeps its tensor's dtype
    (Where's two values can both be constants, with nothing else to take it from)."""
    e = ops.tensor(low, name, dtypes)
    return E.const(e.value, low.value(name).dtype) if e.op == "const" else e


# ---------------------------------------------------------------------- activations
def _hard_sigmoid(x: E, alpha: float, beta: float) -> E:
    """max(0, min(1, alpha * x + beta)), multiply and add rounded separately."""
    return (x * alpha + beta).clip(0.0, 1.0)


def _softplus(x: E) -> E:
    """log(1 + e**x) without overflow: max(x, 0) + log1p(e**-|x|) (onnxruntime's
    x + log1p(e**-x) for x > 0, log1p(e**x) otherwise)."""
    return x.relu() + (-abs(x)).exp().log1p()


def _selu(x: E, attr: Attr) -> E:
    """gamma * x for x > 0, else (gamma * alpha) * (e**x - 1), onnxruntime's rounding
    (the product gamma * alpha rounded to float32 first)."""
    gamma = np.float32(attr("gamma", 1.05070102214813232421875))
    alpha = np.float32(attr("alpha", 1.67326319217681884765625))
    return where(x.greater(0.0), x * float(gamma), (x.exp() - 1.0) * float(gamma * alpha))


_SQRT_2_OVER_PI = 0.7978845608028654


def _gelu(x: E, attr: Attr) -> E:
    """x/2 * (1 + erf(x / sqrt(2))), or with ``approximate="tanh"`` x/2 * (1 +
    tanh(sqrt(2/pi) * (x + 0.044715 x**3))), the latter as onnxruntime factors it:
    tanh(x * (c x**2 + sqrt(2/pi))) with c = 0.044715 sqrt(2/pi)."""
    if attr("approximate", "none") == "tanh":
        inner = x * (0.044715 * _SQRT_2_OVER_PI * x * x + _SQRT_2_OVER_PI)
        return x * 0.5 * (inner.tanh() + 1.0)
    return x * 0.5 * ((x * 0.7071067811865476).erf() + 1.0)


def _gelu_lowering(low: NodeLowering) -> list[Plan]:
    approximate = low.attr("approximate", "none")
    low.require(approximate in ("none", "tanh"), f"approximate={approximate!r} is not one "
                "of 'none' and 'tanh'")
    return _activation(_gelu)(low)


def _prelu(low: NodeLowering) -> list[Plan]:
    """x where x >= 0, else slope * x; the slope broadcasts to x."""
    return _binary(lambda x, slope: where(x.greater_equal(0), x, x * slope),
                   ("float32", "int32"))(low)


def _pow(low: NodeLowering) -> list[Plan]:
    """float32 x ** y. A constant exponent of another dtype (an int64 2, say) is converted
    to float32; a one-element exponent of 2 or 3 is x * x (* x), as in onnxruntime."""
    ops = Operands()
    x = ops.tensor(low, low.node.input(0), FLOAT)
    name = low.node.input(1)
    data = low.graph.const(name)
    if data is None or data.dtype == np.float32:
        y = ops.tensor(low, name, FLOAT)
    else:
        exponent = data.astype(np.float32)
        low.require(np.array_equal(exponent.astype(data.dtype), data), f"its exponent "
                    f"({name!r}) has {data.dtype} values that float32 does not hold exactly")
        y = E.const(float(exponent.reshape(()))) if exponent.size == 1 else \
            ops.array(low.tmp("exponent"), exponent)
    if y.op == "const" and y.value in (2.0, 3.0):
        expr = x * x if y.value == 2.0 else x * x * x
    else:
        expr = x ** y
    out = low.output()
    return [ops.plan(expr, out.name, out.shape, out.dtype)]


# -------------------------------------------------------------------- normalisation
def _check_channel(low: NodeLowering, name: str, channels: int, what: str) -> None:
    value = low.value(name)
    low.require(value.dtype == "float32" and value.size == channels, f"its {what} ({name!r}) "
                f"is {value.dtype}{list(value.shape)}; expected float32[{channels}]")


def _channel_param(low: NodeLowering, ops: Operands, read_as: dict[str, tuple[int, ...]],
                   name: str, shape: tuple[int, ...]) -> E:
    """Per-channel parameter ``name`` (C values) as an operand read as ``shape`` =
    (C, 1, ...), so that it broadcasts over (N, C, D1, ...)."""
    read_as[name] = shape
    return ops.add(name, TensorSpec(low.value(name).shape, "float32"), low.graph.const(name))


def _channel_plan(ops: Operands, read_as: dict[str, tuple[int, ...]], expr: E,
                  low: NodeLowering) -> Plan:
    """The fused kernel of ``expr`` writing the node's output, with the per-channel
    operands of :func:`_channel_param` read in their broadcasting shape."""
    out = low.output()
    specs, names = tuple(ops.specs), tuple(ops.names)
    shapes = [read_as.get(n) for n in names]

    def build() -> CpuKernel:
        return fused_elementwise(expr, specs, out.dtype, out.shape, read_as=shapes)
    return Plan(None, names, (out.name,), build, dict(ops.constants))


def _batch_norm_affine(scale, bias, mean, var, epsilon, sqrt):
    """onnxruntime's inference BatchNormalization as ``x * a + b``: a = scale /
    sqrt(var + eps) (as 1/sqrt(...) times scale), b = bias - mean * a. Works on float32
    arrays (``sqrt=np.sqrt``) and on expressions (``sqrt=E.sqrt``) alike."""
    a = 1.0 / sqrt(var + epsilon) * scale
    return a, bias - mean * a


def _batch_norm(low: NodeLowering) -> list[Plan]:
    node = low.node
    low.require(not low.attr("training_mode", 0) and len([o for o in node.outputs if o]) == 1,
                "training mode (batch statistics, running-mean outputs) is not supported; "
                "export the model for inference")
    x = low.spec(node.input(0), FLOAT)
    low.require(x.ndim >= 2, f"its input has rank {x.ndim}; BatchNormalization needs (N, C, ...)")
    epsilon = np.float32(low.attr("epsilon", 1e-5))
    names = [node.input(i) for i in range(1, 5)]
    low.require(all(names), "it needs all of scale, B, input_mean and input_var")
    for name, what in zip(names, ("scale", "B", "input_mean", "input_var")):
        _check_channel(low, name, x.shape[1], what)
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    ops, read_as = Operands(), {}
    xe = ops.tensor(low, node.input(0), FLOAT)
    consts = [low.graph.const(n) for n in names]
    if all(c is not None for c in consts):
        # Trained models: the parameters fold into one scale and shift per channel.
        a, b = _batch_norm_affine(*consts, epsilon, np.sqrt)
        a, b = (ops.array(low.tmp(w), c.reshape(shape)) for w, c in (("scale", a), ("shift", b)))
    else:
        params = [_channel_param(low, ops, read_as, n, shape) for n in names]
        a, b = _batch_norm_affine(*params, float(epsilon), E.sqrt)
    return [_channel_plan(ops, read_as, xe * a + b, low)]


def _instance_norm(low: NodeLowering) -> list[Plan]:
    """Each (n, c) plane normalised by the layer-norm kernel (mean, then the variance of
    the centred values), then scaled and shifted per channel in a fused kernel."""
    node = low.node
    x = low.spec(node.input(0), FLOAT)
    low.require(x.ndim >= 3, f"its input has rank {x.ndim}; InstanceNormalization needs "
                "(N, C, D1, ...)")
    epsilon = float(low.attr("epsilon", 1e-5))
    one, normalised = low.tmp("one"), low.tmp("normalised")
    ones = TensorSpec((1,), "float32")
    plans = [Plan("normalised", (node.input(0), one), (normalised,),
                  lambda: layer_norm(x, ones, None, axis=2, epsilon=epsilon),
                  {one: np.ones(1, np.float32)})]
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    ops, read_as = Operands(), {}
    y = ops.add(normalised, x)
    for i, what in ((1, "scale"), (2, "B")):
        _check_channel(low, node.input(i), x.shape[1], what)
    scale, bias = (_channel_param(low, ops, read_as, node.input(i), shape) for i in (1, 2))
    return [*plans, _channel_plan(ops, read_as, y * scale + bias, low)]


def _lrn(low: NodeLowering) -> list[Plan]:
    """Local response normalisation across channels: one kernel (:mod:`.lrn`)."""
    x = low.spec(low.node.input(0), FLOAT)
    low.require(x.ndim >= 3, f"its input has rank {x.ndim}; LRN needs (N, C, D1, ...)")
    size = low.attr("size")
    low.require(isinstance(size, int) and size >= 1, f"its size attribute is {size!r}; LRN "
                "needs a positive integer size")
    return single_step(low, build_lrn, x, size, float(low.attr("alpha", 1e-4)),
                       float(low.attr("beta", 0.75)), float(low.attr("bias", 1.0)))


# ---------------------------------------------------------------------- dispatch table
#: op type -> lowering.
MATH_LOWERINGS: dict[str, LowerFn] = {
    # activations
    "Relu": _unary(E.relu),
    "Clip": _clip,
    "Sigmoid": _unary(E.sigmoid, FLOAT),
    "Tanh": _unary(E.tanh, FLOAT),
    "HardSigmoid": _activation(lambda x, a: _hard_sigmoid(x, a("alpha", 0.2), a("beta", 0.5))),
    "HardSwish": _unary(lambda x: x * _hard_sigmoid(x, 1 / 6, 0.5), FLOAT),
    "LeakyRelu": _activation(lambda x, a: where(x.greater_equal(0.0), x, x * a("alpha", 0.01))),
    "PRelu": _prelu,
    "Elu": _activation(lambda x, a: where(x.greater_equal(0.0), x,
                                          (x.exp() - 1.0) * a("alpha", 1.0))),
    "Selu": _activation(_selu),
    "Softplus": _unary(_softplus, FLOAT),
    "Mish": _unary(lambda x: x * _softplus(x).tanh(), FLOAT),
    "Erf": _unary(E.erf, FLOAT),
    "Gelu": _gelu_lowering,
    # arithmetic
    "Add": _binary(lambda x, y: x + y),
    "Sub": _binary(lambda x, y: x - y),
    "Mul": _binary(lambda x, y: x * y),
    "Div": _div,
    "Pow": _pow,
    "Sum": _binary(lambda x, y: x + y, FLOAT),
    "Mean": _mean,
    "Max": _binary(maximum, NUMERIC),
    "Min": _binary(minimum, NUMERIC),
    "Neg": _unary(lambda x: -x, SIGNED),
    "Abs": _unary(abs),
    "Sign": _unary(E.sign),
    "Reciprocal": _unary(lambda x: 1.0 / x, FLOAT),
    "Sqrt": _unary(E.sqrt, FLOAT),
    "Exp": _unary(E.exp, FLOAT),
    "Log": _unary(E.log, FLOAT),
    "Floor": _unary(E.floor, FLOAT),
    "Ceil": _unary(E.ceil, FLOAT),
    "Round": _unary(E.round, FLOAT),
    # comparisons, selection
    "Equal": _binary(E.equal, (*NUMERIC, "bool")),
    "Less": _binary(E.less),
    "LessOrEqual": _binary(E.less_equal),
    "Greater": _binary(E.greater),
    "GreaterOrEqual": _binary(E.greater_equal),
    "Where": _where,
    # per-channel normalisation
    "BatchNormalization": _batch_norm,
    "InstanceNormalization": _instance_norm,
    "LRN": _lrn,
}
