"""onnxruntime's ``com.microsoft`` DynamicQuantizeLSTM on the CPU: an LSTM whose W and R
are int8 (or uint8) with scales and zero points, and whose X and h are quantized to uint8
while it runs.

What onnxruntime computes (``contrib_ops/cpu/quantization/dynamic_quantize_lstm.cc``,
``providers/cpu/rnn/uni_directional_lstm.cc`` and ``rnn_helpers.cc``'s quantized
``ComputeGemm``), reproduced here step by step:

- X (the first ``max(sequence_lens)`` steps of every row at once) is quantized to uint8
  with ``GetQuantizationParameter``: min and max widened to include 0, ``scale = (max -
  min) / 255`` (1 if they are equal), ``zero_point = round_half_even(clamp(-min / scale,
  0, 255))``; each value ``clamp(round_half_even(x / scale) + zero_point, 0, 255)``.
- At each step the recurrent GEMM's A, the previous h of every batch row (onnxruntime's
  buffer: initial_h at step 0, then the step's outputs, zero for rows whose sequence
  ended when Y is an output), is quantized the same way, one scale for all rows.
- Products are exact int32 sums of ``(a - a_zero_point) * (w - w_zero_point)`` (MLAS's
  u8s8/u8u8 GEMM; the weights' zero point is the direction's first), scaled by the float
  ``a_scale * w_scale[j]``: the input part ``float(acc) * scale``, the recurrent part
  added as ``float(acc) * scale + gates`` (two roundings, MLAS's accumulate mode).
- The gates then follow the float LSTM of :mod:`.rnn` (peephole, then ``Wb + Rb``, then
  clip, then MLAS's logistic/tanh), which is onnxruntime's order of operations.

So the result is onnxruntime's bit for bit (measured on an AVX-512 VNNI CPU:
``tests/compiler/cpu/test_rnn.py``) where MLAS's integer GEMM is exact (its VNNI
kernels; the AVX2 u8s8 kernel saturates pairs of products to int16 and can differ) and
onnxruntime does not split the batch over threads (it quantizes each thread's rows
separately when batch > 4, or batch >= 2 with hidden <= 256). One case has no defined
answer to match: a row of sequence length 0 when Y is not an output, where onnxruntime
quantizes its uninitialised Y_h buffer (here: the row's initial_h).
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module
from .rnn import FloatCell, KernelArgs, RecurrentSpec

__all__ = ["QuantizedWeights", "build_dynamic_quantize_lstm"]

#: Batch x hidden values of the quantized h, kept on the stack (1 MiB of int32).
_MAX_STATE = 1 << 18


@dataclass(frozen=True)
class QuantizedWeights:
    """One of DynamicQuantizeLSTM's weights: data [D, K, 4H] (int8 or uint8), scale and
    zero point [D] or [D, 4H]."""

    data: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray

    @classmethod
    def of(cls, data: np.ndarray, scale: np.ndarray,
           zero_point: np.ndarray) -> "QuantizedWeights":
        if str(data.dtype) not in ("int8", "uint8"):
            raise CpuKernelError(f"quantized LSTM weights must be int8 or uint8, not {data.dtype}")
        return cls(np.ascontiguousarray(data), np.asarray(scale, np.float32),
                   np.asarray(zero_point))

    @property
    def dtype(self) -> str:
        return str(self.data.dtype)

    def scales(self, hidden: int) -> np.ndarray:
        """The scale per direction and column, [D, 4H] float32."""
        d = self.data.shape[0]
        return np.ascontiguousarray(np.broadcast_to(
            self.scale.reshape(d, -1), (d, 4 * hidden)), dtype=np.float32)

    def direction_zero_point(self, d: int) -> int:
        """onnxruntime's zero point of direction ``d``: the first of its row."""
        return int(self.zero_point.reshape(self.data.shape[0], -1)[d, 0])


