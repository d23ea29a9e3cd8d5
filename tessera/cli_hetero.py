"""The ``tessera`` commands of CPU + accelerator scheduling: ``stream`` (a sequence of
frames, pipelined) and ``calibrate-host`` (this machine's host cost model), and the
board-schedule outputs ``profile`` shares (``--board-timeline``, ``--board-trace``).

Kept apart from :mod:`tessera.cli` (which registers them) to keep each module small;
the model commands' helpers are imported from it when a command runs.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from .errors import TesseraError

__all__ = ["add_hetero_commands", "host_args", "write_board_files"]


def host_args(p: argparse.ArgumentParser) -> None:
    """``--host`` and ``--placement``: what the placement assumes and optimises."""
    p.add_argument("--host", metavar="NAME|FILE.json",
                   help="the board CPU's cost model: cortex-a9 (PYNQ-Z1/Z2), cortex-a53 "
                        "(ZCU104), local (measured by tessera calibrate-host) or a file "
                        "(default: the config's board)")
    p.add_argument("--placement", choices=("dp", "greedy", "cpu"), default="dp",
                   help="dp: the placement minimising the projected latency (default); "
                        "greedy: node by node; cpu: everything the CPU can run on the CPU")


def board_args(p: argparse.ArgumentParser) -> None:
    """The board-schedule outputs of ``profile`` and ``stream``."""
    p.add_argument("--board-timeline", metavar="PNG",
                   help="write the projected board schedule (CPU cores, accelerator) as a PNG")
    p.add_argument("--board-trace", metavar="FILE",
                   help="write the projected board schedule as a Perfetto trace JSON")


def write_board_files(args: argparse.Namespace, profile) -> None:
    """Write the board timeline/trace a command was asked for."""
    if getattr(args, "board_timeline", None):
        print(f"board timeline written to {profile.write_board_timeline(args.board_timeline)}")
    if getattr(args, "board_trace", None):
        print(f"board Perfetto trace written to {profile.write_board_perfetto(args.board_trace)}")


def add_hetero_commands(sub: Any) -> None:
    """Register ``stream`` and ``calibrate-host``."""
    from .cli import _model_args, _positive, _run_args, _usage_with_model_required
    p = sub.add_parser("stream", help="run a sequence of frames through a model, pipelined "
                                      "(stage k of frame f beside stage k+1 of frame f-1), "
                                      "and print throughput and latency")
    _model_args(p)
    _run_args(p)
    p.add_argument("--frames", type=_positive, default=8,
                   help="frames to run (default 8; random ones unless --inputs)")
    p.add_argument("--sequential", action="store_true",
                   help="one frame after the other, one step at a time (for comparison)")
    board_args(p)
    p.set_defaults(func=_cmd_stream)
    _usage_with_model_required(p)

    p = sub.add_parser("calibrate-host", help="measure this machine's CPU kernels, copies and "
                                              "accelerator launches; write its host model")
    p.add_argument("-o", "--output", metavar="FILE.json",
                   help="where to write it (default: where --host local finds it)")
    p.add_argument("--backend", choices=("sim", "pynq"), default="sim",
                   help="device whose launch cost is measured: pynq on a board; sim "
                        "(default) measures the simulator's host-side overhead")
    p.add_argument("--quick", action="store_true", help="few, small kernels (seconds)")
    p.set_defaults(func=_cmd_calibrate_host)


def _stream_frames(args: argparse.Namespace, model) -> list[dict]:
    """Per-frame feeds: from --inputs (each array with a leading frame axis), else random
    (the model's state inputs left to the stream: zero, then carried)."""
    from .cli_inputs import input_feeds, random_feeds
    if args.inputs:
        stacked = input_feeds(args.inputs)
        counts = {name: len(a) for name, a in stacked.items()}
        if len(set(counts.values())) != 1:
            raise TesseraError(f"--inputs arrays hold different numbers of frames {counts}; "
                               "give each input one array with a leading frame axis")
        return [{n: a[f] for n, a in stacked.items()} for f in range(next(iter(counts.values())))]
    carried = set(model.compiled.state)
    inputs = [t for t in model.inputs if t.name not in carried]
    return [random_feeds(inputs, args.seed + f) for f in range(args.frames)]


def _cmd_stream(args: argparse.Namespace) -> int:
    from .cli import _StageProgress, _compile
    model = _compile(args)
    frames = _stream_frames(args, model)
    bar = _StageProgress(f"streaming {len(frames)} frames on {args.backend}")
    try:
        result = model.stream(frames, backend=args.backend, pipelined=not args.sequential,
                              host=args.host, progress=bar)
    finally:
        bar.close()
        model.close()
    print(result.table())
    write_board_files(args, result.profile)
    return 0


def _cmd_calibrate_host(args: argparse.Namespace) -> int:
    from .hostmodel import local_host_path
    from .runtime.calibrate import calibrate_host, describe

    started = time.perf_counter()

    def report(line: str) -> None:
        print(f"  [{time.perf_counter() - started:5.1f} s] {line}", flush=True)

    print("measuring this machine's CPU kernels, copies and launches"
          + (" (quick)" if args.quick else " (a minute or two; --quick for seconds)"),
          flush=True)
    model = calibrate_host(quick=args.quick, backend=args.backend, progress=report)
    path = model.save(args.output or local_host_path())
    print(describe(model))
    print(f"wrote {path} (use it with --host " + ("local" if args.output is None
                                                  else str(path)) + ")")
    return 0
