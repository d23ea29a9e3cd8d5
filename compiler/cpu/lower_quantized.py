"""CPU lowerings of the integer ``tessera`` nodes QDQ fusion makes (QConv, QGemm, QAdd,
QMaxPool, QGlobalAveragePool, QAveragePool, QSoftmax, QLookup), bit-exact with :mod:`..golden.quantized`:
int8 convolution / matmul to int32 then a requantization step, or a single fused kernel;
:data:`QUANTIZED_LOWERINGS` maps each op type to its lowering (see :mod:`.lower`).
Weights beyond int8 (asymmetric uint8 weights minus their zero points, up to +-255) are
two int8 halves whose int32 results are added; QAdd and QAveragePool of a node shifted
from uint8 compute on the model's uint8 values (:mod:`..frontend.qshift`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tessera.isa.requant import requant_scale

from ..cpu import (E, TensorSpec, build_average_pool, build_byte_lookup, build_conv_int8,
                  build_matmul_int8, build_max_pool, minimum, reduction)
from ..frontend.graph import Node
from ..frontend.qdq import pool_output_size
from ..frontend.qlinear import qlinear_add_coefficients
from ..frontend.qshift import model_domain, qadd_reference
from .lower_onnx import pool_window
from .qsoftmax import lower_qsoftmax
from .sparse_lower import nm_conv_step, nm_matmul_step
from .lower_plan import (QUANT_DTYPES, LowerFn, NodeLowering, Operands, Plan, first_input,
                         single_step)

__all__ = ["QUANTIZED_LOWERINGS", "signed_input", "tap_weight_sums"]

#: Above this many corrected (a, b) pairs a QAdd kernel would get slow. Not seen in
#: practice: over 300 random scale sets the float32 formula without FMA needed 0.09
#: corrections on average, at most 2.
_QADD_MAX_PATCHES = 64


def signed_input(low: NodeLowering, zero_point: int
                  ) -> tuple[str, TensorSpec, int, list[Plan]]:
    """The node's input 0 as int8 for the int8 convolution / matmul kernels: uint8 is
    shifted down by 128 (an extra step), which moves its zero point by as much, so
    ``x - x_zp`` is unchanged. Returns (tensor, spec, zero point, steps)."""
    x = low.spec(first_input(low), QUANT_DTYPES)
    if x.dtype == "int8":
        return first_input(low), x, zero_point, []
    shifted = low.tmp("x_int8")
    ops = Operands()
    expr = (ops.add(first_input(low), x) - 128).cast("int8")
    return shifted, TensorSpec(x.shape, "int8"), zero_point - 128, [
        ops.plan(expr, shifted, x.shape, "int8", suffix="x_int8")]


def _weight(low: NodeLowering, ndim: int) -> np.ndarray:
    w = low.const(low.node.input(1), "weight")
    low.require(w.dtype in (np.int8, np.int16) and w.ndim == ndim, f"its weight is "
                f"{w.dtype}{list(w.shape)}, expected int8 (or int16) of rank {ndim}")
    low.require(int(np.abs(w.astype(np.int64)).max(initial=0)) <= 255,
                "its weights exceed +-255 (an 8-bit weight minus its zero point)")
    low.require(not np.any(np.asarray(low.attr("w_zero_point", 0))),
                "nonzero weight zero points are not supported")
    return w


def _int8_parts(w: np.ndarray) -> list[np.ndarray]:
    """``w`` as int8 arrays summing to it: itself, or (for values up to +-255) its part
    clipped to int8 and the rest."""
    if w.dtype == np.int8:
        return [w]
    head = np.clip(w, -128, 127).astype(np.int8)
    return [head, (w.astype(np.int16) - head).astype(np.int8)]


def _bias(low: NodeLowering, channels: int) -> np.ndarray:
    if not low.node.input(2):
        return np.zeros(channels, np.int64)
    bias = low.const(low.node.input(2), "bias")
    low.require(bias.dtype == np.int32 and bias.size == channels,
                f"its bias is {bias.dtype}{list(bias.shape)}, expected int32 of {channels}")
    return bias.reshape(channels).astype(np.int64)


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    # The kernels accumulate in int32 and wrap; so does onnxruntime (and qref).
    return np.asarray(values, np.int64).astype(np.int32)


def _requantize(low: NodeLowering, accs: Sequence[str], acc_shape: Sequence[int],
                offset: np.ndarray, scale: np.ndarray, channel_shape: Sequence[int]) -> Plan:
    """The node's output from the int32 accumulators ``accs`` (summed): qref's ``_requantize``,
    ``clip(rint(f32(acc + offset) * scale) + y_zp, y_min, y_max)``, with one float32
    multiply and round-half-even; clipping after rounding equals onnxruntime's clamp
    before it because the bounds are integers. ``offset`` (int32, broadcast against
    ``acc``) holds the bias and the input zero-point correction, ``scale`` one float32
    per channel (reshaped to ``channel_shape``)."""
    out = low.output()
    ops = Operands()
    expr = ops.add(accs[0], TensorSpec(tuple(acc_shape), "int32"))
    for acc in accs[1:]:
        expr = expr + ops.add(acc, TensorSpec(tuple(acc_shape), "int32"))
    if np.any(offset):
        expr = expr + ops.array(low.tmp("offset"), _wrap_int32(offset))
    if np.all(scale == scale.reshape(-1)[0]):
        s = E.const(float(scale.reshape(-1)[0]))
    else:
        s = ops.array(low.tmp("scale"), scale.astype(np.float32).reshape(channel_shape))
    y = (expr.cast("float32") * s).quantize(1.0, int(low.attr("y_zero_point")), out.dtype)
    y = _clamp(y, low, out.dtype)
    return ops.plan(y, out.name, out.shape, out.dtype)


def _clamp(y: E, low: NodeLowering, dtype: str) -> E:
    """Clamp to the node's [y_min, y_max] (an absorbed Relu/Clip) when it is narrower
    than the dtype."""
    info = np.iinfo(dtype)
    y_min, y_max = int(low.attr("y_min", info.min)), int(low.attr("y_max", info.max))
    low.require(info.min <= y_min <= y_max <= info.max,
                f"y_min {y_min} / y_max {y_max} do not fit its output type {dtype}")
    if (y_min, y_max) == (info.min, info.max):
        return y
    return y.clip(y_min, y_max)


_REQUANT_ATTRS = ("x_scale", "x_zero_point", "w_scale", "y_scale", "y_zero_point")


def _channel_scales(low: NodeLowering, channels: int) -> np.ndarray:
    a = low.node.attrs
    w_scale = np.asarray(a["w_scale"], np.float32).reshape(-1)
    low.require(w_scale.size in (1, channels), f"w_scale has {w_scale.size} values for "
                f"{channels} output channels")
    return np.broadcast_to(requant_scale(a["x_scale"], w_scale, a["y_scale"]), (channels,))


def _qconv(low: NodeLowering) -> list[Plan]:
    """QConv: int8 convolution to int32 (``build_conv_int8``), then requantization. The
    input zero point is exact through the offset ``bias - x_zp * sum(w over the taps
    inside the image)``: padding holds the zero point in onnxruntime, i.e. contributes
    nothing to ``sum((x - x_zp) * w)``."""
    a = low.require_attrs(*_REQUANT_ATTRS)
    low.rank4(first_input(low))
    w = _weight(low, 4)
    out = low.output()
    x_int8, x, x_zp, plans = signed_input(low, int(a["x_zero_point"]))
    geometry = {"strides": [int(s) for s in a.get("strides", [1, 1])],
                "pads": [int(p) for p in a.get("pads", [0, 0, 0, 0])],
                "dilations": [int(d) for d in a.get("dilations", [1, 1])],
                "group": int(a.get("group", 1))}
    m = w.shape[0]
    low.require(x.shape[1] == w.shape[1] * geometry["group"] and m % geometry["group"] == 0,
                f"weight {list(w.shape)} and group {geometry['group']} do not fit input "
                f"channels {x.shape[1]}")
    offset = _bias(low, m)[:, None, None] - x_zp * tap_weight_sums(
        w, x.shape[2:], out.shape[2:], geometry["strides"], geometry["pads"],
        geometry["dilations"])
    if np.all(offset == offset[:, :1, :1]):
        offset = offset[:, :1, :1]      # no tap in the padding: one offset per channel
    acc_shape = (x.shape[0], m, *out.shape[2:])
    w_spec = TensorSpec(w.shape, "int8")
    accs = []
    for k, part in enumerate(_int8_parts(w)):
        suffix = f"conv{k or ''}"
        w_name = low.node.input(1) if part is w else low.tmp(f"weight{k}")
        accs.append(low.tmp(f"acc{k or ''}"))
        sparse = nm_conv_step(low, suffix, x_int8, x, part, accs[-1], geometry)
        if sparse is not None:      # an N:M sparse weight: the sparse kernel
            plans.append(sparse)
            continue
        plans.append(Plan(suffix, (x_int8, w_name), (accs[-1],),
                          lambda: build_conv_int8(x, w_spec, False, **geometry), {w_name: part}))
    plans.append(_requantize(low, accs, acc_shape, offset[None], _channel_scales(low, m),
                             (1, m, 1, 1)))
    return plans


def tap_weight_sums(w: np.ndarray, in_hw: Sequence[int], out_hw: Sequence[int],
                     strides: Sequence[int], pads: Sequence[int],
                     dilations: Sequence[int]) -> np.ndarray:
    """``(M, OH, OW)``: per output channel and pixel, the sum of the weights whose taps
    fall inside the image (int64, exact). Groups need nothing special: ``w``'s axis 1
    holds exactly the input channels of each output channel's group."""
    per_tap = w.astype(np.int64).sum(axis=1)          # (M, kh, kw)

    def inside(axis: int) -> np.ndarray:
        taps = np.arange(w.shape[2 + axis]) * dilations[axis]
        pos = np.arange(out_hw[axis])[:, None] * strides[axis] - pads[axis] + taps[None, :]
        return ((pos >= 0) & (pos < in_hw[axis])).astype(np.int64)
    return np.einsum("mab,ya,xb->myx", per_tap, inside(0), inside(1))


