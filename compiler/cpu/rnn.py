"""Recurrent layers (ONNX LSTM, GRU and RNN), float32: one kernel per node, the loop over
time inside it.

The kernel takes the node's inputs that are present, in ONNX order (X, W, R, B,
sequence_lens, initial_h, initial_c, P), and writes Y, Y_h (and Y_c for LSTM); the
lowering names a temporary for an output the node leaves out. The recurrent state lives
in Y_h (and Y_c) themselves: initialised from initial_h/initial_c (or zeros), updated in
place at each step of each batch row, left as the state of the row's last step, which is
what ONNX's Y_h is. Y is zeroed first: steps past a row's ``sequence_lens`` stay zero, as
in onnxruntime.

A step of one batch row is a matrix-vector product per gate row (``dot(W_j, x_t) +
dot(R_j, h)``), then the gates' elementwise update, in onnxruntime's order: the products,
plus the peephole term ``c * P`` (LSTM), plus ``Wb_j + Rb_j`` (summed first), clipped,
activated. Sigmoid and tanh are MLAS's
rational approximations (what onnxruntime's recurrent kernels call on an x86 CPU with
FMA3: ``MlasComputeLogistic``/``MlasComputeTanh``), so the activations agree with
onnxruntime to the last bit where their inputs do; the dot products add in another order,
so results differ from onnxruntime's in the last bits (float32 noise). Gate orders are
ONNX's: LSTM i, o, f, c; GRU z, r, h; peepholes i, o, f.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .fmath import log1p_f32, mlas_logistic, mlas_tanh
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module

__all__ = ["ACTIVATIONS", "RecurrentSpec", "activation", "build_recurrent"]

#: Gates per cell type (rows of W per direction are ``gates * hidden``).
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: Default activations per direction (ONNX's).
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"),
                       "RNN": ("Tanh",)}

Act = tuple[str, float, float]      # (lower-case name, alpha, beta)


@dataclass(frozen=True)
class RecurrentSpec:
    """What one recurrent node computes (shapes, attributes, which inputs are present)."""

    op: str                          # "LSTM", "GRU" or "RNN"
    directions: tuple[str, ...]      # ("forward",), ("reverse",) or both
    seq: int
    batch: int
    input_size: int
    hidden: int
    activations: tuple[tuple[Act, ...], ...]   # per direction, onnxruntime's (name, alpha, beta)
    layout: int = 0
    clip: float | None = None
    input_forget: bool = False
    linear_before_reset: bool = False
    has_bias: bool = False
    has_seq_lens: bool = False
    has_initial_h: bool = False
    has_initial_c: bool = False
    has_peepholes: bool = False

    @property
    def gates(self) -> int:
        return GATES[self.op]

    @property
    def num_directions(self) -> int:
        return len(self.directions)

    def x_shape(self) -> tuple[int, ...]:
        return ((self.seq, self.batch, self.input_size) if self.layout == 0
                else (self.batch, self.seq, self.input_size))

    def y_shape(self) -> tuple[int, ...]:
        d = self.num_directions
        return ((self.seq, d, self.batch, self.hidden) if self.layout == 0
                else (self.batch, self.seq, d, self.hidden))

    def state_shape(self) -> tuple[int, ...]:
        d = self.num_directions
        return ((d, self.batch, self.hidden) if self.layout == 0
                else (self.batch, d, self.hidden))

    def input_specs(self, weights: str = "float32") -> list[TensorSpec]:
        """The kernel's inputs, in ONNX order, the absent ones left out."""
        d, g, h = self.num_directions, self.gates, self.hidden
        specs = [TensorSpec(self.x_shape(), "float32"),
                 TensorSpec((d, g * h, self.input_size), weights),
                 TensorSpec((d, g * h, h), weights)]
        optional = [(self.has_bias, (d, 2 * g * h), "float32"),
                    (self.has_seq_lens, (self.batch,), "int32"),
                    (self.has_initial_h, self.state_shape(), "float32"),
                    (self.has_initial_c, self.state_shape(), "float32"),
                    (self.has_peepholes, (d, 3 * h), "float32")]
        return specs + [TensorSpec(s, t) for present, s, t in optional if present]

    def output_specs(self) -> list[TensorSpec]:
        """Y, Y_h and (LSTM) Y_c."""
        outs = [TensorSpec(self.y_shape(), "float32"), TensorSpec(self.state_shape(), "float32")]
        if self.op == "LSTM":
            outs.append(TensorSpec(self.state_shape(), "float32"))
        return outs


