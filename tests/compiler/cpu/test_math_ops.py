"""The elementwise math ops on the CPU (``compiler/cpu/lower_math.py``, the expression
builder of ``compiler/cpu/elementwise.py``, the polynomials of ``irutil``/``fmath``).

Every op against onnxruntime (CPU provider) on one-node models: random shapes with
numpy broadcasting, and inputs salted with edge values (0, -0, subnormals, +-inf, NaN,
+-3e38, halves for rounding). Exactly rounded ops must match bit for bit (NaN where
onnxruntime has NaN, zeros of the same sign); transcendental ones within the tolerance
given per case (a few float32 ulp: rtol 1e-5 or tighter, with a small atol where the
result crosses zero). The polynomials' own error is measured against float64 over
dense sweeps of float32 inputs.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tessera.compiler.cpu.elementwise import E, fused_elementwise, where
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.lower import cpu_unsupported_reason, lower_node_to_cpu
from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.errors import CompileError, CpuKernelError
from tessera.runtime.cpu import load_kernel, run_cpu_steps
from tessera.runtime.jit import get_jit, host_cpu

RNG = np.random.default_rng(15)
SPECIALS = np.float32([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, -1e-40, 3e38, -3e38,
                       0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 100.0, -100.0])


def floats(*shape: int, scale: float = 3.0, salt: float = 0.2) -> np.ndarray:
    """Normal values times ``scale``, a ``salt`` share of them replaced by edge values."""
    x = (RNG.standard_normal(shape) * scale).astype(np.float32)
    mask = RNG.random(shape) < salt
    x[mask] = RNG.choice(SPECIALS, int(mask.sum()))
    return x


def ints(dtype: str, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def bools(*shape: int) -> np.ndarray:
    return RNG.random(shape) < 0.5


def broadcast_shapes(rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two random shapes that broadcast against each other: the second drops leading
    dims, and each shape has some dims set to 1."""
    full = tuple(int(d) for d in RNG.integers(2, 6, rank))
    a = tuple(1 if RNG.random() < 0.25 else d for d in full)
    b = tuple(1 if RNG.random() < 0.4 else d for d in full)[int(RNG.integers(0, rank)):]
    return a, b


EXACT = None
ULP = (2e-6, 0.0)               # pow: both within 0.5 ulp plus double rounding
POLY = (1e-5, 1e-6)             # exp, log, erf, tanh ... and formulas over them


@dataclass
class Case:
    """A one-node model: ``feeds`` are graph inputs, ``consts`` initializers."""

    op: str
    feeds: dict[str, np.ndarray]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    tol: tuple[float, float] | None = EXACT
    opset: int = 17
    inputs: list[str] | None = None

    def model(self) -> onnx.ModelProto:
        inputs = self.inputs if self.inputs is not None else [*self.feeds, *self.consts]
        node = helper.make_node(self.op, inputs, ["y"], name=f"{self.op.lower()}_node",
                                **self.attrs)
        graph = helper.make_graph(
            [node], "case",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in self.feeds.items()],
            [helper.make_empty_tensor_value_info("y")],
            [numpy_helper.from_array(np.asarray(a), n) for n, a in self.consts.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)

    def graph(self, expected: np.ndarray) -> Graph:
        """The model through ``import_onnx``; the ops newer than the graph IR's opset 17
        (Mish 18, Gelu 20), which import converts (or expands), as the node itself."""
        if self.opset <= 17:
            return import_onnx(self.model())
        g = Graph("case")
        for name, a in self.feeds.items():
            g.add_input(name, a.shape, str(a.dtype))
        for name, a in self.consts.items():
            g.add_const(name, a)
        g.add_value("y", expected.shape, str(expected.dtype))
        g.outputs.append("y")
        g.add_node(self.op, [*self.feeds, *self.consts], ["y"], name=f"{self.op.lower()}_node",
                   **self.attrs)
        return g


def case(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
         tol=EXACT, opset: int = 17, id: str | None = None, **attrs: Any):
    return pytest.param(Case(op, feeds, dict(consts or {}), attrs, tol, opset), id=id or op)


def onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def ours(c: Case, expected: np.ndarray) -> tuple[np.ndarray, list]:
    graph = c.graph(expected)
    [node] = graph.nodes
    steps = lower_node_to_cpu(graph, node)
    env = dict(c.feeds)
    run_cpu_steps(steps, env)
    return env["y"], steps


