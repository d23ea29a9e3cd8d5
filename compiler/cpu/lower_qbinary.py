"""CPU lowerings of the fused ``tessera`` nodes of :mod:`..frontend.qdq_binary`, bit for
bit onnxruntime's; :data:`QBINARY_LOWERINGS` maps each op to its lowering (see
:mod:`.lower`).

* ``QMul``: one elementwise kernel, QLinearMul's arithmetic
  (:func:`~..frontend.qlinear.qlinear_mul_reference`: the centred operands multiplied in
  int32, then ``f32(f32(product) * ratio) + y_zp`` in float32 without FMA, rounded to
  even and saturated).
* ``QMatMul``: the int32 matmul of the centred operands
  (:func:`.matmul.build_matmul_integer`), then the requantization of the fused layers
  (:mod:`.lower_quantized`'s, onnxruntime's).
"""
from __future__ import annotations

import numpy as np

from tessera.errors import CpuKernelError
from tessera.isa.requant import requant_scale

from ..frontend.qlinear import qlinear_mul_ratio
from ..frontend.qshift import model_domain
from .lower_plan import QUANT_DTYPES, LowerFn, NodeLowering, Operands, Plan, Unsupported
from .lower_quantized import _requantize as requantize_plan
from .matmul import build_matmul_integer, matmul_output_shape

__all__ = ["QBINARY_LOWERINGS"]

_ATTRS = ("a_scale", "a_zero_point", "b_scale", "b_zero_point", "y_scale", "y_zero_point",
          "y_min", "y_max")


def _qmul(low: NodeLowering) -> list[Plan]:
    """QMul with numpy broadcasting; a node shifted from uint8 computes on ``a + 128``,
    ``b + 128`` with the model's zero points and subtracts 128 from the result."""
    low.require_attrs(*_ATTRS)
    offset, p = model_domain(low.node.attrs)
    out = low.output()
    low.spec(out.name, QUANT_DTYPES)
    ops = Operands()
    a, b = (ops.tensor(low, low.node.input(i), QUANT_DTYPES) for i in (0, 1))
    a_model, b_model = (v.cast("int32") + offset for v in (a, b))
    product = (a_model - int(p["a_zero_point"])) * (b_model - int(p["b_zero_point"]))
    ratio = qlinear_mul_ratio(p["a_scale"], p["b_scale"], p["y_scale"])
    t = product.cast("float32") * float(ratio) + float(np.float32(p["y_zero_point"]))
    info = np.iinfo("uint8" if offset else out.dtype)
    lo, hi = max(info.min, int(p["y_min"])), min(info.max, int(p["y_max"]))
    low.require(lo <= hi, f"y_min {p['y_min']} / y_max {p['y_max']} are empty")
    y = t.quantize(1.0, 0, "int32").clip(lo, hi)
    if offset:
        y = y - offset
    return [ops.plan(y.cast(out.dtype), out.name, out.shape, out.dtype)]


def _qmatmul(low: NodeLowering) -> list[Plan]:
    """QMatMul: int32 sums of ``(a - a_zp) * (b - b_zp)``, then requantization with the
    scale ``f32(f32(a_scale * b_scale) / y_scale)``."""
    p = low.require_attrs(*_ATTRS)
    a, b = (low.spec(low.node.input(i), QUANT_DTYPES) for i in (0, 1))
    out = low.output()
    low.spec(out.name, QUANT_DTYPES)
    try:
        shape = matmul_output_shape(a.shape, b.shape)
    except CpuKernelError as exc:
        raise Unsupported(str(exc)) from None
    low.require(shape == out.shape, f"its output would be {list(shape)}, the graph says "
                f"{list(out.shape)}")
    acc = low.tmp("acc")
    scale = requant_scale(p["a_scale"], p["b_scale"], p["y_scale"]).reshape(1)
    names = (low.node.input(0), low.node.input(1))
    matmul = Plan("matmul", names, (acc,), lambda: build_matmul_integer(
        a, b, int(p["a_zero_point"]), int(p["b_zero_point"])),
        {n: low.graph.const(n) for n in names if low.graph.const(n) is not None})
    return [matmul, requantize_plan(low, [acc], shape, np.zeros(1, np.int64), scale,
                                    (1,) * len(shape))]


#: op type (domain ``tessera``) -> lowering.
QBINARY_LOWERINGS: dict[str, LowerFn] = {"QMul": _qmul, "QMatMul": _qmatmul}