def build_dynamic_quantize_lstm(spec: RecurrentSpec, w: QuantizedWeights, r: QuantizedWeights,
                                y_requested: bool = True) -> CpuKernel:
    """The kernel of a DynamicQuantizeLSTM node: inputs as the float LSTM's (W and R are
    ``w.data`` and ``r.data``), then W's and R's scales per direction and column
    ([D, 4H] float32); outputs Y, Y_h, Y_c. ``y_requested``: whether the node outputs Y
    (it decides which h onnxruntime quantizes after a row's sequence ended)."""
    if spec.op != "LSTM" or spec.layout != 0:
        raise CpuKernelError("DynamicQuantizeLSTM is an LSTM of layout 0")
    if spec.batch * spec.hidden > _MAX_STATE:
        raise CpuKernelError(f"the quantized state of {spec.batch} x {spec.hidden} values is "
                             f"more than the kernel's stack buffer takes ({_MAX_STATE}); "
                             "run the model with a smaller batch")
    d, h = spec.num_directions, spec.hidden
    inputs = spec.input_specs()
    inputs[1] = TensorSpec((d, spec.input_size, 4 * h), w.dtype)
    inputs[2] = TensorSpec((d, h, 4 * h), r.dtype)
    inputs += [TensorSpec((d, 4 * h), "float32")] * 2
    outputs = spec.output_specs()
    module = new_module("dynamic_quantize_lstm")
    fn, b = kernel_function(module, "entry", inputs, outputs)
    args = KernelArgs(spec, list(fn.args[:len(inputs)]), list(fn.args[len(inputs):]))
    if spec.seq * spec.batch * h:
        _QuantizedLstm(b, spec, args, (w, r), y_requested).emit()
    b.ret_void()
    name = (f"dynamic_quantize_lstm({'+'.join(spec.directions)}, seq={spec.seq}, "
            f"batch={spec.batch}, input={spec.input_size}, hidden={h})")
    return CpuKernel(name, str(module), "entry", tuple(inputs), tuple(outputs))