def assert_same(got: np.ndarray, want: np.ndarray, tol) -> None:
    """Bit for bit (``tol`` None: NaN where NaN, zeros of the same sign), or within
    ``tol = (rtol, atol)`` with NaN and infinities where onnxruntime has them."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    if got.dtype != np.float32:
        np.testing.assert_array_equal(got, want)
        return
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    g, w = got[~nan], want[~nan]
    if tol is EXACT:
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
    else:
        finite = np.isfinite(w)
        np.testing.assert_array_equal(g[~finite], w[~finite])
        np.testing.assert_allclose(g[finite], w[finite], rtol=tol[0], atol=tol[1])


def _cases() -> list:
    a3, b3 = broadcast_shapes(3)
    a4, b4 = broadcast_shapes(4)
    a2, b2 = broadcast_shapes(2)
    x = floats(2, 3, 4, 5)
    return [
        # activations
        case("Relu", {"x": x}),
        case("Relu", {"x": ints("int8", 3, 7)}, id="Relu-int8"),
        case("Clip", {"x": x}, {"lo": np.float32(-1.5), "hi": np.float32(0.5)}),
        case("Sigmoid", {"x": x}),              # MLAS's logistic, to the bit
        case("Tanh", {"x": x}, tol=POLY),
        case("HardSigmoid", {"x": x}),
        case("HardSigmoid", {"x": x}, alpha=0.3, beta=0.4, id="HardSigmoid-attrs"),
        case("HardSwish", {"x": x}),
        case("LeakyRelu", {"x": x}),
        case("LeakyRelu", {"x": x}, alpha=0.2, id="LeakyRelu-alpha"),
        case("PRelu", {"x": floats(2, 3, 4, 4)}, {"slope": floats(3, 1, 1, salt=0)},
             id="PRelu-per-channel"),
        case("PRelu", {"x": floats(*a3), "slope": floats(*b3)}, id="PRelu-broadcast"),
        case("Elu", {"x": x}, tol=POLY),
        case("Elu", {"x": x}, alpha=0.5, tol=POLY, id="Elu-alpha"),
        case("Selu", {"x": x}, tol=POLY),
        case("Selu", {"x": x}, alpha=2.0, gamma=3.0, tol=POLY, id="Selu-attrs"),
        case("Softplus", {"x": floats(3, 40, scale=20)}, tol=POLY),
        case("Mish", {"x": floats(3, 40, scale=8)}, tol=POLY, opset=18),
        case("Erf", {"x": x}, tol=POLY),
        case("Gelu", {"x": x}, tol=POLY, opset=20),
        case("Gelu", {"x": x}, tol=POLY, opset=20, approximate="tanh", id="Gelu-tanh"),
        # arithmetic
        case("Add", {"a": floats(*a4), "b": floats(*b4)}, id="Add-broadcast"),
        case("Sub", {"a": floats(*a3), "b": floats(*b3)}, id="Sub-broadcast"),
        case("Mul", {"a": floats(*a2), "b": floats(*b2)}, id="Mul-broadcast"),
        case("Div", {"a": floats(*a3), "b": floats(*b3)}, id="Div-broadcast"),
        case("Add", {"a": ints("int8", *a3), "b": ints("int8", *b3)}, id="Add-int8-wraps"),
        case("Mul", {"a": ints("uint8", *a2), "b": ints("uint8", *b2)}, id="Mul-uint8"),
        case("Div", {"a": ints("int8", 4, 64), "b": ints("int8", 64) | 1}, id="Div-int8"),
        case("Div", {"a": ints("int32", 3, 9) // 7, "b": ints("int32", 9) // 2**20 | 1},
             id="Div-int32"),
        case("Div", {"a": ints("uint8", 5, 8), "b": ints("uint8", 8) | 1}, id="Div-uint8"),
        case("Pow", {"a": np.abs(floats(*a3)), "b": floats(*b3)}, tol=ULP, id="Pow-broadcast"),
        case("Pow", {"a": floats(4, 50)}, {"b": floats(4, 50, scale=2).round()}, tol=ULP,
             id="Pow-negative-base"),
        case("Pow", {"a": floats(3, 5)}, {"b": np.float32(3)}, id="Pow-cube"),
        case("Pow", {"a": floats(3, 5)}, {"b": np.int64(2)}, id="Pow-int64-square"),
        case("Pow", {"a": np.abs(floats(3, 5))}, {"b": np.float32(0.5)}, tol=ULP, id="Pow-sqrt"),
        case("Sqrt", {"x": x}),
        case("Reciprocal", {"x": x}),
        case("Exp", {"x": x}, tol=POLY),
        case("Log", {"x": x}, tol=POLY),
        case("Neg", {"x": ints("int8", 2, 11)}, id="Neg-int8"),
        case("Abs", {"x": x}),
        case("Floor", {"x": x}),
        case("Ceil", {"x": x}),
        case("Round", {"x": np.concatenate([x.ravel(), np.float32([0.5, 1.5, 2.5, -0.5, -3.5])])}),
        case("Sign", {"x": x}),
        case("Sign", {"x": ints("int8", 3, 5)}, id="Sign-int8"),
        case("Sign", {"x": ints("uint8", 3, 5)}, id="Sign-uint8"),
        # variadic
        case("Sum", {"a": floats(*a4), "b": floats(*b4), "c": floats(a4[-1])}, id="Sum-3"),
        case("Mean", {"a": floats(*a3), "b": floats(*b3), "c": floats(*a3)}, id="Mean-3"),
        case("Mean", {"a": floats(2, 3)}, id="Mean-1"),
        case("Max", {"a": floats(*a3), "b": floats(*b3), "c": floats(a3[-1])}, id="Max-3"),
        case("Min", {"a": ints("int8", *a2), "b": ints("int8", *b2)}, id="Min-int8"),
        # comparisons, selection
        case("Equal", {"a": floats(*a3, salt=0.6), "b": floats(*b3, salt=0.6)}),
        case("Equal", {"a": bools(*a2), "b": bools(*b2)}, id="Equal-bool"),
        case("Less", {"a": floats(*a3), "b": floats(*b3)}),
        case("LessOrEqual", {"a": ints("int8", *a3), "b": ints("int8", *b3)}),
        case("Greater", {"a": ints("uint8", *a2), "b": ints("uint8", *b2)}),
        case("GreaterOrEqual", {"a": ints("int32", 4, 6)}, {"b": np.int32(3)}),
        case("Where", {"c": bools(*a3), "a": floats(*b3), "b": floats(*a3)}),
        case("Where", {"c": bools(*a2)}, {"a": np.int8(-7), "b": np.int8(5)},
             id="Where-int8-constants"),
        # per-channel normalisation
        case("BatchNormalization", {"x": floats(2, 6, 5, 7, salt=0.05)},
             {"s": floats(6, salt=0), "b": floats(6, salt=0), "m": floats(6, salt=0),
              "v": np.abs(floats(6, salt=0)) + np.float32(0.1)}, epsilon=1e-3),
        case("BatchNormalization", {"x": floats(3, 6), "s": floats(6, salt=0),
                                    "b": floats(6, salt=0), "m": floats(6, salt=0),
                                    "v": np.abs(floats(6, salt=0))}, id="BatchNormalization-inputs"),
        case("InstanceNormalization", {"x": floats(2, 4, 6, 5, salt=0)},
             {"s": floats(4, salt=0), "b": floats(4, salt=0)}, tol=(1e-5, 1e-5)),
        case("InstanceNormalization", {"x": floats(2, 3, 17, salt=0), "s": floats(3, salt=0),
                                       "b": floats(3, salt=0)}, epsilon=0.1, tol=(1e-5, 1e-5),
             id="InstanceNormalization-1d-inputs"),
    ]


@pytest.mark.parametrize("c", _cases())
def test_op_matches_onnxruntime(c: Case) -> None:
    model = c.model()
    with np.errstate(all="ignore"):
        want = onnxruntime(model, c.feeds)
    got, steps = ours(c, want)
    assert_same(got, want, c.tol)
    kernels = [s for s in steps if s.kernel is not None]
    # One pass over memory: one fused kernel (InstanceNormalization: the plane
    # statistics, then the affine kernel).
    assert len(kernels) == (2 if c.op == "InstanceNormalization" else 1)


def test_cast_to_and_from_bool_matches_onnxruntime() -> None:
    """bool is a kernel dtype: Cast to bool is ``!= 0`` (NaN is true), from bool 0 or 1."""
    x = floats(4, 9, salt=0.5)
    for feeds, to in (({"x": x}, onnx.TensorProto.BOOL),
                      ({"x": ints("int8", 4, 9) // 64}, onnx.TensorProto.BOOL),
                      ({"x": bools(4, 9)}, onnx.TensorProto.FLOAT),
                      ({"x": bools(4, 9)}, onnx.TensorProto.INT32)):
        c = Case("Cast", feeds, attrs={"to": to})
        want = onnxruntime(c.model(), c.feeds)
        got, _ = ours(c, want)
        assert_same(got, want, EXACT)


# ------------------------------------------------------- the polynomials, dense sweeps
def run(expr: E, *arrays: np.ndarray) -> np.ndarray:
    specs = [TensorSpec(a.shape, a.dtype.name) for a in arrays]
    (out,) = load_kernel(fused_elementwise(expr, specs))(*arrays)
    return out


def ulp_error(got: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the float32 spacing at the correctly rounded result."""
    spacing = np.spacing(np.abs(ref64.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - ref64) / spacing


def every_float(lo_bits: int, hi_bits: int, step: int) -> np.ndarray:
    """Every ``step``-th positive float32 between two bit patterns."""
    return np.arange(lo_bits, hi_bits, step, dtype=np.uint32).view(np.float32)


POSITIVE = every_float(1, 0x7F800000, 1021)       # subnormals to the largest float


def test_log_within_one_ulp() -> None:
    got = run(E.input(0).log(), POSITIVE)
    assert ulp_error(got, np.log(POSITIVE.astype(np.float64))).max() <= 1.0   # 0.77


def test_log1p_within_three_ulp() -> None:
    x = np.concatenate([POSITIVE[POSITIVE < 1e30], -every_float(1, 0x3F800000, 1021)])
    got = run(E.input(0).log1p(), x)
    assert ulp_error(got, np.log1p(x.astype(np.float64))).max() <= 3.0        # 2.4


def test_erf_within_one_ulp() -> None:
    half = every_float(1, 0x40A00000, 2039)                                 # up to 5
    x = np.concatenate([half, -half])
    got = run(E.input(0).erf(), x)
    want = np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(np.float64)
    assert ulp_error(got, want).max() <= 1.0                                 # 0.97


TANH_ONE = 0x41200000            # 10.0: tanh rounds to 1 in float32 from 9.0109 up
TANH_CHUNK = 1 << 22


def tanh_worst_ulp(step: int) -> tuple[float, float]:
    """The worst ulp error of the tanh kernel, and where, over every ``step``-th positive
    float32 up to 10 (and every 4099th above, where tanh is 1), in chunks of one kernel's
    shape (the last one padded)."""
    kernel = load_kernel(fused_elementwise(E.input(0).tanh(),
                                           [TensorSpec((TANH_CHUNK,), "float32")]))
    bits = [(0, TANH_ONE, step), (TANH_ONE, 0x7F800001, 4099)]
    worst, at = 0.0, float("nan")
    for lo, hi, stride in bits:
        for start in range(lo, hi, TANH_CHUNK * stride):
            x = np.arange(start, min(start + TANH_CHUNK * stride, hi), stride,
                          dtype=np.uint32).view(np.float32)
            (got,) = kernel(np.pad(x, (0, TANH_CHUNK - x.size)))
            err = ulp_error(got[:x.size], np.tanh(x.astype(np.float64)))
            i = int(err.argmax())
            if err[i] > worst:
                worst, at = float(err[i]), float(x[i])
    return worst, at


def test_tanh_within_two_ulp() -> None:
    """Every 61st float32 (the exhaustive sweep below is slow): 1.765 at worst here."""
    worst, at = tanh_worst_ulp(61)
    assert worst <= 2.0, f"{worst:.3f} ulp at x = {at!r}"


@pytest.mark.exhaustive
def test_tanh_within_two_ulp_over_every_float32() -> None:
    """Every float32 in [0, 10) (tanh is odd: the kernel takes |x| and copies the sign
    back; tests/compiler/cpu/test_elementwise.py checks the sign): 1.771 at worst, at
    x = 0.2407, on a host with FMA."""
    worst, at = tanh_worst_ulp(1)
    assert worst <= 2.0, f"{worst:.3f} ulp at x = {at!r}"


def test_pow_is_correctly_rounded() -> None:
    """float64 inside: within 0.5 ulp (bar double rounding) on bases from 2**-40 to
    2**40 and exponents mostly within +-12; the results that over- or underflow (13%)
    are inf and 0 (or the subnormal) exactly."""
    x = np.abs(floats(400_000, scale=1.0, salt=0)) * np.float32(2.0) ** RNG.integers(
        -40, 40, 400_000).astype(np.float32)
    y = floats(400_000, scale=4.0, salt=0)
    got = run(E.input(0) ** E.input(1), x, y)
    with np.errstate(all="ignore"):
        want = np.power(x.astype(np.float64), y.astype(np.float64))
        want32 = want.astype(np.float32)
    fine = np.isfinite(want32) & (want32 != 0)
    assert fine.mean() > 0.8
    assert ulp_error(got[fine], want[fine]).max() <= 0.5 + 1e-6
    np.testing.assert_array_equal(got[~fine], want32[~fine])


def test_pow_special_values_are_c99() -> None:
    s = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1, -1, 2, -2, 0.5, -0.5, 3, -3, 1e-40,
                    -1e-40, 2.0 ** 25, -(2.0 ** 25), 7.5])
    x, y = (a.ravel() for a in np.meshgrid(s, s, indexing="ij"))
    got = run(E.input(0) ** E.input(1), x, y)
    with np.errstate(all="ignore"):
        want = np.power(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)
    assert_same(got, want, EXACT)


