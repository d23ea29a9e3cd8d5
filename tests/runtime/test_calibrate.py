"""runtime/calibrate.py: the representative kernels (their features are the placement's),
the NNLS fit (exact on synthetic data), and a quick calibration of this machine."""
from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest

from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.qdq import DOMAIN
from tessera.compiler.placement.cost import node_work
from tessera.hostmodel import KINDS, HostModel, KernelCost, Work
from tessera.runtime.calibrate import (Representative, calibrate_host, describe,
                                       fit_kernel_cost, measure_kernel, representatives)

# ------------------------------------------------------------------------ the fit


def _works(n: int, kind: str = "pool") -> list[Work]:
    rng = np.random.default_rng(5)
    return [Work(kind, int(rng.integers(0, 10**6)), int(rng.integers(1, 10**5)),
                 int(rng.integers(1, 10**7))) for _ in range(n)]


@pytest.mark.parametrize("truth", [
    KernelCost(3e-6, 1e-9, 2e-8, 5e-10),
    KernelCost(0.0, 2e-9, 0.0, 1e-9),          # some coefficients exactly zero
    KernelCost(1e-5, 0.0, 0.0, 0.0),
])
def test_fit_recovers_exact_coefficients(truth: KernelCost) -> None:
    works = _works(12)
    cost, residual = fit_kernel_cost(works, [truth.seconds(w) for w in works])
    for got, want in zip((cost.fixed, cost.per_op, cost.per_element, cost.per_byte),
                         (truth.fixed, truth.per_op, truth.per_element, truth.per_byte)):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-18)
    assert residual["max_rel"] < 1e-9


def test_fit_keeps_coefficients_non_negative() -> None:
    """Times falling with the bytes (a negative slope) fit with per_byte 0, not < 0, and
    the result is the best non-negative fit: no non-negative perturbation improves it."""
    works = [Work("movement", 0, e, b) for e, b in [(10, 100), (20, 50), (40, 25), (80, 10)]]
    seconds = [1e-6 * w.elements - 1e-9 * w.bytes + 1e-5 for w in works]
    cost, residual = fit_kernel_cost(works, seconds)
    coef = np.array([cost.fixed, cost.per_op, cost.per_element, cost.per_byte])
    assert np.all(coef >= 0) and cost.per_byte == 0

    def error(c: np.ndarray) -> float:
        return sum((KernelCost(*c).seconds(w) / t - 1) ** 2 for w, t in zip(works, seconds))
    for i in range(4):
        for step in (1.01, 0.99):
            other = coef.copy()
            other[i] = other[i] * step if other[i] else 1e-12
            assert error(other) >= error(coef) - 1e-15
    assert residual["rms_rel"] == pytest.approx(math.sqrt(error(coef) / 4))


@pytest.mark.parametrize("seconds", [[1.0], [1.0, 0.0], [1.0, float("nan")]])
def test_fit_refuses_bad_times(seconds: list[float]) -> None:
    with pytest.raises(ValueError, match="positive, finite"):
        fit_kernel_cost(_works(2), seconds)


# ------------------------------------------------------------- representatives
def _graph_node(rep: Representative) -> Graph:
    """The graph node ``rep``'s kernel stands for, with the kernel's argument shapes."""
    k, label = rep.kernel, rep.label
    ops = {
        "conv3x3 int8": ("ConvInteger", {}, ""), "matmul int8": ("MatMulInteger", {}, ""),
        "conv3x3 f32": ("Conv", {}, ""), "matmul f32": ("MatMul", {}, ""),
        "maxpool3x3/2": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]}, ""),
        "globalavgpool": ("GlobalAveragePool", {}, ""), "add f32": ("Add", {}, ""),
        "relu int8": ("Relu", {}, ""), "tanh f32": ("Tanh", {}, ""),
        "sigmoid f32": ("Sigmoid", {}, ""), "lookup int8": ("QLookup", {}, DOMAIN),
        "transpose f32": ("Transpose", {}, ""), "concat int8": ("Concat", {"axis": 1}, ""),
        "reducesum f32": ("ReduceSum", {"axes": [1]}, ""),
    }
    op, attrs, domain = next(v for prefix, v in ops.items() if label.startswith(prefix))
    g = Graph(label)
    names = [f"x{i}" for i in range(len(k.inputs))]
    for name, spec in zip(names, k.inputs):
        g.add_input(name, spec.shape, spec.dtype)
    for i, spec in enumerate(k.outputs):
        g.add_value(f"y{i}", spec.shape, spec.dtype)
    g.add_node(op, names, [f"y{i}" for i in range(len(k.outputs))], name="n", domain=domain,
               **attrs)
    return g


