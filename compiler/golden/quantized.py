"""The golden model of quantized graphs: :func:`run_reference`.

Evaluates a :class:`~..frontend.graph.Graph` holding the ``tessera`` integer nodes of
:func:`~..frontend.qdq.fuse_qdq` with onnxruntime's x86 integer semantics, and every standard ONNX
node with ``onnx.reference`` one node at a time. What each fused node computes, as
onnxruntime 1.31's CPU kernels do (MLAS, x86 AVX2 build):

* ``QConv`` / ``QGemm`` (QLinearConv, QGemm): ``acc = sum((x - x_zp) * w) + bias`` exact in
  int32, then MLAS ``MlasRequantizeOutput``: ``y = rint(clamp(f32(acc) * s[c], qmin - y_zp,
  qmax - y_zp)) + y_zp`` with ``s[c] = f32(f32(x_scale * w_scale[c]) / y_scale)``
  (:func:`tessera.isa.requant.requant_scale` / ``onnxruntime_reference``), RNE.
* ``QGlobalAveragePool`` (QLinearGlobalAveragePool, MLAS ``qlgavgpool.cpp``):
  ``acc = sum(x) - x_zp * HW`` in int32, requantized as above with ``s = f32(x_scale /
  f32(y_scale * f32(HW)))``.
* ``QMaxPool``: int8 MaxPool on the stored values (padding never wins).
* ``QAdd`` (QLinearAdd, MLAS ``qladd_avx2.cpp``): float32 with FMAs, as
  :mod:`..frontend.qlinear` computes it.
* ``QLookup`` (:mod:`..frontend.qlookup`): ``table[x.view(uint8)]``, the table being
  onnxruntime's values of the activation it replaced.
* ``QAveragePool`` (QLinearAveragePool, ``contrib_ops/cpu/quantization/qlinear_pool.cc``):
  in float32, each input dequantized ``x_scale * f32(x - x_zp)``, each window summed from
  0 in row-major order over the taps inside the input, divided by the count (the taps
  inside, or the whole window with ``count_include_pad``), then
  ``rint(f32(f32(avg / y_scale) + y_zp))`` saturated: the zero point is added before
  rounding. A window that is the whole unpadded image runs as ``QGlobalAveragePool``
  instead (fusion makes it one).

Every fused node then clamps to its ``[y_min, y_max]`` (an absorbed Relu or Clip). QAdd
and QAveragePool of a node shifted from uint8 (``from_uint8``,
:mod:`..frontend.qshift`) compute on the uint8 values, as onnxruntime did.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tessera.errors import CompileError
from tessera.isa.requant import onnxruntime_reference, requant_scale

from ..frontend.graph import Graph, Node
from ..frontend.onnx_import import evaluate_proto, node_proto
from ..frontend.qdq import DOMAIN, pool_output_size
from ..frontend.qdq_binary import qmatmul_reference, qmul_reference
from ..frontend.qshift import model_domain, qadd_reference
from ..frontend.qsoftmax import qlinear_softmax

__all__ = ["run_reference"]


def run_reference(graph: Graph, inputs: Mapping[str, np.ndarray],
                  outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` on ``inputs`` (graph input name -> array of its shape and dtype).

    Returns the graph outputs, or the tensors named in ``outputs`` (any tensor of the
    graph, e.g. a fused node's int8 output), by name. Raises :class:`CompileError` for a
    missing or mis-shaped input or a ``tessera`` op it does not know.
    """
    env: dict[str, np.ndarray] = {n: v.data for n, v in graph.values.items() if v.is_const}
    for name in graph.inputs:
        env[name] = _checked_input(graph, name, inputs)
    for node in graph.nodes:
        results = _run_node(graph, node, env)
        for name, data in zip([o for o in node.outputs if o], results):
            env[name] = np.asarray(data)
    wanted = graph.outputs if outputs is None else outputs
    missing = [name for name in wanted if name not in env]
    if missing:
        raise CompileError(f"run_reference: tensor {missing[0]!r} is not in graph "
                           f"{graph.name!r}")
    return {name: env[name] for name in wanted}


