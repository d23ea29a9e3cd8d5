"""The ``tessera`` command line."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from .config import DEFAULT_PRESET, PRESETS, get_config
from .errors import TesseraError


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_PRESET,
                   help=f"preset ({', '.join(PRESETS)}) or config JSON file (default: {DEFAULT_PRESET})")


def _cmd_demo(args: argparse.Namespace) -> int:
    import numpy as np

    from .kernels.gemm import gemm_program, plan_gemm, read_result, reference_gemm
    from .sim import simulate

    config = get_config(args.config)
    m = n = k = args.size
    epilogue = [("SHR", args.shift)] if args.shift else []
    rng = np.random.default_rng(args.seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    plan = plan_gemm(config, m, n, k, args.threads, len(epilogue))
    print(f"Tessera demo: int8 GEMM {m}x{n}x{k}" + (f", then SHR {args.shift}" if args.shift else "")
          + f", on the cycle-level simulator (config {config.name!r}, "
          f"{config.batch}x{config.block_in}x{config.block_out} core, {config.clock_mhz:g} MHz)")
    print(f"tiles {plan.tile_m * config.batch}x{plan.tile_n * config.block_out}, "
          f"{plan.threads} virtual thread(s)")
    program = gemm_program(config, a, b, epilogue=epilogue, threads=args.threads, plan=plan)
    t0 = time.perf_counter()
    result = simulate(program, trace=bool(args.trace))
    wall = time.perf_counter() - t0
    got = read_result(config, result, program, m, n)
    want = reference_gemm(config, a, b, epilogue)
    mismatches = int((got != want).sum())
    print(f"{len(program.instructions)} instructions simulated in {wall:.3f} s")
    print(f"result check against numpy: {'bit-exact' if not mismatches else f'{mismatches} MISMATCHES'}"
          f" ({m * n} outputs)")
    print()
    print(result.stats.table())
    if args.trace:
        result.write_trace(args.trace)
        print(f"\ntrace written to {args.trace} (open it in https://ui.perfetto.dev)")
    return 0 if not mismatches else 1


def _cmd_isa(args: argparse.Namespace) -> int:
    from .isa import ALU_OPS, get_isa

    config = get_config(args.config)
    print(get_isa(config).field_table())
    print("\nALU ops: " + ", ".join(f"{op.name}={op.opcode}" for op in ALU_OPS)
          + f" (free: {ALU_OPS.free_opcodes()})")
    return 0


def _cmd_asm(args: argparse.Namespace) -> int:
    from .isa.asm import parse_program

    config = get_config(args.config) if args.config else None
    try:
        text = Path(args.input).read_text()
    except OSError as exc:
        raise TesseraError(f"cannot read {args.input}: {exc.strerror}") from None
    program = parse_program(text, config=config)
    out = args.output or str(Path(args.input).with_suffix(".tsp"))
    program.save(out)
    print(f"{out}: {len(program.instructions)} instructions, {len(program.segments)} segments "
          f"(config {program.config.name!r})")
    return 0


def _cmd_disasm(args: argparse.Namespace) -> int:
    from .isa import Program
    from .isa.asm import format_program

    text = format_program(Program.load(args.input))
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    import json

    from .isa import Program
    from .sim import simulate

    program = Program.load(args.program)
    result = simulate(program, trace=bool(args.trace))
    if args.json:
        print(json.dumps(result.stats.to_dict(), indent=2))
    else:
        print(result.stats.table())
    if args.trace:
        result.write_trace(args.trace)
    if args.dump:
        Path(args.dump).write_bytes(result.dram.tobytes())
    return 0


def _require_hw():
    """The hardware layer, or a clear error when the ``hw`` extra is missing."""
    try:
        import amaranth  # noqa: F401
    except ImportError:
        raise TesseraError("the hardware commands need Amaranth: install the hw extra, "
                           "pip install -e \".[hw]\"") from None
    from . import hw
    return hw


def _cmd_hw_verilog(args: argparse.Namespace) -> int:
    _require_hw()
    from .hw import export

    config = get_config(args.config)
    paths = export.write(config, args.output)
    for path in paths:
        print(f"wrote {path}")
    return 0


def _cmd_hw_resources(args: argparse.Namespace) -> int:
    import json

    _require_hw()
    from .hw import export, resources

    config = get_config(args.config)
    part = args.part or config.part
    print(f"synthesising config {config.name!r} for {part} with yosys synth_xilinx "
          "(a few minutes for the large presets)...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    report = resources.synthesize(export.verilog(config), export.TOP_NAME, part)
    took = time.perf_counter() - t0
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"config {config.name!r} on {part} ({took:.0f} s of synthesis)")
        print(report.table())
    return 0 if report.fits else 1


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="tessera", description=(
        "Tessera: FPGA deep-learning accelerator co-design toolkit"))
    parser.add_argument("--version", action="version", version=f"tessera {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="run a GEMM on the simulator and check it against numpy")
    _config_arg(p)
    p.add_argument("--size", type=int, default=256, help="M = N = K (default 256)")
    p.add_argument("--threads", type=int, default=2, choices=(1, 2), help="virtual threads")
    p.add_argument("--shift", type=int, default=8,
                   help="requantize with SHR by this amount, 0 for none (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace JSON")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("isa", help="print the instruction encoding table of a config")
    _config_arg(p)
    p.set_defaults(func=_cmd_isa)

    p = sub.add_parser("asm", help="assemble a program text file into a program file (.tsp)")
    p.add_argument("input")
    p.add_argument("-o", "--output", help="output file (default: input with .tsp)")
    p.add_argument("--config", default=None,
                   help="config for a text without a .config line (preset or JSON file)")
    p.set_defaults(func=_cmd_asm)

    p = sub.add_parser("disasm", help="print a program file (.tsp) as assembly text")
    p.add_argument("input")
    p.add_argument("-o", "--output", help="write to this file instead of standard output")
    p.set_defaults(func=_cmd_disasm)

    p = sub.add_parser("sim", help="run a program file on the cycle-level simulator")
    p.add_argument("program")
    p.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace JSON")
    p.add_argument("--json", action="store_true", help="print statistics as JSON")
    p.add_argument("--dump", metavar="FILE", help="write the final DRAM image")
    p.set_defaults(func=_cmd_sim)

    hw = sub.add_parser("hw", help="hardware: Verilog export and resource estimates")
    hw_sub = hw.add_subparsers(dest="hw_command", required=True, metavar="HW_COMMAND")
    p = hw_sub.add_parser("verilog", help="write the accelerator's Verilog and its register "
                                          "map/ports as JSON")
    _config_arg(p)
    p.add_argument("-o", "--output", default=".", metavar="DIR", help="output directory")
    p.set_defaults(func=_cmd_hw_verilog)
    p = hw_sub.add_parser("resources", help="synthesise with yosys (synth_xilinx) and print "
                                            "LUT/FF/DSP/BRAM use against the part")
    _config_arg(p)
    p.add_argument("--part", help="FPGA part (default: the config's part)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_hw_resources)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tessera`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TesseraError as exc:
        print(f"tessera {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