class _QuantizedLstm(FloatCell):
    """The float LSTM's loops with onnxruntime's dynamically quantized products."""

    def __init__(self, b: ir.IRBuilder, spec: RecurrentSpec, args: KernelArgs,
                 weights: tuple[QuantizedWeights, QuantizedWeights], y_requested: bool):
        super().__init__(b, spec, args)
        self.weights = weights
        self.y_requested = y_requested
        self.w_scale, self.r_scale = args.extra
        self.acc = U.alloca_array(b, U.I32, 4 * spec.hidden, name="acc")
        self.qh = U.alloca_array(b, U.I32, spec.batch * spec.hidden, name="qh")

    def emit(self) -> None:
        b, s = self.b, self.spec
        self.init_states()
        rows = self._max_len()
        x_q = self._qparams(lambda body: U.for_range_fn(
            b, b.mul(rows, U.i64(s.batch * s.input_size)),
            lambda b, i: body(U.load(b, self.args.x, i)), name="xmm"))
        for d in range(s.num_directions):
            with U.for_range(b, s.seq, name=f"s{d}") as step:
                h_q = self._quantize_h(d, step)
                with U.for_range(b, s.batch, name=f"b{d}") as row:
                    length = self.seq_len(row)
                    with b.if_then(b.icmp_signed("<", step, length)):
                        t = self.time_index(d, step, length)
                        self._products_q(d, t, row, x_q, h_q)
                        self.lstm_update(d, self.state_offset(d, row),
                                         self.y_offset(t, d, row))
        self.zero_empty_rows()

    def _max_len(self) -> ir.Value:
        """The longest sequence (the rows of X onnxruntime quantizes)."""
        b, s = self.b, self.spec
        if self.args.seq_lens is None:
            return U.i64(s.seq)
        return U.reduce_range(b, s.batch, U.i64(0), lambda b, i, m: U.call_intrinsic(
            b, "llvm.smax", [m, self.seq_len(i)]), name="maxlen")

    # ---------------------------------------------------------------- quantization
    def _qparams(self, each) -> tuple[ir.Value, ir.Value]:
        """onnxruntime's GetQuantizationParameter (uint8) of the values ``each`` visits:
        ``each(body)`` emits a loop calling ``body(value)``. Returns (scale, zero point)
        as a float and an i32."""
        b = self.b
        lo = U.alloca_array(b, U.F32, 2, name="minmax")
        U.store(b, U.f32(0.0), lo, 0)      # min and max widened to include 0
        U.store(b, U.f32(0.0), lo, 1)

        def body(v: ir.Value) -> None:
            U.store(b, U.call_intrinsic(b, "llvm.minnum", [U.load(b, lo, 0), v]), lo, 0)
            U.store(b, U.call_intrinsic(b, "llvm.maxnum", [U.load(b, lo, 1), v]), lo, 1)
        each(body)
        mn, mx = U.load(b, lo, 0), U.load(b, lo, 1)
        scale = b.select(b.fcmp_ordered("==", mx, mn), U.f32(1.0),
                         b.fdiv(b.fsub(mx, mn), U.f32(255.0)))
        zp = b.fsub(U.f32(0.0), b.fdiv(mn, scale))
        zp = U.call_intrinsic(b, "llvm.maxnum", [U.call_intrinsic(
            b, "llvm.minnum", [zp, U.f32(255.0)]), U.f32(0.0)])
        return scale, b.fptosi(U.round_half_even(b, zp), U.I32)

    def _centered(self, v: ir.Value, q: tuple[ir.Value, ir.Value]) -> ir.Value:
        """``quantize(v) - zero_point`` as i32: MLAS's ``round_half_even(clamp(v / scale,
        -zp, 255 - zp))``."""
        b = self.b
        scale, zp = q
        zpf = b.sitofp(zp, U.F32)
        v = b.fdiv(v, scale)
        v = U.call_intrinsic(b, "llvm.maxnum", [v, b.fneg(zpf)])
        v = U.call_intrinsic(b, "llvm.minnum", [v, b.fsub(U.f32(255.0), zpf)])
        return b.fptosi(U.round_half_even(b, v), U.I32)

    def _quantize_h(self, d: int, step: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Quantize the recurrent GEMM's A (module docstring) into ``qh``; its params."""
        b, s = self.b, self.spec

        def rows(body) -> None:
            with U.for_range(b, s.batch, name="hr") as row:
                live = b.icmp_signed("<=", step, self.seq_len(row))
                if not self.y_requested:
                    live = ir.Constant(U.I1, 1)
                with b.if_then(live):
                    base = self.state_offset(d, row)
                    with U.for_range(b, s.hidden, name="hk") as k:
                        body(U.load(b, self.args.y_h, b.add(base, k)))
        q = self._qparams(rows)
        with U.for_range(b, s.batch * s.hidden, name="hq") as i:
            row, k = b.udiv(i, U.i64(s.hidden)), b.urem(i, U.i64(s.hidden))
            v = U.load(b, self.args.y_h, b.add(self.state_offset(d, row), k))
            U.store(b, self._centered(v, q), self.qh, i)
        return q

    # ------------------------------------------------------------------ products
    def _products_q(self, d: int, t: ir.Value, row: ir.Value, x_q, h_q) -> None:
        """``gbuf[j] = float(acc_h) * (h_scale * r_scale[j]) + float(acc_x) * (x_scale *
        w_scale[j])`` for the row's x_t and h."""
        b, s = self.b, self.spec
        g4 = 4 * s.hidden
        xoff = self.x_offset(t, row)
        self._int_gemv(d, 0, s.input_size,
                       lambda k: self._centered(U.load(b, self.args.x, b.add(xoff, k)), x_q))
        with U.for_range(b, g4, name="sx") as j:
            m = b.fmul(x_q[0], U.load(b, self.w_scale, b.add(U.i64(d * g4), j)))
            U.store(b, b.fmul(b.sitofp(U.load(b, self.acc, j), U.F32), m), self.gbuf, j)
        hbase = b.mul(row, U.i64(s.hidden))
        self._int_gemv(d, 1, s.hidden, lambda k: U.load(b, self.qh, b.add(hbase, k)))
        with U.for_range(b, g4, name="sh") as j:
            m = b.fmul(h_q[0], U.load(b, self.r_scale, b.add(U.i64(d * g4), j)))
            v = b.fmul(b.sitofp(U.load(b, self.acc, j), U.F32), m)
            U.store(b, b.fadd(v, U.load(b, self.gbuf, j)), self.gbuf, j)

    def _int_gemv(self, d: int, which: int, rows: int, a_of) -> None:
        """``acc[j] = sum_k a_of(k) * (w[d, k, j] - w_zero_point)`` over the 4H columns
        of W (``which`` 0) or R (1), exactly in int32."""
        b, s = self.b, self.spec
        g4 = 4 * s.hidden
        weights = self.weights[which]
        ptr = self.args.w if which == 0 else self.args.r
        zp = ir.Constant(U.I32, weights.direction_zero_point(d))
        U.fill(b, self.acc, g4, ir.Constant(U.I32, 0))
        with U.for_range(b, rows, name="qk") as k:
            a = a_of(k)
            base = b.mul(b.add(U.i64(d * rows), k), U.i64(g4))
            with U.for_range(b, g4, name="qj") as j:
                w = U.widen(b, U.load(b, ptr, b.add(base, j)), weights.dtype)
                prod = b.mul(a, b.sub(w, zp))
                U.store(b, b.add(U.load(b, self.acc, j), prod), self.acc, j)