@pytest.mark.parametrize("op, expect", [
    ("log", [np.nan, np.inf, np.nan, -np.inf, -np.inf, np.nan, -103.27893]),
    ("log1p", [np.nan, np.inf, np.nan, 0.0, -0.0, -np.inf, 1e-45]),
    ("erf", [np.nan, 1.0, -1.0, 0.0, -0.0, -0.8427008, 1.1283792e-45]),
])
def test_special_values(op: str, expect: list[float]) -> None:
    x = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1e-45])
    assert_same(run(getattr(E.input(0), op)(), x), np.float32(expect), EXACT)


@pytest.mark.skipif("+avx2" not in host_cpu()[1], reason="host has no AVX2")
@pytest.mark.parametrize("expr", [E.input(0).log(), E.input(0).log1p(), E.input(0).erf(),
                                  E.input(0) ** E.input(1)], ids=str)
def test_math_vectorises_without_libm_calls(expr: E) -> None:
    spec = TensorSpec((4096,), "float32")
    asm = get_jit().emit_assembly(fused_elementwise(expr, [spec, spec]).ir)
    assert re.search(r"%[yz]mm\d", asm) and not re.search(r"\bcall", asm)


# ------------------------------------------------------------ the expression builder
def test_comparisons_where_and_bool_operands() -> None:
    x, y = floats(64, salt=0.5), floats(64, salt=0.5)
    a, b = E.input(0), E.input(1)
    for method, ref in (("equal", np.equal), ("less", np.less), ("less_equal", np.less_equal),
                        ("greater", np.greater), ("greater_equal", np.greater_equal)):
        got = run(getattr(a, method)(b), x, y)
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, ref(x, y))
    got = run(where(a.greater(b), a - b, 0.0), x, y)
    with np.errstate(all="ignore"):
        assert_same(got, np.where(x > y, x - y, np.float32(0)), EXACT)
    mask = bools(64)
    np.testing.assert_array_equal(run(where(E.input(0), 3, -4), mask),
                                  np.where(mask, 3, -4).astype(np.int32))
    np.testing.assert_array_equal(run(E.input(0).cast("bool"), x), x.astype(bool))


