"""N:M sparse CPU kernels (tessera.compiler.cpu.sparse): int8 bit-exact with the dense
kernels and numpy, float32 close to numpy and onnxruntime, the compressed layout, the
lowering's choice of kernel, and a pruned model end to end against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import llvmlite.binding as llvm
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler import zoo
from tessera.compiler.cpu.conv import build_conv_int8, build_matmul_int8
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.lower import lower_node_to_cpu
from tessera.compiler.cpu import sparse_dots
from tessera.compiler.cpu.sparse import build_conv_nm, build_matmul_nm, conv_output_hw
from tessera.compiler.cpu.sparse_dots import specialize_for_host
from tessera.compiler.cpu.sparse_layout import host_byte_dots, nm_layout, vector_lanes
from tessera.compiler.cpu.sparse_lower import INT8_MIN_ROWS, PAIR_MIN_ROWS, nm_matmul_kernel
from tessera.compiler.cpu.sparse_pairs import build_matmul_nm_pairs, nm_pair_layout
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.errors import CpuKernelError
from tessera.runtime.cpu import load_kernel, run_cpu_steps
from tessera.runtime.jit import get_jit
from tessera.sparsity import NM_PATTERNS, is_nm_sparse

RNG = np.random.default_rng(23)


def prune(w: np.ndarray, n: int, m: int, axis: int = 1) -> np.ndarray:
    """``w`` with all but the ``n`` largest of every ``m`` along ``axis`` zeroed."""
    g = np.moveaxis(w, axis, -1).copy()
    groups = g.reshape(*g.shape[:-1], -1, m)
    drop = np.argsort(-np.abs(groups), axis=-1, kind="stable")[..., n:]
    np.put_along_axis(groups, drop, 0, axis=-1)
    out = np.moveaxis(groups.reshape(g.shape), -1, axis)
    assert is_nm_sparse(out, n, m, axis)
    return np.ascontiguousarray(out)


def data(kind: str, shape) -> np.ndarray:
    if kind == "int8":
        return RNG.integers(-128, 128, shape, dtype=np.int8)
    return RNG.standard_normal(shape).astype(np.float32)


def conv_reference(x, w, bias, strides, pads, dilations) -> np.ndarray:
    """float64 / int64 direct convolution, tap by tap."""
    acc = np.int64 if x.dtype == np.int8 else np.float64
    (kh, kw), (sh, sw), (dh, dw) = w.shape[2:], strides, dilations
    oh, ow = conv_output_hw(x.shape[2:], (kh, kw), strides, pads, dilations)
    xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out = np.zeros((x.shape[0], w.shape[0], oh, ow), acc)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky * dh:ky * dh + (oh - 1) * sh + 1:sh,
                       kx * dw:kx * dw + (ow - 1) * sw + 1:sw]
            out += np.einsum("nchw,mc->nmhw", patch, w[:, :, ky, kx].astype(acc))
    if bias is not None:
        out += bias.astype(acc)[None, :, None, None]
    return out


def run_conv(x, w, pattern, bias=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
             vector_bits=None, byte_dots=None) -> np.ndarray:
    oh, ow = conv_output_hw(x.shape[2:], w.shape[2:], strides, pads, dilations)
    kind = str(x.dtype)
    lay = nm_layout(w, pattern, oh * ow, kind, taps=w.shape[2] * w.shape[3],
                    vector_bits=vector_bits, byte_dots=byte_dots)
    k = build_conv_nm(TensorSpec(x.shape, kind), lay, w.shape[2:], bias is not None,
                      strides, pads, dilations)
    args = (x, lay.values, lay.offsets) + ((bias,) if bias is not None else ())
    return load_kernel(k)(*args)[0]


def dense_conv_int8(x, w, bias, strides, pads, dilations) -> np.ndarray:
    dense = build_conv_int8(TensorSpec(x.shape, "int8"), TensorSpec(w.shape, "int8"),
                            bias is not None, strides, pads, dilations)
    return load_kernel(dense)(x, w, *(() if bias is None else (bias,)))[0]


# ------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("byte_dots", [False, True])
@pytest.mark.parametrize("pattern", NM_PATTERNS)
def test_int8_conv_is_bit_identical_to_the_dense_kernel(pattern, byte_dots) -> None:
    """Slots in pairs (int16) and in fours (byte dot products) alike."""
    n, m = pattern
    x = data("int8", (2, 16, 11, 13))
    w = prune(data("int8", (10, 16, 3, 3)), n, m)
    bias = RNG.integers(-9000, 9000, 10, dtype=np.int32)
    geo = dict(strides=(2, 1), pads=(1, 0, 2, 1), dilations=(1, 2))
    got = run_conv(x, w, pattern, bias, byte_dots=byte_dots, **geo)
    want = dense_conv_int8(x, w, bias, **geo)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, conv_reference(x, w, bias, **geo).astype(np.int32))


@pytest.mark.parametrize("byte_dots", [False, True])
@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_int8_conv_long_and_strided_rows_at_every_vector_width(vector_bits, byte_dots) -> None:
    """Output rows longer than one vector copy (several copies per run of X), and a
    stride along the width (element-by-element copies), in both slot groupings and at
    every vector width (the byte dot product at 128, 256 and 512 bits)."""
    x = data("int8", (1, 8, 6, 150))
    w = prune(data("int8", (5, 8, 3, 3)), 2, 4)
    bias = RNG.integers(-9000, 9000, 5, dtype=np.int32)
    for strides in ((1, 1), (1, 2)):
        geo = dict(strides=strides, pads=(1, 1, 1, 1), dilations=(1, 1))
        got = run_conv(x, w, (2, 4), bias, vector_bits=vector_bits, byte_dots=byte_dots,
                       **geo)
        np.testing.assert_array_equal(got, dense_conv_int8(x, w, bias, **geo))


def byte_dot_kernels():
    """An int8 2:4 conv and matmul whose layouts take the slots in fours (byte dot
    products at 512 and 256 bits), their inputs and the dense kernels' results."""
    x = data("int8", (1, 16, 7, 9))
    w = prune(data("int8", (5, 16, 3, 3)), 2, 4)
    lay = nm_layout(w, (2, 4), 63, "int8", taps=9, byte_dots=True)
    conv = build_conv_nm(TensorSpec(x.shape, "int8"), lay, (3, 3), pads=(1, 1, 1, 1))
    a, wm = data("int8", (20, 32)), prune(data("int8", (6, 32)), 2, 4)    # a @ wm.T
    mlay = nm_layout(wm, (2, 4), 20, "int8", vector_bits=256, byte_dots=True)
    matmul = build_matmul_nm(TensorSpec(a.shape, "int8"), mlay)
    assert lay.group == mlay.group == 4
    dense_mm = a.astype(np.int32) @ wm.T.astype(np.int32)
    return [(conv, (x, lay.values, lay.offsets), dense_conv_int8(x, w, None, (1, 1),
                                                                  (1, 1, 1, 1), (1, 1))),
            (matmul, (a, mlay.values, mlay.offsets), dense_mm)]


