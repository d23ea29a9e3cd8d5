"""ONNX node conformance of the CPU backend: every node test that ships with onnx whose
ops we claim runs through import, CPU lowering and the CPU kernels to onnx's expected
outputs (``conformance.py`` beside this module says how).

What we claim has one source of truth, the CPU lowering table
(:func:`tessera.compiler.cpu.lower.cpu_supported_ops`): a node test is claimed when every
op of its model (its ``Constant`` nodes aside: import makes them constants) has a CPU
lowering. That is each claimed op's own node tests, and the ``*_expanded`` tests whose
function body uses claimed ops only. Each claimed test must pass, unless
:data:`EXCEPTIONS` lists it with the reason it fails; a listed test must still fail for
that reason (a fix removes it from the list; a listed crash is a known defect, not a
limit). The default run takes every exception and :data:`FAST_PER_OP` of each op's other
tests; the rest are marked slow. docs/operators.md lists the same ops and exceptions;
``python benchmarks/onnx_conformance.py`` runs every node test, claimed or not, and
prints the pass counts per op.
"""
from __future__ import annotations

import re
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tessera.compiler.cpu.lower import cpu_supported_ops

from tests.compiler.cpu import conformance
from tests.compiler.cpu.conformance import (NODE_TEST_DIR, REASONS, model_ops, node_test_names,
                                            ops_of_test, run_node_test)

ROOT = Path(__file__).resolve().parents[3]
CLAIMED_OPS = cpu_supported_ops("")
#: Op types import never leaves in a graph (it makes Constant nodes constants).
_IMPORTED_AWAY = {"Constant"}


def claimed(name: str) -> bool:
    """Whether every op of node test ``name``'s model has a CPU lowering."""
    ops = set(model_ops(name)) - _IMPORTED_AWAY
    return bool(ops) and ops <= CLAIMED_OPS


CLAIMED_TESTS = [name for name in node_test_names() if claimed(name)]


def _named(pattern: str) -> list[str]:
    """The node tests whose whole name matches the regular expression ``pattern``."""
    return [name for name in node_test_names() if re.fullmatch(pattern, name)]


_NARROW = "FLOAT8E4M3FN|FLOAT8E4M3FNUZ|FLOAT8E5M2|FLOAT8E5M2FNUZ|FLOAT8E8M0|FLOAT4E2M1|" \
          "BFLOAT16|INT4|UINT4|INT2|UINT2"
_NOT_IR_TYPE = ("the graph IR has no {} element type (graph.DTYPES); import refuses the "
                "model")
_KERNEL_TYPES = "the {} CPU kernel does not take {}"
_NEWER_FEATURE = ("import refuses {}, newer than opset 17, the IR's, which it converts "
                  "every model to")
_NO_DOWNGRADE = ("onnx's version converter cannot take {} down to opset 17, the IR's (the "
                 "op gained it later); import fails")
_POOL_SHAPE = ("the float CPU pools take ceil_mode=0 only; besides, onnx 1.22's shape "
               "inference gives this ceil_mode output one longer than the model (and "
               "onnxruntime) declare: it keeps a last window that starts in the padding")
_RANK4 = "the CPU pooling kernels take rank-4 (NCHW) inputs, not {}"
_ARITHMETIC = "add|sub|mul|div|max|min"
_COMPARISON = "equal|greater|greater_equal|less|less_equal"

