"""The ``tessera`` command line.

One subcommand per ``_cmd_*`` function; :func:`build_parser` lists them. What a model
command is given (shapes, .npz/.npy arrays, calibration files) becomes the Python API's
arguments in :mod:`tessera.cli_inputs`. Errors print as one line with the command-line
form of their advice (:meth:`tessera.errors.TesseraError.describe`), exit status 2;
``tessera`` without a command prints its help and exits 0.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from .cli_compress import add_compress_commands
from .cli_hetero import add_hetero_commands, board_args, host_args, write_board_files
from .cli_hw import add_hw_commands
from .cli_inputs import calibration_samples, input_feeds, input_ranks, parse_shapes, random_feeds
from .cli_output import third_party_output, tune_arg, verbose_arg
from .cli_dse import add_dse_commands
from .cli_zoo import add_zoo_commands
from .config import DEFAULT_PRESET, PRESETS, get_config
from .errors import CLI, TesseraError
from .extras import missing_extra_error


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_PRESET,
                   help=f"preset ({', '.join(PRESETS)}) or config JSON file (default: {DEFAULT_PRESET})")


# ------------------------------------------------------------------ models
class _StageProgress:
    """``progress(stage, done, total)`` callbacks drawn as one bar per stage."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar = None
        self.stage = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        from .progress import Progress
        if stage != self.stage:
            self.close()
            self.stage = stage
            if stage != "done":
                self.bar = Progress(total, f"{self.label}: {stage}")
        if self.bar is not None:
            self.bar.set(done)

    def close(self) -> None:
        if self.bar is not None:
            if self.bar.total:
                self.bar.set(self.bar.total)      # a stage that ended is complete
            self.bar.close()
            self.bar = None


def _calibration(args: argparse.Namespace, proto, shapes) -> list[dict] | None:
    """Calibration feeds from --calibration files or --random-calibration."""
    if args.calibration:
        return calibration_samples(args.calibration, input_ranks(proto, shapes))
    if args.random_calibration:
        from .compiler.frontend.zoo import calibration_data
        return calibration_data(proto, args.random_calibration, input_shapes=shapes)
    return None


def _compile(args: argparse.Namespace):
    import onnx

    from . import compile as compile_model
    path = Path(args.model)
    if not path.exists():
        raise TesseraError(f"model file {str(path)!r} does not exist")
    if path.suffix == ".tsr":
        from . import load
        return load(path)
    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001  (protobuf raises several unrelated types)
        raise TesseraError(f"{str(path)!r} is not an ONNX model: {exc}") from None
    if not proto.HasField("graph"):
        raise TesseraError(f"{str(path)!r} is empty or not an ONNX model (it has no graph)")
    shapes = parse_shapes(args.input_shape)
    bar = _StageProgress(f"compiling {path.name}")
    try:
        with third_party_output(args.verbose):
            return compile_model(proto, args.config,
                                 calibration=_calibration(args, proto, shapes),
                                 input_shapes=shapes, force_cpu=args.force_cpu or (),
                                 progress=bar, activations=args.activations,
                                 pieces=args.pieces, tolerance=args.tolerance, host=args.host,
                                 placement=args.placement,
                                 skip_zero_blocks=not args.dense_weights, tune=args.tune)
    finally:
        bar.close()


def _cmd_compile(args: argparse.Namespace) -> int:
    from .runtime.aot import prebuild, resolve_targets   # CPU kernels ahead of time
    # Checked before the compile, which can take minutes: the config and the CPU targets.
    targets = resolve_targets(args.cpu_targets or ("host", "board"), get_config(args.config))
    model = _compile(args)
    with contextlib.closing(_StageProgress(f"compiling {Path(args.model).name}")) as bar:
        objects = prebuild(model.compiled, targets, bar)
    out = Path(args.output or Path(args.model).with_suffix(".tsr"))
    model.save(out, cpu_targets=())       # prebuilt above, as --cpu-targets asked
    c = model.compiled
    print(model.summary())
    print(f"\n{len(c.placements)} nodes: {c.stats['nodes']['accelerator']} on the accelerator "
          f"in {c.stats['segments']} segment(s), {c.stats['nodes']['cpu']} on the CPU, "
          f"{c.stats['nodes']['view']} views; compiled in {c.compile_seconds:.2f} s")
    if objects:
        print(f"CPU kernels compiled for {', '.join(objects)} in {sum(objects.values()):.1f} s")
    print(f"wrote {out} ({out.stat().st_size:,} bytes, config {model.config.name!r})")
    return 0


