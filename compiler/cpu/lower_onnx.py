"""CPU lowerings of the standard ONNX ops (domain ""): casts,
QuantizeLinear/DequantizeLinear, softmax, layer norm, reductions, pooling;
:data:`ONNX_LOWERINGS` maps each op type to its lowering (see :mod:`.lower`). Data
movement and views are :mod:`.lower_movement`'s, elementwise math :mod:`.lower_math`'s.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tessera.errors import CpuKernelError

from ..cpu import (DTYPES as KERNEL_DTYPES, CpuKernel, E, TensorSpec, build_average_pool,
                  build_global_average_pool, build_global_max_pool, build_max_pool,
                  layer_norm, log_softmax, reduction, softmax)
from .lower_plan import (QUANT_DTYPES, LowerFn, NodeLowering, Operands, Plan, Unsupported,
                         first_input, lower_view, single_step)
from .pool import Window

__all__ = ["ONNX_LOWERINGS", "pool_window"]


# ------------------------------------------------------------------- elementwise ops
FLOAT_ONLY = ("float32",)


def _cast(low: NodeLowering) -> list[Plan]:
    x, out = low.input(0), low.output()
    if x.dtype == out.dtype:
        return lower_view(low)
    low.spec(out.name)
    ops = Operands()
    expr = ops.tensor(low, x.name).cast(out.dtype)
    return [ops.plan(expr, out.name, out.shape, out.dtype)]


def _qparams(low: NodeLowering, ops: Operands, rank: int, zp_dtype: str) -> tuple[E, E]:
    """Scale and zero point of a QuantizeLinear/DequantizeLinear (inputs 1 and 2) as
    expressions: constants per tensor, ``(1, .., C, .., 1)`` arrays per axis."""
    scale = low.const(low.node.input(1), "scale")
    low.require(scale.dtype == np.float32, f"its scale is {scale.dtype}, the CPU kernel takes "
                "float32 scales")
    zp_name = low.node.input(2)
    zp = low.const(zp_name, "zero point") if zp_name else np.zeros(scale.shape, zp_dtype)
    low.require(str(zp.dtype) == zp_dtype, f"its zero point is {zp.dtype}, expected {zp_dtype}")
    if scale.size == 1 and zp.size == 1:
        return E.const(float(scale.reshape(()))), E.const(int(zp.reshape(())))
    axis = low.attr("axis", 1)
    low.require(scale.ndim == 1 and zp.shape == scale.shape and -rank <= axis < rank,
                f"its scale has shape {list(scale.shape)} and zero point "
                f"{list(zp.shape)}; the CPU kernel takes one of each, or one per element "
                "of an axis")
    shape = [1] * rank
    shape[axis % rank] = scale.size
    return (ops.array(low.tmp("scale"), scale.reshape(shape)),
            ops.array(low.tmp("zero_point"), zp.reshape(shape)))


def _quantize_linear(low: NodeLowering) -> list[Plan]:
    out = low.output()
    low.spec(out.name, QUANT_DTYPES)
    ops = Operands()
    x = ops.tensor(low, low.node.input(0), FLOAT_ONLY)
    scale, zp = _qparams(low, ops, len(out.shape), out.dtype)
    return [ops.plan(x.quantize(scale, zp, out.dtype), out.name, out.shape, out.dtype)]


def _dequantize_linear(low: NodeLowering) -> list[Plan]:
    x, out = low.input(0), low.output()
    ops = Operands()
    q = ops.tensor(low, x.name, ("int8", "uint8", "int32"))
    scale, zp = _qparams(low, ops, len(x.shape), x.dtype)
    return [ops.plan(q.dequantize(scale, zp), out.name, out.shape, out.dtype)]


# --------------------------------------------------------------- normalisation, reduce
def _softmax(log: bool) -> LowerFn:
    def lower(low: NodeLowering) -> list[Plan]:
        x = low.spec(low.node.input(0), FLOAT_ONLY)
        axis = int(low.attr("axis", -1))
        low.require(-x.ndim <= axis < x.ndim, f"axis {axis} is out of range for rank {x.ndim}")
        return single_step(low, log_softmax if log else softmax, x, axis)
    return lower


def _layer_norm(low: NodeLowering) -> list[Plan]:
    node = low.node
    x = low.spec(node.input(0), FLOAT_ONLY)
    scale = low.spec(node.input(1), FLOAT_ONLY)
    bias = low.spec(node.input(2), FLOAT_ONLY) if node.input(2) else None
    axis, epsilon = int(low.attr("axis", -1)), float(low.attr("epsilon", 1e-5))
    low.require(-x.ndim <= axis < x.ndim, f"axis {axis} is out of range for rank {x.ndim}")
    low.require(low.attr("stash_type", 1) == 1, "stash_type other than 1 (float32) is not "
                "supported")
    normalised = _strip_ones(x.shape[axis % x.ndim:])
    for what, p in (("Scale", scale), ("B", bias)):
        low.require(p is None or p.size == 1 or _strip_ones(p.shape) == normalised,
                    f"its {what} has shape {list(p.shape) if p else []}; the CPU kernel takes "
                    f"one value or the normalised shape {list(normalised)}")
    stats = any(node.outputs[1:])
    outputs = [node.outputs[0]]
    if stats:
        outputs += [node.outputs[k] if len(node.outputs) > k and node.outputs[k]
                    else low.tmp(what) for k, what in ((1, "mean"), (2, "inv_std_dev"))]
    [plan] = single_step(low, layer_norm, x, scale, bias, axis, epsilon, stats)
    plan.outputs = tuple(outputs)
    return [plan]


def _strip_ones(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` without leading 1s (how layer_norm compares Scale/B to X)."""
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2",
           "ReduceSumSquare": "sum_square"}
