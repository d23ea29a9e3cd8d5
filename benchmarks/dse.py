"""Issue 21's design-space sweep: configs around pynq for ResNet-18 and MobileNet on an xc7z020.

Usage: python benchmarks/dse.py [--results FILE.jsonl] [--address RAY] [--no-synth]
       [--tune sim]

Sweeps the pynq preset over the GEMM core's shape (``block_in`` 4/8/16/32, ``block_out``
8/16), the weight buffer (512/1024 entries) and the accumulator (1024/2048 rows): 32
configs, the four 32x16 cores refused before synthesis (256 DSP48s), on Ray
(this machine unless --address), each point synthesized with yosys (cached by design),
each model compiled and simulated on it (tessera.dse.explore). Rows stream into
--results (default benchmarks/results/dse-xc7z020.jsonl): a stopped run resumes, a
complete one prints at once. Prints the sweep's table, then the best fitting point for
ResNet-18 against the pynq preset (one of the points) with both latencies and resources.
A full run synthesizes 28 configs, 3-18 minutes each on a 2-core machine.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tessera.config import PRESETS
from tessera.dse import explore
from tessera.dse.plot import write_plot
from tessera.dse.report import table
from tessera.dse.sweep import PARETO_RESOURCES, PointResult, Sweep

AXES = {"block_in": [4, 8, 16, 32], "block_out": [8, 16], "wgt_depth": [512, 1024],
        "acc_depth": [1024, 2048]}
MODELS = ["resnet18", "mobilenet"]
DEFAULT_RESULTS = Path(__file__).resolve().parent / "results" / "dse-xc7z020.jsonl"


def _is_preset(r: PointResult) -> bool:
    pynq = PRESETS["pynq"]
    return all(getattr(r.point.config, f) == getattr(pynq, f) for f in AXES)


def _describe(r: PointResult, models: list[str]) -> str:
    used = r.resources["used"] if r.resources else {}
    res = ", ".join(f"{k} {used[k]:,}" for k in PARETO_RESOURCES if k in used)
    lat = ", ".join(f"{m} {r.models[m]['latency_ms']:.1f} ms" for m in models
                    if "latency_ms" in r.models.get(m, {}))
    return f"{r.point.label}: {lat}; {res or 'not synthesized'}"


def _share(r: PointResult) -> float:
    """The design's LUT, DSP and BRAM shares of the part, summed (inf if not synthesized)."""
    shares = [r.share(k) for k in PARETO_RESOURCES]
    return float("inf") if None in shares else sum(shares)


def compare_with_preset(sweep: Sweep) -> list[str]:
    """The best fitting point for the first model, and the pynq preset's point."""
    model = sweep.models[0]
    done = [r for r in sweep.results if r.fits is not False and not r.errors
            and "latency_ms" in r.models.get(model, {})]
    if not done:
        return ["no point finished yet"]
    # equal latencies (buffer sizes a model does not need): the smaller design wins
    best = min(done, key=lambda r: (round(r.models[model]["latency_ms"], 6), _share(r)))
    lines = [f"best for {model}: {_describe(best, sweep.models)}"]
    preset = next((r for r in sweep.results if _is_preset(r)), None)
    if preset is not None and model in preset.models and "latency_ms" in preset.models[model]:
        ratio = preset.models[model]["latency_ms"] / best.models[model]["latency_ms"]
        lines.append(f"pynq preset: {_describe(preset, sweep.models)} ({ratio:.2f}x the best's "
                     f"{model} latency)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(DEFAULT_RESULTS))
    ap.add_argument("--address")
    ap.add_argument("--no-synth", action="store_true")
    ap.add_argument("--tune", choices=("model", "sim"), default="model")
    args = ap.parse_args()
    sweep = explore("pynq", AXES, MODELS, part="xc7z020", results=args.results,
                    address=args.address, synthesize=not args.no_synth, tune=args.tune)
    print(table(sweep))
    print()
    print("\n".join(compare_with_preset(sweep)))
    print(f"plot: {write_plot(sweep, Path(args.results).with_suffix('.png'))}")
    return 1 if sweep.failures else 0


if __name__ == "__main__":
    sys.exit(main())
