"""``prune``: magnitude pruning of a float ONNX model to accelerator blocks or N:M groups,
with the sparsity of each layer chosen against the output error on calibration data.

The steps: find the prunable layers (:mod:`.layers`); measure, with onnxruntime, the
model's output error with each layer alone pruned to each candidate sparsity
(:mod:`.measure`); choose a sparsity per layer by the knapsack of :mod:`.dp` (or the same
one everywhere, ``strategy="uniform"``); write the pruned weights and measure the pruned
model's error as a whole.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from tessera.config import HwConfig, get_config
from tessera.errors import CLI, PYTHON, CompileError

from . import dp
from .inputs import check_fraction, load_model, prune_feeds
from .layers import Layer, find_layers, weight_arrays
from .measure import WeightSession, relative_rms, run_model, with_weights
from .patterns import Pattern, block_pattern, nm_pattern_named, pattern_names

__all__ = ["LayerResult", "PruneResult", "STRATEGIES", "prune"]

#: How the per-layer sparsities are chosen: the DP over measured errors, or one for all.
STRATEGIES = ("dp", "uniform")

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class LayerResult:
    """One prunable layer's row of the result table."""

    node: str
    op: str
    macs: int
    sparsity: float      #: the sparsity it was pruned to (0: dense)
    density: float       #: the fraction of its work left (blocks kept, or n/m)
    error: float         #: measured output error with this layer alone pruned
    skipped: bool = False


@dataclass
class PruneResult:
    """The pruned model and how it was pruned (``str()`` is the table)."""

    model: onnx.ModelProto
    pattern: str
    strategy: str
    layers: list[LayerResult]
    mac_sparsity: float          #: MACs removed / MACs of the pruned (not skipped) layers
    estimated_error: float       #: the per-layer errors summed (what the DP budgets)
    error: float                 #: the pruned model's error, measured
    samples: int                 #: calibration samples the errors were measured on
    random_calibration: bool     #: the samples were random (no calibration given)
    seconds: dict[str, float] = field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        """Write the pruned model as an ONNX file."""
        onnx.save(self.model, str(path))
        return Path(path)

    def table(self) -> str:
        """The per-layer table and the totals."""
        rows = [f"{'layer':<28} {'op':<6} {'MACs':>13} {'sparsity':>8} {'density':>7} "
                f"{'error':>9}"]
        for r in self.layers:
            sparsity = "skip" if r.skipped else f"{r.sparsity:.4g}"
            rows.append(f"{r.node[:28]:<28} {r.op:<6} {r.macs:>13,} {sparsity:>8} "
                        f"{r.density:>7.3f} {r.error:>9.2e}")
        source = "random normal" if self.random_calibration else "calibration"
        rows.append(f"{self.pattern} pruning ({self.strategy}): {self.mac_sparsity:.1%} of "
                    f"the MACs removed; output error (relative RMS, {self.samples} "
                    f"{source} samples) {self.error:.3e} measured, {self.estimated_error:.3e} "
                    "estimated (per-layer errors summed)")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def _pattern(pattern: str, config: str | HwConfig) -> Pattern:
    if pattern == "block":
        return block_pattern(get_config(config))
    found = nm_pattern_named(pattern) if isinstance(pattern, str) else None
    if found is None:
        names = ", ".join(pattern_names())
        raise CompileError(f"unknown pruning pattern {pattern!r}: the patterns are {names}",
                           fix={PYTHON: "pass pattern='block' or an N:M one such as '2:4'",
                                CLI: f"give --pattern one of {names}"})
    return found


def _check_goal(pattern: Pattern, strategy: str, sparsity: float | None,
                budget: float | None) -> None:
    if strategy not in STRATEGIES:
        raise CompileError(f"unknown strategy {strategy!r}: the strategies are dp, uniform",
                           fix={PYTHON: "pass strategy='dp' or 'uniform'",
                                CLI: "give --strategy dp or --strategy uniform"})
    if strategy == "uniform" and budget is not None:
        raise CompileError("strategy 'uniform' prunes every layer to one sparsity and takes "
                           "no error budget",
                           fix={PYTHON: "drop error_budget=, or use strategy='dp'",
                                CLI: "drop --error-budget, or give --strategy dp"})
    if sparsity is None and budget is None and (strategy == "dp" or pattern.block):
        raise CompileError("say how much to prune: a target sparsity, an error budget or both",
                           fix={PYTHON: "pass sparsity=0.75 (fraction of the MACs removed) "
                                        "or error_budget=0.05 (relative RMS output error)",
                                CLI: "give --sparsity 0.75 (fraction of the MACs removed) "
                                     "or --error-budget 0.05 (relative RMS output error)"})
    if pattern.nm and strategy == "uniform" and sparsity is not None:
        n, m = pattern.nm
        if not math.isclose(sparsity, 1 - n / m):
            raise CompileError(f"pattern {pattern.name} removes {1 - n / m:g} of each layer's "
                               f"weights, not {sparsity:g}",
                               fix={PYTHON: f"pass sparsity={1 - n / m:g} or none",
                                    CLI: f"give --sparsity {1 - n / m:g} or none"})


