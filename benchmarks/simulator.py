"""The cycle-level simulator's wall time against the numpy golden model, one process.

Usage: python benchmarks/simulator.py [--config pynq] [--model resnet18|small]
                                      [--repeats 3] [--profile] [--markdown]

Quantizes the zoo model (onnxruntime's static PTQ, 8 calibration samples), compiles it
with ``tessera.compile`` and keeps the accelerator operators each segment was lowered
to. Then, in this process, for every accelerator segment on the same random int8 input:

* sim: what a user pays per inference on the ``sim`` backend: the program loaded once
  on a :class:`~tessera.runtime.SimDevice`, then per run the input segments written,
  the launch, the cycle-level simulation (data and timing) and the outputs read back;
* golden: :func:`tessera.compiler.golden.operators.run_reference` over the same
  operators (numpy, no timing).

Each is the median of ``--repeats`` runs, the two taking turns; "sim first" is the first run alone, which
also decodes, checks and times the instruction stream and plans its loop nests (kept
for the runs after it, see ``sim/facts.py`` and ``sim/nest.py``). The outputs must be identical (a broken
simulator cannot pass); the table gives the ratio against the issue's target (sim at
most 2.0x the golden model) and the simulated cycles, which must not change when the
simulator gets faster. ``--profile`` prints cProfile's top entries of one simulator run.
Exits 1 when the outputs differ or the target is missed.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tessera  # noqa: E402
from tables import table  # noqa: E402
from tessera.compiler import model as compiled_model  # noqa: E402
from tessera.compiler import zoo  # noqa: E402
from tessera.compiler.frontend.quantize import quantize_static  # noqa: E402
from tessera.compiler.golden.operators import run_reference  # noqa: E402
from tessera.config import get_config  # noqa: E402
from tessera.sim.registers import SimRegisters  # noqa: E402

TARGET_RATIO = 2.0
MODELS = {"resnet18": zoo.resnet18, "small": zoo.small_resnet}


@contextmanager
def recorded_segments() -> Iterator[list]:
    """Collect ``(ops, input shapes)`` of every program ``tessera.compile`` builds: the
    compiled model keeps its programs but not the operators they were lowered from."""
    seen: list = []
    original = compiled_model.compile_ops

    def record(ops, input_shapes, *args, **kwargs):
        seen.append((list(ops), dict(input_shapes)))
        return original(ops, input_shapes, *args, **kwargs)

    compiled_model.compile_ops = record
    try:
        yield seen
    finally:
        compiled_model.compile_ops = original


def seconds(fn: Callable[[], object]) -> tuple[float, object]:
    """The wall time of one call of ``fn`` and its result."""
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def interleaved(a: Callable[[], object], b: Callable[[], object], repeats: int):
    """``repeats`` timed calls of ``a`` and ``b`` in turn (on a shared machine both see the
    same load): the two lists of wall times and the last results."""
    times_a, times_b, result_a, result_b = [], [], None, None
    for _ in range(repeats):
        t, result_a = seconds(a)
        times_a.append(t)
        t, result_b = seconds(b)
        times_b.append(t)
    return times_a, times_b, result_a, result_b


def segment_runner(model, step, device):
    """A function running ``step`` (an accelerator segment) on ``device`` for a feed and
    returning ``(outputs, cycles)``, the program loaded once as the executor does."""
    cp = step.program
    loaded = device.load(cp.program)

    def run(feeds: dict[str, np.ndarray]):
        result = loaded.run(cp.input_segments(feeds), read=cp.output_segments)
        return {n: cp.read(result, n) for n in step.outputs}, result.cycles
    return run


def random_feeds(step, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {n: rng.integers(-128, 128, step.shapes[n], dtype=np.int8) for n in step.inputs}


def profile_run(run: Callable[[], object], sort: str = "tottime", top: int = 25) -> str:
    """cProfile's top entries (by own time) of ``run``, the simulator's thread included:
    the ``sim`` backend simulates in a thread of its own (``SimRegisters._run``)."""
    prof = cProfile.Profile()
    simulate = SimRegisters._run
    SimRegisters._run = lambda self: prof.runcall(simulate, self)
    try:
        run()
    finally:
        SimRegisters._run = simulate
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats(sort).print_stats(top)
    return out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="pynq")
    ap.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", nargs="?", const="tottime", choices=("tottime", "cumulative"),
                    help="cProfile one simulator run (after the timed ones), sorted by own "
                         "or cumulative time")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    config = get_config(args.config)
    onnx_model = MODELS[args.model]()
    qdq = quantize_static(onnx_model, zoo.calibration_data(onnx_model, 8))
    with recorded_segments() as segments:
        model = tessera.compile(qdq, config)
    steps = model.compiled.accel_steps
    assert len(steps) == len(segments), "one recorded operator list per segment"
    device = model.device("sim")
    rng = np.random.default_rng(0)
    rows, sim_total, golden_total, first_total, exact = [], 0.0, 0.0, 0.0, True
    for step, (ops, _) in zip(steps, segments):
        feeds = random_feeds(step, rng)
        run = segment_runner(model, step, device)
        sim_times, golden_times, (outputs, cycles), values = interleaved(
            lambda: run(feeds), lambda: run_reference(ops, feeds), args.repeats)
        sim_s, golden_s = statistics.median(sim_times), statistics.median(golden_times)
        same = all(np.array_equal(outputs[n].reshape(-1), values[n].reshape(-1))
                   for n in step.outputs)
        exact &= same
        sim_total += sim_s
        golden_total += golden_s
        rows.append([step.name, str(len(ops)), f"{len(step.program.program.instructions):,}",
                     f"{cycles:,}", f"{sim_times[0]:.3f}", f"{sim_s:.3f}", f"{golden_s:.3f}",
                     f"{sim_s / golden_s:.2f}", "yes" if same else "NO"])
        first_total += sim_times[0]
        if args.profile:
            print(f"cProfile of one simulator run of {step.name}:")
            print(profile_run(lambda: run(feeds), args.profile))
    ratio = sim_total / golden_total
    rows.append(["total", "", "", "", f"{first_total:.3f}", f"{sim_total:.3f}",
                 f"{golden_total:.3f}",
                 f"{ratio:.2f}", "yes" if exact else "NO"])
    print(f"{args.model} on {config.name!r}, medians of {args.repeats} runs, one process")
    print(table(["segment", "ops", "instructions", "cycles", "sim first s", "sim s",
                 "golden s", "sim/golden", "outputs equal"], rows, args.markdown))
    met = exact and ratio <= TARGET_RATIO
    print(f"\nsim/golden {ratio:.2f} (target <= {TARGET_RATIO:g}): "
          + ("met" if met else "MISSED" if exact else "OUTPUTS DIFFER"))
    model.close()
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
