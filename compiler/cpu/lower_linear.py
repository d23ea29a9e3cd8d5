"""CPU lowerings of the float32 linear ops (domain ""): MatMul, Gemm, Einsum, Conv and
ConvTranspose, and ArgMax/ArgMin; :data:`LINEAR_LOWERINGS` maps each op type to its
lowering (see :mod:`.lower`).

These run a model's float layers that the accelerator does not take (a model that
stayed in float, an attention MatMul of two activations, a 1-D or 3-D convolution):
the kernels are :mod:`.matmul`'s and :mod:`.conv_float`'s loop nests, exact in their
products and rounded differently from onnxruntime's SGEMM only in the order of the sums.
The int8 forms are the fused ``tessera`` nodes of :mod:`.lower_quantized`.
"""
from __future__ import annotations

import numpy as np

from tessera.errors import CpuKernelError

from ..cpu import TensorSpec
from .conv_float import (build_conv_float, build_conv_transpose_float, conv_geometry,
                         conv_transpose_geometry, conv_transpose_pads)
from .lower_onnx import _same_pads
from .lower_plan import LowerFn, NodeLowering, Plan, Unsupported, first_input, single_step
from .matmul import (build_einsum, build_gemm, build_matmul, einsum_output_shape,
                     matmul_output_shape)
from .reduce import ARG_DTYPES, arg_extreme
from .sparse_lower import nm_conv_step, nm_matmul_step

__all__ = ["LINEAR_LOWERINGS"]

FLOAT = ("float32",)


def _checked(low: NodeLowering, shape_of, *args) -> None:
    """The output shape the kernel will write (``shape_of(*args)``) is the graph's;
    a builder's refusal becomes Unsupported."""
    try:
        shape = tuple(shape_of(*args))
    except CpuKernelError as exc:
        raise Unsupported(str(exc)) from None
    want = low.output().shape
    low.require(shape == want, f"its kernel would write shape {list(shape)}, the graph "
                f"says {list(want)}")


# ------------------------------------------------------------------- MatMul, Gemm
def _matmul(low: NodeLowering) -> list[Plan]:
    a, b = (low.spec(low.node.input(i), FLOAT) for i in (0, 1))
    _checked(low, matmul_output_shape, a.shape, b.shape)
    weight = low.graph.const(low.node.input(1))
    if weight is not None and weight.ndim == 2:   # N:M sparse B (K, N): along K
        step = nm_matmul_step(low, None, low.node.input(0), a, np.ascontiguousarray(
            weight.T), low.output().name)
        if step is not None:
            return [step]
    return single_step(low, build_matmul, a, b)


def _gemm(low: NodeLowering) -> list[Plan]:
    a, b = (low.spec(low.node.input(i), FLOAT) for i in (0, 1))
    c = low.spec(low.node.input(2), FLOAT) if low.node.input(2) else None
    low.require(a.ndim == 2 and b.ndim == 2, f"A and B must be 2-D, got {a} and {b}")
    beta = float(low.attr("beta", 1.0))
    if c is not None and beta == 0.0:
        c = None   # onnxruntime ignores C when beta is 0 (NaN or inf in C included)
    trans_a, trans_b = bool(low.attr("transA", 0)), bool(low.attr("transB", 0))
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    low.require(low.output().shape == (m, n), f"output {list(low.output().shape)} is not "
                f"[{m}, {n}]")
    inputs = [low.node.input(0), low.node.input(1)] + ([low.node.input(2)] if c else [])
    step = None if trans_a else _sparse_gemm(low, a, c, trans_b, beta)
    if step is not None:
        return [step]
    return single_step(low, build_gemm, a, b, c, trans_a, trans_b,
                       float(low.attr("alpha", 1.0)), beta, inputs=inputs)


def _sparse_gemm(low: NodeLowering, a: TensorSpec, c: TensorSpec | None, trans_b: bool,
                 beta: float) -> Plan | None:
    """Gemm with a constant N:M sparse ``B`` and a ``C`` that is one value per output
    column (or none): the sparse kernel, ``alpha`` folded into the weights and
    ``beta * C`` its bias."""
    b_data = low.graph.const(low.node.input(1))
    c_data = low.graph.const(low.node.input(2)) if c is not None else None
    n = low.output().shape[1]
    if b_data is None or (c is not None and (c_data is None or c.shape not in
                                              ((n,), (1, n)))):
        return None
    w = (b_data if trans_b else b_data.T) * np.float32(low.attr("alpha", 1.0))
    bias = None
    if c is not None:
        bias = (low.tmp("nm_bias"), (np.float32(beta) * c_data.reshape(n)).astype(np.float32))
    return nm_matmul_step(low, None, low.node.input(0), a,
                          np.ascontiguousarray(w, np.float32), low.output().name, bias)


