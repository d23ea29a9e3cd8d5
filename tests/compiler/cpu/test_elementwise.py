"""Fused elementwise kernels (tessera.compiler.cpu.elementwise) against numpy.

Chains of exactly rounded ops (+ - * / min max neg abs relu clip, casts, quantize) must
match numpy bit for bit: the kernel computes the same float32 / int operations in the
same order without fast-math. exp / tanh are checked in ulps against float64, sigmoid bit
for bit against onnxruntime's (MLAS's logistic).
"""
from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.compiler.cpu.elementwise import E, fused_elementwise, maximum, minimum, where
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.errors import CpuKernelError
from tessera.runtime.cpu import load_kernel
from tessera.runtime.cpu_abi import NATIVE, module_ir
from tessera.runtime.jit import CpuTarget, get_jit

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38],
                    np.float32)


def run(expr, *arrays, **kw):
    specs = [TensorSpec(a.shape, a.dtype.name) for a in arrays]
    (out,) = load_kernel(fused_elementwise(expr, specs, **kw))(*arrays)
    return out


# -- an independent numpy evaluator of expression trees


def has_input(e: E) -> bool:
    return e.op == "input" or any(has_input(a) for a in e.args)


def np_eval(e: E, arrays, want=None):
    """numpy's result for ``e``; untyped constants take the dtype of their sibling."""
    if e.op == "input":
        return arrays[e.value]
    if e.op == "const":
        return np.array(e.value, e.dtype or want)
    if e.op in ("add", "sub", "mul", "div", "min", "max", "clip"):
        typed = [a for a in e.args if has_input(a)]
        dt = np_eval(typed[0], arrays).dtype if typed else want
        x, *rest = [np_eval(a, arrays, dt) for a in e.args]
        with np.errstate(all="ignore"):
            if e.op == "clip":
                return np.minimum(np.maximum(x, rest[0]), rest[1])
            fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                  "div": np.divide, "min": np.minimum, "max": np.maximum}[e.op]
            return fn(x, rest[0])
    x = np_eval(e.args[0], arrays, want)
    with np.errstate(all="ignore"):
        if e.op == "neg":
            return np.negative(x)
        if e.op == "abs":
            return np.abs(x)
        if e.op == "relu":
            return np.maximum(x, np.zeros((), x.dtype))
        if e.op == "cast":
            return x.astype(e.dtype)
        if e.op == "quantize":
            scale = np_eval(e.args[1], arrays, "float32")
            zp = np_eval(e.args[2], arrays, e.dtype)
            info = np.iinfo(e.dtype)
            q = np.rint(x / scale) + zp.astype(np.float32)
            return np.clip(q, info.min, info.max).astype(e.dtype)
        if e.op == "dequantize":
            scale = np_eval(e.args[1], arrays, "float32")
            zp = np_eval(e.args[2], arrays, x.dtype.name)
            return (x.astype(np.int32) - zp.astype(np.int32)).astype(np.float32) * scale
    raise AssertionError(e.op)


# -- single ops

RNG = np.random.default_rng(1234)
XF = np.concatenate([RNG.standard_normal(1000).astype(np.float32) * 4, SPECIALS])
YF = np.concatenate([RNG.standard_normal(1000).astype(np.float32) * 4, SPECIALS[::-1]])


@pytest.mark.parametrize("expr, ref", [
    (E.input(0) + E.input(1), lambda x, y: x + y),
    (E.input(0) - E.input(1), lambda x, y: x - y),
    (E.input(0) * E.input(1), lambda x, y: x * y),
    (E.input(0) / E.input(1), lambda x, y: x / y),
    (minimum(E.input(0), E.input(1)), np.minimum),
    (maximum(E.input(0), E.input(1)), np.maximum),
    (-E.input(0), lambda x, y: -x),
    (abs(E.input(0)), lambda x, y: np.abs(x)),
    (E.input(0).relu(), lambda x, y: np.maximum(x, np.float32(0))),
    (E.input(0).clip(-1.5, 2.0), lambda x, y: np.clip(x, np.float32(-1.5), np.float32(2))),
    (E.input(0).clip(E.input(1), 3.0), lambda x, y: np.minimum(np.maximum(x, y), np.float32(3))),
    (1.0 - E.input(0) / 3.0, lambda x, y: np.float32(1) - x / np.float32(3)),
], ids=str)
def test_float_ops_match_numpy_exactly(expr, ref):
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run(expr, XF, YF), ref(XF, YF))


