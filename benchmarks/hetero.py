"""CPU and accelerator scheduled together (issue 17's acceptance): one model, five
schedules, projected on a board's host model, side by side in one run.

Usage: python benchmarks/hetero.py [--host cortex-a9] [--frames 6] [--only NAME ...]
                                   [--zoo] [--markdown]

For the zoo's video-captioning model (a CNN encoder and an LSTM decoder carrying its
state from frame to frame, the IIS seed's workload) and its Inception-style branchy CNN,
on the ``pynq`` config:

1. **CPU only**: every node the CPU can run on the CPU (``placement="cpu"``), in order and
   (for comparison) with independent kernels on the host's cores at once;
2. **greedy, sequential**: the per-node placement ("cheaper here"), steps in order;
3. **DP, sequential**: the placement minimising the projected latency of the graph;
4. **DP + inter-operator parallelism**: the DP placement, independent steps at once
   (CPU kernels on the host's cores beside the accelerator segment running);
5. **DP + pipelining**: ``Model.stream`` of ``--frames`` frames, stage k of frame f
   beside stage k+1 of frame f-1; frames/s in the steady state.

Every latency is the run's board projection (``Profile.board``): the accelerator's
simulated cycles at the config's clock, the host model's time for every CPU kernel, and
its launch and transfer costs, scheduled on the host's cores and the one accelerator
(:func:`tessera.schedule.list_schedule`). Not this machine's CPU time. Each schedule's
outputs are compared with the DP sequential run's (they must be bit-identical), and
the stream's frames with frame-by-frame runs.

``--zoo`` adds greedy against DP on the other zoo models (projected sequential latency);
``--published`` greedy and DP, sequential and parallel, on published branchy models with
host work (YOLOX, PicoDet; fetched into the test cache on first use).
``--markdown`` prints markdown tables for docs/models.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tessera  # noqa: E402
from tessera.compiler import zoo  # noqa: E402
from tessera.hostmodel import get_host_model  # noqa: E402

from benchmarks.tables import table  # noqa: E402

MODELS = ("captioning", "inception")
ZOO_MODELS = ("mlp", "lenet", "small_resnet", "mobilenet", "resnet18")
CONFIG = "pynq"

#: The IIS figures the targets come from (references.md, section 6).
IIS_PIPELINE_SPEEDUP = 54.9
PARALLEL_TARGET = 1.3


@dataclass
class Schedules:
    """One model's five schedules: projected seconds (and fps), and the checks."""

    name: str
    cpu_only: float = 0.0
    cpu_parallel: float = 0.0
    greedy: float = 0.0
    dp: float = 0.0
    parallel: float = 0.0
    fps: float = 0.0
    frame_latency: float = 0.0
    identical: bool = True
    notes: list[str] = field(default_factory=list)
    profiles: dict = field(default_factory=dict)

    @property
    def cpu_fps(self) -> float:
        return 1.0 / self.cpu_only


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _feeds(net, frames: int) -> tuple[dict, list[dict]]:
    """One feed for the single runs; ``frames`` per-frame feeds (state inputs left out:
    the stream carries them)."""
    state = set(zoo.recurrent_state(net))
    feeds = zoo.calibration_data(net, frames, seed=7)
    return feeds[0], [{k: v for k, v in f.items() if k not in state} for f in feeds]


def measure(name: str, host, frames: int) -> Schedules:
    """Compile ``name`` three ways and run the five schedules."""
    net = zoo.ZOO[name]()
    calibration = zoo.calibration_data(net)
    feed, stream_feeds = _feeds(net, frames)
    result = Schedules(name)
    models = {how: tessera.compile(net, CONFIG, calibration=calibration, host=host,
                                   placement=how) for how in ("cpu", "greedy", "dp")}
    reference, prof = models["dp"].run(feed, host=host)
    result.dp, result.profiles["dp"] = prof.latency_seconds, prof
    for how, attr, parallel in (("cpu", "cpu_only", False), ("cpu", "cpu_parallel", True),
                                ("greedy", "greedy", False), ("dp", "parallel", True)):
        out, prof = models[how].run(feed, host=host, parallel=parallel)
        setattr(result, attr, prof.latency_seconds)
        result.profiles[attr] = prof
        if not _same(out, reference):
            result.identical = False
            result.notes.append(f"{attr} outputs differ from DP sequential")
    streamed = models["dp"].stream(stream_feeds, host=host)
    result.fps = streamed.fps
    result.frame_latency = float(np.median(streamed.frame_latencies))
    result.profiles["stream"] = streamed.profile
    one_by_one = models["dp"].stream(stream_feeds, host=host, pipelined=False)
    if not all(_same(a, b) for a, b in zip(streamed.outputs, one_by_one.outputs)):
        result.identical = False
        result.notes.append("pipelined frames differ from frame-by-frame runs")
    for m in models.values():
        m.close()
    return result


_HEAD = ("model", "CPU only", "CPU only + parallel", "greedy, seq.", "DP, seq.",
         "DP + parallel", "DP + pipelining", "DP vs greedy", "parallel vs DP seq.",
         "pipelined fps / CPU-only fps", "outputs identical")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def schedule_rows(results: list[Schedules]) -> list[list[str]]:
    rows = []
    for r in results:
        rows.append([r.name, f"{_ms(r.cpu_only)} ({r.cpu_fps:.2f} fps)",
                     f"{_ms(r.cpu_parallel)} ({r.cpu_only / r.cpu_parallel:.2f}x)", _ms(r.greedy),
                     _ms(r.dp), _ms(r.parallel),
                     f"{r.fps:.2f} fps (frame latency {_ms(r.frame_latency)})",
                     f"{r.greedy / r.dp:.2f}x", f"{r.dp / r.parallel:.2f}x",
                     f"{r.fps / r.cpu_fps:.1f}x", "yes" if r.identical else
                     "NO: " + "; ".join(r.notes)])
    return rows


