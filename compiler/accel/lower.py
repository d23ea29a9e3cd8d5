"""Lowering the fused integer nodes of :mod:`..frontend.qdq` to accelerator operators (:mod:`.ops`).

Each ``tessera``-domain node becomes one operator computing onnxruntime's integer result
on the stored int8 values:

* ``QConv`` -> :class:`~.ops.Conv2d`. The input zero point is folded into the bias
  (``bias - x_zp * sum(w)`` per output channel) and the padding holds ``x_zp``
  (LOAD's ``pad_value``), so every output, borders included, equals
  ``sum((x - x_zp) * w) + bias``; then onnxruntime's requantization
  (:func:`~.ops.requantize`) clamped to ``[y_min, y_max]``. Bit-exact.
* ``QConvTranspose`` -> :class:`~.ops.ConvTranspose2d` (the raw bias and ``x_zp`` as its
  pad value: the zero point is folded per sub-pixel phase, :mod:`.convtranspose`).
* ``QGemm`` -> :class:`~.ops.Dense` the same way (no padding). A QGemm reading a
  ``Flatten`` of an image is first rewritten into a QConv whose kernel covers the image
  (:func:`convert_flattened_gemms`), which the accelerator runs without a host round
  trip.
* ``QMaxPool`` -> :class:`~.ops.Pool2d` ``max`` (padding never wins, as in onnxruntime);
  the compiler runs a 3x3/2 one in the tiles of the convolution it reads where it can
  (:mod:`.poolfuse`).
* ``QGlobalAveragePool`` -> a :class:`~.ops.Pool2d` ``sum`` over the whole image (row
  adds on the tensor ALU; a plane too large for the accumulator, a depthwise
  :class:`~.ops.Conv2d` of ones): ``acc = sum(x) - x_zp * HW`` exactly in int32 and
  onnxruntime's requantization with ``s = f32(x_scale / f32(y_scale * HW))``. Bit-exact.
* ``QAdd`` (MLAS computes it in float32) in fixed point: ``y = (A*a + B*b + F) >> k``
  with ``A, B`` the ratios ``a_scale / y_scale``, ``b_scale / y_scale`` scaled by
  ``2**k`` (``k`` as large as int32 allows, about 22 bits) and ``A, B, F`` chosen so that
  every one of the 65,536 int8 operand pairs gives MLAS's float32 result
  (:func:`qlinear_add`): bit-exact. When one operand is the output of a
  convolution read by nothing else, the add is fused into that convolution's epilogue
  (:class:`~.ops.Mul` and a scaled :class:`~.ops.Residual`); otherwise it is an
  :class:`~.ops.Eltwise`. A QAdd shifted from uint8 (``from_uint8``,
  :mod:`..frontend.qshift`) is searched against onnxruntime's uint8 result alike.
* ``Concat`` (of int8 images along channels, :mod:`..frontend.qdq_concat`) ->
  :class:`~.ops.Concat`: no instructions, its inputs' producers store into its buffer
  side by side (:func:`~.dram.concat_parts`).
* ``QAveragePool`` stays on the CPU: onnxruntime averages the dequantized float32
  values, each rounded, summed in window order, divided and offset by the zero point in
  float32, so at the frequent ties (with equal input and output scales, every fourth sum
  of a 2x2 window is one) the result depends on the individual inputs, not only on the
  integer sum :class:`~.ops.Pool2d` ``avg`` computes: no integer form is exact.

uint8 activations arrive here as int8 (:mod:`..frontend.qshift` shifts them by 128
before placement), so every node the accelerator runs computes on int8.

:func:`accel_unsupported_reason` says why a node cannot run on the accelerator (``None``
when it can), without building anything.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from tessera.config import HwConfig
from tessera.errors import CompileError
from tessera.isa import ALU_OPS, get_isa
from tessera.isa.requant import requant_scale

from ..frontend.graph import Graph, Node
from .convtranspose import conv_transpose_phases
from .ops import (INT32_MAX, INT32_MIN, AddConst, Clip, Concat, Conv2d, ConvTranspose2d, Dense,
                  Eltwise, Op, Pool2d, Residual, Shift, Stage, requantize)
from ..frontend.qdq import DOMAIN
from ..frontend.qlinear import qlinear_add_coefficients
from ..frontend.qshift import SHIFT, qadd_reference
from .patterns import match_node, patterns_of
from .pool import pool_fits

__all__ = ["AVERAGE_POOL_REASON", "accel_unsupported_reason", "convert_flattened_gemms",
           "fuse_into_producer", "lower_node", "lowering_note", "qadd_stages", "qlinear_add"]

#: Why QAveragePool runs on the CPU (module doc).
AVERAGE_POOL_REASON = ("onnxruntime averages dequantized float32 values (QLinearAveragePool): "
                       "at ties its result depends on each input's float rounding, not only "
                       "on the integer sum the accelerator's average pool computes, so no "
                       "integer form is exact")

#: Largest fixed-point fraction for QAdd (k <= 30 keeps 2**(k-1) an int32 immediate).
_MAX_ADD_FRACTION = 30


# ------------------------------------------------------------------------ graph rewrite
def convert_flattened_gemms(graph: Graph) -> int:
    """Rewrite ``QGemm(Flatten(x))`` with a 4-D ``x`` into ``Flatten(QConv(x))``.

    The convolution's kernel covers the whole ``H x W`` image (``w.reshape(O, C, H, W)``
    matches Flatten's C-order), so the accelerator computes the dense layer on the image
    as it is stored, with no host-side flatten between two accelerator ops. Returns the
    number of rewrites.
    """
    count = 0
    for gemm in [n for n in graph.nodes if n.domain == DOMAIN and n.op == "QGemm"]:
        flatten = graph.producer(gemm.inputs[0])
        if flatten is None or flatten.op != "Flatten" or flatten.attr("axis", 1) != 1:
            continue
        x = graph.value(flatten.inputs[0])
        if len(x.shape) != 4 or len(graph.consumers(flatten.outputs[0])) != 1:
            continue
        n, c, h, w = x.shape
        weight = graph.value(gemm.inputs[1]).data
        w_name = graph.unique_name(f"{gemm.inputs[1]}.as_conv")
        graph.add_const(w_name, np.ascontiguousarray(weight.reshape(-1, c, h, w)))
        y = gemm.outputs[0]
        o = weight.shape[0]
        image = graph.unique_name(f"{y}.image")
        graph.add_value(image, (n, o, 1, 1), graph.value(y).dtype)
        index = next(i for i, node in enumerate(graph.nodes) if node is gemm)
        graph.add_node("QConv", [x.name, w_name, *gemm.inputs[2:]], [image],
                       name=graph.unique_name(f"{gemm.name}.conv"), index=index, domain=DOMAIN,
                       **gemm.attrs, strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1],
                       group=1)
        graph.add_node("Flatten", [image], [y], name=graph.unique_name(f"{gemm.name}.flatten"),
                       index=index + 1, axis=1)
        graph.remove_nodes([gemm, flatten])
        graph.values.pop(flatten.outputs[0], None)
        count += 1
    return count


# ------------------------------------------------------------------------ support check
def accel_unsupported_reason(graph: Graph, node: Node, config: HwConfig) -> str | None:
    """Why ``node`` cannot run on the accelerator of ``config`` (``None``: it can)."""
    if node.op == "Concat" and not node.domain:
        return _concat_reason(graph, node, config)
    if node.domain != DOMAIN:
        return (f"{node.op} is not an integer op of the accelerator (only quantized conv, "
                "dense, add, max and global average pooling are)")
    if node.op == "QAveragePool":
        return AVERAGE_POOL_REASON
    dtypes = {graph.value(t).dtype for t in [*node.inputs[:1], *node.outputs]}
    if node.op == "QAdd":
        dtypes |= {graph.value(node.inputs[1]).dtype}
    if dtypes != {"int8"} or config.inp_width != 8 or config.out_width != 8:
        return (f"the accelerator computes on int8 activations ({config.name!r}: "
                f"{config.inp_width}-bit inputs, {config.out_width}-bit outputs), this node has "
                f"{'/'.join(sorted(dtypes))}")
    shape = graph.value(node.inputs[0]).shape
    if node.op not in _LOWERINGS:
        return _pattern_reason(graph, node, config) or _batch_reason(shape, config)
    if node.op in ("QConv", "QGemm") and graph.value(node.inputs[1]).dtype != "int8":
        w = graph.value(node.inputs[1]).data
        return (f"its weights minus their zero points span [{w.min()}, {w.max()}], beyond the "
                "int8 the accelerator multiplies (asymmetric uint8 weights); quantize the "
                "weights symmetric (onnxruntime's WeightSymmetric=True) to run it here")
    if node.op == "QConv":
        pad_max = get_isa(config).layouts[0].field("y_pad_0").hi
        if max(node.attrs["pads"]) > pad_max:
            return f"padding {max(node.attrs['pads'])} exceeds the load DMA's {pad_max}"
    elif node.op == "QConvTranspose":
        return _conv_transpose_reason(graph, node, config) or _batch_reason(shape, config)
    elif node.op == "QGemm":
        if len(shape) != 2:
            return f"a dense layer needs a 2-D input, not {list(shape)}"
    elif node.op == "QMaxPool":
        if list(node.attrs["dilations"]) != [1, 1] or node.attrs["ceil_mode"]:
            return "max pooling with dilation or ceil_mode is not lowered"
        if any(p >= k for p, k in zip(node.attrs["pads"], node.attrs["kernel_shape"] * 2)):
            return "a pooling window would see only padding"
    return _batch_reason(shape, config)


def _pattern_reason(graph: Graph, node: Node, config: HwConfig) -> str | None:
    """Why no intrinsic pattern of ``config`` lowers ``node`` (:mod:`.patterns`)."""
    try:
        found = match_node(graph, node, config)
    except CompileError as exc:
        return str(exc)
    if found is not None:
        return None
    exact, approximate = [], []
    for op in ALU_OPS.available(config):
        for p in patterns_of(op):
            if p.node_op == node.op:
                (approximate if p.approximate else exact).append(op.name)
    if approximate and not node.attrs.get("approximate"):
        return (f"config {config.name!r} has no intrinsic that computes this {node.op} exactly"
                f"{' (the patterns of ' + ', '.join(exact) + ' do not match it)' if exact else ''}; "
                f"{'/'.join(approximate)} can approximate it: compile with "
                "activations='approximate' (CLI: --activations approximate)")
    if exact:
        return f"no pattern of {', '.join(exact)} (config {config.name!r}) matches this {node.op}"
    return (f"no intrinsic of config {config.name!r} implements {node.op} (a plug-in with a "
            "pattern for it would; see docs/extending.md)")


def _batch_reason(shape: tuple[int, ...], config: HwConfig) -> str | None:
    if len(shape) == 4 and shape[0] % config.batch and shape[0] > config.batch:
        return f"batch {shape[0]} is not a multiple of the config's {config.batch}"
    return None


def _concat_reason(graph: Graph, node: Node, config: HwConfig) -> str | None:
    """Why Concat ``node`` cannot be stored in place by its inputs' producers (None: it
    can, as far as the node itself shows; the placement checks the producers)."""
    values = [graph.value(t) for t in [*node.inputs, *node.outputs] if t]
    if (any(v.dtype != "int8" or len(v.shape) != 4 or v.is_const for v in values)
            or config.out_width != 8):
        return "the accelerator concatenates int8 images (N, C, H, W) its operators write"
    if node.attr("axis", 1) % 4 != 1 or values[0].shape[0] > config.batch:
        return (f"only a concat along channels of one image block (batch {config.batch}) is "
                "stored in place")
    if len(set(node.inputs)) != len(node.inputs) or any(
            v.shape[1] % config.block_out for v in values[:len(node.inputs) - 1]):
        return (f"each input but the last must fill whole blocks of {config.block_out} "
                "channels (and appear once) to be stored side by side")
    return None


def _lower_concat(graph: Graph, node: Node, config: HwConfig) -> Concat:
    return Concat(node.name, tuple(node.inputs), node.outputs[0],
                  tuple(graph.value(t).shape[1] for t in node.inputs))


def _conv_transpose_reason(graph: Graph, node: Node, config: HwConfig) -> str | None:
    """Why the sub-pixel phases of QConvTranspose ``node`` cannot run (None: they can)."""
    try:
        phases = conv_transpose_phases(_lower_qconv_transpose(graph, node, config),
                                       graph.value(node.inputs[0]).shape)
    except CompileError as exc:
        return str(exc)
    pad_max = get_isa(config).layouts[0].field("y_pad_0").hi
    pad = max(max(p.conv.padding) for p in phases)
    return f"a phase's padding {pad} exceeds the load DMA's {pad_max}" if pad > pad_max else None


# ------------------------------------------------------------------------ lowering
def lower_node(graph: Graph, node: Node, config: HwConfig) -> Op:
    """The accelerator operator computing ``node`` (see the module doc): its own lowering,
    or an elementwise operator running the stages of the intrinsic pattern that matches
    it (:mod:`.patterns`)."""
    reason = accel_unsupported_reason(graph, node, config)
    if reason is not None:
        raise CompileError(f"{node.op} node {node.name!r} cannot run on the accelerator: "
                           f"{reason}", op=node.name)
    if node.op in _LOWERINGS:
        return _LOWERINGS[node.op](graph, node, config)
    found = match_node(graph, node, config)
    return Eltwise(node.name, found.intrinsic.lower(), node.inputs[found.value], node.outputs[0],
                   epilogue=found.stages)


def lowering_note(graph: Graph, node: Node, config: HwConfig) -> str:
    """What the placement report adds for a node an intrinsic pattern lowers (which
    intrinsic, or an approximation and its error); ``""`` for the others."""
    if node.domain != DOMAIN or node.op in _LOWERINGS:
        return ""
    found = match_node(graph, node, config)
    return "" if found is None else f"; {found.describe(graph, node, config)}"


def fuse_into_producer(graph: Graph, node: Node, config: HwConfig, ops: list[Op],
                       readers: dict[str, list[int]]) -> tuple[int, Op] | None:
    """``(index, fused op)`` when an intrinsic pattern's stages for ``node`` can join the
    epilogue of an operator in ``ops``: it writes the pattern's value operand, nothing else
    reads that tensor, and any other tensor the stages read (a residual) exists before it
    runs. Of several candidates (either operand of an add), the operator computed last."""
    if node.op in _LOWERINGS:
        return None
    produced_at = {op.output: k for k, op in enumerate(ops)}
    best = None
    for value, t in enumerate(node.inputs):
        k = produced_at.get(t)
        if k is None or len(readers.get(t, [])) != 1 or best is not None and k <= best[0]:
            continue
        try:
            found = match_node(graph, node, config, value=value)
        except CompileError:
            continue
        if found is None or not _can_take(ops[k], found, produced_at, k):
            continue
        best = (k, replace(ops[k], output=node.outputs[0],
                           epilogue=(*ops[k].epilogue, *found.stages)))
    return best


def _can_take(op: Op, found, produced_at: dict[str, int], k: int) -> bool:
    """Whether ``op`` (the ``k``-th operator) can run ``found``'s stages as its epilogue:
    residual stages need a convolution's or dense layer's epilogue, and tensors computed
    before it."""
    if not hasattr(op, "epilogue"):
        return False
    if not found.residuals:
        return True
    return isinstance(op, (Conv2d, Dense)) and all(produced_at.get(t, -1) < k
                                                   for t in found.residuals)


def _output_stages(node: Node, scale: np.ndarray | float, bias: np.ndarray | None
                   ) -> tuple[Stage, ...]:
    a = node.attrs
    return requantize(scale, int(a["y_zero_point"]), bias=bias,
                      qmin=int(a.get("y_min", -128)), qmax=int(a.get("y_max", 127)))


def _folded_bias(graph: Graph, node: Node, weight: np.ndarray) -> np.ndarray:
    """``bias - x_zp * sum(w)`` per output channel, wrapped to int32 like the sums."""
    bias = graph.value(node.inputs[2]).data.astype(np.int64) if len(node.inputs) > 2 \
        and node.inputs[2] else np.zeros(weight.shape[0], np.int64)
    sums = weight.reshape(weight.shape[0], -1).astype(np.int64).sum(axis=1)
    folded = bias - int(node.attrs["x_zero_point"]) * sums
    return ((folded + (1 << 31)) % (1 << 32)) - (1 << 31)


def _weight_scale(node: Node) -> np.ndarray:
    a = node.attrs
    return requant_scale(a["x_scale"], a["w_scale"], a["y_scale"])


def _lower_qconv(graph: Graph, node: Node, config: HwConfig) -> Conv2d:
    a = node.attrs
    w = graph.value(node.inputs[1]).data
    t, l, b, r = a["pads"]
    return Conv2d(node.name, node.inputs[0], node.outputs[0], w, stride=tuple(a["strides"]),
                  padding=(t, l, b, r), dilation=tuple(a["dilations"]), groups=int(a["group"]),
                  pad_value=int(a["x_zero_point"]),
                  epilogue=_output_stages(node, _weight_scale(node),
                                          _folded_bias(graph, node, w)))


def _lower_qconv_transpose(graph: Graph, node: Node, config: HwConfig) -> ConvTranspose2d:
    a = node.attrs
    w = graph.value(node.inputs[1]).data
    bias = (graph.value(node.inputs[2]).data.astype(np.int64) if len(node.inputs) > 2
            and node.inputs[2] else None)
    # The input zero point is folded per sub-pixel phase (:mod:`.convtranspose`).
    return ConvTranspose2d(node.name, node.inputs[0], node.outputs[0], w,
                           stride=tuple(a["strides"]), padding=tuple(a["pads"]),
                           groups=int(a["group"]), output_padding=tuple(a["output_padding"]),
                           pad_value=int(a["x_zero_point"]),
                           epilogue=_output_stages(node, _weight_scale(node), bias))


def _lower_qgemm(graph: Graph, node: Node, config: HwConfig) -> Dense:
    w = graph.value(node.inputs[1]).data
    return Dense(node.name, node.inputs[0], node.outputs[0], w,
                 epilogue=_output_stages(node, _weight_scale(node), _folded_bias(graph, node, w)))


def _lower_qmaxpool(graph: Graph, node: Node, config: HwConfig) -> Pool2d:
    a = node.attrs
    return Pool2d(node.name, node.inputs[0], node.outputs[0], "max",
                  kernel=tuple(a["kernel_shape"]), stride=tuple(a["strides"]),
                  padding=tuple(a["pads"]))


def _lower_qgap(graph: Graph, node: Node, config: HwConfig) -> Pool2d | Conv2d:
    a = node.attrs
    n, c, h, w = graph.value(node.inputs[0]).shape
    f32 = np.float32
    scale = f32(f32(a["x_scale"]) / (f32(a["y_scale"]) * f32(h * w)))
    stages = requantize(scale, int(a["y_zero_point"]),
                        bias=np.full(c, -int(a["x_zero_point"]) * h * w, np.int64))
    # The sum is the ALU's (one ADD per pixel over the channel blocks), the zero point
    # and rescale the epilogue's: a depthwise convolution of ones uses 1/16 of the GEMM
    # core and streams its diagonal weight blocks (8x slower). The ALU's sum holds a
    # channel block's whole plane in the accumulator; a plane too large for it stays a
    # convolution, which tiles any plane.
    pool = Pool2d(node.name, node.inputs[0], node.outputs[0], "sum", kernel=(h, w),
                  epilogue=stages)
    if pool_fits(pool, (n, c, h, w), config):
        return pool
    return Conv2d(node.name, node.inputs[0], node.outputs[0], np.ones((c, 1, h, w), np.int8),
                  groups=c, epilogue=stages)


def qlinear_add(a_scale: float, a_zero_point: int, b_scale: float, b_zero_point: int,
                y_scale: float, y_zero_point: int, y_min: int = -128, y_max: int = 127,
                from_uint8: bool = False) -> tuple[int, tuple[Stage, ...]]:
    """QLinearAdd in fixed point, bit-exact with MLAS: ``(A, stages)`` such that
    ``acc = A*a``, then ``stages`` (``acc += B*b``, a constant, a shift by ``k``, the
    clamp) give onnxruntime's result for every pair of int8 operands. The parameters are
    a fused QAdd's (stored domain); ``from_uint8``: onnxruntime computed on the stored
    values plus 128 (:mod:`..frontend.qshift`).

    MLAS computes ``a*ra + b*rb + fixed`` in float32 with FMAs
    (:func:`~..frontend.qlinear.qlinear_add_reference`). A fixed-point form with ``A ~ ra*2**k``,
    ``B ~ rb*2**k`` agrees except where the float result lies within rounding noise of
    a tie, and one such element, far upstream, changes a ResNet's logits. So all 65,536
    operand pairs are checked: for each ``(k, A, B)`` near the nominal the offsets
    ``F`` that reproduce every pair form an interval (each pair bounds ``F`` from both
    sides), and the first non-empty one is taken. Raises :class:`CompileError` when
    none exists (the add then runs on the CPU). Cached per parameter set.

    The residual in the returned stages is named ``"b"``; callers rename it.
    """
    found = _exact_add(float(a_scale), int(a_zero_point), float(b_scale), int(b_zero_point),
                       float(y_scale), int(y_zero_point), int(y_min), int(y_max),
                       bool(from_uint8))
    if found is None:
        raise CompileError("QLinearAdd: no int32 fixed-point form reproduces onnxruntime's "
                           f"float32 result for a_scale {a_scale:g}, b_scale {b_scale:g}, "
                           f"y_scale {y_scale:g} on every operand pair")
    k, big_a, big_b, offset = found
    return big_a, (Residual("b", big_b), AddConst(offset), Shift(k, rounding=False),
                   Clip(y_min, y_max))


#: Every pair of int8 operands (a, b).
_PAIRS = np.stack(np.meshgrid(np.arange(-128, 128), np.arange(-128, 128)), -1).reshape(-1, 2)


@lru_cache(maxsize=256)
def _exact_add(a_scale: float, a_zp: int, b_scale: float, b_zp: int, y_scale: float,
               y_zp: int, y_min: int, y_max: int, from_uint8: bool
               ) -> tuple[int, int, int, int] | None:
    """``(k, A, B, F)`` with ``clip((A*a + B*b + F) >> k) == MLAS`` on every pair."""
    a, b = _PAIRS[:, 0], _PAIRS[:, 1]
    attrs = {"a_scale": a_scale, "a_zero_point": a_zp, "b_scale": b_scale,
             "b_zero_point": b_zp, "y_scale": y_scale, "y_zero_point": y_zp, "y_min": y_min,
             "y_max": y_max, "from_uint8": int(from_uint8)}
    want = qadd_reference(a.astype(np.int8), b.astype(np.int8), attrs)
    offset = SHIFT if from_uint8 else 0
    ra, rb, fixed = (float(v) for v in qlinear_add_coefficients(
        a_scale, a_zp + offset, b_scale, b_zp + offset, y_scale, y_zp + offset))
    # The nominal offset in the stored domain: y - o = (a + o)*ra + (b + o)*rb + fixed - o.
    fixed += offset * (ra + rb - 1)
    top = _MAX_ADD_FRACTION
    while top > 0 and _add_magnitude(ra, rb, fixed, top) > INT32_MAX:
        top -= 1
    # A clamped result only bounds F from one side: anything at or past the clamp.
    low_open, high_open = want <= y_min, want >= y_max
    for k in range(top, max(top - 6, 7), -1):
        one = 1 << k
        for da, db in sorted(((i, j) for i in range(-2, 3) for j in range(-2, 3)),
                             key=lambda d: abs(d[0]) + abs(d[1])):
            big_a, big_b = round(ra * one) + da, round(rb * one) + db
            s = big_a * a + big_b * b
            # (s + F) >> k == want  <=>  want*2**k - s <= F <= (want+1)*2**k - 1 - s.
            lo = np.where(low_open, np.int64(INT32_MIN), want * one - s)
            hi = np.where(high_open, np.int64(INT32_MAX), (want + 1) * one - 1 - s)
            f_lo, f_hi = int(lo.max()), int(hi.min())
            if f_lo > f_hi:
                continue
            offset = min(max(round(fixed * one) + one // 2, f_lo), f_hi)
            # Every partial sum the ALU forms (A*a, + B*b, + F) must fit int32.
            if max(int(np.abs(big_a * a).max()), int(np.abs(s).max()),
                   int(np.abs(s + offset).max())) <= INT32_MAX:
                return k, big_a, big_b, offset
    return None


def _add_magnitude(ra: float, rb: float, fixed: float, k: int) -> float:
    """Largest |acc| of the fixed-point add with ``k`` fraction bits (int8 operands)."""
    scale = 2.0 ** k
    return 128 * (abs(ra) + abs(rb)) * scale + abs(fixed) * scale + 2 * scale


def qadd_stages(node: Node, value: int = 0) -> tuple[int, tuple[Stage, ...]]:
    """``(A, stages)`` of QAdd ``node`` with input ``value`` in the accumulator (scaled by
    ``A``) and the other as the scaled residual (:func:`qlinear_add`)."""
    a = dict(node.attrs)
    if value == 1:
        for key in ("scale", "zero_point"):
            a[f"a_{key}"], a[f"b_{key}"] = node.attrs[f"b_{key}"], node.attrs[f"a_{key}"]
    big_a, (res, *rest) = qlinear_add(a["a_scale"], a["a_zero_point"], a["b_scale"],
                                      a["b_zero_point"], a["y_scale"], a["y_zero_point"],
                                      a.get("y_min", -128), a.get("y_max", 127),
                                      bool(a.get("from_uint8", 0)))
    return big_a, (replace(res, tensor=node.inputs[1 - value]), *rest)


#: The nodes with an operator of their own; the others go through the intrinsics' patterns.
_LOWERINGS = {"QConv": _lower_qconv, "QGemm": _lower_qgemm, "QMaxPool": _lower_qmaxpool,
              "QGlobalAveragePool": _lower_qgap, "QConvTranspose": _lower_qconv_transpose,
              "Concat": _lower_concat}
