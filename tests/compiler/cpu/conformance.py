"""Run one of onnx's node tests through Tessera's import and CPU kernels.

The ``onnx`` package ships a conformance suite: ``onnx/backend/test/data/node/test_*/``,
each a one-node model (``model.onnx``; the ``*_expanded`` variants hold the op's function
body instead) with inputs and expected outputs as protobufs in ``test_data_set_*/``.
:func:`run_node_test` takes one such folder through the float path a user's model takes
to the CPU: :func:`~tessera.compiler.frontend.onnx_import.import_onnx`, then
:func:`~tessera.compiler.cpu.lower.lower_node_to_cpu` for every node, then
:func:`~tessera.runtime.cpu.run_cpu_steps`, and compares the outputs with the expected
ones as onnx's own backend runner does (``onnx.backend.test.runner``: same shape and
dtype, ``allclose`` with rtol 1e-3 and atol 1e-7, NaN equal to NaN), except that integer
and boolean outputs must be exact.

The test feeds every operand as a graph input, but a real model carries the operands
that fix shapes and kernel parameters (Reshape's shape, Pad's pads, Resize's scales,
DequantizeLinear's scale, ...) as constants, and the compiler needs them so: static
shapes everywhere, CPU kernels generated for fixed parameters. So operands are made
constants from the last one, the fewest that import and lowering take, but never all
(import would evaluate the node: no kernel would be tested). A graph that import folds
all the same (Shape, Size: their value is the static shape) is ``folded``: the values
are checked, but no CPU kernel ran, so it is not a pass.

This lives beside the tests, not in the package: it needs the compiler's frontend, its
CPU backend and the runtime together, which docs/architecture.md's rule lets no package
layer import (the runtime may not import the frontend). ``benchmarks/onnx_conformance.py``
runs every test through it; ``test_onnx_conformance.py`` the ones of the ops we claim.
"""
from __future__ import annotations

import re
import traceback
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from tessera.compiler.cpu.lower import cpu_supported_ops, lower_node_to_cpu
from tessera.compiler.frontend.graph import DTYPES, Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.errors import TesseraError
from tessera.runtime.cpu import run_cpu_steps

__all__ = ["ATOL", "NODE_TEST_DIR", "REASONS", "RTOL", "NodeTestResult", "model_ops",
           "node_test_names", "ops_of_test", "run_node_test"]

#: The node tests of the installed onnx package.
NODE_TEST_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
#: onnx.backend.test.loader's tolerances for node tests (none has a data.json to change them).
RTOL, ATOL = 1e-3, 1e-7

#: Failure reason -> what it means (the benchmark's legend).
REASONS = {
    "dtype": "an element type (or a sequence/optional value) the compiler does not take",
    "import": "import_onnx refused the model",
    "no kernel": "an op of the imported graph has no CPU lowering",
    "refused": "the op's CPU lowering refused the node (an attribute, dtype or rank)",
    "kernel error": "a CPU kernel failed when run",
    "wrong shape": "an output has another shape or dtype than expected",
    "wrong values": "an output differs from the expected one beyond the tolerance",
    "crash": "an exception that is not a TesseraError: a defect",
}


@dataclass(frozen=True)
class NodeTestResult:
    """The outcome of one node test.

    ``status`` is ``passed``, ``folded`` (right values, but import evaluated every node, so
    no CPU kernel ran) or ``failed``; a failure has a ``reason`` (a key of
    :data:`REASONS`) and a ``detail`` (the error message, or where values differ).
    """

    name: str
    ops: tuple[str, ...]          # the op(s) under test (ops_of_test)
    status: str
    reason: str = ""
    detail: str = ""
    max_error: float | None = None  # wrong values: the largest |got - expected|
    constants: tuple[str, ...] = ()  # the inputs given as constants (initializers)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)


class _Failure(Exception):
    """A failed step of a test, with its reason."""

    def __init__(self, reason: str, detail: str, max_error: float | None = None) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.max_error = reason, detail, max_error


