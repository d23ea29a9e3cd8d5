"""The layout rules of docs/architecture.md, checked on the source: which folder may import
which, the compiler's folder list, and the size of modules and functions.

Static (``ast``) checks of every import statement, the ones inside functions included: a
lazy import is still a dependency.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Source folder -> the ``tessera`` subpackage it installs as.
PACKAGES = {"tessera": "tessera", "sim": "tessera.sim", "hw": "tessera.hw",
            "compiler": "tessera.compiler", "runtime": "tessera.runtime",
            "recursive": "tessera.recursive", "compress": "tessera.compress",
            "dse": "tessera.dse", "bitstreams": "tessera.bitstreams", "plugins": "tessera.plugins"}

#: Layer -> the layers it may import (besides itself). docs/architecture.md states the rule:
#: core <- sim, hw, compiler <- runtime <- CLI, and inside the compiler
#: frontend <- accel, cpu <- placement <- model, with golden beside the backends.
ALLOWED = {
    "core": set(),
    "sim": {"core"},
    "hw": {"core"},
    "hw.synth": {"core", "hw"},
    "hw.harness": {"core", "hw", "hw.synth"},
    "bitstreams": {"core", "hw", "hw.synth"},
    "compiler": {"core", "compiler.accel", "compiler.frontend"},
    "compiler.frontend": {"core"},
    # The compiler may run the simulator (CompiledProgram.run, a tuner's cost model).
    "compiler.accel": {"core", "sim", "compiler.frontend"},
    "compiler.cpu": {"core", "compiler.frontend"},
    "compiler.golden": {"core", "compiler.frontend", "compiler.accel"},
    "compiler.placement": {"core", "compiler.frontend", "compiler.accel", "compiler.cpu"},
    "compiler.model": {"core", "compiler.frontend", "compiler.accel", "compiler.cpu",
                       "compiler.placement"},
    "runtime": {"core", "sim", "hw.harness", "compiler.accel", "compiler.cpu",
                "compiler.model", "bitstreams"},
    # Recursive models (tree, DAG, sequence cells): a vertical of their own above the
    # runtime -- the cell and linearizer in numpy, templates lowered with the accelerator
    # backend's emitter, runs through the Device API.
    "recursive": {"core", "sim", "compiler.accel", "runtime"},
    # Model compression (pruning float ONNX models to block or N:M patterns): works on ONNX
    # files with onnxruntime as the error yardstick; reads the block geometry from the core.
    "compress": {"core", "compiler.frontend"},
    # Design-space exploration: compiles and simulates models (through tessera.compile and
    # the runtime), synthesizes configs (hw/synth, keyed by hw/harness's source key; the
    # GEMM core's multipliers from hw first), and draws with the runtime's PNG toolkit;
    # nothing imports it but the entry points.
    "dse": {"core", "compiler.frontend", "runtime", "hw", "hw.synth", "hw.harness"},
    # Intrinsic plug-ins sit beside the layers they extend and are loaded only through the
    # tessera.intrinsics entry points (or the hook references they register): no layer
    # imports them.
    "plugins": {"core", "hw", "compiler.accel", "compiler.frontend"},
}
#: The entry points above every layer: the CLI (its scheduling commands in a module of
#: their own), and ``tessera.compile``/``tessera.load`` (lazy imports in the core
#: package's ``__init__``).
ENTRY_POINTS = {"tessera", "tessera.cli", "tessera.cli_hetero", "tessera.cli_compress",
                "tessera.cli_hw", "tessera.cli_zoo", "tessera.cli_dse"}

#: Modules allowed past MAX_MODULE_LINES, with the reason.
LONG_MODULES: dict[str, str] = {}
MAX_MODULE_LINES = 600
#: Functions (``module:qualname``) allowed past MAX_FUNCTION_LINES, with the reason.
LONG_FUNCTIONS: dict[str, str] = {}
MAX_FUNCTION_LINES = 80
SIZED_FOLDERS = ("compiler", "sim", "runtime", "recursive", "compress", "hw", "bitstreams",
                 "tessera", "plugins")


def _modules():
    """(path, dotted module name, package the module's relative imports start from)."""
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            if is_init:
                parts.pop()
            name = ".".join([package, *parts])
            yield path, name, name if is_init else name.rsplit(".", 1)[0]


def _imports(path: Path, package: str) -> set[str]:
    """Every ``tessera`` module (or package) a file imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {t for t in found if t == "tessera" or t.startswith("tessera.")}


def layer(module: str) -> str:
    """The layer of a dotted module name: ``core``, ``sim``, ``compiler.accel``, ..."""
    parts = module.split(".")[1:]
    if not parts or parts[0] not in ("sim", "hw", "compiler", "runtime", "recursive", "compress",
                                     "dse", "bitstreams", "plugins"):
        return "core"
    if parts[0] == "compiler" and len(parts) > 1:
        sub = parts[1]
        return f"compiler.{sub}" if f"compiler.{sub}" in ALLOWED else "compiler"
    if parts[0] == "hw" and len(parts) > 1 and f"hw.{parts[1]}" in ALLOWED:
        return f"hw.{parts[1]}"
    return parts[0]


def _existing(module: str) -> bool:
    """Whether a dotted name is a module or package of ours (not a name inside one)."""
    names = {name for _, name, _ in _modules()}
    return module in names


def test_every_import_goes_down_the_layers():
    names = {name for _, name, _ in _modules()}
    wrong = []
    for path, name, package in _modules():
        if name in ENTRY_POINTS:
            continue
        for target in _imports(path, package):
            if target not in names:
                continue  # a name imported from a module, already counted as the module
            a, b = layer(name), layer(target)
            if a != b and b not in ALLOWED[a]:
                wrong.append(f"{name} ({a}) imports {target} ({b})")
    assert not wrong, "imports against docs/architecture.md's rule:\n" + "\n".join(wrong)


def test_layer_rule_covers_every_module():
    assert {layer(name) for _, name, _ in _modules()} <= set(ALLOWED)


def test_isa_modules_import_one_way():
    """tessera.isa: no module imports one that imports it back (at any depth)."""
    graph = {name: {t for t in _imports(path, package) if t.startswith("tessera.isa.")}
             for path, name, package in _modules() if name.startswith("tessera.isa.")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False
    cycles = sorted(f"{a} <-> {b}" for a, targets in graph.items() for b in targets
                    if b in graph and reaches(b, a, {b}))
    assert not cycles


def test_compiler_folder_reads_as_the_pipeline():
    entries = sorted(p.name for p in (ROOT / "compiler").iterdir()
                     if p.name != "__pycache__")
    assert entries == ["__init__.py", "accel", "cpu", "frontend", "golden", "model.py",
                       "placement"]


def _sized_files():
    for folder in SIZED_FOLDERS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_module_past_the_line_budget():
    long = {str(p.relative_to(ROOT)): n for p in _sized_files()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert set(long) <= set(LONG_MODULES), (
        f"modules over {MAX_MODULE_LINES} lines: {long}; split them by concern")


def _functions(path: Path):
    """(qualified name, lines) of every function and method of a file."""
    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child.end_lineno - child.lineno + 1
                yield from visit(child, name + ".")
    yield from visit(ast.parse(path.read_text()), "")


def test_no_function_a_reader_must_scroll():
    long = {f"{p.relative_to(ROOT)}:{name}": n for p in _sized_files()
            for name, n in _functions(p) if n > MAX_FUNCTION_LINES}
    assert set(long) <= set(LONG_FUNCTIONS), (
        f"functions over {MAX_FUNCTION_LINES} lines: {long}; break them into named steps")


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_documented_paths_exist(doc):
    """Every ``folder/.../file.py`` path the map names exists."""
    text = (ROOT / doc).read_text()
    paths = set(re.findall(r"`((?:compiler|sim|runtime|recursive|compress|hw|bitstreams|tessera|tests|benchmarks)"
                           r"/[\w/.-]*)`", text))
    missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"{doc} names paths that do not exist: {missing}"