def _model_inputs(args: argparse.Namespace, model) -> dict:
    if args.inputs:
        return input_feeds(args.inputs)
    print("no --inputs given: running on random inputs", file=sys.stderr)
    return random_feeds(model.inputs, args.seed)


def _run(args: argparse.Namespace, model):
    bar = _StageProgress(f"running on {args.backend}")
    options = {"bitstream": args.bitstream} if getattr(args, "bitstream", None) else {}
    try:
        device = model.device(args.backend, **options)
        with third_party_output(args.verbose):
            return model.run(_model_inputs(args, model), device=device, progress=bar,
                             parallel=args.parallel, host=args.host)
    finally:
        bar.close()
        model.close()


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np
    model = _compile(args)
    outputs, profile = _run(args, model)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}  min {value.min():.6g}  "
              f"max {value.max():.6g}" + (f"  argmax {int(np.argmax(value))}"
                                           if value.size > 1 else ""))
    b = profile.board
    print(f"accelerator {profile.accel_cycles:,} cycles ({profile.accel_seconds * 1e3:.3f} ms at "
          f"{model.config.clock_mhz:g} MHz); projected latency on the board "
          f"{b.latency_seconds * 1e3:.3f} ms (host model {b.host!r}); {args.backend} wall "
          f"time {profile.wall_seconds:.2f} s")
    _say_if_accelerator_idle(model)
    if args.output:
        np.savez(args.output, **outputs)
        print(f"wrote {args.output}")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    import json
    model = _compile(args)
    _, profile = _run(args, model)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=1))
    else:
        print(profile.table())
        _say_if_accelerator_idle(model)
    _write_profile_files(args, profile)
    write_board_files(args, profile)
    return 0


#: Placement reasons :func:`_say_if_accelerator_idle` quotes (the summary has them all).
_IDLE_REASONS = 5


def _say_if_accelerator_idle(model) -> None:
    """Say so when no node of ``model`` ran on the accelerator, and why (its 0 cycles
    alone read like a measurement)."""
    placements = model.compiled.placements
    if any(p.target == "accelerator" for p in placements):
        return
    kept = [p for p in placements if p.target == "cpu"]
    print(f"nothing ran on the accelerator: no node was placed there (config "
          f"{model.config.name!r}); why, for the nodes on the CPU:")
    for p in kept[:_IDLE_REASONS]:
        print(f"  {p.node} ({p.op}): {p.reason}")
    if len(kept) > _IDLE_REASONS:
        print(f"  ... and {len(kept) - _IDLE_REASONS} more (tessera compile prints every "
              "placement)")