# ------------------------------------------------------------------ the suite's index
def node_test_names() -> list[str]:
    """Every node test of the installed onnx package, by name (``test_abs``, ...)."""
    return sorted(p.name for p in NODE_TEST_DIR.iterdir() if (p / "model.onnx").is_file())


@lru_cache(maxsize=None)
def model_ops(name: str, suite: Path = NODE_TEST_DIR) -> tuple[str, ...]:
    """The op types of node test ``name``'s model (in folder ``suite``), in order of first
    use."""
    model = onnx.load(str(suite / name / "model.onnx"), load_external_data=False)
    return tuple(dict.fromkeys(n.op_type for n in model.graph.node))


def ops_of_test(name: str, suite: Path = NODE_TEST_DIR) -> tuple[str, ...]:
    """The op(s) a node test tests: its model's op types; for an ``*_expanded`` test (the
    op's function body written out), the op of the test it expands."""
    base = re.sub(r"_expanded(_ver\d+)?$", "", name)
    return model_ops(base if (suite / base).is_dir() else name, suite)


# ----------------------------------------------------------------------- one test
def run_node_test(path: str | Path) -> NodeTestResult:
    """Run the node test in folder ``path`` (every data set) through import, CPU lowering
    and the CPU kernels; never raises for what the test does (a non-Tessera exception is
    reported as reason ``crash``)."""
    path = Path(path)
    ops = ops_of_test(path.name, path.parent)
    try:
        model = onnx.load(str(path / "model.onnx"))
        runs = [_run_data_set(model, data_set)
                for data_set in sorted(path.glob("test_data_set_*"))]
    except _Failure as failure:
        return NodeTestResult(path.name, ops, "failed", failure.reason, failure.detail,
                              failure.max_error)
    folded = any(not ran for ran, _ in runs)
    return NodeTestResult(path.name, ops, "folded" if folded else "passed",
                          constants=tuple(dict.fromkeys(c for _, cs in runs for c in cs)))


def _run_data_set(model: onnx.ModelProto, data_set: Path) -> tuple[bool, tuple[str, ...]]:
    """Run one data set: whether any node ran (none: import folded the graph), and the
    inputs made constants. Raises _Failure."""
    feeds = _load_values(data_set, "input", model.graph.input)
    expected = _load_values(data_set, "output", model.graph.output)
    graph, steps = _compile(model, feeds)
    env = {name: feeds[name] for name in graph.inputs}
    _stage("kernel error", lambda: run_cpu_steps(steps, env), model)
    got = {name: env[name] if name in env else graph.values[name].data
           for name in graph.outputs}
    _compare(got, expected)
    return bool(graph.nodes), tuple(name for name in feeds if name not in graph.inputs)


