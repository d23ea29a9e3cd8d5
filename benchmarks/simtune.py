"""How often the tiling cost model and the simulator disagree, and what the simulator's picks save.

Usage: python benchmarks/simtune.py [--models resnet18 mobilenet] [--configs pynq zcu104 ...]
       [--markdown]

Compiles each zoo model (quantized by onnxruntime, 8 random calibration feeds) for each
config twice in one process: with the cost model's tilings (``tune="model"``) and with the
simulator checking each convolution's first choice and ranking the best
``tessera.compiler.accel.simtune.CANDIDATES`` when the estimate is off by more than
``MARGIN`` of the simulated cycles (``tune="sim"``). Both run on the simulator. Prints per
(model, config): layers checked, how many the model missed by more than the margin, how
many tilings the simulator changed, the whole model's accelerator cycles both ways, and
the compile time both ways (after an untimed warm-up compile). Besides the presets, the
default configs include four of the kind a design-space sweep visits (small buffers; a
narrow bus; rectangular GEMM cores), where the model is further from its calibration.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import tessera
from tessera.compiler import zoo
from tessera.config import PRESETS, get_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import table  # noqa: E402  (a sibling module)

#: Configs a sweep visits beside the presets: the pynq core with a quarter of its input
#: and weight buffers, with a 4-byte bus, and rectangular (its GEMM reading twice or half
#: the channels it stores: sub-block DMAs the cost model prices as whole rows).
SWEEP_LIKE = {
    "pynq-small-buffers": PRESETS["pynq"].replace(name="pynq-small-buffers", inp_depth=512,
                                                  wgt_depth=256),
    "pynq-narrow-bus": PRESETS["pynq"].replace(name="pynq-narrow-bus", bus_bytes=4),
    "pynq-16x8": PRESETS["pynq"].replace(name="pynq-16x8", block_out=8),
    "pynq-8x16": PRESETS["pynq"].replace(name="pynq-8x16", block_in=8),
}


def measure(model_name: str, config) -> list[str]:
    model = zoo.ZOO[model_name]()
    qdq = zoo.to_qdq(model, zoo.calibration_data(model, 8))
    feed = zoo.calibration_data(model, 1, seed=1)[0]
    cycles, seconds, tuning = {}, {}, None
    tessera.compile(qdq, config).close()    # warm-up: CPU kernels JIT-compiled, caches filled
    for tune in ("model", "sim"):
        t0 = time.perf_counter()
        compiled = tessera.compile(qdq, config, tune=tune)
        seconds[tune] = time.perf_counter() - t0
        _, profile = compiled.run(feed, device=compiled.device("sim", trace=False))
        cycles[tune] = profile.accel_cycles
        tuning = compiled.compiled.stats.get("tuning", tuning)
        compiled.close()
    assert tuning is not None
    return [model_name, config.name, str(tuning["layers"]), str(tuning["disagreed"]),
            str(tuning["changed"]), f"{cycles['model']:,}", f"{cycles['sim']:,}",
            f"{1 - cycles['sim'] / cycles['model']:+.2%}",
            f"{seconds['model']:.1f}", f"{seconds['sim']:.1f}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet"])
    ap.add_argument("--configs", nargs="+", default=["pynq", "zcu104", *SWEEP_LIKE])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows = [measure(m, SWEEP_LIKE.get(c) or get_config(c))
            for m in args.models for c in args.configs]
    head = ["model", "config", "layers", "model off > 2%", "tiling changed", "cycles (model)",
            "cycles (sim)", "saved", "compile s (model)", "compile s (sim)"]
    print(table(head, rows, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
