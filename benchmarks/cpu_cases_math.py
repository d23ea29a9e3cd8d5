"""Benchmark cases for the math CPU kernels: elementwise ops and fused chains,
reductions, softmax, layer norm (run by ``cpu_kernels.py``).

Each numpy baseline is the expression a user would write for the op, on the same data
as the kernel, returning the same array. Fused chains (target 2.0x) are expressions of
three or more elementwise ops, where numpy makes a temporary per op.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from cpu_case import Case, KernelCall
from tessera.compiler.cpu.elementwise import E, fused_elementwise, maximum
from tessera.compiler.cpu.kernel import CpuKernel, TensorSpec
from tessera.compiler.cpu.norm import layer_norm
from tessera.compiler.cpu.reduce import reduction
from tessera.compiler.cpu.softmax import log_softmax, softmax
from tessera.runtime.cpu import load_kernel

Fns = tuple[Callable[[], object], Callable[[], object]]
_RNG = np.random.default_rng(0)

ACT = (1, 64, 56, 56)          # a ResNet stage-1 activation
CHAN = (1, 64, 1, 1)           # per-channel parameters for it
VEC = (1_000_000,)
TOKENS = (1, 197, 768)         # ViT-B/16 tokens


def _f32(shape, scale=1.0) -> np.ndarray:
    return (_RNG.standard_normal(shape) * scale).astype(np.float32)


def _i8(shape) -> np.ndarray:
    return _RNG.integers(-128, 128, shape, dtype=np.int8)


def _spec(a: np.ndarray) -> TensorSpec:
    return TensorSpec(a.shape, a.dtype.name)


def _kernel_fn(kernel: CpuKernel, *arrays: np.ndarray) -> Callable[[], np.ndarray]:
    return KernelCall(load_kernel(kernel), *arrays)


def _ew(expr: E, *arrays: np.ndarray) -> Callable[[], np.ndarray]:
    return _kernel_fn(fused_elementwise(expr, [_spec(a) for a in arrays]), *arrays)


def _shape(shape) -> str:
    if len(shape) > 1:
        return "x".join(str(d) for d in shape)
    return f"{shape[0]:.0e}".replace("+0", "")     # 1e6


def case(op: str, shape, dtype: str, target: float = 1.0):
    """Decorator: register ``setup`` as a benchmark case."""
    def register(setup: Callable[[], Fns]) -> Callable[[], Fns]:
        CASES.append(Case(op, _shape(shape), dtype, target, setup))
        return setup
    return register


CASES: list[Case] = []
x0, x1 = E.input(0), E.input(1)


# --- single elementwise ops ----------------------------------------------------------

@case("relu", ACT, "float32")
def _relu_f32() -> Fns:
    x = _f32(ACT)
    return (lambda: np.maximum(x, np.float32(0))), _ew(x0.relu(), x)


@case("relu", VEC, "int8")
def _relu_i8() -> Fns:
    q = _i8(VEC)
    return (lambda: np.maximum(q, np.int8(0))), _ew(x0.relu(), q)


@case("add", VEC, "float32")
def _add_f32() -> Fns:
    x, y = _f32(VEC), _f32(VEC)
    return (lambda: x + y), _ew(x0 + x1, x, y)


@case("add (wrapping)", VEC, "int8")
def _add_i8() -> Fns:
    a, b = _i8(VEC), _i8(VEC)
    return (lambda: a + b), _ew(x0 + x1, a, b)


@case("mul per-channel", ACT, "float32")
def _mul_chan() -> Fns:
    x, s = _f32(ACT), _f32(CHAN)
    return (lambda: x * s), _ew(x0 * x1, x, s)


@case("clip (relu6)", ACT, "float32")
def _clip() -> Fns:
    x = _f32(ACT, 4)
    return (lambda: np.clip(x, np.float32(0), np.float32(6))), _ew(x0.clip(0.0, 6.0), x)


@case("exp", VEC, "float32")
def _exp() -> Fns:
    x = _f32(VEC, 5)
    return (lambda: np.exp(x)), _ew(x0.exp(), x)


@case("sigmoid", ACT, "float32")
def _sigmoid() -> Fns:
    x = _f32(ACT, 4)
    return (lambda: 1 / (1 + np.exp(-x))), _ew(x0.sigmoid(), x)


@case("tanh", VEC, "float32")
def _tanh() -> Fns:
    x = _f32(VEC, 2)
    return (lambda: np.tanh(x)), _ew(x0.tanh(), x)


@case("quantize", ACT, "float32->int8")
def _quantize() -> Fns:
    x = _f32(ACT, 3)
    s, zp = np.float32(0.05), np.float32(-3)
    return ((lambda: np.clip(np.rint(x / s) + zp, -128, 127).astype(np.int8)),
            _ew(x0.quantize(0.05, -3, "int8"), x))


@case("dequantize", ACT, "int8->float32")
def _dequantize() -> Fns:
    q = _i8(ACT)
    s = np.float32(0.05)
    return ((lambda: (q.astype(np.int32) - 3).astype(np.float32) * s),
            _ew(x0.dequantize(0.05, 3), q))


# --- fused chains (>= 3 elementwise ops) ---------------------------------------------

@case("scale+bias+relu", ACT, "float32", 2.0)
def _affine_relu() -> Fns:
    x, s, b = _f32(ACT), _f32(CHAN), _f32(CHAN)
    return ((lambda: np.maximum(x * s + b, np.float32(0))),
            _ew((x0 * x1 + E.input(2)).relu(), x, s, b))


@case("batchnorm (x-m)*r*g+b", ACT, "float32", 2.0)
def _batchnorm() -> Fns:
    x, m, r, g, b = _f32(ACT), _f32(CHAN), np.abs(_f32(CHAN)), _f32(CHAN), _f32(CHAN)
    expr = (x0 - x1) * E.input(2) * E.input(3) + E.input(4)
    return (lambda: (x - m) * r * g + b), _ew(expr, x, m, r, g, b)


@case("swish x*sigmoid(x)", ACT, "float32", 2.0)
def _swish() -> Fns:
    x = _f32(ACT, 3)
    return (lambda: x / (1 + np.exp(-x))), _ew(x0 * x0.sigmoid(), x)


@case("gelu (tanh approx.)", (1, 197, 3072), "float32", 2.0)
def _gelu() -> Fns:
    x = _f32((1, 197, 3072), 2)
    c, k = np.float32(0.7978845608), np.float32(0.044715)
    expr = 0.5 * x0 * (1.0 + (0.7978845608 * (x0 + 0.044715 * x0 * x0 * x0)).tanh())
    return ((lambda: np.float32(0.5) * x * (1 + np.tanh(c * (x + k * x * x * x)))),
            _ew(expr, x))


@case("dequant+relu+requant", ACT, "int8", 2.0)
def _requant() -> Fns:
    q = _i8(ACT)
    s, s2 = np.float32(0.05), np.float32(0.1)

    def numpy_fn():
        f = np.maximum((q.astype(np.int32) - 3).astype(np.float32) * s, np.float32(0))
        return np.clip(np.rint(f / s2) - 2, -128, 127).astype(np.int8)
    return numpy_fn, _ew(x0.dequantize(0.05, 3).relu().quantize(0.1, -2, "int8"), q)


@case("saturating residual add", ACT, "int8", 2.0)
def _residual() -> Fns:
    a, b = _i8(ACT), _i8(ACT)
    expr = (x0.cast("int32") + x1.cast("int32")).clip(-128, 127).cast("int8")
    return (lambda: np.clip(a.astype(np.int16) + b, -128, 127).astype(np.int8)), _ew(expr, a, b)


@case("max(x,y)*s+b", VEC, "float32", 2.0)
def _max_affine() -> Fns:
    x, y = _f32(VEC), _f32(VEC)
    return ((lambda: np.maximum(x, y) * np.float32(0.5) + np.float32(1)),
            _ew(maximum(x0, x1) * 0.5 + 1.0, x, y))


# --- reductions ----------------------------------------------------------------------

def _reduce_case(op: str, shape, dtype: str, axes, numpy_fn):
    def setup() -> Fns:
        x = _f32(shape) if dtype == "float32" else _i8(shape)
        kernel = reduction(op, _spec(x), axes, keepdims=True)
        return (lambda: numpy_fn(x)), _kernel_fn(kernel, x)
    CASES.append(Case(f"reduce_{op} axes={list(axes) if axes else 'all'}", _shape(shape),
                      dtype, 1.0, setup))


_reduce_case("sum", ACT, "float32", (2, 3), lambda x: x.sum((2, 3), keepdims=True))
_reduce_case("mean", ACT, "float32", (2, 3), lambda x: x.mean((2, 3), keepdims=True))
_reduce_case("max", ACT, "float32", (2, 3), lambda x: x.max((2, 3), keepdims=True))
_reduce_case("mean", TOKENS, "float32", (-1,), lambda x: x.mean(-1, keepdims=True))
_reduce_case("sum", TOKENS, "float32", (1,), lambda x: x.sum(1, keepdims=True))
_reduce_case("max", VEC, "float32", None, lambda x: x.max(keepdims=True))
_reduce_case("sum", VEC, "int8", None, lambda x: x.sum(keepdims=True, dtype=np.int32))
_reduce_case("max", ACT, "int8", (1,), lambda x: x.max(1, keepdims=True))


# --- softmax and layer norm -----------------------------------------------------------

def _softmax_np(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _log_softmax_np(x, axis):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def _softmax_case(shape, axis: int, log: bool = False):
    def setup() -> Fns:
        x = _f32(shape, 4)
        ref = _log_softmax_np if log else _softmax_np
        build = log_softmax if log else softmax
        return (lambda: ref(x, axis)), _kernel_fn(build(_spec(x), axis), x)
    CASES.append(Case(f"{'log_softmax' if log else 'softmax'} axis={axis}", _shape(shape),
                      "float32", 1.0, setup))


_softmax_case((1, 1000), -1)
_softmax_case((64, 1000), -1)
_softmax_case((1, 12, 197, 197), -1)
_softmax_case(ACT, 1)
_softmax_case((64, 1000), -1, log=True)


@case("layer_norm axis=-1", TOKENS, "float32")
def _layer_norm() -> Fns:
    x, g, b = _f32(TOKENS, 2), _f32(TOKENS[-1:]), _f32(TOKENS[-1:])
    eps = np.float32(1e-5)

    def numpy_fn():
        m = x.mean(-1, keepdims=True)
        v = x.var(-1, keepdims=True)
        return (x - m) / np.sqrt(v + eps) * g + b
    return numpy_fn, _kernel_fn(layer_norm(_spec(x), _spec(g), _spec(b)), x, g, b)


@case("layer_norm axis=-1", (64, 1024), "float32")
def _layer_norm_wide() -> Fns:
    x, g, b = _f32((64, 1024)), _f32((1024,)), _f32((1024,))

    def numpy_fn():
        m = x.mean(-1, keepdims=True)
        v = x.var(-1, keepdims=True)
        return (x - m) / np.sqrt(v + np.float32(1e-5)) * g + b
    return numpy_fn, _kernel_fn(layer_norm(_spec(x), _spec(g), _spec(b)), x, g, b)
