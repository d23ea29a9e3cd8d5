"""The ``tessera prune`` command: :func:`tessera.compress.prune` on an ONNX file.

Kept apart from :mod:`tessera.cli` (which registers it) to keep each module small.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from .config import DEFAULT_PRESET, PRESETS
from .progress import StageLines

__all__ = ["add_compress_commands"]


def add_compress_commands(sub: Any) -> None:
    """Register ``prune``."""
    from .cli import _Items, _usage_with_model_required
    p = sub.add_parser("prune", help="prune a float ONNX model's weights to accelerator "
                                     "blocks or N:M groups, each layer's sparsity chosen "
                                     "against the output error on calibration data")
    # nargs="?": a list option may swallow the model path, tessera.cli takes it back
    p.add_argument("model", nargs="?", help="a float ONNX model")
    p.set_defaults(parser=p, func=_cmd_prune)
    p.add_argument("-o", "--output", metavar="OUT.onnx",
                   help="the pruned model (default: MODEL-pruned.onnx beside the model)")
    p.add_argument("--pattern", default="block",
                   help="block (the accelerator's GEMM weight blocks of --config; default) "
                        "or an N:M pattern: 2:4, 4:8, 1:4, 2:8")
    p.add_argument("--sparsity", type=float, metavar="S",
                   help="fraction of the prunable MACs to remove (e.g. 0.75)")
    p.add_argument("--error-budget", type=float, metavar="E",
                   help="summed per-layer output error allowed (relative RMS against the "
                        "unpruned model, e.g. 0.05)")
    p.add_argument("--config", default=DEFAULT_PRESET,
                   help=f"config whose weight blocks --pattern block prunes: a preset "
                        f"({', '.join(PRESETS)}) or config JSON file (default {DEFAULT_PRESET})")
    p.add_argument("--calibration", nargs="+", action=_Items, metavar="FILE",
                   help="samples the error is measured on: .npz files of arrays named as "
                        "the inputs, one sample or a stack each (default: a few random normal "
                        "samples)")
    p.add_argument("--strategy", choices=("dp", "uniform"), default="dp",
                   help="dp: per-layer sparsities chosen by a DP over measured errors "
                        "(default); uniform: every layer pruned to --sparsity")
    p.add_argument("--skip", nargs="+", action=_Items, metavar="NODE",
                   help="layers (node names) to leave dense")
    _usage_with_model_required(p)


class _Stages:
    """``progress(stage, done, total)`` as stage lines with the elapsed time on stderr
    (:class:`tessera.progress.StageLines`), and a bar per stage on a terminal."""

    def __init__(self, label: str) -> None:
        from .cli import _StageProgress
        self.lines = StageLines(label)
        self.bars = _StageProgress(label)

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.bars(stage, done, total)
        if stage == "done":
            self.lines.close()
        else:
            self.lines.stage(stage + (f" ({total})" if total > 1 else ""))

    def close(self) -> None:
        """End the bars, and the lines: ``stopped after`` unless the work said done."""
        self.bars.close()
        self.lines.close(failed=True)


def _cmd_prune(args: argparse.Namespace) -> int:
    from .cli_inputs import calibration_samples, input_ranks
    from .compress import prune
    from .compress.inputs import load_model
    proto = load_model(args.model)
    calibration = (calibration_samples(args.calibration, input_ranks(proto, None))
                   if args.calibration else None)
    stages = _Stages(f"pruning {Path(args.model).name}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # said above, in CLI terms
            result = prune(proto, pattern=args.pattern, sparsity=args.sparsity,
                           error_budget=args.error_budget, calibration=calibration,
                           config=args.config, strategy=args.strategy, skip=args.skip or (),
                           progress=stages)
    finally:
        stages.close()
    out = Path(args.output or Path(args.model).with_name(Path(args.model).stem
                                                         + "-pruned.onnx"))
    print(result)
    if result.random_calibration:
        print("no --calibration given: the errors are measured on random normal inputs, "
              "not on your data", file=sys.stderr)
    result.save(out)
    print(f"wrote {out} ({out.stat().st_size:,} bytes) in {result.seconds['total']:.1f} s")
    return 0