# ----------------------------------------------------------------------- activations
# The other activations onnxruntime's recurrent ops take (rnn_activation_functors.h),
# each ``(builder, x, alpha, beta) -> value``.
def _softplus(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    """log(1 + e**x) as ``max(x, 0) + log1p(e**-|x|)``, which never overflows."""
    ax = U.call_intrinsic(b, "llvm.fabs", [x])
    tail = log1p_f32(b, U.exp_f32(b, b.fneg(ax)))
    return b.fadd(U.call_intrinsic(b, "llvm.maxnum", [x, U.f32(0.0)]), tail)


def _relu(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    return U.call_intrinsic(b, "llvm.maxnum", [x, U.f32(0.0)])


def _leaky_relu(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    return b.select(b.fcmp_ordered(">=", x, U.f32(0.0)), x, b.fmul(x, U.f32(alpha)))


def _thresholded_relu(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    return b.select(b.fcmp_ordered(">", x, U.f32(alpha)), x, U.f32(0.0))


def _hard_sigmoid(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    y = b.fadd(b.fmul(x, U.f32(alpha)), U.f32(beta))
    y = U.call_intrinsic(b, "llvm.maxnum", [y, U.f32(0.0)])
    return U.call_intrinsic(b, "llvm.minnum", [y, U.f32(1.0)])


def _elu(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    em1 = b.fmul(U.f32(alpha), b.fsub(U.exp_f32(b, x), U.f32(1.0)))
    return b.select(b.fcmp_ordered(">=", x, U.f32(0.0)), x, em1)


def _softsign(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    return b.fdiv(x, b.fadd(U.f32(1.0), U.call_intrinsic(b, "llvm.fabs", [x])))


#: onnxruntime's activation names (lower case) -> (emitter, default alpha, default beta,
#: uses alpha, uses beta): rnn_helpers.cc's NameToArgUsageMap and NameToArgDefaultsMap.
ACTIVATIONS: dict[str, tuple[Callable[..., ir.Value], float, float, bool, bool]] = {
    "sigmoid": (lambda b, x, a, c: mlas_logistic(b, x), 0.0, 0.0, False, False),
    "tanh": (lambda b, x, a, c: mlas_tanh(b, x), 0.0, 0.0, False, False),
    "relu": (_relu, 0.0, 0.0, False, False),
    "affine": (lambda b, x, a, c: b.fadd(b.fmul(x, U.f32(a)), U.f32(c)), 0.0, 0.0, True, True),
    "leakyrelu": (_leaky_relu, 0.01, 0.0, True, False),
    "thresholdedrelu": (_thresholded_relu, 0.0, 0.0, True, False),
    "scaledtanh": (lambda b, x, a, c: b.fmul(U.f32(a), mlas_tanh(b, b.fmul(x, U.f32(c)))),
                   0.0, 0.0, True, True),
    "hardsigmoid": (_hard_sigmoid, 0.2, 0.5, True, True),
    "elu": (_elu, 1.0, 0.0, True, False),
    "softsign": (_softsign, 0.0, 0.0, False, False),
    "softplus": (_softplus, 0.0, 0.0, False, False),
}


def activation(b: ir.IRBuilder, act: Act, x: ir.Value) -> ir.Value:
    """``act`` (a normalised (name, alpha, beta)) applied to float ``x``."""
    name, alpha, beta = act
    return ACTIVATIONS[name][0](b, x, alpha, beta)


# ---------------------------------------------------------------------------- kernel
def build_recurrent(spec: RecurrentSpec) -> CpuKernel:
    """The kernel of one LSTM, GRU or RNN node (module docstring)."""
    if spec.op not in GATES:
        raise CpuKernelError(f"recurrent op {spec.op!r} is not LSTM, GRU or RNN")
    if any(len(acts) != len(DEFAULT_ACTIVATIONS[spec.op]) for acts in spec.activations):
        raise CpuKernelError(f"{spec.op} needs {len(DEFAULT_ACTIVATIONS[spec.op])} "
                             "activations per direction")
    inputs, outputs = spec.input_specs(), spec.output_specs()
    module = new_module(spec.op.lower())
    fn, b = kernel_function(module, "entry", inputs, outputs)
    args = KernelArgs(spec, list(fn.args[:len(inputs)]), list(fn.args[len(inputs):]))
    if spec.seq * spec.batch * spec.hidden:
        FloatCell(b, spec, args).emit()
    b.ret_void()
    dirs = "+".join(spec.directions)
    name = (f"{spec.op.lower()}({dirs}, seq={spec.seq}, batch={spec.batch}, "
            f"input={spec.input_size}, hidden={spec.hidden})")
    return CpuKernel(name, str(module), "entry", tuple(inputs), tuple(outputs))


class KernelArgs:
    """The kernel's pointer arguments by role (None for an absent optional input)."""

    def __init__(self, spec: RecurrentSpec, ins: list[ir.Value], outs: list[ir.Value]):
        self.x, self.w, self.r = ins[:3]
        rest = iter(ins[3:])
        self.bias = next(rest) if spec.has_bias else None
        self.seq_lens = next(rest) if spec.has_seq_lens else None
        self.initial_h = next(rest) if spec.has_initial_h else None
        self.initial_c = next(rest) if spec.has_initial_c else None
        self.peepholes = next(rest) if spec.has_peepholes else None
        self.extra = list(rest)          # a quantized kernel's further inputs
        self.y, self.y_h = outs[:2]
        self.y_c = outs[2] if len(outs) > 2 else None


class RecurrentLoops:
    """The loops and addressing every recurrent kernel shares: state initialisation,
    the time loop over each direction and batch row, sequence lengths, layouts."""

    def __init__(self, b: ir.IRBuilder, spec: RecurrentSpec, args: KernelArgs) -> None:
        self.b, self.spec, self.args = b, spec, args
        gh = spec.gates * spec.hidden
        self.gbuf = U.alloca_array(b, U.F32, gh, name="gates")

    # addressing (element offsets) -------------------------------------------------
    def x_offset(self, t: ir.Value, row: ir.Value) -> ir.Value:
        s = self.spec
        pos = (self._add(self._mul(t, s.batch), row) if s.layout == 0
               else self._add(self._mul(row, s.seq), t))
        return self._mul(pos, s.input_size)

    def y_offset(self, t: ir.Value, d: int, row: ir.Value) -> ir.Value:
        s = self.spec
        nd = s.num_directions
        if s.layout == 0:
            pos = self._add(self._mul(self._add(self._mul(t, nd), U.i64(d)), s.batch), row)
        else:
            pos = self._add(self._mul(self._add(self._mul(row, s.seq), t), nd), U.i64(d))
        return self._mul(pos, s.hidden)

    def state_offset(self, d: int, row: ir.Value) -> ir.Value:
        s = self.spec
        pos = (self._add(U.i64(d * s.batch), row) if s.layout == 0
               else self._add(self._mul(row, s.num_directions), U.i64(d)))
        return self._mul(pos, s.hidden)

    def _mul(self, v: ir.Value, n: int) -> ir.Value:
        return self.b.mul(v, U.i64(n))

    def _add(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.add(x, y)

    # loops -----------------------------------------------------------------------
    def seq_len(self, row: ir.Value) -> ir.Value:
        """Row ``row``'s sequence length (i64)."""
        if self.args.seq_lens is None:
            return U.i64(self.spec.seq)
        return self.b.sext(U.load(self.b, self.args.seq_lens, row), U.I64)

    def time_index(self, d: int, step: ir.Value, length: ir.Value) -> ir.Value:
        """The time index of step ``step`` of direction ``d`` for a row of ``length``."""
        if self.spec.directions[d] == "forward":
            return step
        return self.b.sub(self.b.sub(length, U.i64(1)), step)

    def init_states(self) -> None:
        """Y zeroed; Y_h (Y_c) from initial_h (initial_c) or zeros."""
        b, s, a = self.b, self.spec, self.args
        U.fill(b, a.y, TensorSpec(s.y_shape(), "float32").size, U.f32(0.0))
        size = TensorSpec(s.state_shape(), "float32").size
        for src, dst in ((a.initial_h, a.y_h), (a.initial_c, a.y_c)):
            if dst is None:
                continue
            with U.for_range(b, size, name="init") as i:
                v = U.f32(0.0) if src is None else U.load(b, src, i)
                U.store(b, v, dst, i)

    def zero_empty_rows(self) -> None:
        """onnxruntime's Y_h (Y_c) of a row of sequence length 0 is zero."""
        if self.args.seq_lens is None:
            return
        b, s = self.b, self.spec
        with U.for_range(b, s.batch, name="row0") as row:
            empty = b.icmp_signed("==", self.seq_len(row), U.i64(0))
            with b.if_then(empty):
                for d in range(s.num_directions):
                    base = self.state_offset(d, row)
                    for state in (self.args.y_h, self.args.y_c):
                        if state is not None:
                            with U.for_range(b, s.hidden, name="z") as j:
                                U.store(b, U.f32(0.0), state, b.add(base, j))

    # arithmetic ------------------------------------------------------------------
    def dot(self, wp: ir.Value, woff: ir.Value, xp: ir.Value, xoff: ir.Value,
            n: int) -> ir.Value:
        """``sum(w[woff + k] * x[xoff + k] for k < n)`` (reassociated: vectorised)."""
        def body(b: ir.IRBuilder, k: ir.Value, acc: ir.Value) -> ir.Value:
            p = b.fmul(U.load(b, wp, b.add(woff, k)), U.load(b, xp, b.add(xoff, k)),
                       flags=U.REASSOC)
            return b.fadd(acc, p, flags=U.REASSOC)
        return U.reduce_range(self.b, n, U.f32(0.0), body, name="k")

    def bias(self, d: int, j: ir.Value) -> ir.Value | None:
        """``Wb[d, j] + Rb[d, j]`` (None without B)."""
        if self.args.bias is None:
            return None
        b, gh = self.b, self.spec.gates * self.spec.hidden
        base = b.add(U.i64(d * 2 * gh), j)
        return b.fadd(U.load(b, self.args.bias, base),
                      U.load(b, self.args.bias, b.add(base, U.i64(gh))))

    def clip(self, v: ir.Value) -> ir.Value:
        """onnxruntime's clip of a gate's input: ``max(-clip, min(clip, v))``."""
        if self.spec.clip is None:
            return v
        v = U.call_intrinsic(self.b, "llvm.minnum", [v, U.f32(self.spec.clip)])
        return U.call_intrinsic(self.b, "llvm.maxnum", [v, U.f32(-self.spec.clip)])


class FloatCell(RecurrentLoops):
    """The float LSTM/GRU/RNN: per direction, step and batch row, the gates' products
    and then their elementwise update."""

    def emit(self) -> None:
        b, s = self.b, self.spec
        if s.op == "GRU" and not s.linear_before_reset:
            self.rh = U.alloca_array(b, U.F32, s.hidden, name="rh")
        self.init_states()
        for d in range(s.num_directions):
            with U.for_range(b, s.seq, name=f"s{d}") as step:
                with U.for_range(b, s.batch, name=f"b{d}") as row:
                    length = self.seq_len(row)
                    with b.if_then(b.icmp_signed("<", step, length)):
                        t = self.time_index(d, step, length)
                        self._row_step(d, t, row)
        self.zero_empty_rows()

    def _row_step(self, d: int, t: ir.Value, row: ir.Value) -> None:
        s = self.spec
        xoff = self.x_offset(t, row)
        hoff = self.state_offset(d, row)
        yoff = self.y_offset(t, d, row)
        if s.op == "LSTM":
            self._products(d, xoff, hoff, 0, 4 * s.hidden, with_bias=False)
            self.lstm_update(d, hoff, yoff)
        elif s.op == "GRU":
            self._products(d, xoff, hoff, 0, 2 * s.hidden)
            self._gru_update(d, xoff, hoff, yoff)
        else:
            self._products(d, xoff, hoff, 0, s.hidden)
            self._rnn_update(d, hoff, yoff)

    def _products(self, d: int, xoff: ir.Value, hoff: ir.Value, lo: int, hi: int,
                  with_bias: bool = True) -> None:
        """``gates[j] = (W_j . x + R_j . h) + (Wb_j + Rb_j)`` for gate rows [lo, hi)
        (the bias left for later if not ``with_bias``)."""
        b, s, a = self.b, self.spec, self.args
        gh = s.gates * s.hidden
        with U.for_range(b, hi, start=lo, name="j") as j:
            wrow = b.mul(b.add(U.i64(d * gh), j), U.i64(s.input_size))
            rrow = b.mul(b.add(U.i64(d * gh), j), U.i64(s.hidden))
            v = b.fadd(self.dot(a.w, wrow, a.x, xoff, s.input_size),
                       self.dot(a.r, rrow, a.y_h, hoff, s.hidden))
            bias = self.bias(d, j) if with_bias else None
            U.store(b, v if bias is None else b.fadd(v, bias), self.gbuf, j)

    def _gate_input(self, d: int, gate: int, j: ir.Value, products: ir.Value,
                    c: ir.Value | None = None, peephole: int = 0) -> ir.Value:
        """An LSTM gate's activation input in onnxruntime's order: the products, plus
        ``c * P`` (peephole ``peephole`` of i, o, f), plus ``Wb + Rb``, clipped."""
        b, h = self.b, self.spec.hidden
        v = products
        if c is not None and self.args.peepholes is not None:
            p = U.load(b, self.args.peepholes, b.add(U.i64((3 * d + peephole) * h), j))
            v = b.fadd(v, b.fmul(c, p))
        bias = self.bias(d, b.add(j, U.i64(gate * h)))
        return self.clip(v if bias is None else b.fadd(v, bias))

    def lstm_update(self, d: int, hoff: ir.Value, yoff: ir.Value) -> None:
        """The LSTM's elementwise step from the gates' products (``gbuf``, without
        bias): c and h updated in Y_c and Y_h at ``hoff``, h written to Y at ``yoff``."""
        b, s, a = self.b, self.spec, self.args
        f_act, g_act, h_act = s.activations[d]
        hid = s.hidden
        with U.for_range(b, hid, name="u") as j:
            gate = [U.load(b, self.gbuf, b.add(j, U.i64(k * hid))) for k in range(4)]
            c_prev = U.load(b, a.y_c, b.add(hoff, j))
            i = activation(b, f_act, self._gate_input(d, 0, j, gate[0], c_prev, 0))
            if s.input_forget:
                f = b.fsub(U.f32(1.0), i)
            else:
                f = activation(b, f_act, self._gate_input(d, 2, j, gate[2], c_prev, 2))
            g = activation(b, g_act, self._gate_input(d, 3, j, gate[3]))
            c = b.fadd(b.fmul(c_prev, f), b.fmul(i, g))
            o = activation(b, f_act, self._gate_input(d, 1, j, gate[1], c, 1))
            h = b.fmul(activation(b, h_act, c), o)
            U.store(b, c, a.y_c, b.add(hoff, j))
            U.store(b, h, a.y_h, b.add(hoff, j))
            U.store(b, h, a.y, b.add(yoff, j))

    def _gru_update(self, d: int, xoff: ir.Value, hoff: ir.Value, yoff: ir.Value) -> None:
        b, s, a = self.b, self.spec, self.args
        f_act, g_act = s.activations[d]
        hid, gh = s.hidden, 3 * s.hidden
        with U.for_range(b, 2 * hid, name="zr") as j:
            U.store(b, activation(b, f_act, self.clip(U.load(b, self.gbuf, j))), self.gbuf, j)
        if not s.linear_before_reset:
            with U.for_range(b, hid, name="rh") as k:
                r = U.load(b, self.gbuf, b.add(k, U.i64(hid)))
                U.store(b, b.fmul(r, U.load(b, a.y_h, b.add(hoff, k))), self.rh, k)
        with U.for_range(b, gh, start=2 * hid, name="jh") as j:
            wrow = b.mul(b.add(U.i64(d * gh), j), U.i64(s.input_size))
            rrow = b.mul(b.add(U.i64(d * gh), j), U.i64(hid))
            xw = self.dot(a.w, wrow, a.x, xoff, s.input_size)
            v = self._gru_candidate(d, j, xw, rrow, hoff)
            U.store(b, activation(b, g_act, self.clip(v)), self.gbuf, j)
        with U.for_range(b, hid, name="u") as j:
            z = U.load(b, self.gbuf, j)
            ht = U.load(b, self.gbuf, b.add(j, U.i64(2 * hid)))
            h_prev = U.load(b, a.y_h, b.add(hoff, j))
            h = b.fadd(b.fmul(b.fsub(U.f32(1.0), z), ht), b.fmul(z, h_prev))
            U.store(b, h, a.y_h, b.add(hoff, j))
            U.store(b, h, a.y, b.add(yoff, j))

    def _gru_candidate(self, d: int, j: ir.Value, xw: ir.Value, rrow: ir.Value,
                       hoff: ir.Value) -> ir.Value:
        """The h gate's input: ``xW + (r*h)R + Wb + Rb``, or with linear_before_reset
        ``xW + Wb + r * (hR + Rb)``."""
        b, s, a = self.b, self.spec, self.args
        gh = 3 * s.hidden
        wb = rb = None
        if a.bias is not None:
            base = b.add(U.i64(d * 2 * gh), j)
            wb = U.load(b, a.bias, base)
            rb = U.load(b, a.bias, b.add(base, U.i64(gh)))
        if s.linear_before_reset:
            hr = self.dot(a.r, rrow, a.y_h, hoff, s.hidden)
            r = U.load(b, self.gbuf, b.sub(j, U.i64(s.hidden)))
            v = b.fmul(r, hr if rb is None else b.fadd(hr, rb))
            return b.fadd(xw if wb is None else b.fadd(xw, wb), v)
        v = b.fadd(xw, self.dot(a.r, rrow, self.rh, U.i64(0), s.hidden))
        return v if wb is None else b.fadd(v, b.fadd(wb, rb))

    def _rnn_update(self, d: int, hoff: ir.Value, yoff: ir.Value) -> None:
        b, s, a = self.b, self.spec, self.args
        (f_act,) = s.activations[d]
        with U.for_range(b, s.hidden, name="u") as j:
            h = activation(b, f_act, self.clip(U.load(b, self.gbuf, j)))
            U.store(b, h, a.y_h, b.add(hoff, j))
            U.store(b, h, a.y, b.add(yoff, j))
