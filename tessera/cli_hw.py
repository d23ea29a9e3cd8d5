"""The ``tessera hw`` commands: Verilog export, yosys resource estimates, bitstreams.

Kept apart from :mod:`tessera.cli` (which registers them) to keep each module small. Each
command checks its arguments (config, part, board, output folder) before the work that
takes minutes, and reports that work as stage lines with the elapsed time
(:class:`tessera.progress.StageLines`).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .boards import BOARDS
from .config import HwConfig, get_config
from .errors import CLI, PYTHON, ConfigError, TesseraError
from .extras import missing_extra_error
from .progress import StageLines

if TYPE_CHECKING:
    from .hw.synth.resources import ResourceReport

__all__ = ["add_hw_commands"]


def add_hw_commands(sub: Any) -> None:
    """Register ``hw`` with its subcommands ``verilog``, ``resources``, ``bitstream``."""
    from .cli import _config_arg, _help_by_default
    hw = sub.add_parser("hw", help="hardware: Verilog export, resource estimates and "
                                   "bitstreams")
    _help_by_default(hw)
    hw_sub = hw.add_subparsers(dest="hw_command", metavar="HW_COMMAND")
    p = hw_sub.add_parser("verilog", help="write the accelerator's Verilog and its register "
                                          "map/ports as JSON")
    _config_arg(p)
    p.add_argument("-o", "--output", default=".", metavar="DIR", help="output directory")
    p.set_defaults(func=_cmd_hw_verilog)
    p = hw_sub.add_parser("resources", help="synthesise with yosys (synth_xilinx) and print "
                                            "LUT/FF/DSP/BRAM use against the part (cached)")
    _config_arg(p)
    p.add_argument("--part", help="FPGA part (default: the config's part)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-cache", action="store_true",
                   help="synthesise again even if this config, part and yosys version were "
                        "synthesised before")
    p.set_defaults(func=_cmd_hw_resources)
    p = hw_sub.add_parser("bitstream", help="write the Vivado project for a board, build the "
                                            "bitstream when Vivado is on the PATH and install "
                                            "it where the pynq backend finds it")
    p.add_argument("--board", required=True, choices=sorted(BOARDS), help="the board")
    _config_arg(p)
    p.add_argument("-o", "--output", metavar="DIR",
                   help="project folder (default: ./tessera-<board>-<config-id>)")
    p.add_argument("--vivado", metavar="PATH", help="the Vivado executable (default: vivado "
                                                   "on the PATH)")
    p.add_argument("--install", metavar="DIR", help="install the bitstream of a project folder "
                                                   "Vivado ran elsewhere instead of building")
    p.set_defaults(func=_cmd_hw_bitstream)


def _require_hw() -> None:
    """Raise a clear error when the ``hw`` extra (Amaranth) is missing."""
    if importlib.util.find_spec("amaranth") is None:
        raise (missing_extra_error(ModuleNotFoundError(name="amaranth"))
               or TesseraError("the hardware commands need Amaranth, of the hw extra"))


def _output_folder(path: str) -> Path:
    """``path`` as a folder to write into, refused at once when it is a file."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise TesseraError(f"output {str(folder)!r} is a file, not a folder",
                           fix={PYTHON: "give a folder to write into",
                                CLI: "give a folder with -o DIR"})
    return folder


def _cmd_hw_verilog(args: argparse.Namespace) -> int:
    config = get_config(args.config)
    folder = _output_folder(args.output)
    _require_hw()
    from .hw.synth import export
    with StageLines(f"hw verilog {config.name!r}") as lines:
        paths = export.write(config, folder, lines.stage)
    for path in paths:
        print(f"wrote {path}")
    return 0


def _checked_part(config: HwConfig, part: str | None) -> str:
    """The part to synthesise for (``--part`` or the config's), known to yosys and to the
    capacity table; checked before minutes of synthesis."""
    from .hw.synth.resources import family_of, part_capacity
    chosen = part or config.part
    try:
        family_of(chosen)
        part_capacity(chosen)
    except ConfigError as exc:
        raise ConfigError(str(exc), fix={CLI: "give a known part with --part, e.g. "
                                               "--part xc7z020"}) from None
    return chosen


def _cmd_hw_resources(args: argparse.Namespace) -> int:
    config = get_config(args.config)
    part = _checked_part(config, args.part)
    report, how = _resource_report(config, part, args.no_cache)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"config {config.name!r} on {part} ({how})")
        print(report.table())
    return 0 if report.fits else 1


def _resource_report(config: HwConfig, part: str, no_cache: bool) -> tuple[ResourceReport, str]:
    """``(report, how)``: the cached report of ``config`` on ``part``, else a new
    synthesis (stored for the next call); ``how`` says which."""
    _require_hw()
    from .hw.harness.verilator_build import source_key
    from .hw.synth import export, resource_cache
    key = resource_cache.cache_key(source_key(export.design_config(config)), export.TOP_NAME,
                                   part)
    report = None if no_cache else resource_cache.load(key)
    if report is not None:
        return report, ("cached: synthesised before with the same sources and yosys; "
                        "--no-cache to run it again")
    with StageLines(f"hw resources {config.name!r} on {part}") as lines:
        report, synthesized = resource_cache.synthesize_and_store(
            config, part, key, lines.stage, reuse=not no_cache)
    return report, ("synthesised now" if synthesized else "cached: the same Verilog was "
                    "synthesised before (sources changed elsewhere); --no-cache to run it again")


def _cmd_hw_bitstream(args: argparse.Namespace) -> int:
    if args.install:
        # installing a project Vivado ran elsewhere needs neither Amaranth nor Vivado
        from .bitstreams.build import install_build
        result = install_build(args.install, args.board, get_config(args.config))
    else:
        _require_hw()
        from .bitstreams.build import build_bitstream
        config = get_config(args.config)
        BOARDS[args.board].check(config)      # before the stage lines say work started
        with StageLines(f"hw bitstream {args.board}") as lines:
            lines.stage("exporting the Verilog and writing the Vivado project")
            result = build_bitstream(args.board, config, output=args.output,
                                     vivado=args.vivado,
                                     progress=lambda stage, done, total:
                                     lines.stage(f"Vivado {stage}"))
    # Without Vivado the project folder is the documented outcome: exit 0 and say what next
    print(result.message)
    return 0