def breakdown_rows(results: list[Schedules]) -> list[list[str]]:
    """Where each single-frame schedule's time goes on the board."""
    rows = []
    for r in results:
        for label, key in (("CPU only", "cpu_only"), ("CPU only + parallel", "cpu_parallel"),
                           ("greedy", "greedy"), ("DP", "dp"), ("DP + parallel", "parallel")):
            b = r.profiles[key].board
            rows.append([r.name, label, _ms(b.accel_seconds), _ms(b.cpu_seconds),
                         _ms(b.overhead_seconds), _ms(b.sequential_seconds),
                         _ms(b.latency_seconds)])
    return rows


_BREAKDOWN_HEAD = ("model", "schedule", "accelerator", "board CPU", "launch/transfer",
                   "sum", "latency (scheduled)")


def zoo_rows(host) -> list[list[str]]:
    """Greedy against DP on the other zoo models: projected sequential latency of one
    run each (the simulator's cycles, the host model's CPU time)."""
    rows = []
    for name in ZOO_MODELS:
        net = zoo.ZOO[name]()
        calibration = zoo.calibration_data(net)
        feed = zoo.calibration_data(net, 1, seed=7)[0]
        got = {}
        for how in ("greedy", "dp"):
            m = tessera.compile(net, CONFIG, calibration=calibration, host=host, placement=how)
            out, prof = m.run(feed, host=host)
            got[how] = (prof.latency_seconds, m.compiled.stats["segments"],
                        m.compiled.stats["nodes"]["cpu"], out)
            m.close()
        g, d = got["greedy"], got["dp"]
        rows.append([name, f"{_ms(g[0])} ({g[1]} seg., {g[2]} CPU nodes)",
                     f"{_ms(d[0])} ({d[1]} seg., {d[2]} CPU nodes)", f"{g[0] / d[0]:.2f}x",
                     "yes" if _same(g[3], d[3]) else "NO"])
    return rows


_ZOO_HEAD = ("model", "greedy", "DP", "DP vs greedy", "outputs identical")

#: Published branchy models with host work (tests/models/cases.py, fetched into the test
#: cache on first use): YOLOX's detection heads, PicoDet's.
PUBLISHED = ("common_det", "layout_cdla")


def published_rows(host) -> list[list[str]]:
    """Greedy and DP, sequential and parallel, on published models whose host ops
    (slices, resizes, concatenations the accelerator cannot do in place) give the CPU
    work beside the accelerator."""
    from tests.models.cases import MODELS as WHEEL_MODELS
    rows = []
    for case in (c for c in WHEEL_MODELS if c.name in PUBLISHED):
        feeds = case.feeds()
        got = {}
        for how in ("greedy", "dp"):
            m = tessera.compile(str(case.path), CONFIG, calibration=feeds.calibration,
                                input_shapes=dict(case.input_shapes), host=host,
                                placement=how)
            for parallel in (False, True):
                out, prof = m.run(feeds.check, host=host, parallel=parallel)
                got[how, parallel] = (prof.latency_seconds, out,
                                      m.compiled.stats["segments"])
            m.close()
        seq, par = got["dp", False], got["dp", True]
        same = all(_same(v[1], seq[1]) for v in got.values())
        rows.append([case.name, f"{_ms(got['greedy', False][0])} "
                                f"({got['greedy', False][2]} seg.)",
                     f"{_ms(seq[0])} ({seq[2]} seg.)", _ms(par[0]),
                     f"{got['greedy', False][0] / seq[0]:.3f}x", f"{seq[0] / par[0]:.2f}x",
                     "yes" if same else "NO"])
    return rows


_PUBLISHED_HEAD = ("model", "greedy, seq.", "DP, seq.", "DP + parallel", "DP vs greedy",
                   "parallel vs DP seq.", "outputs identical")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="cortex-a9", help="host model (default cortex-a9: "
                                                       "PYNQ-Z1/Z2)")
    ap.add_argument("--frames", type=int, default=6, help="frames of the pipelined stream")
    ap.add_argument("--only", nargs="*", choices=MODELS, help="models (default: both)")
    ap.add_argument("--zoo", action="store_true", help="greedy vs DP on the other zoo models")
    ap.add_argument("--published", action="store_true",
                    help=f"also the published models {', '.join(PUBLISHED)} (minutes)")
    ap.add_argument("--markdown", action="store_true", help="markdown tables")
    ap.add_argument("--timeline", metavar="PNG",
                    help="write the first model's pipelined stream as a board timeline")
    args = ap.parse_args()
    host = get_host_model(args.host)
    results = []
    for name in args.only or MODELS:
        started = time.perf_counter()
        results.append(measure(name, host, args.frames))
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.timeline:
        results[0].profiles["stream"].write_board_timeline(args.timeline, width=1800)
    print(f"Projected on host model {host.name!r} ({host.cpu}), config {CONFIG!r}; "
          f"{args.frames} frames streamed. Targets: DP <= greedy; parallel >= "
          f"{PARALLEL_TARGET}x on the branchy CNN; pipelined fps >= {IIS_PIPELINE_SPEEDUP}x "
          "CPU-only fps on the captioning model (the IIS figure).\n")
    print(table(_HEAD, schedule_rows(results), args.markdown))
    print()
    print(table(_BREAKDOWN_HEAD, breakdown_rows(results), args.markdown))
    if args.zoo:
        print()
        print(table(_ZOO_HEAD, zoo_rows(host), args.markdown))
    if args.published:
        print()
        print(table(_PUBLISHED_HEAD, published_rows(host), args.markdown))
    return 0 if all(r.identical for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