_REDUCE_DTYPES = {"sum": ("float32", "int32", "int64"), "mean": FLOAT_ONLY,
                  "max": KERNEL_DTYPES, "min": KERNEL_DTYPES,
                  "prod": ("float32", "int32", "int64"), "l1": FLOAT_ONLY,
                  "l2": FLOAT_ONLY, "sum_square": FLOAT_ONLY}


def _reduce(low: NodeLowering) -> list[Plan]:
    """ReduceSum/Mean/Max/Min, the axes an attribute (ReduceMean/Max/Min up to opset 17)
    or an input (ReduceSum from opset 13, all from 18)."""
    op = _REDUCE[low.node.op]
    # ONNX sums keep the input type, which the kernel does for float32 and int32 only.
    x = low.spec(low.node.input(0), _REDUCE_DTYPES[op])
    axes = low.attr("axes")
    if low.node.input(1):
        axes = low.const(low.node.input(1), "axes").reshape(-1).tolist()
    axes = [int(a) for a in axes or ()]
    low.require(all(-x.ndim <= a < x.ndim for a in axes),
                f"axes {axes} are out of range for rank {x.ndim}")
    if not axes and low.attr("noop_with_empty_axes", 0):
        return lower_view(low)
    keepdims = bool(low.attr("keepdims", 1))
    return single_step(low, reduction, op, x, axes, keepdims, inputs=[first_input(low)])


# ---------------------------------------------------------------------------- pooling
def pool_window(low: NodeLowering, x: TensorSpec) -> dict[str, Any]:
    """kernel_shape, strides, pads, dilations of a 2-D pool, checked as the builder will
    (explicit pads; auto_pad turned into them)."""
    low.require(low.attr("ceil_mode", 0) == 0, "ceil_mode=1 is not supported; export the "
                "model with ceil_mode=0 and explicit pads")
    kernel = [int(k) for k in low.attr("kernel_shape", [])]
    low.require(len(kernel) == 2, f"kernel_shape {kernel} is not 2-D")
    strides = [int(s) for s in low.attr("strides", [1, 1])]
    dilations = [int(d) for d in low.attr("dilations", [1, 1])]
    pads = [int(p) for p in low.attr("pads", [0, 0, 0, 0])]
    auto_pad = low.attr("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(auto_pad, x.shape[2:], kernel, strides, dilations)
    else:
        low.require(auto_pad == "NOTSET", f"auto_pad {auto_pad!r} is not supported")
    win = Window(x.shape[2], x.shape[3], tuple(kernel), tuple(strides), tuple(dilations),
                 tuple(pads))
    try:
        win.check(low.node.op)
    except CpuKernelError as exc:
        raise Unsupported(str(exc)) from None
    low.require(all(r.k_hi > r.k_lo for axis in (0, 1) for r in win.runs(axis)),
                f"pads {pads} put a whole window in the padding")
    return {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations}


def _same_pads(mode: str, size: Sequence[int], kernel: Sequence[int],
               strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """ONNX's SAME_UPPER / SAME_LOWER pads: output ``ceil(size / stride)``, the odd pad
    at the end (UPPER) or the beginning (LOWER)."""
    begins, ends = [], []
    for n, k, s, d in zip(size, kernel, strides, dilations):
        total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
        small = total // 2
        begins.append(small if mode == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return begins + ends


def _max_pool(low: NodeLowering) -> list[Plan]:
    low.require(len([o for o in low.node.outputs if o]) == 1,
                "the Indices output is not supported; drop it from the model")
    low.rank4(first_input(low))
    x = low.spec(first_input(low), ("float32", "int8", "uint8"))
    return single_step(low, build_max_pool, x, **pool_window(low, x), inputs=[first_input(low)])


def _average_pool(low: NodeLowering) -> list[Plan]:
    low.rank4(first_input(low))
    x = low.spec(first_input(low), FLOAT_ONLY)
    return single_step(low, build_average_pool, x, **pool_window(low, x),
                       count_include_pad=int(low.attr("count_include_pad", 0)))


def _global_pool(builder: Callable[..., CpuKernel]) -> LowerFn:
    def lower(low: NodeLowering) -> list[Plan]:
        low.rank4(first_input(low))
        x = low.spec(first_input(low), FLOAT_ONLY)
        low.require(x.shape[2] * x.shape[3] > 0, "its input has no pixels")
        return single_step(low, builder, x)
    return lower


# ---------------------------------------------------------------------- dispatch table
#: op type -> lowering.
ONNX_LOWERINGS: dict[str, LowerFn] = {
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear,
    "Cast": _cast,
    "Softmax": _softmax(log=False),
    "LogSoftmax": _softmax(log=True),
    "LayerNormalization": _layer_norm,
    **{op: _reduce for op in _REDUCE},
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalAveragePool": _global_pool(build_global_average_pool),
    "GlobalMaxPool": _global_pool(build_global_max_pool),
}