def _layers(model: onnx.ModelProto, skip: Sequence[str],
            feed: Mapping[str, np.ndarray]) -> tuple[list[Layer], set[str]]:
    """The prunable layers (MACs at the shapes of ``feed``) and the names of those
    skipped; errors for unknown skips."""
    if isinstance(skip, str):
        skip = (skip,)
    layers = find_layers(model, feed)
    names = {layer.node for layer in layers}
    unknown = sorted(set(skip) - names)
    if unknown:
        raise CompileError(f"skip names {unknown}, which are not prunable layers of the model "
                           f"(those are {sorted(names) or 'none'})",
                           fix={PYTHON: "pass skip= names of Conv/Gemm/MatMul nodes",
                                CLI: "give --skip names of Conv/Gemm/MatMul nodes"})
    if not names - set(skip):
        raise CompileError(f"model {model.graph.name!r} has no layer to prune: none is a Conv "
                           "(group 1), Gemm or 2-D MatMul with a float initializer weight, "
                           "or all are skipped",
                           fix={PYTHON: "give a model with such layers, and skip fewer",
                                CLI: "give a model with such layers, and fewer --skip names"})
    return layers, set(skip)


@dataclass
class _Measured:
    """The single-layer measurements of one prunable layer."""

    layer: Layer
    candidates: tuple[float, ...]
    densities: list[float]
    errors: list[float]


def _measure(session: WeightSession, layers: list[Layer], pattern: Pattern,
             candidates: Callable[[np.ndarray], tuple[float, ...]],
             progress: Progress) -> list[_Measured]:
    """Each layer's density and error at each of its ``candidates`` sparsities."""
    total = sum(len(candidates(layer.oriented(session.weights[layer.weight])))
                for layer in layers)
    done, measured = 0, []
    for layer in layers:
        w = layer.oriented(session.weights[layer.weight])
        m = _Measured(layer, candidates(w), [], [])
        for s in m.candidates:
            pruned = pattern.prune(w, s)
            m.densities.append(pattern.density(pruned))
            m.errors.append(session.error({layer.weight: layer.stored(pruned)}) if s else 0.0)
            done += 1
            progress("measuring layers", done, total)
        measured.append(m)
    return measured


def _choose(measured: list[_Measured], sparsity: float | None,
            budget: float | None) -> list[int]:
    """The candidate index per layer the DP picks (see :func:`prune`)."""
    gains = [[m.layer.macs * (1 - d) for d in m.densities] for m in measured]
    errors = [m.errors for m in measured]
    macs = sum(m.layer.macs for m in measured)
    target = None if sparsity is None else sparsity * macs
    choice = dp.choose(gains, errors, limit=budget, target=target)
    if choice.options is None:
        within = (f"within the error budget {budget:g}" if budget is not None
                  else "with these candidate sparsities")
        raise CompileError(
            f"sparsity {sparsity:g} cannot be reached {within}: at most "
            f"{choice.removed / macs:.4f} of the MACs can be removed",
            fix={PYTHON: "lower sparsity=, raise error_budget= or skip fewer layers",
                 CLI: "lower --sparsity, raise --error-budget or give fewer --skip names"})
    return choice.options


def _select(session: WeightSession, layers: list[Layer], pattern: Pattern, strategy: str,
            sparsity: float | None, budget: float | None,
            progress: Progress) -> list[tuple[_Measured, int]]:
    """The measured layers with the index of the candidate chosen for each."""
    if strategy == "uniform":
        def only(w: np.ndarray) -> tuple[float, ...]:
            # N:M: the pattern's sparsity, or 0 where the axis does not divide by m
            return (pattern.candidates(w)[-1] if pattern.nm else sparsity,)
        measured = _measure(session, layers, pattern, only, progress)
        return [(m, 0) for m in measured]
    measured = _measure(session, layers, pattern, pattern.candidates, progress)
    return list(zip(measured, _choose(measured, sparsity, budget)))


