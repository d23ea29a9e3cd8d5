"""``explore``: a sweep from its space and models to its results, and :class:`Sweep`, what
it found (each point's resources and model figures, the Pareto set)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tessera.config import HwConfig
from tessera.errors import CLI, DseError

from . import evaluate
from .models import ModelRef, model_refs
from .results import ResultsFile, job_key
from .runner import Failure, Job, run_jobs
from .space import Axis, Point, Space, board_of, refuse_without_dsps

__all__ = ["PointResult", "Sweep", "explore", "host_for_part"]

#: The resources the Pareto set trades latency against.
PARETO_RESOURCES = ("LUT", "DSP", "BRAM")


@dataclass
class PointResult:
    """A legal point and what its jobs found: ``resources`` (``None`` until synthesized,
    or when the sweep does not synthesize) and each model's figures by name."""

    point: Point
    resources: dict[str, Any] | None = None
    models: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def fits(self) -> bool | None:
        return None if self.resources is None else self.resources.get("fits")

    @property
    def errors(self) -> list[str]:
        found = [self.resources] if self.resources else []
        return [r["error"] for r in [*found, *self.models.values()] if "error" in r]

    def share(self, resource: str) -> float | None:
        """The fraction of the part's ``resource`` (``"LUT"``...) the design uses; ``None``
        when not synthesized (or failed) or the part's capacity is unknown."""
        if self.resources is None or "error" in self.resources:
            return None
        available = self.resources["available"].get(resource)
        return self.resources["used"][resource] / available if available else None

    def objectives(self, models: Sequence[str]) -> tuple[float, ...] | None:
        """What the Pareto set minimises: each model's projected latency, then the used
        LUTs, DSPs and BRAMs (when synthesized); ``None`` for a point without all of them
        or that does not fit."""
        if self.errors or self.fits is False or any(m not in self.models for m in models):
            return None
        latency = tuple(self.models[m]["latency_ms"] for m in models)
        if self.resources is None:
            return latency
        return latency + tuple(self.resources["used"][r] for r in PARETO_RESOURCES)


@dataclass
class Sweep:
    """A sweep's outcome: the legal points' results, the illegal points with why, the
    models, the part, and the jobs Ray gave up on."""

    space: Space
    results: list[PointResult]
    illegal: list[Point]
    models: list[str]
    synthesized: bool
    failures: list[Failure] = field(default_factory=list)
    ran: int = 0

    @property
    def part(self) -> str:
        return self.space.part

    def pareto(self) -> list[PointResult]:
        """The points no other point beats on every objective (:meth:`PointResult.objectives`),
        by the first model's latency."""
        scored = [(r, r.objectives(self.models)) for r in self.results]
        scored = [(r, o) for r, o in scored if o is not None]
        front = [r for r, o in scored
                 if not any(_dominates(other, o) for _, other in scored)]
        return sorted(front, key=lambda r: r.objectives(self.models))


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def host_for_part(part: str) -> str | None:
    """The CPU model of the board carrying ``part`` (the PYNQ-Z2's Cortex-A9 for its
    xc7z020), ``None`` for a part no board has (the config's default then)."""
    board = board_of(part)
    return None if board is None else board.host


def explore(base: str | HwConfig, axes: Mapping[str, Sequence[Any]] | Sequence[Axis],
            models: Sequence[str], *, part: str | None = None,
            results: str | Path = "dse-results.jsonl", address: str | None = None,
            synthesize: bool = True, tune: str = "model",
            on_row: Callable[[dict], None] | None = None, verbose: bool = False) -> Sweep:
    """Sweep ``base`` over ``axes`` (``{"block_out": [8, 16], ...}``) for ``models`` (zoo
    names or ONNX files) on ``part`` (the base's by default).

    Each legal point is synthesized with yosys (unless ``synthesize`` is False; cached by
    design) and each model compiled for it and run on the simulator, as Ray tasks on
    this machine or at ``address``. Rows stream into the ``results`` file (JSON lines);
    jobs it already holds are not run again. ``tune="sim"`` lets the simulator pick the
    tilings where the cost model is off (:func:`tessera.compile`). ``on_row`` sees each
    new row; ``verbose`` shows Ray's own log lines. Returns the :class:`Sweep`.
    """
    if tune not in ("model", "sim"):      # before any job: each would fail alike
        raise DseError(f"tune must be 'model' or 'sim', not {tune!r}",
                       fix={CLI: "--tune model or --tune sim"})
    space = Space.of(base, axes, part)
    refs = model_refs(models)
    points = space.points()
    if synthesize:
        points = [refuse_without_dsps(p, space.part) for p in points]
    legal = [p for p in points if p.legal]
    store = ResultsFile(results)
    jobs = _jobs(legal, refs, space.part, synthesize, tune)
    pending = [j for j in jobs if j.key not in store]
    failures = []
    if pending:
        failures = run_jobs(pending, refs, space.part, host_for_part(space.part), store,
                            tune=tune, address=address, on_row=on_row, verbose=verbose)
    sweep = Sweep(space, [PointResult(p) for p in legal], [p for p in points if not p.legal],
                  [r.name for r in refs], synthesize, failures, len(pending) - len(failures))
    _fill(sweep, jobs, store)
    return sweep


def _jobs(points: Sequence[Point], refs: Sequence[ModelRef], part: str, synthesize: bool,
          tune: str) -> list[Job]:
    jobs = []
    for p in points:
        assert p.config is not None
        # a model's figures depend on how its tilings were chosen
        named = [(ref.name, f"{ref.digest} tune={tune} figures={evaluate.FIGURES}")
                 for ref in refs]
        if synthesize:
            named.insert(0, (evaluate.RESOURCES, evaluate.design_key(p.config, part)))
        jobs += [Job(job_key(p.config, part, name, identity), name, p.config, p.label,
                     p.values) for name, identity in named]
    return jobs


def _fill(sweep: Sweep, jobs: Sequence[Job], store: ResultsFile) -> None:
    by_name = {r.point.config.name: r for r in sweep.results if r.point.config}
    for job in jobs:
        row = store.rows.get(job.key)
        if row is None:
            continue
        target = by_name[job.config.name]
        if job.job == evaluate.RESOURCES:
            target.resources = row["result"]
        else:
            target.models[job.job] = row["result"]