def test_representatives_cover_every_kind_with_the_placements_features() -> None:
    reps = representatives(quick=True)
    assert set(reps) == set(KINDS)
    for kind, calls in reps.items():
        assert len({r.work for r in calls}) >= 2, kind          # at least 2 sizes
        for rep in calls:
            graph = _graph_node(rep)
            assert node_work(graph, graph.nodes[0]) == rep.work, rep.label
    full = representatives()
    assert all(len(full[k]) >= 2 * len(reps[k]) for k in KINDS)


# --------------------------------------------------------------- calibration
@pytest.fixture(scope="module")
def quick_model() -> HostModel:
    lines: list[str] = []
    model = calibrate_host(name="here", quick=True, progress=lines.append)
    assert len(lines) == len(KINDS) + 1
    return model


def test_quick_calibration_gives_a_complete_positive_model(quick_model, tmp_path) -> None:
    assert quick_model.name == "here" and quick_model.cores >= 1
    assert set(quick_model.kernels) == set(KINDS)
    for kind, cost in quick_model.kernels.items():
        coef = (cost.fixed, cost.per_op, cost.per_element, cost.per_byte)
        assert min(coef) >= 0 and max(coef) > 0, kind
        calls = quick_model.details["kinds"][kind]["calls"]
        assert all(c["seconds"] > 0 for c in calls)
    assert quick_model.launch_seconds > 0 and quick_model.copy_bytes_per_second > 0
    assert quick_model.flush_bytes_per_second == math.inf        # sim buffers: host memory
    assert "simulator's, not a board's" in quick_model.details["launch"]
    assert HostModel.load(quick_model.save(tmp_path / "h.json")) == quick_model
    table = describe(quick_model)
    assert all(kind in table for kind in KINDS) and "free (coherent)" in table


def test_quick_model_predicts_a_held_out_kernel(quick_model) -> None:
    """A size the quick fit never saw (8x the largest elements) is predicted within a
    factor of 10 of its measurement: a loose bound (a shared, noisy machine), which a
    model that mixed up units or kinds would still miss by far."""
    rep = representatives()["elementwise"][-2]          # add f32, 65,536 elements
    assert rep.work.elements >= 8 * max(r.work.elements
                                         for r in representatives(True)["elementwise"])
    measured = measure_kernel(rep, repeats=3, block=0.002)
    predicted = quick_model.kernel_seconds(rep.work)
    assert 0.1 < predicted / measured < 10, (predicted, measured)


# ------------------------------------- the board models' method (benchmarks/host_models.py)
@pytest.fixture(scope="module")
def host_models():
    """The board-model generator, imported from its file (benchmarks are no package)."""
    if not shutil.which("llvm-mca", path="/usr/bin"):
        pytest.skip("llvm-mca (LLVM 14) is not installed at /usr/bin")
    path = Path(__file__).parents[2] / "benchmarks" / "host_models.py"
    spec = importlib.util.spec_from_file_location("host_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["host_models"] = module
    spec.loader.exec_module(module)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return module


@pytest.mark.parametrize("board, trips", [("cortex-a9", 1024), ("cortex-a53", 128)])
def test_block_counts_follow_the_boards_code(host_models, board: str, trips: int) -> None:
    """A float add of 1,024 elements: the Cortex-A9's loop runs once per element (LLVM
    does not vectorise IEEE float on ARMv7 NEON, which flushes denormals), the A53's once
    per 8 (4 lanes, interleaved twice); the modelled time is at least its memory floor
    plus the dispatch."""
    cpu = host_models.FIGURES[board]
    jit = host_models.BoardJit(cpu)
    rep = representatives(quick=True)["elementwise"][0]
    counts = host_models.block_counts(rep, str(jit.optimize(rep.kernel.ir)))
    assert counts.max() == trips and counts[0] == 1
    result = host_models.modelled_seconds(rep, cpu, jit)
    assert result["cycles"] >= trips and not result["calls"]
    assert result["seconds"] == pytest.approx(
        cpu.dispatch_seconds + max(result["compute"], rep.work.bytes / cpu.dram_bytes_per_second))


def test_switch_tables_keep_their_syntax(host_models) -> None:
    ir = ("define void @f(ptr %p, i32 %x) {\nentry:\n  switch i32 %x, label %d [\n"
          "    i32 0, label %a\n  ]\na:\n  store i32 1, ptr %p\n  br label %d\nd:\n"
          "  ret void\n}\n")
    llvm.parse_assembly(host_models.located(ir)).verify()
    counted, blocks = host_models.counted(ir)
    llvm.parse_assembly(counted).verify()
    assert blocks == 3