def _qgemm(low: NodeLowering) -> list[Plan]:
    """QGemm: ``x @ w.T`` with ``build_matmul_int8`` (the weight passed transposed,
    ``(K, N)``), then requantization; the zero point folds into the per-column offset
    ``bias - x_zp * sum_k w[n, k]``."""
    a = low.require_attrs(*_REQUANT_ATTRS)
    w = _weight(low, 2)
    x_shape = low.value(first_input(low)).shape
    low.require(len(x_shape) == 2 and x_shape[1] == w.shape[1],
                f"input {list(x_shape)} does not fit weight {list(w.shape)} (x @ w.T)")
    x_int8, x, x_zp, plans = signed_input(low, int(a["x_zero_point"]))
    n = w.shape[0]
    offset = _bias(low, n) - x_zp * w.astype(np.int64).sum(axis=1)
    wt_spec = TensorSpec(w.shape[::-1], "int8")
    accs = []
    for k, part in enumerate(_int8_parts(w)):
        weight_t = low.tmp(f"weight_t{k or ''}")
        accs.append(low.tmp(f"acc{k or ''}"))
        sparse = nm_matmul_step(low, f"matmul{k or ''}", x_int8, x, part, accs[-1])
        if sparse is not None:      # an N:M sparse weight: the sparse kernel
            plans.append(sparse)
            continue
        plans.append(Plan(f"matmul{k or ''}", (x_int8, weight_t), (accs[-1],),
                          lambda: build_matmul_int8(x, wt_spec),
                          {weight_t: np.ascontiguousarray(part.T)}))
    plans.append(_requantize(low, accs, (x.shape[0], n), offset[None],
                             _channel_scales(low, n), (1, n)))
    return plans