def _write_profile_files(args: argparse.Namespace, profile) -> None:
    if getattr(args, "timeline", None):
        print(f"timeline written to {profile.write_timeline(args.timeline)}")
    if getattr(args, "trace", None):
        print(f"Perfetto trace written to {profile.write_perfetto(args.trace)} "
              "(open it in https://ui.perfetto.dev)")


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.gemm:
        return _gemm_demo(args)
    import numpy as np

    from . import compile as compile_model
    from .compiler.frontend import zoo
    from .compiler.golden.check import int8_agreement, output_scales, reference_outputs
    config = get_config(args.config)
    t0 = time.perf_counter()
    model = zoo.ZOO[args.model]()
    print(f"Tessera demo: {args.model} ({zoo.parameter_count(model):,} parameters, "
          f"{zoo.mac_count(model):,} MACs) built from numpy weights, quantized to int8 with "
          f"onnxruntime's PTQ, compiled for {config.name!r}, run on the simulator, checked "
          "against onnxruntime")
    bar = _StageProgress("compiling")
    try:
        with third_party_output(args.verbose):
            compiled = compile_model(model, config, calibration=zoo.calibration_data(model),
                                     progress=bar)
    finally:
        bar.close()
    c = compiled.compiled
    print(f"compiled in {c.compile_seconds:.2f} s: {c.stats['nodes']['accelerator']} nodes on "
          f"the accelerator ({c.stats['segments']} program(s)), {c.stats['nodes']['cpu']} on "
          "the CPU")
    x = zoo.calibration_data(model, 1, seed=args.seed)[0]
    bar = _StageProgress("simulating")
    try:
        outputs, profile = compiled.run(x, backend="sim", progress=bar)
    finally:
        bar.close()
    reference = reference_outputs(c.reference, x)
    scales = output_scales(c.reference)
    ok = True
    for name, ours in outputs.items():
        agree = int8_agreement(ours, reference[name], scales[name])
        ok &= agree.fraction >= 0.999 and agree.max_steps <= 1
        print(f"{name} vs onnxruntime: {agree}; top-1 {int(np.argmax(ours))} "
              f"(onnxruntime {int(np.argmax(reference[name]))})")
    print()
    print(profile.table())
    _write_profile_files(args, profile)
    compiled.close()
    print(f"\ndemo finished in {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1


def _gemm_demo(args: argparse.Namespace) -> int:
    import numpy as np

    from .kernels.gemm import gemm_program, plan_gemm, read_result, reference_gemm
    from .sim import simulate

    config = get_config(args.config)
    m = n = k = args.size
    epilogue = [("SHR", args.shift)] if args.shift else []
    plan = plan_gemm(config, m, n, k, args.threads, len(epilogue))   # checks the sizes
    rng = np.random.default_rng(args.seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
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


def build_parser() -> argparse.ArgumentParser:
    """The ``tessera`` argument parser: one subcommand per function below."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="tessera", description=(
        "Tessera: FPGA deep-learning accelerator co-design toolkit"))
    parser.add_argument("--version", action="version", version=f"tessera {__version__}")
    _help_by_default(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo_command(sub)
    _add_model_commands(sub)
    _add_program_commands(sub)
    add_hw_commands(sub)
    add_hetero_commands(sub)
    add_compress_commands(sub)
    add_zoo_commands(sub)
    add_dse_commands(sub)
    return parser


def _help_by_default(parser: argparse.ArgumentParser) -> None:
    """Without a (sub)command, ``parser`` prints its help and the command exits 0: asking
    ``tessera`` what it does is not an error."""
    parser.set_defaults(func=lambda args: parser.print_help() or 0)


def _positive(text: str) -> int:
    """An argparse type: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


class _Items(argparse.Action):
    """A list option: ``--calibration A.npz B.npz`` or the flag repeated, into one list.

    argparse gives a list option every word up to the next option, so the model path
    written last (``--calibration cal.npz net.onnx``) lands in the list: the option given
    last and how many words it took are kept for :func:`_claim_model` to take it back.
    """

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *values])
        namespace.last_items = (self.dest, len(values))


def _claim_model(args: argparse.Namespace) -> None:
    """Set ``args.model`` from the last word of the list option that swallowed it (it
    took at least two words, or the model was not given at all)."""
    dest, count = getattr(args, "last_items", (None, 0))
    if count < 2:
        args.parser.error("the following arguments are required: model")
    args.model = getattr(args, dest).pop()


def _add_demo_command(sub) -> None:
    """demo: a zoo CNN end to end, or the hand-written GEMM."""
    p = sub.add_parser("demo", help="build a small CNN, quantize, compile, simulate and check "
                                    "it against onnxruntime (--gemm: a hand-written GEMM)")
    _config_arg(p)
    p.add_argument("--model", default="small_resnet", choices=("mlp", "lenet", "small_resnet",
                                                               "mobilenet", "resnet18"),
                   help="zoo model (default small_resnet)")
    p.add_argument("--timeline", metavar="PNG", help="write a timeline of the queues")
    p.add_argument("--gemm", action="store_true",
                   help="the int8 GEMM demo instead (--size, --threads, --shift)")
    p.add_argument("--size", type=_positive, default=256,
                   help="GEMM: M = N = K (default 256)")
    p.add_argument("--threads", type=int, default=2, choices=(1, 2),
                   help="GEMM: virtual threads")
    p.add_argument("--shift", type=int, default=8,
                   help="GEMM: requantize with SHR by this amount, 0 for none (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace JSON")
    verbose_arg(p)
    p.set_defaults(func=_cmd_demo)