#: Claimed node tests that fail: test -> (reason, a key of REASONS; why it fails). Each
#: must still fail for that reason: a fix removes it from here and from docs/operators.md.
EXCEPTIONS: dict[str, tuple[str, str]] = {
    # Element types the IR does not have.
    **dict.fromkeys(_named(rf"test_cast_\w*({_NARROW})\w*|test_castlike_\w*({_NARROW})\w*"
                           r"_expanded"),
                    ("dtype", _NOT_IR_TYPE.format("float8, float4, bfloat16, 4-bit or 2-bit"))),
    **dict.fromkeys(_named(r"test_(de)?quantizelinear_(e4m3fn\w*|e5m2|float4e2m1|u?int[24])"),
                    ("dtype", _NOT_IR_TYPE.format("float8, float4, 4-bit or 2-bit"))),
    **dict.fromkeys(_named(rf"test_({_ARITHMETIC}|{_COMPARISON})_uint(16|32|64)")
                    + _named(r"test_pow_types_float32_uint(32|64)")
                    + ["test_dequantizelinear_uint16", "test_quantizelinear_uint16"],
                    ("dtype", _NOT_IR_TYPE.format("uint16, uint32 or uint64"))),
    **dict.fromkeys(["test_equal_string", "test_equal_string_broadcast"],
                    ("dtype", _NOT_IR_TYPE.format("string"))),
    **dict.fromkeys(["test_identity_opt", "test_identity_sequence"],
                    ("dtype", "optionals and sequences are not tensors, all the IR holds")),
    # Types and attributes the CPU lowerings refuse.
    **{f"test_{op.lower()}_{t}": ("refused", _KERNEL_TYPES.format(op, t))
       for op in ("Max", "Min") for t in ("float16", "float64")},
    **{name: ("refused", _KERNEL_TYPES.format("Pow", "int32 or int64 bases"))
       for name in _named(r"test_pow_types_int(32|64)_\w+")},
    **{name: ("refused", _KERNEL_TYPES.format("Einsum", "float64"))
       for name in _named(r"test_einsum_\w+")},
    **dict.fromkeys(["test_batchnorm_epsilon_training_mode",
                     "test_batchnorm_example_training_mode"],
                    ("refused", "the BatchNormalization lowering is inference only (no "
                                "training_mode, batch statistics or running-mean outputs)")),
    **dict.fromkeys(_named(r"test_dynamicquantizelinear\w*_expanded"),
                    ("refused", "the body quantizes with a scale computed at run time; the "
                                "QuantizeLinear CPU kernel is generated for a constant scale")),
    **dict.fromkeys(_named(r"test_cast_(FLOAT|FLOAT16|DOUBLE)_to_(FLOAT|FLOAT16|DOUBLE)|"
                           r"test_castlike_(FLOAT|FLOAT16|DOUBLE)_to_(FLOAT|FLOAT16|DOUBLE)"
                           r"_expanded"),
                    ("refused", _KERNEL_TYPES.format("Cast", "float16 or float64"))),
    **dict.fromkeys(_named(r"test_(average|max)pool_3d\w*"),
                    ("refused", _RANK4.format("rank 5 (3-D pooling)"))),
    **dict.fromkeys(["test_averagepool_1d_default", "test_maxpool_1d_default"],
                    ("refused", _RANK4.format("rank 3 (1-D pooling)"))),
    **dict.fromkeys(["test_averagepool_2d_ceil", "test_averagepool_2d_dilations",
                     "test_maxpool_2d_ceil"],
                    ("refused", "the CPU pooling kernels take ceil_mode=0 only")),
    **dict.fromkeys(_named(r"test_maxpool_with_argmax\w*"),
                    ("refused", "the MaxPool CPU kernel has no Indices output")),
    **dict.fromkeys(_named(r"test_resize_\w*_cubic(_A_n0p5_exclude_outside|_align_corners|"
                           r"_asymmetric)?"),
                    ("refused", "the Resize CPU kernel has modes nearest and linear, not cubic")),
    **dict.fromkeys(["test_resize_tf_crop_and_resize",
                     "test_resize_tf_crop_and_resize_extrapolation_value"],
                    ("refused", "the Resize CPU kernel has no coordinate_transformation_mode "
                                "tf_crop_and_resize")),
    **dict.fromkeys(["test_reduce_max_empty_set", "test_reduce_min_empty_set"],
                    ("refused", "the lowering refuses max/min over an empty axis, where onnx "
                                "(opset 18+) and onnxruntime give -inf/+inf")),
    # What import refuses.
    **dict.fromkeys(_named(r"test_resize_\w*(antialias|axes_\d_\d|not_larger|not_smaller)"),
                    ("import", _NEWER_FEATURE.format("Resize's antialias, axes and "
                                                     "keep_aspect_ratio_policy (opset 18)"))),
    **dict.fromkeys(_named(r"test_resize_\w*half_pixel_symmetric"),
                    ("import", _NEWER_FEATURE.format("Resize's half_pixel_symmetric "
                                                     "(opset 19)"))),
    **dict.fromkeys(["test_constant_pad_axes", "test_constant_pad_negative_axes",
                     "test_wrap_pad"],
                    ("import", _NEWER_FEATURE.format("Pad's axes input and mode wrap "
                                                     "(opset 18, 19)"))),
    **dict.fromkeys(["test_globalmaxpool", "test_globalmaxpool_precomputed"],
                    ("import", _NO_DOWNGRADE.format("GlobalMaxPool from opset 22 (no "
                                                    "adapter)"))),
    **dict.fromkeys(["test_quantizelinear_int16", "test_dequantizelinear_int16",
                     "test_quantizelinear_blocked_symmetric",
                     "test_quantizelinear_blocked_asymmetric", "test_dequantizelinear_blocked"],
                    ("import", _NO_DOWNGRADE.format("int16 and blocked quantization "
                                                    "(opset 21)"))),
    **dict.fromkeys(["test_reduce_max_bool_inputs", "test_reduce_min_bool_inputs"],
                    ("import", _NO_DOWNGRADE.format("ReduceMax/ReduceMin of bool (opset 20)"))),
    **dict.fromkeys(["test_averagepool_2d_ceil_last_window_starts_on_pad",
                     "test_maxpool_2d_ceil_output_size_reduce_by_one"], ("refused", _POOL_SHAPE)),
    # onnx's expected values that onnxruntime (our reference) does not compute.
    "test_resize_downsample_scales_linear_align_corners": (
        "wrong values", "onnx's reference takes align_corners' output length as 4 * 0.6 = 2.4 "
                        "(3.142857); onnxruntime 1.31, which the kernel follows, as the whole "
                        "output length 2 (4.0)"),
}


