"""Running a sweep's jobs as Ray tasks: on this machine by default (``ray.init()``), on a
cluster when given its address. Each finished job's row goes to the results file at once;
a worker lost mid-job (killed, out of memory, its node gone) is retried by Ray.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tessera.config import HwConfig
from tessera.errors import TesseraError
from tessera.extras import missing_extra_error
from tessera.progress import Progress

from . import evaluate
from .models import ModelRef, prepare
from .results import ResultsFile

__all__ = ["Job", "Failure", "run_jobs", "RETRIES"]

#: Times Ray runs a job again after its worker died (Ray's own default, stated).
RETRIES = 3


@dataclass(frozen=True)
class Job:
    """One measurement of a sweep: ``job`` (:data:`~.evaluate.RESOURCES` or a model's
    name) on ``point``'s config, with its results-file ``key`` and the row's fields."""

    key: str
    job: str
    config: HwConfig
    label: str
    values: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Failure:
    """A job Ray gave up on (its worker lost more than :data:`RETRIES` times, or a bug):
    not in the results file, so the next run tries it again."""

    job: Job
    reason: str


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`~tessera.extras.MissingExtraError` naming the
    extra that installs it."""
    try:
        import ray
    except ModuleNotFoundError as exc:
        raise (missing_extra_error(exc) or exc) from None
    return ray


def run_jobs(jobs: Sequence[Job], models: Sequence[ModelRef], part: str, host: str | None,
             results: ResultsFile, *, tune: str = "model", address: str | None = None,
             on_row: Callable[[dict], None] | None = None,
             verbose: bool = False) -> list[Failure]:
    """Run ``jobs`` on Ray and append each finished one's row to ``results``; returns the
    jobs Ray gave up on; ``tune`` chooses the models' tilings (see :func:`tessera.compile`).
    Joins the Ray instance already running in this process, else
    starts one (``address``: a cluster's, or ``None`` for this machine) and stops it
    after. ``on_row`` sees each row after it is stored; Ray's own log lines below errors
    show only when ``verbose``."""
    ray = import_ray()
    own = not ray.is_initialized()
    if own:
        ray.init(address=address, include_dashboard=False, log_to_driver=verbose,
                 logging_level=logging.INFO if verbose else logging.ERROR)
    try:
        return _run(ray, jobs, models, (part, host, tune), results, on_row)
    finally:
        if own:
            ray.shutdown()


def _run(ray: Any, jobs: Sequence[Job], models: Sequence[ModelRef],
         context: tuple[str, str | None, str], results: ResultsFile,
         on_row: Callable[[dict], None] | None) -> list[Failure]:
    part, host, tune = context
    task = ray.remote(max_retries=RETRIES)(evaluate.run_job)
    pending: dict[Any, Job] = {}
    with Progress(len(jobs), "dse", unit="jobs") as bar:
        # Syntheses first (the long jobs), then each model's jobs once it is quantized:
        # the workers start while the driver prepares the models.
        for job in jobs:
            if job.job == evaluate.RESOURCES:
                pending[task.remote(job.job, job.config, part, None, host, tune)] = job
        for ref in models:
            mine = [job for job in jobs if job.job == ref.name]
            if mine:
                bar.update(0, item=f"quantizing {ref.name}")
                spec = ray.put(prepare(ref))
                for job in mine:
                    pending[task.remote(job.job, job.config, part, spec, host, tune)] = job
        return _collect(ray, pending, results, bar, on_row)


def _collect(ray: Any, pending: dict[Any, Job], results: ResultsFile, bar: Progress,
             on_row: Callable[[dict], None] | None) -> list[Failure]:
    failures = []
    while pending:
        (done,), _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(done)
        try:
            result = ray.get(done)
        except (ray.exceptions.RayError, TesseraError) as exc:
            failures.append(Failure(job, f"{type(exc).__name__}: {exc}".splitlines()[0]))
        else:
            row = {"key": job.key, "point": job.config.name, "values": job.values,
                   "label": job.label, "job": job.job, "result": result}
            results.append(row)
            if on_row is not None:
                on_row(row)
        bar.update(item=f"{job.label}: {job.job}")
    return failures