def _checked_input(graph: Graph, name: str, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    if name not in inputs:
        raise CompileError(f"run_reference: no data for graph input {name!r}")
    value, data = graph.values[name], np.asarray(inputs[name])
    if data.shape != value.shape or str(data.dtype) != value.dtype:
        raise CompileError(f"run_reference: input {name!r} is {data.dtype}{list(data.shape)}, "
                           f"the graph takes {value.dtype}{list(value.shape)}")
    return data


def _run_node(graph: Graph, node: Node, env: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    if node.domain == DOMAIN:
        kernel = _KERNELS.get(node.op)
        if kernel is None:
            raise CompileError(f"run_reference: {node} is in domain {DOMAIN!r} but not one of "
                               f"its ops ({', '.join(sorted(_KERNELS))})", op=node.name)
        args = [env[name] if name else None for name in node.inputs]
        y = kernel(node, *args)
        return [y.astype(graph.values[node.outputs[0]].dtype)]
    feeds = {name: env[name] for name in node.inputs if name}
    return evaluate_proto(node_proto(node), feeds, node.name,
                          failure="cannot be evaluated by run_reference")


# ---------------------------------------------------------------------- requantization
def _requantize(node: Node, acc: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """onnxruntime's requantization of int32 ``acc`` (channels on axis 1) plus the node's
    clamp to ``[y_min, y_max]``."""
    scale = np.asarray(scale, np.float32)
    if scale.ndim:
        scale = scale.reshape((1, -1) + (1,) * (acc.ndim - 2))
    dtype = np.iinfo(np.int8 if node.attrs["y_min"] < 0 else np.uint8)
    y = onnxruntime_reference(acc, scale, node.attrs["y_zero_point"], int(dtype.min),
                              int(dtype.max))
    return np.clip(y, node.attrs["y_min"], node.attrs["y_max"])


def _wrap32(acc: np.ndarray) -> np.ndarray:
    # MLAS accumulates in int32 registers: sums wrap, as on the accelerator.
    return acc.astype(np.int64).astype(np.int32).astype(np.int64)


def _weight_scale(node: Node) -> np.ndarray:
    return requant_scale(node.attrs["x_scale"], node.attrs["w_scale"], node.attrs["y_scale"])


# ---------------------------------------------------------------------------- kernels
def _qconv(node: Node, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None
           ) -> np.ndarray:
    a = node.attrs
    centred = x.astype(np.int64) - a["x_zero_point"]
    acc = _conv2d(centred, w.astype(np.int64), a["strides"], a["pads"], a["dilations"],
                  a["group"])
    if bias is not None:
        acc = acc + bias.astype(np.int64).reshape(1, -1, 1, 1)
    return _requantize(node, _wrap32(acc), _weight_scale(node))


def _conv2d(x: np.ndarray, w: np.ndarray, strides: Sequence[int], pads: Sequence[int],
            dilations: Sequence[int], group: int) -> np.ndarray:
    """Exact integer NCHW convolution; zero padding (``x`` is already zero-point centred,
    and onnxruntime pads with the zero point)."""
    (sy, sx), (dy, dx) = strides, dilations
    kh, kw = w.shape[2:]
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    windows = sliding_window_view(x, ((kh - 1) * dy + 1, (kw - 1) * dx + 1), axis=(2, 3))
    windows = windows[:, :, ::sy, ::sx, ::dy, ::dx]
    cin, cout = w.shape[1], w.shape[0] // group
    out = [np.tensordot(windows[:, g * cin:(g + 1) * cin], w[g * cout:(g + 1) * cout],
                        axes=([1, 4, 5], [1, 2, 3])) for g in range(group)]
    return np.concatenate(out, axis=-1).transpose(0, 3, 1, 2)


def _qgemm(node: Node, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None
           ) -> np.ndarray:
    acc = (x.astype(np.int64) - node.attrs["x_zero_point"]) @ w.astype(np.int64).T
    if bias is not None:
        acc = acc + bias.astype(np.int64)
    return _requantize(node, _wrap32(acc), _weight_scale(node))


def _qglobal_average_pool(node: Node, x: np.ndarray) -> np.ndarray:
    a = node.attrs
    pixels = x.shape[2] * x.shape[3]
    acc = x.astype(np.int64).sum(axis=(2, 3), keepdims=True) - a["x_zero_point"] * pixels
    scale = np.float32(a["x_scale"]) / (np.float32(a["y_scale"]) * np.float32(pixels))
    info = np.iinfo(x.dtype)
    y = onnxruntime_reference(_wrap32(acc), scale, a["y_zero_point"], int(info.min),
                              int(info.max))
    return y


def _qmax_pool(node: Node, x: np.ndarray) -> np.ndarray:
    a = node.attrs
    (kh, kw), (sy, sx), (dy, dx) = a["kernel_shape"], a["strides"], a["dilations"]
    pads = list(a["pads"])
    extent = ((kh - 1) * dy + 1, (kw - 1) * dx + 1)
    sizes = [pool_output_size(x.shape[2 + i], pads[i], pads[i + 2], extent[i], (sy, sx)[i],
                              a["ceil_mode"]) for i in range(2)]
    for i in range(2):
        # ceil_mode windows may run past the end padding: pad enough for the last one.
        pads[i + 2] = max(pads[i + 2], (sizes[i] - 1) * (sy, sx)[i] + extent[i]
                          - x.shape[2 + i] - pads[i])
    lowest = np.iinfo(x.dtype).min - 1
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])),
                    constant_values=lowest)
    windows = sliding_window_view(padded, extent, axis=(2, 3))[:, :, ::sy, ::sx, ::dy, ::dx]
    return windows.max(axis=(4, 5))[:, :, :sizes[0], :sizes[1]]


