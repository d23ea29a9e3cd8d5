"""What one sweep job measures, run in a Ray worker (or in-process): a point's resources
from yosys, or one model compiled for a point and run on the cycle-level simulator.

Both return plain JSON-able dicts, the rows of the results file. A job that fails on its
input (a model the config cannot compile, say) returns ``{"error": ...}``: that is a
result, kept like any other, where a worker lost mid-job is retried by Ray.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from tessera.config import HwConfig
from tessera.errors import PYTHON, SynthesisError, TesseraError

__all__ = ["ModelSpec", "RESOURCES", "design_key", "evaluate_model", "evaluate_resources",
           "run_job"]

#: The job name of a point's synthesis; a model's job is named by the model.
RESOURCES = "resources"
#: What a model job measures, in the results key: bumped when that changes (or the
#: compiler changes what a config can run), so rows of an older kind run again (2: the
#: floor counts only the accelerator's MACs, and the share of MACs the accelerator runs is
#: kept; 3: cores with block_in != block_out chain layers on the accelerator).
FIGURES = 3
#: Seconds a point's yosys run may take: the largest xc7z020 design here took 18 minutes
#: on a loaded 2-core machine (docs/benchmarks.md), so over three times that.
SYNTH_TIMEOUT = 3600.0


@dataclass(frozen=True)
class ModelSpec:
    """A model as every job of a sweep runs it: its int8 QDQ ONNX bytes, the input feed
    and its MACs (for the compute floor). ``digest`` identifies the model's bytes."""

    name: str
    qdq: bytes
    feed: Mapping[str, np.ndarray]
    macs: int
    digest: str


def design_key(config: HwConfig, part: str) -> str:
    """The yosys resource cache's key of ``config``'s design on ``part`` (the design's
    sources, the part, yosys): the same for every config with the same Verilog."""
    from tessera.hw.harness.verilator_sources import source_key
    from tessera.hw.synth import export, resource_cache
    return resource_cache.cache_key(source_key(export.design_config(config)),
                                    export.TOP_NAME, part)


def evaluate_resources(config: HwConfig, part: str) -> dict[str, Any]:
    """``config``'s resources on ``part`` from the yosys cache, or from a new synthesis
    (kept in the cache): used and available per resource, fits, seconds spent."""
    from tessera.hw.synth import resource_cache
    t0 = time.perf_counter()
    key = design_key(config, part)
    report = resource_cache.load(key)
    cached = report is not None
    if report is None:
        report, synthesized = resource_cache.synthesize_and_store(config, part, key,
                                                                  timeout=SYNTH_TIMEOUT)
        cached = not synthesized
    used = {k: u for k, (u, _) in report.rows().items()}
    return {"used": used, "available": {k: a for k, (_, a) in report.rows().items()},
            "fits": report.fits, "cached": cached, "seconds": time.perf_counter() - t0}


def evaluate_model(config: HwConfig, spec: ModelSpec, host: str | None,
                   tune: str = "model") -> dict[str, Any]:
    """``spec`` compiled for ``config`` (tilings chosen by ``tune``, see
    :func:`tessera.compile`) and run once on the simulator: accelerator cycles, the
    projected latency on the board (``host``'s CPU model for the layers placed on the
    CPU), GEMM utilisation, the share of the model's MACs placed on the accelerator and
    its cycles over their compute floor, the tuner's summary, and where the time went."""
    import tessera
    t0 = time.perf_counter()
    model = tessera.compile(spec.qdq, config, host=host, tune=tune)
    t1 = time.perf_counter()
    try:
        # no event trace: a sweep keeps the figures, not the timeline
        _, profile = model.run(dict(spec.feed), device=model.device("sim", trace=False))
    finally:
        model.close()
    accel_macs = sum(x.macs for x in profile.layers if x.placement == "accelerator")
    floor = accel_macs / config.peak_macs_per_cycle
    return {"cycles": profile.accel_cycles, "latency_ms": profile.latency_seconds * 1e3,
            "accel_ms": profile.accel_seconds * 1e3,
            "gemm_utilisation": profile.gemm_utilisation,
            "accel_mac_share": accel_macs / spec.macs if spec.macs else None,
            "floor_ratio": profile.accel_cycles / floor if floor else None,
            "tuning": model.compiled.stats.get("tuning"),
            "compile_s": t1 - t0, "sim_s": time.perf_counter() - t1}


def run_job(job: str, config: HwConfig, part: str, spec: ModelSpec | None,
            host: str | None, tune: str = "model") -> dict[str, Any]:
    """One job of a sweep: :data:`RESOURCES` or a model's run. A :class:`TesseraError` of
    the input (the config refuses the model) is returned as the row's error; a failed
    synthesis (yosys killed, out of time) is raised, so the job is not recorded and the
    next run tries it again."""
    try:
        if job == RESOURCES:
            return evaluate_resources(config, part)
        assert spec is not None and spec.name == job
        return evaluate_model(config, spec, host, tune)
    except SynthesisError:
        raise
    except TesseraError as exc:
        return {"error": exc.describe(PYTHON)}