def test_integer_ops_wrap_and_truncate() -> None:
    a = np.int8([7, -7, 7, -7, -128, -128, 5, 0, 127])
    b = np.int8([2, 2, -2, -2, -1, 1, 0, 0, -1])
    np.testing.assert_array_equal(run(E.input(0).trunc_div(E.input(1)), a, b),
                                  np.int8([3, -3, -3, 3, -128, -128, 0, 0, -127]))
    a32 = np.int32([-(2**31), 2**31 - 1, -9, 9])
    b32 = np.int32([-1, -1, 4, 0])
    np.testing.assert_array_equal(run(E.input(0).trunc_div(E.input(1)), a32, b32),
                                  np.int32([-(2**31), -(2**31) + 1, -2, 0]))
    np.testing.assert_array_equal(run(E.input(0).sign(), a), np.sign(a))
    u = np.uint8([0, 1, 255])
    np.testing.assert_array_equal(run(E.input(0).sign(), u), np.uint8([0, 1, 1]))


def test_read_as_broadcasts_a_channel_vector() -> None:
    x, scale = floats(2, 3, 4, 5, salt=0), floats(3, salt=0)
    spec = [TensorSpec(x.shape, "float32"), TensorSpec((3,), "float32")]
    (got,) = load_kernel(fused_elementwise(E.input(0) * E.input(1), spec,
                                           read_as=[None, (3, 1, 1)]))(x, scale)
    np.testing.assert_array_equal(got, x * scale.reshape(3, 1, 1))
    with pytest.raises(CpuKernelError, match="cannot be read as"):
        fused_elementwise(E.input(0) * E.input(1), spec, read_as=[None, (4, 1, 1)])