def _model_args(p: argparse.ArgumentParser) -> None:
    """The arguments of every command that takes a model."""
    # nargs="?": a list option may swallow the model path, _claim_model takes it back
    p.add_argument("model", nargs="?",
                   help="an ONNX model (compiled first) or a compiled .tsr file")
    p.set_defaults(parser=p)
    p.add_argument("--config", "--target", dest="config", default=DEFAULT_PRESET,
                   help=f"config to compile for (default {DEFAULT_PRESET}; a .tsr has its "
                        "own)")
    p.add_argument("--calibration", nargs="+", action=_Items, metavar="FILE",
                   help="calibration samples for a float model: .npz files of arrays named "
                        "as the inputs, each one sample (the input's shape) or a stack of "
                        "samples (one more, leading, axis), or NAME=FILE.npy; the samples "
                        "of several files add up")
    p.add_argument("--random-calibration", type=_positive, metavar="N",
                   help="calibrate on N random normal samples of the inputs' shapes, "
                        "--input-shape included (for trying things out)")
    p.add_argument("--input-shape", nargs="+", action=_Items, metavar="NAME=D0,D1,...",
                   help="fix dynamic input dimensions")
    p.add_argument("--force-cpu", nargs="+", action=_Items, metavar="NODE",
                   help="keep nodes on the CPU")
    p.add_argument("--activations", choices=("exact", "approximate"), default="exact",
                   help="approximate: run activations the config has no exact intrinsic for "
                        "(no LUT) as sums of shifted ReLUs on the accelerator; changes "
                        "results (default exact)")
    p.add_argument("--pieces", type=_positive, metavar="K",
                   help="with --activations approximate: shifted ReLUs per activation")
    p.add_argument("--tolerance", type=float, metavar="LSB",
                   help="with --activations approximate: the fewest pieces whose max error "
                        "is at most LSB output steps")
    p.add_argument("--dense-weights", action="store_true",
                   help="multiply zero weight blocks too (default: skipped; same results)")
    tune_arg(p)
    verbose_arg(p)
    host_args(p)


def _run_args(p: argparse.ArgumentParser) -> None:
    """The arguments of every command that runs a model."""
    p.add_argument("--inputs", nargs="+", action=_Items, metavar="FILE",
                   help="inputs: .npz files (arrays named as the inputs) or NAME=FILE.npy "
                        "(default: random)")
    p.add_argument("--backend", default="sim", choices=("sim", "rtl", "pynq"))
    p.add_argument("--bitstream", help="pynq: the .bit file (its .hwh beside it)")
    p.add_argument("--seed", type=int, default=0, help="seed of random inputs")
    p.add_argument("--parallel", action="store_true",
                   help="run independent steps at once (CPU kernels on the host's cores "
                        "beside the accelerator)")


def _add_model_commands(sub) -> None:
    """compile, run, profile: a model in, a compiled model, outputs or a profile out."""
    p = sub.add_parser("compile", help="compile an ONNX model into a .tsr file")
    _model_args(p)
    p.add_argument("-o", "--output", help="output file (default: the model with .tsr)")
    p.add_argument("--cpu-targets", nargs="+", action=_Items, metavar="CPU",
                   help="CPUs whose object code for the CPU kernels the .tsr carries (their "
                        "first run compiles nothing): host, board (the config's), pynq-z1, "
                        "pynq-z2, zcu104, x86-64-v3, or none (default: host board)")
    p.set_defaults(func=_cmd_compile)
    _usage_with_model_required(p)

    p = sub.add_parser("run", help="run a model and write its outputs (.npz)")
    _model_args(p)
    _run_args(p)
    p.add_argument("-o", "--output", metavar="FILE.npz", help="write the outputs")
    p.set_defaults(func=_cmd_run)
    _usage_with_model_required(p)

    p = sub.add_parser("profile", help="run a model and print its per-layer profile")
    _model_args(p)
    _run_args(p)
    p.add_argument("--timeline", metavar="PNG", help="write a timeline of the queues (sim)")
    p.add_argument("--trace", metavar="FILE", help="write a Perfetto trace JSON (sim)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    board_args(p)
    p.set_defaults(func=_cmd_profile)
    _usage_with_model_required(p)


def _usage_with_model_required(p: argparse.ArgumentParser) -> None:
    """The usage line as argparse writes it, but with ``model``, not ``[model]``: the
    model is required, nargs="?" only lets :func:`_claim_model` find it."""
    p.usage = p.format_usage().removeprefix("usage: ").rstrip().replace("[model]", "model")


def _add_program_commands(sub) -> None:
    """isa, asm, disasm, sim: the instruction set and hand-written programs."""
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tessera`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "model", "") is None:
        _claim_model(args)
    try:
        try:
            return args.func(args)
        except ModuleNotFoundError as exc:
            # A package of an extra this install lacks: say which extra (else a real bug).
            raise missing_extra_error(exc) or exc
    except TesseraError as exc:
        print(f"tessera {args.command}: error: {exc.describe(CLI)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (``tessera zoo | head``): stop quietly, as Unix tools do;
        # stdout goes to devnull so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