def test_int8_kernel_ir_is_portable() -> None:
    """The IR stored in a model names no host's instructions, whatever this host has:
    the byte dot products call the module's portable helpers, and LLVM compiles it for
    an AVX2 laptop and the PYNQ board's Cortex-A9 (an x86 intrinsic would abort it)."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    for kernel, _, _ in byte_dot_kernels():
        assert "llvm.x86" not in kernel.ir
        assert '@"tessera.dot4.' in kernel.ir
        for triple, cpu in (("x86_64-unknown-linux-gnu", "haswell"),
                            ("armv7a-unknown-linux-gnueabihf", "cortex-a9")):
            tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, opt=2)
            mod = llvm.parse_assembly(kernel.ir)
            mod.triple, mod.data_layout = triple, str(tm.target_data)
            assert "entry:" in tm.emit_assembly(mod)


@pytest.mark.parametrize("vnni", [False, True])
def test_byte_dot_products_with_and_without_the_instruction(monkeypatch, vnni) -> None:
    """The JIT's result is bit-identical to the dense kernels' with the helpers kept
    portable (as on a host without VNNI) and specialised to ``vpdpbusd``; the
    specialised IR gets a cache key of its own."""
    if vnni and not host_byte_dots():
        pytest.skip("the host has no AVX512-VNNI: vpdpbusd would abort LLVM")
    monkeypatch.setattr(sparse_dots, "host_byte_dots", lambda: vnni)
    jit = get_jit()
    for kernel, args, want in byte_dot_kernels():
        compiled = specialize_for_host(kernel.ir)
        assert ("llvm.x86.avx512.vpdpbusd" in compiled) == vnni
        assert ("vpdpbusd" in jit.emit_assembly(kernel.ir)) == vnni
        assert jit.compile(kernel.ir).key == jit.key(compiled)
        np.testing.assert_array_equal(load_kernel(kernel)(*args)[0], want)


@pytest.mark.skipif(not host_byte_dots(), reason="the host has no AVX512-VNNI")
def test_specialised_ir_calls_vpdpbusd_on_a_vnni_host() -> None:
    """On this host each helper's body becomes one ``vpdpbusd`` of its width, declared
    once; specialising again changes nothing; IR without helpers is left as is."""
    (conv, _, _), (matmul, _, _) = byte_dot_kernels()
    for kernel, bits in ((conv, 512), (matmul, 256)):
        compiled, lanes = specialize_for_host(kernel.ir), bits // 32
        intrinsic = f'@"llvm.x86.avx512.vpdpbusd.{bits}"'
        assert compiled.count(f"declare <{lanes} x i32> {intrinsic}") == 1
        helper = compiled.split(f'define internal <{lanes} x i32> @"tessera.dot4.{lanes}"(')[1]
        helper = helper.split("\n}")[0]
        assert f"call <{lanes} x i32> {intrinsic}(" in helper and "zext" not in helper
        assert specialize_for_host(compiled) == compiled
        llvm.parse_assembly(compiled).verify()
    plain = build_conv_int8(TensorSpec((1, 4, 5, 5), "int8"), TensorSpec((2, 4, 3, 3), "int8"))
    assert specialize_for_host(plain.ir) is plain.ir


@pytest.mark.parametrize("kind", ["int8", "float32"])
def test_long_reduction_in_chunks_odd_rows_and_tail_tile(kind) -> None:
    """Several reduction chunks, an odd number of output rows, a partial column tile
    and a bias: the partial sums carried between chunks lose nothing."""
    x = data(kind, (1, 96, 9, 11))
    w = prune(data(kind, (7, 96, 3, 3)), 2, 4)
    bias = (RNG.integers(-9000, 9000, 7, dtype=np.int32) if kind == "int8"
            else data("float32", (7,)))
    lay = nm_layout(w, (2, 4), 99, kind, taps=9)
    assert lay.chunks > 1
    got = run_conv(x, w, (2, 4), bias, pads=(1, 1, 1, 1))
    want = conv_reference(x, w, bias, (1, 1), (1, 1, 1, 1), (1, 1))
    if kind == "int8":
        np.testing.assert_array_equal(got, want.astype(np.int32))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_parallel_form_splits_output_rows_bit_identically() -> None:
    """``entry.range`` over disjoint row ranges (several threads) gives the serial
    kernel's bits."""
    x = data("int8", (2, 32, 10, 10))
    w = prune(data("int8", (9, 32, 3, 3)), 2, 4)
    lay = nm_layout(w, (2, 4), 100, "int8", taps=9)
    k = build_conv_nm(TensorSpec(x.shape, "int8"), lay, (3, 3), False, pads=(1, 1, 1, 1))
    assert k.parallel == 9
    loaded = load_kernel(k)
    (serial,) = loaded(x, lay.values, lay.offsets, threads=1)
    (split,) = loaded(x, lay.values, lay.offsets, threads=3)
    np.testing.assert_array_equal(split, serial)