@pytest.mark.parametrize("build, match", [
    (lambda: fused_elementwise(E.input(0) + E.input(1), [TensorSpec((2,), "bool")] * 2),
     "bool operands"),
    (lambda: fused_elementwise(E.input(0).less(E.input(1)), [TensorSpec((2,), "bool")] * 2),
     "bool operands"),
    (lambda: fused_elementwise(where(E.input(0), 1.0, 2.0), [TensorSpec((2,), "float32")]),
     "expected bool"),
    (lambda: fused_elementwise(E.input(0).trunc_div(2.0), [TensorSpec((2,), "float32")]),
     "integer operands"),
    (lambda: fused_elementwise(E.input(0).erf(), [TensorSpec((2,), "int32")]), "needs float32"),
    (lambda: E.input(0).quantize(0.1, 0, "bool"), "integer dtype"),
])
def test_invalid_expressions_raise(build, match: str) -> None:
    with pytest.raises(CpuKernelError, match=match):
        build()


# ------------------------------------------------------------ what the lowering refuses
def one_node(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray],
             **attrs: Any) -> Graph:
    """A graph of one ``op`` node over ``feeds`` and ``consts``, output ``y`` shaped as
    the first feed (built directly: the refused forms need not pass ONNX's checker)."""
    g = Graph("refused")
    for name, a in feeds.items():
        g.add_input(name, a.shape, str(a.dtype))
    for name, a in consts.items():
        g.add_const(name, a)
    first = next(iter(feeds.values()))
    g.add_value("y", first.shape, "float32")
    g.outputs.append("y")
    g.add_node(op, [*feeds, *consts], ["y"], name=f"my_{op.lower()}", **attrs)
    return g


