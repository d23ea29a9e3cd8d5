"""CPU lowerings of the ops of dynamically quantized models (onnxruntime's
``quantize_dynamic``): DynamicQuantizeLinear, ConvInteger and MatMulInteger, bit-exact
with onnxruntime; :data:`DYNAMIC_LOWERINGS` maps each op type to its lowering (see
:mod:`.lower`). The float rescale after them (Cast, Mul by ``x_scale * w_scale``, Add of
the bias) is plain float ops, computed as onnxruntime does (one IEEE operation each).

* ``DynamicQuantizeLinear`` (onnxruntime ``dynamicquantizelinear.cc``,
  ``GetQuantizationParameter`` in ``core/util/qmath.h``): ``lo = min(min(x), 0)``, ``hi =
  max(max(x), 0)``, ``scale = hi == lo ? 1 : f32(hi - lo) / 255``, ``zero_point =
  rint(clip(0 - lo / scale, 0, 255))`` (ties to even), ``y = saturate(rint(x / scale) +
  zero_point)`` (MLAS QuantizeLinear: a float32 division, ties to even). Min and max do
  not depend on the order of the elements, so the result is exact whatever the threads;
  NaN inputs are undefined (MLAS's vector min/max keep or drop them by position).
* ``ConvInteger`` / ``MatMulInteger``: ``sum((x - x_zp) * (w - w_zp))`` in int32 with the
  int8 kernels of :mod:`.conv`. The constant weight is stored as ``w - w_zp``: one int8
  weight for int8 weights with zero point 0 (the quantizer's default), two or three
  int8 weights summing to it for uint8 weights (``w - w_zp`` spans [-255, 255]), each
  a kernel call whose int32 results add up. A uint8 ``x`` is shifted to int8 (``shift``
  = -128); the input's zero point, a run-time value when a DynamicQuantizeLinear makes
  it, enters as ``acc - (x_zp + shift) * sum(w - w_zp)`` over the weights whose taps fall
  inside the image (padding holds the zero point in onnxruntime, contributing nothing).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..cpu import (TensorSpec, build_conv_int8, build_matmul_int8, maximum, minimum,
                   reduction)
from ..cpu.elementwise import where
from .lower_plan import (QUANT_DTYPES, LowerFn, NodeLowering, Operands, Plan, first_input)
from .lower_quantized import signed_input, tap_weight_sums

__all__ = ["DYNAMIC_LOWERINGS"]

#: DynamicQuantizeLinear's target range (uint8).
_QMAX = 255.0


# --------------------------------------------------------------- DynamicQuantizeLinear
def _dynamic_quantize_linear(low: NodeLowering) -> list[Plan]:
    """Min and max of ``x`` (two reductions), scale and zero point (two scalar steps),
    then the quantization of ``x`` with them (the node's own step)."""
    x = low.spec(first_input(low), ("float32",))
    low.require(x.size > 0, "its input is empty (no range to quantize)")
    y, scale, zero_point = (_output_name(low, i, what)
                            for i, what in enumerate(("y", "y_scale", "y_zero_point")))
    low.require(low.value(y).dtype == "uint8", "its output is not uint8")
    lo, hi = low.tmp("min"), low.tmp("max")
    scalar = TensorSpec((), "float32")
    plans = [Plan(op, (first_input(low),), (name,),
                  lambda op=op: reduction(op, x, None, keepdims=False))
             for op, name in (("min", lo), ("max", hi))]
    ops = Operands()
    low_end = minimum(ops.add(lo, scalar), 0.0)
    high_end = maximum(ops.add(hi, scalar), 0.0)
    plans.append(ops.plan(where(high_end.equal(low_end), 1.0, (high_end - low_end) / _QMAX),
                          scale, (), "float32", suffix="scale"))
    ops = Operands()
    low_end = minimum(ops.add(lo, scalar), 0.0)
    initial = 0.0 - low_end / ops.add(scale, scalar)
    plans.append(ops.plan(initial.clip(0.0, _QMAX).round().cast("uint8"), zero_point, (),
                          "uint8", suffix="zero_point"))
    ops = Operands()
    q = ops.add(first_input(low), x).quantize(ops.add(scale, scalar),
                                              ops.add(zero_point, TensorSpec((), "uint8")),
                                              "uint8")
    plans.append(ops.plan(q, y, x.shape, "uint8"))
    return plans


def _output_name(low: NodeLowering, index: int, what: str) -> str:
    """Output ``index`` of the node, or a name of its own when the graph drops it."""
    outputs = low.node.outputs
    return outputs[index] if index < len(outputs) and outputs[index] else low.tmp(what)


# ------------------------------------------------------------ ConvInteger, MatMulInteger
def _centred_weight(low: NodeLowering, ndim: int, axis: int) -> np.ndarray:
    """The constant weight minus its zero point (input 3: one, or one per channel along
    ``axis``), int16."""
    name = low.node.input(1)
    low.require(low.graph.const(name) is not None,
                f"its weight {name!r} is computed at run time; the CPU kernels take a "
                f"constant weight (as quantize_dynamic writes {low.node.op})")
    w = low.const(name, "weight")
    low.require(str(w.dtype) in QUANT_DTYPES and w.ndim == ndim,
                f"its weight is {w.dtype}{list(w.shape)}, expected int8 or uint8 of rank "
                f"{ndim}")
    zero_point = low.optional_const(3, "weight zero point")
    zero_point = np.zeros(1, np.int16) if zero_point is None else zero_point.reshape(-1)
    channels = w.shape[axis]
    low.require(zero_point.size in (1, channels), f"its weight zero point has "
                f"{zero_point.size} values for {channels} channels")
    shape = [1] * ndim
    shape[axis] = zero_point.size
    return w.astype(np.int16) - zero_point.astype(np.int16).reshape(shape)


def _int8_parts(centred: np.ndarray) -> list[np.ndarray]:
    """int8 weights summing to ``centred``: itself when it fits int8 (int8 weights with
    zero point 0, the quantizer's default), else two or three parts (uint8 weights with
    a zero point span [-255, 255]), each a kernel call of its own."""
    parts, rest = [], centred.astype(np.int16)
    while not parts or np.any(rest):
        part = np.clip(rest, -128, 127)
        parts.append(part.astype(np.int8))
        rest = rest - part
    return parts


def _zero_point_correction(low: NodeLowering, products: list[str], shape: Sequence[int],
                           weight_sums: np.ndarray, shift: int) -> Plan | None:
    """The node's output ``sum(products) - (x_zp + shift) * weight_sums`` (int32,
    wrapping), where ``x_zp`` is input 2 (omitted: 0; a constant; or a run-time scalar)
    and ``shift`` the value added to ``x`` to make it int8. None when that is
    ``products[0]`` itself."""
    out = low.output()
    ops = Operands()
    spec = TensorSpec(tuple(shape), "int32")
    y = ops.add(products[0], spec)
    for name in products[1:]:
        y = y + ops.add(name, spec)
    sums = _wrap_int32(weight_sums)
    name = low.node.input(2)
    data = low.graph.const(name) if name else np.zeros(1, np.int64)
    if data is not None:
        low.require(data.size == 1, "its input zero point has several values (per row); "
                    "the CPU kernel takes one")
        offset = int(data.reshape(-1)[0]) + shift
        if offset == 0 and len(products) == 1:
            return None
        if offset:
            y = y - ops.array(low.tmp("offset"), _wrap_int32(offset * sums.astype(np.int64)))
    else:
        zp_spec = low.spec(name, QUANT_DTYPES)
        low.require(math.prod(zp_spec.shape) == 1, f"its input zero point {name!r} has "
                    f"shape {list(zp_spec.shape)}; the CPU kernel takes one value")
        zero_point = ops.add(name, zp_spec).cast("int32") + shift
        y = y - zero_point * ops.array(low.tmp("weight_sums"), sums)
    return ops.plan(y, out.name, out.shape, "int32")


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    # The kernels accumulate in int32 and wrap; so does onnxruntime.
    return np.asarray(values, np.int64).astype(np.int32)


def _numbered(what: str, k: int, count: int) -> str:
    """Name of part ``k``'s ``what`` (unnumbered when there is one part)."""
    return what if count == 1 else f"{what}{k}"


def _conv_integer(low: NodeLowering) -> list[Plan]:
    """ConvInteger: int8 convolutions of the (shifted) input with the centred weight's
    parts, then the input zero point's correction (module doc)."""
    low.rank4(first_input(low))
    low.require(low.attr("auto_pad", "NOTSET") == "NOTSET",
                f"auto_pad {low.attr('auto_pad')!r} is not supported; give explicit pads")
    w = _centred_weight(low, 4, axis=0)
    out = low.output()
    x_int8, x, shift, plans = signed_input(low, 0)
    geometry = {"strides": [int(s) for s in low.attr("strides", [1, 1])],
                "pads": [int(p) for p in low.attr("pads", [0, 0, 0, 0])],
                "dilations": [int(d) for d in low.attr("dilations", [1, 1])],
                "group": int(low.attr("group", 1))}
    low.require(x.shape[1] == w.shape[1] * geometry["group"]
                and w.shape[0] % geometry["group"] == 0,
                f"weight {list(w.shape)} and group {geometry['group']} do not fit input "
                f"channels {x.shape[1]}")
    sums = tap_weight_sums(w, x.shape[2:], out.shape[2:], geometry["strides"],
                            geometry["pads"], geometry["dilations"])
    if np.all(sums == sums[:, :1, :1]):
        sums = sums[:, :1, :1]          # no tap in the padding: one sum per channel
    parts = _int8_parts(w)
    count = len(parts)
    products = [low.tmp(_numbered("acc", k, count)) for k in range(count)]
    correction = _zero_point_correction(low, products, out.shape, sums[None], shift)
    if correction is None:
        products = [out.name]           # one product, and it is the output
    spec = TensorSpec(w.shape, "int8")
    for k, (part, product) in enumerate(zip(parts, products)):
        weight = low.tmp(_numbered("weight", k, count))
        plans.append(Plan(None if correction is None else _numbered("conv", k, count),
                          (x_int8, weight), (product,),
                          lambda: build_conv_int8(x, spec, False, **geometry), {weight: part}))
    return plans + ([correction] if correction else [])


def _matmul_integer(low: NodeLowering) -> list[Plan]:
    """MatMulInteger ``A [..., M, K] @ B [K, N]`` with a constant ``B``: the leading dims
    of ``A`` folded into M (views), int8 matmuls with the centred weight's parts, then
    the zero point's correction."""
    a_shape = low.input(0).shape
    low.require(len(a_shape) >= 2, f"its input A has rank {len(a_shape)}; the CPU kernel "
                "takes rank 2 or more")
    b = _centred_weight(low, 2, axis=1)
    out = low.output()
    low.require(a_shape[-1] == b.shape[0], f"A {list(a_shape)} does not fit B "
                f"{list(b.shape)}")
    x_int8, _, shift, plans = signed_input(low, 0)
    a2 = TensorSpec((math.prod(a_shape[:-1]), a_shape[-1]), "int8")
    folded = len(a_shape) != 2
    if folded:
        flat = low.tmp("a_2d")
        plans.append(Plan("a_2d", (x_int8,), (flat,), None, shape=a2.shape))
        x_int8 = flat
    parts = _int8_parts(b)
    count = len(parts)
    products = [low.tmp(_numbered("acc", k, count)) for k in range(count)]
    correction = _zero_point_correction(low, products, out.shape,
                                        b.astype(np.int64).sum(axis=0), shift)
    if correction is None:
        products = [out.name]           # one product, and it is the output
    for k, (part, product) in enumerate(zip(parts, products)):
        weight = low.tmp(_numbered("weight", k, count))
        written = low.tmp(_numbered("acc_2d", k, count)) if folded else product
        plans.append(Plan(None if written == out.name else _numbered("matmul", k, count),
                          (x_int8, weight), (written,),
                          lambda: build_matmul_int8(a2, TensorSpec(b.shape, "int8")),
                          {weight: part}))
        if folded:
            plans.append(Plan(None if product == out.name else product.rsplit(":", 1)[1],
                              (written,), (product,), None, shape=out.shape))
    return plans + ([correction] if correction else [])


# ---------------------------------------------------------------------- dispatch table
#: op type (standard domain) -> lowering.
DYNAMIC_LOWERINGS: dict[str, LowerFn] = {
    "DynamicQuantizeLinear": _dynamic_quantize_linear,
    "ConvInteger": _conv_integer,
    "MatMulInteger": _matmul_integer,
}
