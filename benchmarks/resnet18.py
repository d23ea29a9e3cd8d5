"""ResNet-18 (224x224, batch 1) end to end: quantize, compile for ``pynq``, simulate, check.

Usage: python benchmarks/resnet18.py [--config pynq] [--batch N] [--layers] [--timeline FILE.png]

Builds torchvision's ResNet-18 topology from seeded numpy weights (tessera.compiler.frontend.zoo),
quantizes it with onnxruntime's post-training static quantization (8 random calibration
samples), compiles it with ``tessera.compile`` and runs it on the cycle-level simulator.
The output is compared with onnxruntime running the same int8 QDQ model
(``session.qdqisint8allowed=1``) on the same input.

Prints, against the issue's targets: every node's placement, total cycles, the projected
latency at the config's clock (target < 100 ms; VTA's published ResNet-18 on a PYNQ-Z1
takes 420 ms), GEMM utilisation, the simulator's wall time (target < 60 s on a 2-core
machine), the compile time (target < 20 s; quantization, which is onnxruntime's
calibration, shown apart) and the agreement with onnxruntime (target: >= 99.9% of int8
values identical, none off by more than 1). The accelerator total is also shown against
the compute floor (the model's MACs over the config's peak MACs per cycle) and, apart,
without the pooling layers. ``--batch N`` runs N images at once (the latency target then
applies to the whole batch). Exits 1 when a target is missed.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import numpy as np

import tessera
from tessera.compiler import zoo
from tessera.compiler.frontend.qdq import OPS as FUSED_OPS
from tessera.compiler.golden.check import int8_agreement, output_scales, reference_outputs
from tessera.compiler.frontend.quantize import quantize_static
from tessera.config import get_config

TARGET_LATENCY_MS = 100.0
VTA_LATENCY_MS = 420.0
TARGET_SIM_SECONDS = 60.0
TARGET_COMPILE_SECONDS = 20.0
#: Issue 20's goals for the accelerator total over the compute floor, by (config, batch);
#: printed beside the ratio, not yet part of the exit status.
FLOOR_GOALS = {("pynq", 1): 1.05, ("zcu104", 1): 1.10, ("pynq", 2): 1.06}


def pool_cycles(profile) -> int:
    """Accelerator cycles of the pooling layers (torchvision names them ``maxpool`` and
    ``avgpool``; a global average pool may run as a depthwise convolution)."""
    return sum(layer.cycles or 0 for layer in profile.layers
               if "pool" in layer.kind or layer.name.startswith(("maxpool", "avgpool")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="pynq")
    ap.add_argument("--batch", type=int, default=1, help="images per inference")
    ap.add_argument("--layers", action="store_true", help="print the per-layer profile")
    ap.add_argument("--timeline", metavar="PNG", help="write the queue timeline")
    ap.add_argument("--runs", type=int, default=1,
                    help="run the model this many times on one device (host traffic of the "
                         "later runs, whose program is already loaded)")
    args = ap.parse_args()
    config = get_config(args.config)

    model = zoo.resnet18(batch=args.batch)
    floor = zoo.mac_count(model) / config.peak_macs_per_cycle
    print(f"ResNet-18 (batch {args.batch}): {zoo.parameter_count(model):,} parameters, "
          f"{zoo.mac_count(model):,} MACs, "
          f"config {config.name!r} ({config.peak_macs_per_cycle} MAC/cycle at "
          f"{config.clock_mhz:g} MHz)")
    calibration = zoo.calibration_data(model, 8)
    t0 = time.perf_counter()
    qdq = quantize_static(model, calibration)
    quantize_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = tessera.compile(qdq, config)
    compile_s = time.perf_counter() - t0
    placed = Counter(p.target for p in compiled.placements)
    off = [p for p in compiled.placements if p.target != "accelerator"]
    print(f"\nquantization (onnxruntime calibration, 8 samples): {quantize_s:.1f} s")
    print(f"compile: {compile_s:.1f} s, {placed['accelerator']} nodes on the accelerator in "
          f"{compiled.compiled.stats['segments']} program(s); off the accelerator: "
          + ", ".join(f"{p.node} ({p.op}: {p.target})" for p in off))

    x = zoo.calibration_data(model, 1, seed=1)[0]
    dev = compiled.device("sim")
    t0 = time.perf_counter()
    outputs, profile = compiled.run(x, device=dev)
    sim_s = time.perf_counter() - t0
    first = dev.counters()
    traffic = [("host bytes, first run (program load)",
                f"{first['host_bytes_written']:,} written, {first['host_bytes_read']:,} read", "")]
    repeats_identical = True
    for _ in range(args.runs - 1):
        before = dev.counters()
        again, _ = compiled.run(x, device=dev)
        after = dev.counters()
        same = all(np.array_equal(again[k], outputs[k]) for k in outputs)
        repeats_identical &= same
        traffic.append(("host bytes, a later run",
                        f"{after['host_bytes_written'] - before['host_bytes_written']:,} written,"
                        f" {after['host_bytes_read'] - before['host_bytes_read']:,} read",
                        "outputs identical to the first run" if same else
                        "OUTPUTS DIFFER FROM THE FIRST RUN"))
    reference = reference_outputs(qdq, x)
    scales = output_scales(qdq)
    name = compiled.outputs[0].name
    agree = int8_agreement(outputs[name], reference[name], scales[name])
    if args.layers:
        print()
        print(profile.table())
    if args.timeline:
        print(f"timeline: {profile.write_timeline(args.timeline)}")

    latency_ms = profile.latency_seconds * 1e3
    pools = pool_cycles(profile)
    goal = FLOOR_GOALS.get((config.name, args.batch))
    rows = [
        ("total accelerator cycles", f"{profile.accel_cycles:,}",
         f"{profile.accel_cycles / floor:.3f}x floor ({floor:,.0f} = MACs / "
         f"{config.peak_macs_per_cycle})" + (f", goal <= {goal:.2f}x" if goal else "")),
        ("  without the pooling layers", f"{profile.accel_cycles - pools:,}",
         f"{(profile.accel_cycles - pools) / floor:.3f}x floor"),
        (f"projected latency at {config.clock_mhz:g} MHz", f"{latency_ms:.1f} ms",
         f"< {TARGET_LATENCY_MS:g} ms (VTA: {VTA_LATENCY_MS:g} ms, "
         f"{VTA_LATENCY_MS / latency_ms:.1f}x)"),
        ("  of which CPU layers (host time here)", f"{profile.cpu_seconds * 1e3:.2f} ms", ""),
        ("GEMM utilisation", f"{profile.gemm_utilisation:.1%}", ""),
        ("simulator wall time", f"{sim_s:.1f} s", f"< {TARGET_SIM_SECONDS:g} s"),
        *traffic,
        ("compile time", f"{compile_s:.1f} s", f"< {TARGET_COMPILE_SECONDS:g} s"),
        ("logits vs onnxruntime", str(agree), ">= 99.9% identical, none off by > 1"),
        ("top-1", f"{int(np.argmax(outputs[name]))} (onnxruntime "
                  f"{int(np.argmax(reference[name]))})", ""),
    ]
    print()
    width = max(len(r[0]) for r in rows) + 2
    for label, value, target in rows:
        print(f"{label:<{width}}{value:<44}{target}")
    met = (latency_ms < TARGET_LATENCY_MS and sim_s < TARGET_SIM_SECONDS
           and compile_s < TARGET_COMPILE_SECONDS and agree.fraction >= 0.999
           and agree.max_steps <= 1 and not [p for p in off if p.op in FUSED_OPS]
           and repeats_identical)
    print("\nall targets met" if met else "\nTARGET MISSED")
    compiled.close()
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