def _compile(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[Graph, list]:
    """The imported graph and its CPU steps, with the fewest trailing inputs made
    constants that import and lowering take (a real model carries pads, axes, scales,
    shapes and zero points as constants), but never all of them: that would let import
    evaluate the node, and no kernel would be tested. The failure reported is the
    refusal with the most constant operands, or else the import error with none."""
    names = [v.name for v in model.graph.input if v.name in feeds]
    failures: list[_Failure] = []
    for count in range(max(1, len(names))):
        try:
            return _import_and_lower(_fix_inputs(model, feeds, names[len(names) - count:]),
                                     model)
        except _Failure as failure:
            if failure.reason == "crash":
                raise
            failures.append(failure)
    past_import = [f for f in failures if f.reason in ("no kernel", "refused")]
    raise past_import[-1] if past_import else failures[0]


def _import_and_lower(proto: onnx.ModelProto, model: onnx.ModelProto) -> tuple[Graph, list]:
    graph = _stage("import", lambda: import_onnx(proto), model)
    steps = [step for node in graph.nodes
             for step in _stage(_lowering_reason(node.domain, node.op),
                                lambda node=node: lower_node_to_cpu(graph, node), model)]
    return graph, steps


def _stage(reason: str, run: Callable, model: onnx.ModelProto):
    """``run()``; a TesseraError becomes a _Failure for ``reason`` (or ``dtype`` when the
    model has a type the compiler does not take), any other exception a crash."""
    try:
        return run()
    except TesseraError as exc:
        untaken = _untaken_types(model)
        if untaken and reason in ("import", "refused", "no kernel"):
            raise _Failure("dtype", f"{', '.join(untaken)}: {exc}") from None
        raise _Failure(reason, str(exc)) from None
    except Exception as exc:  # anything else is a defect to report, not to hide
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise _Failure("crash", f"{reason} stage: {type(exc).__name__}: {exc} "
                                f"({Path(frame.filename).name}:{frame.lineno})") from None


def _lowering_reason(domain: str, op: str) -> str:
    return "refused" if op in cpu_supported_ops(domain) else "no kernel"


def _untaken_types(model: onnx.ModelProto) -> list[str]:
    """The graph's input and output types the compiler's IR cannot hold."""
    found = []
    for value in (*model.graph.input, *model.graph.output):
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            found.append(f"{value.name!r} is a {kind.replace('_type', '')}")
            continue
        dtype = _numpy_name(value.type.tensor_type.elem_type)
        if dtype not in DTYPES:
            found.append(f"{value.name!r} is {dtype}")
    return found


def _numpy_name(elem_type: int) -> str:
    """The IR's name of an ONNX element type (``float32``, ``int64``, ``bfloat16``...)."""
    name = onnx.TensorProto.DataType.Name(elem_type).lower()
    return {"float": "float32", "double": "float64"}.get(name, name)


# --------------------------------------------------------------------- test data
def _load_values(data_set: Path, kind: str, values: Sequence[onnx.ValueInfoProto]
                 ) -> dict[str, np.ndarray]:
    """The data set's ``{kind}_<i>.pb`` files as arrays, by the model's value names.
    Sequences and optionals (not tensors) fail the test as a ``dtype`` reason."""
    arrays = {}
    for i, value in enumerate(values):
        file = data_set / f"{kind}_{i}.pb"
        if not file.exists():
            continue    # an omitted optional input
        if value.type.WhichOneof("value") != "tensor_type":
            raise _Failure("dtype", f"{kind} {value.name!r} is a "
                                    f"{value.type.WhichOneof('value')}, not a tensor")
        tensor = onnx.TensorProto()
        tensor.ParseFromString(file.read_bytes())
        arrays[value.name] = numpy_helper.to_array(tensor)
    return arrays


def _fix_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                constants: Sequence[str]) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    kept = []
    for value in proto.graph.input:
        if value.name in constants:
            proto.graph.initializer.append(numpy_helper.from_array(feeds[value.name],
                                                                   value.name))
            continue
        if value.name in feeds and value.type.HasField("tensor_type"):
            shape = value.type.tensor_type.shape
            shape.Clear()
            for d in feeds[value.name].shape:
                shape.dim.add().dim_value = d
        kept.append(value)
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    return proto


# ------------------------------------------------------------------- comparison
def _compare(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """onnx's runner's comparison (shape, dtype, allclose), exact for non-float outputs."""
    for i, (name, want) in enumerate(expected.items()):
        have = np.asarray(got[name])
        if have.shape != want.shape or have.dtype != want.dtype:
            raise _Failure("wrong shape", f"output {i} {name!r} is {have.dtype}"
                                          f"{list(have.shape)}, expected {want.dtype}"
                                          f"{list(want.shape)}")
        if np.issubdtype(want.dtype, np.floating):
            close = np.isclose(have, want, rtol=RTOL, atol=ATOL, equal_nan=True)
        else:
            close = have == want
        if not close.all():
            _raise_wrong_values(i, name, have, want, close)


def _raise_wrong_values(i: int, name: str, have: np.ndarray, want: np.ndarray,
                        close: np.ndarray) -> None:
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs(have.astype(np.float64) - want.astype(np.float64))
    error = np.where(close, 0.0, np.nan_to_num(error, nan=np.inf))
    at = np.unravel_index(int(np.argmax(error)), want.shape) if want.ndim else ()
    raise _Failure("wrong values",
                   f"output {i} {name!r}: {int((~close).sum())} of {close.size} elements "
                   f"differ; the largest at {list(at)}: got {have[at]!r}, expected "
                   f"{want[at]!r}", float(error.max()))