def _qmax_pool(low: NodeLowering) -> list[Plan]:
    """QMaxPool: max pooling of the stored values (same scale and zero point out)."""
    low.require_attrs("kernel_shape")
    low.rank4(first_input(low))
    x = low.spec(first_input(low), QUANT_DTYPES)
    return single_step(low, build_max_pool, x, **pool_window(low, x), inputs=[first_input(low)])


def _qglobal_average_pool(low: NodeLowering) -> list[Plan]:
    """QGlobalAveragePool as qref (MLAS): ``acc = sum(x) - x_zp * HW`` in int32, then
    ``rint(f32(acc) * s) + y_zp`` saturated, ``s = f32(x_scale / f32(y_scale * HW))``."""
    a = low.require_attrs("x_scale", "x_zero_point", "y_scale", "y_zero_point")
    low.rank4(first_input(low))
    x = low.spec(first_input(low), QUANT_DTYPES)
    out = low.output()
    low.require(out.dtype == x.dtype, f"input {x.dtype} and output {out.dtype} differ")
    pixels = x.shape[2] * x.shape[3]
    f32 = np.float32
    scale = f32(a["x_scale"]) / (f32(a["y_scale"]) * f32(pixels))
    total = low.tmp("sum")
    sum_shape = (*x.shape[:2], 1, 1)
    ops = Operands()
    acc = ops.add(total, TensorSpec(sum_shape, "int32"))
    correction = int(_wrap_int32(int(a["x_zero_point"]) * pixels))
    if correction:
        acc = acc - E.const(correction, "int32")
    y = (acc.cast("float32") * float(scale)).quantize(1.0, int(a["y_zero_point"]), out.dtype)
    return [Plan("sum", (first_input(low),), (total,), lambda: reduction("sum", x, [2, 3], True)),
            ops.plan(y, out.name, out.shape, out.dtype)]