@pytest.mark.parametrize("byte_dots", [False, True])
def test_int8_extremes_wrap_like_int32(byte_dots) -> None:
    """-128 * -128 in every slot: the pair sums (2**15) need int32, which they get; the
    byte dot products' inputs x + 128 are 0 and their correction carries the sum."""
    x = np.full((1, 8, 4, 4), -128, np.int8)
    w = np.zeros((3, 8, 1, 1), np.int8)
    w[:, 0::4] = w[:, 1::4] = -128
    got = run_conv(x, w, (2, 4), byte_dots=byte_dots)
    np.testing.assert_array_equal(got, np.full((1, 3, 4, 4), 4 * 128 * 128, np.int32))


def dense_int8_matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w.T`` by the dense int8 kernel (the sparse kernels' yardstick)."""
    wt = np.ascontiguousarray(w.T)
    (out,) = load_kernel(build_matmul_int8(TensorSpec(a.shape, "int8"),
                                           TensorSpec(wt.shape, "int8")))(a, wt)
    return out


@pytest.mark.parametrize("byte_dots", [False, True])
@pytest.mark.parametrize("pattern", [(2, 4), (4, 8), (1, 4)])
def test_int8_matmul_is_bit_identical_to_the_dense_kernel(pattern, byte_dots) -> None:
    a = data("int8", (7, 64))
    w = prune(data("int8", (40, 64)), *pattern)          # (N, K): a @ w.T
    lay = nm_layout(w, pattern, 7, "int8", byte_dots=byte_dots)
    (got,) = load_kernel(build_matmul_nm(TensorSpec(a.shape, "int8"), lay))(
        a, lay.values, lay.offsets)
    want = dense_int8_matmul(a, w)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, (a.astype(np.int32) @ w.T.astype(np.int32)))