def test_claimed_tests_are_found():
    """The suite is where we look for it, and the claim covers tests (else every test
    below would pass by being absent)."""
    assert (NODE_TEST_DIR / "test_abs" / "model.onnx").is_file(), NODE_TEST_DIR
    assert len(CLAIMED_TESTS) > 100, CLAIMED_TESTS


def test_exceptions_are_claimed_tests():
    """Every exception names a claimed node test, with a known reason."""
    stale = sorted(set(EXCEPTIONS) - set(CLAIMED_TESTS))
    assert not stale, f"EXCEPTIONS lists tests that are not claimed node tests: {stale}"
    unknown = {k: v[0] for k, v in EXCEPTIONS.items() if v[0] not in REASONS}
    assert not unknown, f"reasons not among {list(REASONS)}: {unknown}"


def test_docs_list_every_claimed_op_and_exception():
    """docs/operators.md names every op we claim and every exception."""
    text = (ROOT / "docs" / "operators.md").read_text()
    missing_ops = sorted(op for op in CLAIMED_OPS if not re.search(rf"\| `?{op}`? +\|", text))
    missing_tests = sorted(name for name in EXCEPTIONS if name not in text)
    assert not missing_ops and not missing_tests, (
        f"docs/operators.md lacks ops {missing_ops} and exceptions {missing_tests}; "
        f"regenerate it: python benchmarks/onnx_conformance.py --markdown > docs/operators.md")


# --------------------------------------------------------------- the runner itself
def test_runner_reports_wrong_values(tmp_path):
    """A test whose expected output is off fails with the largest error."""
    case = tmp_path / "test_abs"
    shutil.copytree(NODE_TEST_DIR / "test_abs", case)
    file = case / "test_data_set_0" / "output_0.pb"
    expected = numpy_helper.to_array(onnx.load_tensor(str(file)))
    wrong = expected.copy()
    wrong.flat[3] += 0.5
    file.write_bytes(numpy_helper.from_array(wrong, "y").SerializeToString())
    result = run_node_test(case)
    assert (result.status, result.reason) == ("failed", "wrong values"), result
    assert result.max_error == pytest.approx(0.5) and "1 of" in result.detail


def test_runner_makes_shape_operands_constants():
    """Pad's pads and value become constants (as in a real model, and as its kernel needs
    them); Relu's input stays an input."""
    pad = run_node_test(NODE_TEST_DIR / "test_constant_pad")
    assert pad.passed and set(pad.constants) == {"pads", "value"}, pad
    relu = run_node_test(NODE_TEST_DIR / "test_relu")
    assert relu.passed and relu.constants == (), relu


def test_runner_does_not_count_folded_graphs_as_passes():
    result = run_node_test(NODE_TEST_DIR / "test_shape")
    assert result.status == "folded" and not result.passed, result


def test_runner_reports_missing_kernel(tmp_path):
    op = next(op for op in ("Det", "Hardmax", "Shrink") if op not in CLAIMED_OPS)
    case = tmp_path / f"test_{op.lower()}"
    x = np.arange(1, 5, dtype=np.float32).reshape(1, 2, 2)
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)])
    model = onnx.shape_inference.infer_shapes(model)
    (case / "test_data_set_0").mkdir(parents=True)
    onnx.save(model, str(case / "model.onnx"))
    (case / "test_data_set_0" / "input_0.pb").write_bytes(
        numpy_helper.from_array(x, "x").SerializeToString())
    result = run_node_test(case)
    assert (result.reason, result.ops) == ("no kernel", (op,)), result


def test_runner_reports_other_exceptions_as_crashes(monkeypatch):
    def broken(graph, node):
        raise IndexError("list index out of range")
    monkeypatch.setattr(conformance, "lower_node_to_cpu", broken)
    result = run_node_test(NODE_TEST_DIR / "test_relu")
    assert result.reason == "crash" and "IndexError" in result.detail, result


#: Passing claimed tests per op that run in the default test run, spread over the op's
#: tests by name; the others are marked slow (benchmarks/onnx_conformance.py runs them
#: all too). Every listed exception runs (most fail at import, in milliseconds).
FAST_PER_OP = 3


def _fast_tests() -> set[str]:
    per_op: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name in CLAIMED_TESTS:
        if name not in EXCEPTIONS:
            per_op[ops_of_test(name)].append(name)
    fast = set(EXCEPTIONS)
    for names in per_op.values():
        step = len(names) / FAST_PER_OP
        fast.update(names[int(i * step)] for i in range(min(FAST_PER_OP, len(names))))
    return fast


_FAST = _fast_tests()


@pytest.mark.parametrize("name", [name if name in _FAST else
                                  pytest.param(name, marks=pytest.mark.slow)
                                  for name in CLAIMED_TESTS])
def test_node(name):
    result = run_node_test(NODE_TEST_DIR / name)
    if name in EXCEPTIONS:
        reason, why = EXCEPTIONS[name]
        assert not result.passed, f"{name} passes now: remove it from EXCEPTIONS ({why})"
        assert result.reason == reason, (
            f"{name} is listed as failing for {reason!r} ({why}), but fails for "
            f"{result.reason!r}: {result.detail}")
    else:
        assert result.passed, f"{name}: {result.status} ({result.reason}): {result.detail}"