def ulp_error(got: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(ref64.astype(np.float32))).astype(np.float64)
    with np.errstate(all="ignore"):
        return np.abs(got.astype(np.float64) - ref64) / spacing


TRANSCENDENTAL_X = np.concatenate([
    np.linspace(-110, 95, 400_001), np.linspace(-2, 2, 40_001),
    np.logspace(-30, 1, 2000), -np.logspace(-30, 1, 2000)]).astype(np.float32)


@pytest.mark.parametrize("op, ref, max_ulp", [
    ("exp", np.exp, 2),
    ("tanh", np.tanh, 2),
])
def test_transcendentals_are_within_a_few_ulp(op, ref, max_ulp):
    x = TRANSCENDENTAL_X
    got = run(getattr(E.input(0), op)(), x)
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
        want32 = want.astype(np.float32)
    finite = np.isfinite(want32)
    assert ulp_error(got[finite], want[finite]).max() <= max_ulp
    np.testing.assert_array_equal(got[~finite], want32[~finite])


def test_sigmoid_is_onnxruntimes_to_the_bit():
    """onnxruntime's Sigmoid is MLAS's rational logistic (not the correctly rounded
    1 / (1 + e**-x)); dynamically quantized models need its bits (fmath.sigmoid_f32)."""
    x = np.concatenate([TRANSCENDENTAL_X, SPECIALS])
    io = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, x.shape) for n in "xy"]
    graph = onnx.helper.make_graph([onnx.helper.make_node("Sigmoid", ["x"], ["y"])],
                                   "sigmoid", io[:1], io[1:])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x})
    got = run(E.input(0).sigmoid(), x)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-TRANSCENDENTAL_X.astype(np.float64)))
    assert np.abs(got[:exact.size] - exact).max() <= 2e-7   # absolute: tiny results lose digits


@pytest.mark.parametrize("op, expect", [
    ("exp", [np.nan, np.inf, 0.0, 1.0, np.inf, 0.0]),
    ("sigmoid", [np.nan, 1.0, 0.0, 0.5, 1.0, 0.0]),
    ("tanh", [np.nan, 1.0, -1.0, 0.0, 1.0, -1.0]),
])
def test_transcendental_special_values(op, expect):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 89.0, -105.0], np.float32)
    np.testing.assert_array_equal(run(getattr(E.input(0), op)(), x), np.float32(expect))


def test_exp_subnormal_results():
    x = np.linspace(-103.9, -87.4, 5001).astype(np.float32)
    got = run(E.input(0).exp(), x)
    want = np.exp(x.astype(np.float64))
    assert (got > 0).all()
    assert ulp_error(got, want).max() <= 1.0   # spacing is the subnormal step here


def test_tanh_is_odd_and_accurate_near_zero():
    """Either side of where fmath.tanh_f32 changes form (tanh = 1/2, x = 0.5493) and of
    where its reduction's n steps (x = (n + 3/4) ln2 / 2: 0.2599, 0.6065)."""
    x = np.float32([1e-40, 1e-7, 1e-3, 0.2599, 0.26, 0.5493, 0.5494, 0.6065, 0.6066, 3.0])
    got = run(E.input(0).tanh(), np.concatenate([x, -x]))
    np.testing.assert_array_equal(got[x.size:], -got[:x.size])
    np.testing.assert_allclose(got[:x.size], np.tanh(x.astype(np.float64)), rtol=3e-7)


# -- integers: numpy's wrapping semantics, explicit saturation


def test_int8_arithmetic_wraps_like_numpy():
    x = np.array([127, -128, 100, -100, 5, 0], np.int8)
    y = np.array([1, -1, 100, 100, -7, -128], np.int8)
    np.testing.assert_array_equal(run(E.input(0) + E.input(1), x, y), x + y)
    np.testing.assert_array_equal(run(E.input(0) - E.input(1), x, y), x - y)
    np.testing.assert_array_equal(run(E.input(0) * E.input(1), x, y), x * y)
    np.testing.assert_array_equal(run(-E.input(0), x), -x)
    np.testing.assert_array_equal(run(abs(E.input(0)), x), np.abs(x))
    assert run(E.input(0) + 1, np.array([127], np.int8))[0] == -128