BN_PARAMS = {"s": floats(3), "b": floats(3), "m": floats(3), "v": floats(3)}


@pytest.mark.parametrize("graph, words", [
    (one_node("Gelu", {"x": floats(3)}, {}, approximate="fast"), "approximate"),
    (one_node("BatchNormalization", {"x": floats(2, 3)}, BN_PARAMS, training_mode=1),
     "training mode"),
    (one_node("BatchNormalization", {"x": floats(2, 4)}, BN_PARAMS), "expected float32[4]"),
    (one_node("InstanceNormalization", {"x": floats(2, 3)}, {"s": floats(3), "b": floats(3)}),
     "rank 2"),
    (one_node("Pow", {"x": floats(3), "e": ints("int32", 3)}, {}), "float32"),
    (one_node("Pow", {"x": floats(3)}, {"e": np.int64(2**40 + 1)}), "does not hold exactly"),
    (one_node("Where", {"c": floats(3), "x": floats(3)}, {"y2": floats(3)}), "bool"),
], ids=["gelu-approximate", "batchnorm-training", "batchnorm-channels", "instancenorm-rank",
        "pow-int-exponent", "pow-huge-exponent", "where-float-condition"])
def test_refused_nodes_say_why(graph: Graph, words: str) -> None:
    node = graph.nodes[0]
    assert words in cpu_unsupported_reason(graph, node)
    with pytest.raises(CompileError, match=node.name):
        lower_node_to_cpu(graph, node)
