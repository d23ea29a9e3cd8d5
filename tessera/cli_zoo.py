"""``tessera zoo`` (the model zoo: list, export to ONNX) and ``tessera bench`` (the
benchmark scripts of a source checkout).

Kept apart from :mod:`tessera.cli` (which registers them) to keep each module small.
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

from .errors import CLI, PYTHON, TesseraError

__all__ = ["add_zoo_commands", "benchmark_scripts", "benchmarks_dir"]


def add_zoo_commands(sub: Any) -> None:
    """Register ``zoo`` (with ``zoo export``) and ``bench``."""
    from .cli_output import verbose_arg
    p = sub.add_parser("zoo", help="list the zoo models (parameters, MACs, input shapes); "
                                   "zoo export NAME -o FILE.onnx writes one as ONNX")
    p.set_defaults(func=_cmd_zoo_list)
    zoo_sub = p.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")
    e = zoo_sub.add_parser("export", help="write a zoo model as a float ONNX model, or "
                                          "quantized to int8 QDQ with --qdq")
    e.add_argument("name", help="the zoo model (tessera zoo lists them)")
    e.add_argument("-o", "--output", metavar="FILE.onnx",
                   help="output file (default: NAME.onnx, or NAME-qdq.onnx with --qdq)")
    e.add_argument("--qdq", action="store_true",
                   help="quantize with onnxruntime's static int8 QDQ quantization, "
                        "calibrated on random normal inputs")
    verbose_arg(e)
    e.set_defaults(func=_cmd_zoo_export)

    b = sub.add_parser("bench", help="list the benchmark scripts of the source checkout, or "
                                     "run some (or --all) and print their tables")
    b.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (tessera bench "
                                                            "lists them)")
    b.add_argument("--all", action="store_true", help="run every benchmark (takes long)")
    b.set_defaults(func=_cmd_bench)


# ------------------------------------------------------------------ zoo
def _cmd_zoo_list(args: argparse.Namespace) -> int:
    from .compiler.frontend import zoo
    from .progress import Progress
    rows = []
    with Progress(len(zoo.ZOO), "building the zoo models", unit="models") as bar:
        for name, build in zoo.ZOO.items():
            model = build()
            rows.append((name, f"{zoo.parameter_count(model):,}", f"{zoo.mac_count(model):,}",
                         _input_shapes(model)))
            bar.update(item=name)
    head = ("model", "parameters", "MACs per inference", "inputs (name: shape)")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}")
    print("\nexport one: tessera zoo export NAME -o NAME.onnx [--qdq]")
    return 0


def _input_shapes(model) -> str:
    """``name: 1x3x32x32`` for each graph input (not the initializers)."""
    inits = {t.name for t in model.graph.initializer}
    shapes = []
    for value in model.graph.input:
        if value.name not in inits:
            dims = value.type.tensor_type.shape.dim
            shapes.append(f"{value.name}: " + "x".join(str(d.dim_value or d.dim_param or "?")
                                                       for d in dims))
    return ", ".join(shapes)


def _cmd_zoo_export(args: argparse.Namespace) -> int:
    from .cli_output import third_party_output
    from .compiler.frontend import zoo
    if args.name not in zoo.ZOO:
        raise TesseraError(f"no zoo model {args.name!r}; the zoo has {', '.join(zoo.ZOO)}",
                           fix={PYTHON: "pick one of tessera.compiler.frontend.zoo.ZOO",
                                CLI: "pick one that tessera zoo lists"})
    out = Path(args.output or f"{args.name}{'-qdq' if args.qdq else ''}.onnx")
    if out.is_dir():
        raise TesseraError(f"output {str(out)!r} is a folder", fix={CLI: "give -o FILE.onnx"})
    import onnx
    model = zoo.ZOO[args.name]()
    if args.qdq:
        with third_party_output(args.verbose):
            model = zoo.to_qdq(model, zoo.calibration_data(model))
    onnx.save(model, out)
    kind = ("int8 QDQ (onnxruntime's static quantization, calibrated on random normal "
            "inputs)" if args.qdq else "float")
    print(f"wrote {out} ({out.stat().st_size:,} bytes): {args.name}, {kind}")
    return 0


# ------------------------------------------------------------------ bench
def benchmarks_dir() -> Path | None:
    """The ``benchmarks/`` folder of the source checkout tessera runs from, or ``None``
    (an installed wheel has none: the scripts are not part of the package)."""
    root = Path(__file__).resolve().parents[1]
    folder = root / "benchmarks"
    is_checkout = (root / "pyproject.toml").is_file()
    return folder if is_checkout and folder.is_dir() else None


def benchmark_scripts(folder: Path) -> dict[str, str]:
    """``{name: first sentence of its docstring}`` of the scripts in ``folder`` that run as
    a program (the others are modules the scripts share)."""
    scripts = {}
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body):
            paragraph = (ast.get_docstring(tree) or "").split("\n\n")[0]
            scripts[path.stem] = " ".join(paragraph.split()).split(". ")[0].rstrip(".")
    return scripts


def _cmd_bench(args: argparse.Namespace) -> int:
    folder = benchmarks_dir()
    if folder is None:
        raise TesseraError("no benchmarks folder: the benchmark scripts live in a source "
                           "checkout (benchmarks/ beside tessera/), not in an installed "
                           "package", fix={CLI: "clone the repository, pip install -e . in "
                                                "it and run tessera bench there"})
    scripts = benchmark_scripts(folder)
    names = list(scripts) if args.all else args.names
    unknown = [n for n in names if n not in scripts]
    if unknown:
        raise TesseraError(f"no benchmark {', '.join(map(repr, unknown))} in {folder}",
                           fix={CLI: "run tessera bench to list them"})
    if not names:
        _list_benchmarks(folder, scripts)
        return 0
    failed = [name for name in names if _run_benchmark(folder, name, scripts[name]) != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _list_benchmarks(folder: Path, scripts: dict[str, str]) -> None:
    width = max(map(len, scripts))
    print(f"benchmarks in {folder}:")
    for name, doc in scripts.items():
        print(f"  {name:<{width}}  {doc}")
    print("\nrun one: tessera bench NAME (or several, or --all)")


def _run_benchmark(folder: Path, name: str, doc: str) -> int:
    """Run ``benchmarks/<name>.py`` from the checkout's root, its tables printed as they
    come; its exit status."""
    from .progress import StageLines
    print(f"== {name}: {doc}", flush=True)
    with StageLines(f"bench {name}") as lines:
        lines.stage("running")
        status = subprocess.run([sys.executable, str(folder / f"{name}.py")],
                                cwd=folder.parent).returncode
    print(flush=True)
    return status