@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_float_conv_matches_numpy_at_every_vector_width(vector_bits) -> None:
    """The layout chosen for another host's vectors still computes the same conv here
    (LLVM splits or widens the vectors)."""
    x = data("float32", (1, 8, 9, 10))
    w = prune(data("float32", (6, 8, 3, 3)), 2, 4)
    bias = data("float32", (6,))
    got = run_conv(x, w, (2, 4), bias, pads=(1, 1, 1, 1), vector_bits=vector_bits)
    np.testing.assert_allclose(got, conv_reference(x, w, bias, (1, 1), (1, 1, 1, 1),
                                                   (1, 1)), rtol=1e-5, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["int8", "float32"]), pattern=st.sampled_from(NM_PATTERNS),
       groups=st.integers(1, 3), out_channels=st.integers(1, 5), size=st.integers(1, 9),
       kernel=st.sampled_from([1, 2, 3]), stride=st.integers(1, 2),
       images=st.integers(1, 2), byte_dots=st.booleans())
def test_conv_property(kind, pattern, groups, out_channels, size, kernel, stride,
                       images, byte_dots) -> None:
    n, m = pattern
    pad = kernel // 2
    if size + 2 * pad < kernel:
        return
    x = data(kind, (images, groups * m, size, size + 1))
    w = prune(data(kind, (out_channels, groups * m, kernel, kernel)), n, m)
    geo = dict(strides=(stride, stride), pads=(pad, pad, pad, pad), dilations=(1, 1))
    got = run_conv(x, w, pattern, byte_dots=byte_dots, **geo)
    want = conv_reference(x, w, None, **geo)
    if kind == "int8":
        np.testing.assert_array_equal(got, want.astype(np.int32))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(["int8", "float32"]), pattern=st.sampled_from(NM_PATTERNS),
       rows=st.integers(1, 70), groups=st.integers(1, 4), outs=st.integers(1, 9))
def test_matmul_property(kind, pattern, rows, groups, outs) -> None:
    n, m = pattern
    a = data(kind, (rows, groups * m))
    w = prune(data(kind, (outs, groups * m)), n, m)
    lay = nm_layout(w, pattern, rows, kind)
    (got,) = load_kernel(build_matmul_nm(TensorSpec(a.shape, kind), lay))(
        a, lay.values, lay.offsets)
    if kind == "int8":
        np.testing.assert_array_equal(got, a.astype(np.int32) @ w.T.astype(np.int32))
    else:
        np.testing.assert_allclose(got, a @ w.T, rtol=1e-5, atol=1e-4)