def test_uint8_and_int32_wrap_and_compare_unsigned():
    u = np.array([250, 3, 128, 0], np.uint8)
    v = np.array([10, 200, 127, 1], np.uint8)
    np.testing.assert_array_equal(run(E.input(0) + E.input(1), u, v), u + v)
    np.testing.assert_array_equal(run(maximum(E.input(0), E.input(1)), u, v), np.maximum(u, v))
    np.testing.assert_array_equal(run(minimum(E.input(0), 100), u), np.minimum(u, np.uint8(100)))
    i = np.array([2**31 - 1, -(2**31), 123456789], np.int32)
    np.testing.assert_array_equal(run(E.input(0) * 3 + 1, i), i * np.int32(3) + np.int32(1))


def test_int8_clip_and_relu_saturate_explicitly():
    x = np.arange(-128, 128, dtype=np.int8)
    np.testing.assert_array_equal(run(E.input(0).clip(-6, 6), x), np.clip(x, -6, 6))
    np.testing.assert_array_equal(run(E.input(0).relu(), x), np.maximum(x, 0))


@pytest.mark.parametrize("src, dst", [("float32", "int8"), ("float32", "int32"),
                                      ("int8", "uint8"), ("int32", "int8"),
                                      ("uint8", "float32"), ("int32", "float32")])
def test_cast_is_astype(src, dst):
    if src == "float32":
        x = np.float32([-127.9, -1.5, -0.5, 0.49, 1.99, 126.7, 5e8, -5e8])
        if dst == "int8":   # out of range float -> int8 is undefined in numpy too
            x = x[np.abs(x) < 128]
    else:
        info = np.iinfo(src)
        x = np.array([info.min, -1 if info.min else 0, 0, 1, 127, info.max], src)
    np.testing.assert_array_equal(run(E.input(0).cast(dst), x), x.astype(dst))


# -- quantize / dequantize (ONNX QuantizeLinear / DequantizeLinear)


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.float32([0.25, 0.75, -0.25, -0.75, 1.25, 100.0, -100.0, np.nan, 0.0])
    got = run(E.input(0).quantize(0.5, 0, "int8"), x)
    np.testing.assert_array_equal(got, np.int8([0, 2, 0, -2, 2, 127, -128, -128, 0]))
    got = run(E.input(0).quantize(0.5, 10, "uint8"), x)
    np.testing.assert_array_equal(got, np.uint8([10, 12, 10, 8, 12, 210, 0, 0, 10]))