def _einsum(low: NodeLowering) -> list[Plan]:
    names = [n for n in low.node.inputs if n]
    specs = [low.spec(n, FLOAT) for n in names]
    equation = low.attr("equation", "")
    _checked(low, einsum_output_shape, equation, [s.shape for s in specs])
    return single_step(low, build_einsum, equation, specs)


# ----------------------------------------------------------------- convolutions
def _conv_attrs(low: NodeLowering, x: TensorSpec, w: TensorSpec) -> dict:
    sp = x.ndim - 2
    low.require(1 <= sp <= 3, f"input {first_input(low)!r} has rank {x.ndim}; the CPU "
                "kernel takes 1-D to 3-D convolutions (rank 3 to 5)")
    kernel = list(w.shape[2:])
    low.require(list(low.attr("kernel_shape", kernel)) == kernel,
                f"kernel_shape {low.attr('kernel_shape')} disagrees with the weights {w}")
    strides = [int(s) for s in low.attr("strides", [1] * sp)]
    dilations = [int(d) for d in low.attr("dilations", [1] * sp)]
    return {"strides": strides, "dilations": dilations, "group": int(low.attr("group", 1))}


def _conv(low: NodeLowering) -> list[Plan]:
    x, w = (low.spec(low.node.input(i), FLOAT) for i in (0, 1))
    bias = low.spec(low.node.input(2), FLOAT) if low.node.input(2) else None
    attrs = _conv_attrs(low, x, w)
    sp = x.ndim - 2
    auto_pad = low.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(auto_pad, x.shape[2:], w.shape[2:], attrs["strides"],
                          attrs["dilations"])
    else:
        low.require(auto_pad in ("NOTSET", "VALID"), f"auto_pad {auto_pad!r} is unknown")
        pads = [0] * (2 * sp) if auto_pad == "VALID" else \
            [int(p) for p in low.attr("pads", [0] * (2 * sp))]
    _checked(low, lambda: conv_geometry(x, w, bias, pads=pads, **attrs).out_shape)
    weight = low.graph.const(low.node.input(1))
    if weight is not None:     # an N:M sparse constant weight: the sparse kernel
        bias_in = (low.node.input(2), low.graph.const(low.node.input(2))) if bias else None
        step = nm_conv_step(low, None, low.node.input(0), x, weight, low.output().name,
                            {"pads": pads, **attrs}, bias_in)
        if step is not None:
            return [step]
    return single_step(low, build_conv_float, x, w, bias, pads=pads, **attrs)


def _conv_transpose(low: NodeLowering) -> list[Plan]:
    x, w = (low.spec(low.node.input(i), FLOAT) for i in (0, 1))
    bias = low.spec(low.node.input(2), FLOAT) if low.node.input(2) else None
    attrs = _conv_attrs(low, x, w)
    sp = x.ndim - 2
    output_padding = [int(p) for p in low.attr("output_padding", [0] * sp)]
    auto_pad = low.attr("auto_pad", "NOTSET")
    low.require(auto_pad in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"),
                f"auto_pad {auto_pad!r} is unknown")
    output_shape = low.attr("output_shape")
    pads = conv_transpose_pads(x.shape[2:], w.shape[2:], attrs["strides"],
                               attrs["dilations"], output_padding, low.attr("pads"),
                               None if output_shape is None else list(output_shape)[-sp:],
                               auto_pad)
    low.require(min(pads[:sp]) >= 0, f"output_shape {output_shape} with auto_pad "
                f"{auto_pad} pads the output's beginning; the CPU kernel takes output "
                "growth at the end only")
    _checked(low, lambda: conv_transpose_geometry(
        x, w, bias, pads=pads, output_padding=output_padding, **attrs).out_shape)
    return single_step(low, build_conv_transpose_float, x, w, bias, pads=pads,
                       output_padding=output_padding, **attrs)


# ---------------------------------------------------------------------- ArgMax/Min
def _arg(op: str) -> LowerFn:
    def lower(low: NodeLowering) -> list[Plan]:
        x = low.spec(first_input(low), ARG_DTYPES)
        axis = int(low.attr("axis", 0))
        low.require(-x.ndim <= axis < x.ndim and x.shape[axis % x.ndim] > 0,
                    f"axis {axis} is out of range or empty for {x}")
        return single_step(low, arg_extreme, op, x, axis, bool(low.attr("keepdims", 1)),
                           bool(low.attr("select_last_index", 0)))
    return lower


#: op type -> lowering.
LINEAR_LOWERINGS: dict[str, LowerFn] = {
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Einsum": _einsum,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "ArgMax": _arg("max"),
    "ArgMin": _arg("min"),
}