def _rows(chosen: list[tuple[_Measured, int]], layers: list[Layer]) -> list[LayerResult]:
    """The table's rows in graph order, skipped layers as dense."""
    pruned = {m.layer.node: LayerResult(m.layer.node, m.layer.op, m.layer.macs,
                                        m.candidates[j], m.densities[j], m.errors[j])
              for m, j in chosen}
    return [pruned.get(layer.node) or LayerResult(layer.node, layer.op, layer.macs, 0.0,
                                                  1.0, 0.0, skipped=True)
            for layer in layers]


def prune(model: Any, *, pattern: str = "block", sparsity: float | None = None,
          error_budget: float | None = None,
          calibration: Sequence[Mapping[str, Any]] | None = None,
          config: str | HwConfig = "pynq", strategy: str = "dp", skip: Sequence[str] = (),
          progress: Progress | None = None) -> PruneResult:
    """Prune a float ONNX model (path or ``ModelProto``) by weight magnitude.

    ``pattern`` is ``"block"`` -- the accelerator's ``block_out x block_in`` GEMM weight
    blocks of ``config`` per kernel tap, the blocks of least L2 norm zeroed -- or an N:M
    pattern of :data:`tessera.sparsity.NM_PATTERNS` (``"2:4"``: of every 4 weights along
    the reduction axis the 2 largest kept). Prunable layers: Conv (group 1), Gemm and 2-D
    MatMul with a float initializer weight, except the node names in ``skip``.

    ``strategy="dp"`` chooses each layer's sparsity from the output error measured with
    that layer alone pruned (relative RMS of the outputs against the unpruned model, by
    onnxruntime on ``calibration``, a list of ``{input name: array}`` feeds; random
    normal feeds with a warning when None): with ``sparsity=s``, the choice removing at
    least ``s`` of the prunable MACs at the least summed error; with ``error_budget=e``,
    the one removing the most MACs at a summed error <= e; with both, ``s`` within ``e``.
    ``strategy="uniform"`` prunes every layer to ``sparsity`` (N:M: to the pattern).
    ``progress(stage, done, total)`` is called as the measurement advances.

    Returns a :class:`PruneResult`; :class:`~tessera.errors.CompileError` for bad
    arguments, a model that is not float or has nothing to prune, or an unmeetable goal.
    """
    progress = progress or (lambda stage, done, total: None)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    pat = _pattern(pattern, config)
    sparsity = check_fraction(sparsity, "sparsity", "--sparsity", upper=1.0)
    error_budget = check_fraction(error_budget, "error_budget", "--error-budget", upper=None)
    _check_goal(pat, strategy, sparsity, error_budget)
    proto = load_model(model)
    feeds, random = prune_feeds(proto, calibration)
    layers, skip = _layers(proto, skip, feeds[0])
    if random:
        warnings.warn(f"no calibration given: pruning errors are measured on {len(feeds)} "
                      "random normal samples, not on your data", stacklevel=2)
    pruned_layers = [layer for layer in layers if layer.node not in skip]
    progress("reference run", 0, 1)
    session = WeightSession(proto, weight_arrays(proto, pruned_layers), feeds)
    seconds["reference"] = time.perf_counter() - start
    chosen = _select(session, pruned_layers, pat, strategy, sparsity, error_budget, progress)
    seconds["measure"] = time.perf_counter() - start - seconds["reference"]
    progress("pruned model run", 0, 1)
    weights = {m.layer.weight: m.layer.stored(pat.prune(m.layer.oriented(
        session.weights[m.layer.weight]), m.candidates[j])) for m, j in chosen}
    result = with_weights(proto, weights)
    error = relative_rms(run_model(result, feeds), run_model(proto, feeds))
    progress("done", 0, 0)
    seconds["total"] = time.perf_counter() - start
    rows = _rows(chosen, layers)
    kept = [r for r in rows if not r.skipped]
    macs = sum(r.macs for r in kept)
    return PruneResult(result, pat.name, strategy, rows,
                       sum(r.macs * (1 - r.density) for r in kept) / macs,
                       sum(r.error for r in kept), error, len(feeds), random, seconds)