def _qadd(low: NodeLowering) -> list[Plan]:
    """QAdd. qref (onnxruntime's AVX2 kernel) computes ``t = fma(a, rA, fma(b, rB,
    fixed))`` in float32; the elementwise kernels have no FMA, so the kernel computes
    ``t = a*rA + (b*rB + fixed)`` with separate roundings and then corrects the (a, b)
    pairs whose result differs. Those pairs are found at compile time by evaluating both
    formulas over every pair of 8-bit values (65,536): there are 0 to 2 of them for typical
    scales, each a ``delta * [a == a0] * [b == b0]`` term. The result is bit-exact with
    qref on every input. A node shifted from uint8 computes on ``a + 128``, ``b + 128``
    with the model's zero points and subtracts 128 from the result."""
    low.require_attrs("a_scale", "a_zero_point", "b_scale", "b_zero_point", "y_scale",
                      "y_zero_point", "y_min", "y_max")
    offset, p = model_domain(low.node.attrs)
    a_spec = low.spec(low.node.input(0), QUANT_DTYPES)
    b_spec = low.spec(low.node.input(1), QUANT_DTYPES)
    low.require(a_spec.shape == b_spec.shape, "its inputs have different shapes")
    out = low.output()
    low.spec(out.name, QUANT_DTYPES)
    ra, rb, fixed = _qadd_coefficients(p)
    info = np.iinfo("uint8" if offset else a_spec.dtype)
    lo, hi = max(info.min, int(p["y_min"])), min(info.max, int(p["y_max"]))
    low.require(lo <= hi, f"y_min {p['y_min']} / y_max {p['y_max']} are empty for "
                f"{a_spec.dtype}")
    b_const = low.graph.const(low.node.input(1))
    patches = _qadd_patches(low.node, a_spec.dtype, b_spec.dtype, (ra, rb, fixed), (lo, hi),
                            None if b_const is None else np.unique(b_const))
    low.require(len(patches) <= _QADD_MAX_PATCHES,
                f"its scales need {len(patches)} corrections of the float32 formula "
                f"(at most {_QADD_MAX_PATCHES}); requantize with other scales")
    ops = Operands()
    a = ops.add(low.node.input(0), a_spec)
    # b is a constant for an add of a constant (.frontend.qdq_binary.fuse_add_constant).
    b = ops.add(low.node.input(1), b_spec, b_const)
    a_model, b_model = (v.cast("int32") + offset if offset else v for v in (a, b))
    t = a_model.cast("float32") * float(ra) + (b_model.cast("float32") * float(rb)
                                               + float(fixed))
    y = t.quantize(1.0, 0, "int32").clip(lo, hi)
    if offset:
        y = y - offset
    for a0, b0, delta in patches:
        y = y + delta * _equals(a, a0) * _equals(b, b0)
    return [ops.plan(y.cast(out.dtype), out.name, out.shape, out.dtype)]


def _qadd_coefficients(p: dict[str, Any]) -> tuple[np.float32, np.float32, np.float32]:
    """rA, rB and ``fixed`` of parameters ``p`` (the model's domain), in float32 exactly as
    qref and MLAS compute them."""
    return qlinear_add_coefficients(p["a_scale"], p["a_zero_point"], p["b_scale"],
                                    p["b_zero_point"], p["y_scale"], p["y_zero_point"])


def _qadd_patches(node: Node, a_dtype: str, b_dtype: str,
                  coefficients: tuple[np.float32, np.float32, np.float32],
                  bounds: tuple[int, int], b_values: np.ndarray | None = None
                  ) -> list[tuple[int, int, int]]:
    """``(a0, b0, delta)`` for every pair of stored input values where the kernel's
    formula (mirrored here in numpy float32, which rounds as the kernel does; ``bounds``
    in the model's domain) differs from qref. ``b_values``: the values a constant ``b``
    holds (only those pairs can occur), else every value of its type."""
    ia, ib = np.iinfo(a_dtype), np.iinfo(b_dtype)
    if b_values is None:
        b_values = np.arange(ib.min, ib.max + 1)
    a, b = np.meshgrid(np.arange(ia.min, ia.max + 1).astype(a_dtype),
                       np.asarray(b_values).astype(b_dtype), indexing="ij")
    offset, _ = model_domain(node.attrs)
    ra, rb, fixed = coefficients
    f32 = np.float32
    a_model, b_model = ((v.astype(np.int64) + offset).astype(f32) for v in (a, b))
    t = (a_model * ra).astype(f32) + ((b_model * rb).astype(f32) + fixed)
    kernel = np.clip(np.rint(t.astype(f32)), *bounds).astype(np.int64) - offset
    golden = qadd_reference(a, b, node.attrs)
    where = np.nonzero(kernel != golden)
    return [(int(a[i, j]), int(b[i, j]), int(golden[i, j] - kernel[i, j]))
            for i, j in zip(*where)]