def test_quantize_and_dequantize_match_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    x = (RNG.standard_normal((2, 3, 8, 8)) * 20).astype(np.float32)
    x.flat[:4] = [0.5 * 0.07, 1.5 * 0.07, -2.5 * 0.07, 1e9]
    scale, zp = np.float32(0.07), np.int8(-3)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"])]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("q", TensorProto.INT8, x.shape),
         helper.make_tensor_value_info("d", TensorProto.FLOAT, x.shape)],
        initializer=[helper.make_tensor("s", TensorProto.FLOAT, [], [float(scale)]),
                     helper.make_tensor("z", TensorProto.INT8, [], [int(zp)])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    q_ref, d_ref = sess.run(None, {"x": x})
    q = run(E.input(0).quantize(float(scale), int(zp), "int8"), x)
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_array_equal(run(E.input(0).dequantize(float(scale), int(zp)), q), d_ref)


def test_per_channel_dequantize_relu_requantize():
    q = RNG.integers(-128, 128, (1, 4, 5, 6), dtype=np.int8)
    scale = np.float32([0.1, 0.02, 0.5, 0.003]).reshape(1, 4, 1, 1)
    zp = np.int8([0, -5, 7, 127]).reshape(1, 4, 1, 1)
    expr = E.input(0).dequantize(E.input(1), E.input(2)).relu().quantize(0.05, -20, "int8")
    got = run(expr, q, scale, zp)
    deq = (q.astype(np.int32) - zp).astype(np.float32) * scale
    want = np.clip(np.rint(np.maximum(deq, 0) / np.float32(0.05)) - 20, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(got, want)


# -- broadcasting, shapes, fused chains


@pytest.mark.parametrize("shapes", [
    [(1, 8, 5, 5), (1, 8, 1, 1)],
    [(2, 3, 4), (4,)],
    [(2, 1, 4), (1, 3, 1)],
    [(), (3, 2)],
    [(5, 1), ()],
    [(0, 3), (3,)],
])
def test_broadcasting_matches_numpy(shapes):
    x, y = (RNG.standard_normal(s).astype(np.float32) for s in shapes)
    np.testing.assert_array_equal(run(E.input(0) * E.input(1) - E.input(0), x, y), x * y - x)


def test_out_shape_broadcasts_a_scalar_input():
    x = np.array(2.5, np.float32)
    out = run(E.input(0) * 2.0, x, out_shape=(2, 3))
    np.testing.assert_array_equal(out, np.full((2, 3), 5.0, np.float32))


def test_shared_subexpressions_and_realistic_chains():
    x = RNG.standard_normal((1, 16, 7, 7)).astype(np.float32)
    s = RNG.random((1, 16, 1, 1)).astype(np.float32)
    b = RNG.standard_normal((1, 16, 1, 1)).astype(np.float32)
    y = E.input(0) * E.input(1) + E.input(2)
    np.testing.assert_array_equal(run(y.relu() * y.relu(), x, s, b),
                                  np.maximum(x * s + b, 0) ** 2)
    swish = run(y * y.sigmoid(), x, s, b)
    v = x.astype(np.float64) * s + b
    np.testing.assert_allclose(swish, v / (1 + np.exp(-v)), rtol=1e-6, atol=1e-7)
    x0 = E.input(0)
    gelu = 0.5 * x0 * (1.0 + (0.7978845608 * (x0 + 0.044715 * x0 * x0 * x0)).tanh())
    xd = x.astype(np.float64)
    want = 0.5 * xd * (1 + np.tanh(0.7978845608 * (xd + 0.044715 * xd**3)))
    np.testing.assert_allclose(run(gelu, x), want, rtol=1e-5, atol=1e-6)


def test_signed_zero_constants_are_not_merged():
    x = np.float32([1.0, -2.0, np.inf])
    got = run(E.input(0) * -0.0 + E.input(0) * 0.0, x)
    np.testing.assert_array_equal(np.signbit(got[:2]), [False, False])   # +0 + -0
    assert np.isnan(got[2])


def test_kernel_name_and_signature():
    k = fused_elementwise((E.input(0) * E.input(1) + 3.0).relu(),
                          [TensorSpec((2, 3), "float32"), TensorSpec((3,), "float32")])
    assert k.name == "relu(((x0 * x1) + 3.0))"
    assert k.outputs == (TensorSpec((2, 3), "float32"),)


#: A CPU with AVX-512 that LLVM vectorises 512 bits wide by default (Zen 4).
ZEN4 = CpuTarget("x86_64-znver4", "x86_64-unknown-linux-gnu", "znver4", "", (), NATIVE)
X, Y = E.input(0), E.input(1)


@pytest.mark.parametrize("expr, streams", [
    (X + Y, True), ((X * Y + 1.5).relu(), True), (where(X.greater(Y), X / Y, 0.0), True),
    (X.exp() + Y, False), (X.tanh(), False), (X.quantize(0.1, 3, "int8"), False),
], ids=str)
def test_streaming_kernels_use_256_bit_vectors_on_avx512(expr, streams):
    """Memory-bound kernels are vectorised 256 bits wide on a 512-bit CPU (faster there,
    STREAM_VECTOR_BITS), compute-bound ones 512: in every function of the loaded module,
    the Python-call wrappers and the parallel slices included."""
    spec = TensorSpec((64, 4096), "float32")
    kernel = fused_elementwise(expr, [spec, spec])
    assert kernel.parallel
    asm = get_jit().emit_assembly(module_ir(kernel), ZEN4)
    assert re.search("%ymm" if streams else "%zmm", asm)
    assert ("%zmm" in asm) != streams


@pytest.mark.parametrize("build, match", [
    (lambda: fused_elementwise(E.input(0) + E.input(1), [TensorSpec((2,), "int8"),
                                                          TensorSpec((2,), "float32")]),
     "no implicit promotion"),
    (lambda: fused_elementwise(E.input(0).exp(), [TensorSpec((2,), "int8")]), "needs float32"),
    (lambda: fused_elementwise(E.input(0) / 2, [TensorSpec((2,), "int32")]), "needs float32"),
    (lambda: fused_elementwise(E.input(0) + 300, [TensorSpec((2,), "int8")]), "not a int8 value"),
    (lambda: fused_elementwise(E.input(0) + 0.5, [TensorSpec((2,), "int8")]), "not a int8 value"),
    (lambda: fused_elementwise(E.input(1), [TensorSpec((2,), "int8")]), "uses input 1"),
    (lambda: fused_elementwise(E.input(0), [TensorSpec((2,), "int8")], out_dtype="float32"),
     "out_dtype"),
    (lambda: fused_elementwise(E.input(0) + E.input(1), [TensorSpec((2,), "float32"),
                                                          TensorSpec((3,), "float32")]),
     "do not broadcast"),
    (lambda: E.input(0).quantize(0.1, 0, "float32"), "integer dtype"),
    (lambda: fused_elementwise(E.input(0).dequantize(0.1), [TensorSpec((2,), "float32")]),
     "integer operand"),
    (lambda: E.input(0) + "a", "cannot use"),
])
def test_invalid_expressions_raise(build, match):
    with pytest.raises(CpuKernelError, match=match):
        build()


# -- random expression trees (hypothesis)

FLOAT_UNARY = ["neg", "abs", "relu", "clip"]
FLOAT_BINARY = ["add", "sub", "mul", "div", "min", "max"]
INT_BINARY = ["add", "sub", "mul", "min", "max"]


def trees(n_inputs: int, binary: list[str], consts):
    leaves = st.one_of(st.integers(0, n_inputs - 1).map(E.input), consts.map(E.const))

    def extend(children):
        unary = st.tuples(st.sampled_from(FLOAT_UNARY), children, consts, consts).map(
            lambda t: (t[1].clip(min(t[2], t[3]), max(t[2], t[3])) if t[0] == "clip"
                       else E(t[0], (t[1],))))
        bin_ = st.tuples(st.sampled_from(binary), children, children).map(
            lambda t: E(t[0], (t[1], t[2])))
        return st.one_of(unary, bin_)

    # The root reads the inputs, so the tree's dtype comes from them.
    return st.recursive(leaves, extend, max_leaves=6).map(
        lambda e: e + E.input(0) * E.input(n_inputs - 1))


@st.composite
def broadcast_shapes(draw, n: int):
    out = draw(st.lists(st.integers(1, 6), min_size=0, max_size=4))
    shapes = []
    for _ in range(n):
        keep = draw(st.integers(0, len(out)))
        shapes.append(tuple(d if draw(st.booleans()) else 1 for d in out[len(out) - keep:]))
    shapes[0] = tuple(out)
    return shapes


def random_arrays(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        arrays = [np.asarray(rng.standard_normal(s) * 4, np.float32) for s in shapes]
        for a in arrays:
            if a.size > 2:
                a.flat[rng.integers(0, a.size, 2)] = rng.choice(SPECIALS, 2)
        return arrays
    info = np.iinfo(dtype)
    return [rng.integers(info.min, info.max + 1, s, dtype=dtype) for s in shapes]


@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_random_float_trees_match_numpy_bit_for_bit(data, n, seed):
    consts = st.floats(-4, 4, width=32, allow_subnormal=False)
    expr = data.draw(trees(n, FLOAT_BINARY, consts))
    arrays = random_arrays(data.draw(broadcast_shapes(n)), "float32", seed)
    np.testing.assert_array_equal(run(expr, *arrays), np_eval(expr, arrays))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), dtype=st.sampled_from(["int8", "uint8", "int32"]),
       seed=st.integers(0, 2**32 - 1))
def test_random_int_trees_wrap_like_numpy(data, n, dtype, seed):
    info = np.iinfo(dtype)
    consts = st.integers(max(info.min, -1000), min(info.max, 1000))
    expr = data.draw(trees(n, INT_BINARY, consts))
    arrays = random_arrays(data.draw(broadcast_shapes(n)), dtype, seed)
    got = run(expr, *arrays)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np_eval(expr, arrays))
