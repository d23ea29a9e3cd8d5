"""Layer normalisation (ONNX LayerNormalization, opset 17), float32.

``Y = (X - mean) / sqrt(var + epsilon) * Scale + B`` where mean and (biased) variance
are taken over the dimensions ``axis..rank-1`` of X. Per row of those dimensions the
kernel makes three vectorised passes over memory that is in cache after the first:
mean, variance of the centred values (two-pass, no cancellation), then the affine
output. Sums are reassociated (vector partial sums): compare with a relative tolerance.

Scale and B must have the normalised shape (``X.shape[axis:]``, leading 1s allowed) or
a single element. The optional outputs Mean and InvStdDev (shape ``X.shape[:axis]``
followed by ones) are produced with ``stats=True``.
"""
from __future__ import annotations

from math import prod

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module


def _strip_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return shape[k:]


def _param_scalar(spec: TensorSpec, norm_shape: tuple[int, ...], what: str) -> bool:
    """Whether a Scale/B spec is one element (else it must have the normalised shape)."""
    if spec.dtype != "float32":
        raise CpuKernelError(f"layer_norm {what} must be float32, not {spec.dtype}")
    if spec.size == 1:
        return True
    if _strip_ones(spec.shape) != _strip_ones(norm_shape):
        raise CpuKernelError(f"layer_norm {what} shape {spec.shape} must be {norm_shape} "
                             "or a single element")
    return False


def layer_norm(x: TensorSpec, scale: TensorSpec, bias: TensorSpec | None = None,
               axis: int = -1, epsilon: float = 1e-5, stats: bool = False) -> CpuKernel:
    """ONNX LayerNormalization. Inputs: X, Scale and optionally B (in that order);
    outputs: Y, plus Mean and InvStdDev if ``stats``."""
    if x.dtype != "float32":
        raise CpuKernelError(f"layer_norm needs float32 input, not {x.dtype}")
    if not -x.ndim <= axis < x.ndim:
        raise CpuKernelError(f"layer_norm axis {axis} out of range for rank {x.ndim}")
    ax = axis % x.ndim
    norm_shape = x.shape[ax:]
    rows, n = prod(x.shape[:ax]), prod(norm_shape)
    params = [scale] + ([bias] if bias is not None else [])
    scalar = [_param_scalar(s, norm_shape, w) for s, w in zip(params, ("Scale", "B"))]
    inputs = [x, *params]
    outputs = [x]
    if stats:
        stat = TensorSpec(x.shape[:ax] + (1,) * (x.ndim - ax), "float32")
        outputs += [stat, stat]
    name = f"layer_norm(axis={axis}, epsilon={epsilon:g})"

    module = new_module("layer_norm")
    fn, b = kernel_function(module, "entry", inputs, outputs)
    args = list(fn.args)
    xp, sp = args[0], args[1]
    bp = args[2] if bias is not None else None
    yp = args[len(inputs)]
    if n:
        with U.for_range(b, rows, name="row") as r:
            base = b.mul(r, U.i64(n))
            mean, rstd = _row_stats(b, xp, base, n, epsilon)
            _row_output(b, xp, sp, bp, yp, base, n, mean, rstd, scalar)
            if stats:
                U.store(b, mean, args[len(inputs) + 1], r)
                U.store(b, rstd, args[len(inputs) + 2], r)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", tuple(inputs), tuple(outputs))


def _row_stats(b: ir.IRBuilder, xp: ir.Value, base: ir.Value, n: int,
               epsilon: float) -> tuple[ir.Value, ir.Value]:
    """(mean, 1/sqrt(var + epsilon)) of x[base : base + n]."""
    def at(i):
        return U.load(b, xp, b.add(base, i))
    total = U.reduce_range(b, n, U.f32(0.0), lambda b, i, s: b.fadd(s, at(i), flags=U.REASSOC),
                           name="sum")
    mean = b.fdiv(total, U.f32(n))

    def sq(b, i, s):
        d = b.fsub(at(i), mean)
        return b.fadd(s, b.fmul(d, d, flags=U.REASSOC), flags=U.REASSOC)
    var = b.fdiv(U.reduce_range(b, n, U.f32(0.0), sq, name="var"), U.f32(n))
    rstd = b.fdiv(U.f32(1.0), U.sqrt_f32(b, b.fadd(var, U.f32(epsilon))))
    return mean, rstd


def _row_output(b: ir.IRBuilder, xp, sp, bp, yp, base: ir.Value, n: int,
                mean: ir.Value, rstd: ir.Value, scalar: list[bool]) -> None:
    with U.for_range(b, n, name="j") as j:
        i = b.add(base, j)
        y = b.fmul(b.fsub(U.load(b, xp, i), mean), rstd)
        y = b.fmul(y, U.load(b, sp, 0 if scalar[0] else j))
        if bp is not None:
            y = b.fadd(y, U.load(b, bp, 0 if scalar[1] else j))
        U.store(b, y, yp, i)