def _qaverage_pool(low: NodeLowering) -> list[Plan]:
    """QAveragePool as onnxruntime's QLinearAveragePool (qref): three steps in float32,
    dequantize ``x_scale * f32(x - x_zp)``, the float average pool (its taps summed from
    0 in row-major order, divided by the count: onnxruntime's order and roundings), then
    ``rint(avg / y_scale + y_zp)`` saturated and clamped. ``ceil_mode`` is the same pool
    with the end padding that makes its last window."""
    a = low.require_attrs("kernel_shape", "strides", "pads", "ceil_mode", "count_include_pad",
                          "x_scale", "x_zero_point", "y_scale", "y_zero_point", "y_min",
                          "y_max")
    low.rank4(first_input(low))
    x = low.spec(first_input(low), QUANT_DTYPES)
    out = low.output()
    offset, m = model_domain(a)
    kernel, strides = [int(k) for k in a["kernel_shape"]], [int(s) for s in a["strides"]]
    pads = [int(p) for p in a["pads"]]
    for i in range(2):
        size = pool_output_size(x.shape[2 + i], pads[i], pads[i + 2], kernel[i], strides[i],
                                int(a["ceil_mode"]))
        low.require(size == out.shape[2 + i], f"its output {list(out.shape)} is not the "
                    "pool's")
        pads[i + 2] = max(pads[i + 2], (size - 1) * strides[i] + kernel[i] - x.shape[2 + i]
                          - pads[i])
    ops = Operands()
    real = ops.add(first_input(low), x).dequantize(float(a["x_scale"]), int(a["x_zero_point"]))
    plans = [ops.plan(real, low.tmp("real"), x.shape, "float32", suffix="real")]
    real_spec = TensorSpec(x.shape, "float32")
    plans.append(Plan("mean", (low.tmp("real"),), (low.tmp("mean"),),
                      lambda: build_average_pool(real_spec, kernel, strides, pads, None,
                                                 int(a["count_include_pad"]))))
    ops = Operands()
    mean = ops.add(low.tmp("mean"), TensorSpec(out.shape, "float32"))
    info = np.iinfo("uint8" if offset else out.dtype)
    lo, hi = max(info.min, int(m["y_min"])), min(info.max, int(m["y_max"]))
    y = (mean / float(a["y_scale"]) + float(m["y_zero_point"])).round().clip(lo, hi)
    y = (y - offset if offset else y).quantize(1.0, 0, out.dtype)
    plans.append(ops.plan(y, out.name, out.shape, out.dtype))
    return plans


def _equals(x: E, value: int) -> E:
    """1 where the 8-bit ``x`` equals ``value``, else 0 (int32), with integer min/abs."""
    return 1 - minimum(abs(x.cast("int32") - value), 1)


# ---------------------------------------------------------------------- dispatch table
#: op type (domain tessera) -> lowering.
def _qlookup(low: NodeLowering) -> list[Plan]:
    """QLookup: one byte-indexed load per element (:mod:`..frontend.qlookup`); the table
    is already in the stored domain of a node shifted from uint8."""
    x = low.spec(first_input(low), QUANT_DTYPES)
    y = low.output()
    table = low.const(low.node.input(1), "table")
    low.require(table.size == 256 and str(table.dtype) == y.dtype,
                f"its table is {table.dtype}{list(table.shape)}, expected 256 {y.dtype} values")
    low.require(tuple(y.shape) == x.shape, f"its output shape {list(y.shape)} is not its "
                f"input's {list(x.shape)}")
    return single_step(low, build_byte_lookup, x, y.dtype)


QUANTIZED_LOWERINGS: dict[str, LowerFn] = {
    "QLookup": _qlookup,
    "QConv": _qconv,
    "QGemm": _qgemm,
    "QAdd": _qadd,
    "QMaxPool": _qmax_pool,
    "QGlobalAveragePool": _qglobal_average_pool,
    "QAveragePool": _qaverage_pool,
    "QSoftmax": lower_qsoftmax,
}