def _qaverage_pool(node: Node, x: np.ndarray) -> np.ndarray:
    offset, a = model_domain(node.attrs)
    f32 = np.float32
    (kh, kw), (sy, sx), pads = a["kernel_shape"], a["strides"], a["pads"]
    sizes = [pool_output_size(x.shape[2 + i], pads[i], pads[i + 2], a["kernel_shape"][i],
                              a["strides"][i], a["ceil_mode"]) for i in range(2)]
    # The zero point is stored shifted like x: their difference is the model's.
    real = f32(a["x_scale"]) * (x.astype(np.int64) - node.attrs["x_zero_point"]).astype(f32)
    # Taps outside the input add +0.0, which leaves a float32 sum as it is: so each
    # window's sum, tap by tap in row-major order, is onnxruntime's over its inside taps.
    ends = [(sizes[i] - 1) * (sy, sx)[i] + (kh, kw)[i] - x.shape[2 + i] - pads[i]
            for i in range(2)]
    padded = np.pad(real, ((0, 0), (0, 0), (pads[0], max(ends[0], 0)),
                           (pads[1], max(ends[1], 0))))
    total = np.zeros((*x.shape[:2], *sizes), f32)
    for ky in range(kh):
        for kx in range(kw):
            total = total + padded[:, :, ky::sy, kx::sx][:, :, :sizes[0], :sizes[1]]
    if a["count_include_pad"]:
        count = np.full(sizes, kh * kw)
    else:
        inside = [np.clip(np.arange(n) * s - p + k, 0, size) - np.clip(np.arange(n) * s - p, 0,
                                                                         size)
                  for n, s, p, k, size in zip(sizes, (sy, sx), pads, (kh, kw), x.shape[2:])]
        count = np.outer(*inside)
    t = (total / count.astype(f32)) / f32(a["y_scale"]) + f32(a["y_zero_point"])
    info = np.iinfo(np.uint8 if offset else x.dtype)
    y = np.clip(np.rint(t).astype(np.int64), max(info.min, a["y_min"]), min(info.max, a["y_max"]))
    return y - offset


def _qadd(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return qadd_reference(a, b, node.attrs)


def _qmul(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return qmul_reference(a, b, node.attrs)


def _qmatmul(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return qmatmul_reference(a, b, node.attrs)


def _qsoftmax(node: Node, x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return qlinear_softmax(x, table, node.attrs["y_scale"], node.attrs["y_zero_point"],
                           node.attrs["axis"])


def _qlookup(node: Node, x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return np.asarray(table).reshape(256)[np.asarray(x).view(np.uint8)]


_KERNELS: dict[str, Callable[..., np.ndarray]] = {
    "QLookup": _qlookup,
    "QConv": _qconv, "QGemm": _qgemm, "QAdd": _qadd, "QMul": _qmul, "QMatMul": _qmatmul,
    "QMaxPool": _qmax_pool,
    "QGlobalAveragePool": _qglobal_average_pool, "QAveragePool": _qaverage_pool,
    "QSoftmax": _qsoftmax}