@settings(max_examples=10, deadline=None)
@given(pattern=st.sampled_from([(2, 4), (2, 8), (4, 8)]), rows=st.integers(1, 20),
       groups=st.integers(1, 6), outs=st.integers(1, 19))
def test_pair_kernel_is_bit_identical_to_the_dense_kernel(pattern, rows, groups,
                                                          outs) -> None:
    a = data("int8", (rows, groups * pattern[1]))
    w = prune(data("int8", (outs, groups * pattern[1])), *pattern)
    lay = nm_pair_layout(w, pattern, rows)
    (got,) = load_kernel(build_matmul_nm_pairs(TensorSpec(a.shape, "int8"), lay))(
        a, lay.values, lay.offsets)
    np.testing.assert_array_equal(got, dense_int8_matmul(a, w))


def test_pair_layout_needs_an_even_n() -> None:
    with pytest.raises(CpuKernelError, match="even n"):
        nm_pair_layout(prune(data("int8", (3, 8)), 1, 4), (1, 4), 4)


@pytest.mark.parametrize("kind, rows, pattern, kernel", [
    ("float32", 1, (2, 4), "matmul_nm"),
    ("int8", INT8_MIN_ROWS, (2, 4), "matmul_nm"),
    ("int8", PAIR_MIN_ROWS, (4, 8), "matmul_pairs_nm"),
    ("int8", INT8_MIN_ROWS // 2, (1, 4), "matmul_nm"),   # density 1/4: half the rows
    ("int8", INT8_MIN_ROWS // 2 - 1, (1, 4), None),      # odd n: no pairs
    ("int8", PAIR_MIN_ROWS - 1, (2, 4), None),       # too few rows: dense
])
def test_matmul_kernel_choice(kind, rows, pattern, kernel) -> None:
    w = prune(data(kind, (6, 16)), *pattern)
    chosen = nm_matmul_kernel(TensorSpec((rows, 16), kind), w)
    assert (chosen and chosen[0]().name) == kernel


# -------------------------------------------------------------------------- layout
def test_layout_keeps_n_slots_per_group_sorted_by_reduction_index() -> None:
    w = prune(data("float32", (5, 8, 3, 3)), 2, 4)
    lay = nm_layout(w, (2, 4), 30, "float32", taps=9, vector_bits=512)
    assert lay.slots == 8 * 9 // 2 and lay.lanes == vector_lanes("float32", 512) == 16
    assert lay.tile == 64 and lay.chunks == 1
    k, values = lay.row_slots()
    assert np.all(np.diff(k, axis=1) >= 0)
    dense = np.zeros((5, 72), np.float32)
    np.add.at(dense, (np.arange(5)[:, None], k), values)
    np.testing.assert_array_equal(dense, w.reshape(5, -1))


def test_layout_is_chunk_major_for_long_reductions() -> None:
    """A reduction too long for L1 is cut into chunks of whole groups: the same slots,
    stored chunk by chunk."""
    w = prune(data("int8", (6, 256, 3, 3)), 2, 4)
    lay = nm_layout(w, (2, 4), 200, "int8", taps=9, vector_bits=512)
    assert lay.chunks > 1 and lay.chunk_slots % 2 == 0
    k, values = lay.row_slots()
    dense = np.zeros((6, 256 * 9), np.int64)
    np.add.at(dense, (np.arange(6)[:, None], k.astype(np.int64)), values)
    np.testing.assert_array_equal(dense, w.reshape(6, -1))
    assert lay.offsets.dtype == np.int16


def test_int8_layout_packs_pairs_of_int16() -> None:
    w = prune(data("int8", (3, 12)), 1, 4)                # 3 slots per row: padded to 4
    lay = nm_layout(w, (1, 4), 5, "int8", vector_bits=256, byte_dots=False)
    assert lay.group == 2 and lay.lanes == 8           # 128-bit vectors for 5 columns
    assert lay.slots == 4 and lay.values.shape == (6,) and lay.values.dtype == np.int32
    _, halves = lay.row_slots()
    assert sorted(halves[0][halves[0] != 0]) == sorted(w[0][w[0] != 0])


def test_int8_layout_packs_fours_of_int8_and_row_corrections() -> None:
    """Byte dot products: slots padded to a multiple of 4, four int8 per word, then each
    row's ``-128 * sum(w)``; chunks of whole fours."""
    w = prune(data("int8", (3, 20)), 1, 4)                # 5 slots per row: padded to 8
    lay = nm_layout(w, (1, 4), 5, "int8", vector_bits=256, byte_dots=True)
    assert lay.group == 4 and lay.lanes == 16 and lay.slots == 8
    assert lay.values.shape == (3 * 8 // 4 + 3,) and lay.values.dtype == np.int32
    k, values = lay.row_slots()
    dense = np.zeros((3, 20), np.int64)
    np.add.at(dense, (np.arange(3)[:, None], k.astype(np.int64)), values)
    np.testing.assert_array_equal(dense, w)
    np.testing.assert_array_equal(lay.values[-3:], -128 * w.astype(np.int64).sum(axis=1))
    long = nm_layout(prune(data("int8", (2, 512, 3, 3)), 1, 4), (1, 4), 4096, "int8",
                     taps=9, byte_dots=True)
    assert long.chunks > 1 and long.chunk_slots % 4 == 0


def test_int8_layout_takes_fours_only_for_full_byte_vectors() -> None:
    """By default byte dot products where the host has them and the columns fill its
    widest vector of bytes (fewer columns: int16 pairs, twice as wide)."""
    w = prune(data("int8", (4, 16)), 2, 4)
    assert nm_layout(w, (2, 4), 32, "int8", vector_bits=512).group == 2
    wide = nm_layout(w, (2, 4), 33, "int8", vector_bits=512)
    assert wide.group == (4 if host_byte_dots() else 2)
    assert nm_layout(w, (2, 4), 33, "float32", vector_bits=512).group == 1


def test_layout_refuses_a_weight_beyond_its_pattern() -> None:
    w = np.ones((2, 8), np.float32)
    with pytest.raises(CpuKernelError, match="more than 2 non-zeros"):
        nm_layout(w, (2, 4), 4, "float32")


def test_builder_refuses_a_mismatched_input() -> None:
    lay = nm_layout(prune(data("float32", (2, 8)), 2, 4), (2, 4), 3, "float32")
    with pytest.raises(CpuKernelError, match="does not fit"):
        build_matmul_nm(TensorSpec((3, 12), "float32"), lay)
    with pytest.raises(CpuKernelError, match="float32 layout"):
        build_matmul_nm(TensorSpec((3, 8), "int8"), lay)


# ------------------------------------------------------------------------ lowering
def _one_node_model(op: str, inputs: dict, consts: dict, out_shape, **attrs):
    node = helper.make_node(op, list(inputs) + list(consts), ["y"], name="n", **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                      for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


FLOAT_CASES = {
    "Conv": lambda w: ("Conv", {"x": data("float32", (1, 8, 7, 7))},
                       {"w": w(data("float32", (4, 8, 3, 3)), 1), "b": data("float32", (4,))},
                       (1, 4, 7, 7), {"pads": [1, 1, 1, 1]}),
    "Gemm": lambda w: ("Gemm", {"x": data("float32", (3, 16))},
                       {"w": w(data("float32", (5, 16)), 1), "c": data("float32", (5,))},
                       (3, 5), {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    "MatMul": lambda w: ("MatMul", {"x": data("float32", (2, 3, 16))},
                         {"w": w(data("float32", (16, 5)), 0)}, (2, 3, 5), {}),
}


@pytest.mark.parametrize("op", FLOAT_CASES)
@pytest.mark.parametrize("sparse", [True, False])
def test_float_lowering_picks_the_sparse_kernel_for_nm_weights(op, sparse) -> None:
    def weight(w, axis):
        return prune(w, 2, 4, axis) if sparse else w
    op_type, inputs, consts, out_shape, attrs = FLOAT_CASES[op](weight)
    model = _one_node_model(op_type, inputs, consts, out_shape, **attrs)
    graph = import_onnx(model)
    [step] = lower_node_to_cpu(graph, graph.nodes[0])
    assert step.kernel.name.endswith("_nm") == sparse, step.kernel.name
    assert any(k.endswith("_nm_values") for k in step.constants) == sparse
    env = dict(inputs)
    run_cpu_steps([step], env)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (want,) = session.run(None, inputs)
    np.testing.assert_allclose(env["y"], want, rtol=1e-5, atol=1e-5)


def _pruned_model():
    """A float Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm model, weights
    pruned to 2:4. (A Gemm straight after the Flatten of a feature map runs as a
    convolution over it, whose groups run along its channels, not along the flattened
    inputs.)"""
    w1 = prune(data("float32", (16, 8, 3, 3)) * 0.3, 2, 4)
    w2 = prune(data("float32", (10, 16)), 2, 4)
    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["c"], pads=[1, 1, 1, 1],
                              name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w2", "b2"], [zoo.OUTPUT], transB=1, name="fc")]
    inits = {"w1": w1, "b1": data("float32", (16,)) * 0.1, "w2": w2,
             "b2": data("float32", (10,)) * 0.1}
    graph = helper.make_graph(
        nodes, "pruned", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                        [1, 8, 6, 6])],
        [helper.make_tensor_value_info(zoo.OUTPUT, TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _pruned_dense_model(rows: int = 16):
    """A float Gemm -> Relu -> Gemm model on a 2-D input, weights pruned to 2:4 and 4:8."""
    nodes = [helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2"], [zoo.OUTPUT], name="fc2")]
    inits = {"w1": prune(data("float32", (24, 32)) * 0.3, 2, 4),
             "b1": data("float32", (24,)) * 0.1,
             "w2": prune(data("float32", (24, 8)) * 0.3, 4, 8, axis=0)}
    graph = helper.make_graph(
        nodes, "pruned_fc", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                           [rows, 32])],
        [helper.make_tensor_value_info(zoo.OUTPUT, TensorProto.FLOAT, [rows, 8])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("make, ops", [
    (_pruned_model, {"QConv"}),
    (_pruned_dense_model, {"QGemm"}),
    (lambda: _pruned_dense_model(8), {"QGemm"}),      # the pair kernel
    # int8 on 2 rows: the dense kernel is faster there (sparse_lower.PAIR_MIN_ROWS)
    (lambda: _pruned_dense_model(2), set())])
def test_pruned_model_on_the_cpu_equals_onnxruntime(make, ops, tmp_path) -> None:
    """A pruned float model quantized (onnxruntime's PTQ) and compiled with every node
    on the CPU: its QConv / QGemm nodes run the sparse kernels (but an int8 matmul of
    too few rows) and the outputs are onnxruntime's on the same QDQ model, bit for
    bit."""
    model = make()
    calibration = zoo.calibration_data(model, 4)
    qdq = zoo.to_qdq(model, calibration)
    compiled = tessera.compile(qdq, placement="cpu")
    steps = [s for s in compiled.compiled.steps if getattr(s, "kernel", None) is not None]
    sparse = [s for s in steps if s.kernel.name.endswith("_nm")]
    assert len(sparse) == 2 * len(ops) and {s.op for s in sparse} == ops, \
        [s.name for s in steps]
    session = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    loaded = tessera.load(compiled.save(tmp_path / "pruned.tsr"))   # the layout's arrays
    for feed in zoo.calibration_data(model, 2, seed=3):
        (want,) = session.run(None, feed)
        for runner in (compiled, loaded):
            outputs, _ = runner.run(feed)
            np.testing.assert_array_equal(outputs[zoo.OUTPUT], want)
