"""What the Verilator build compiles and what its cache is keyed by, without exporting.

:func:`sim_top_source` wraps ``tessera_top`` for the simulation (a registered reset);
:func:`source_key` names the sources the Verilog export reads, so that a cached model is
found without exporting the Verilog (20-40 s for ``pynq``) and edits to unrelated code
(the CLI, the compiler) do not invalidate it.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from tessera.config import HwConfig
from tessera.errors import RtlSimError

__all__ = ["SIM_TOP", "TOP", "digest", "export_sources", "sim_top_source", "source_key"]

TOP = "tessera_top"
#: The simulation's top level: ``tessera_top`` behind a registered reset.
SIM_TOP = "tessera_sim_top"
_PORT_DECL = re.compile(r"^\s*(input|output)\s*(\[[^\]]*\])?\s*([A-Za-z_][A-Za-z0-9_$]*)\s*;",
                        re.MULTILINE)
_HW_ROOT = Path(__file__).resolve().parents[1]
#: The module the Verilog comes from (tessera.hw.synth.export.verilog).
_EXPORT = "tessera.hw.synth.export"


def sim_top_source(verilog: str) -> str:
    """Module ``tessera_sim_top``: ``tessera_top`` with the same ports, its ``aresetn``
    through a flip-flop (reset 0: the model starts in reset).

    Amaranth gives every register's next value a ``rst`` override, so with ``aresetn`` a
    top-level input Verilator evaluates all of that logic in its input region, on every
    ``eval`` (twice a cycle). From a register it is evaluated once, after the clock edge:
    1.2-1.3x the cycles/s on ``pynq``. The harness holds reset one cycle longer to match."""
    match = re.search(rf"^module\s+{TOP}\b.*?^endmodule", verilog, re.DOTALL | re.MULTILINE)
    decls = _PORT_DECL.findall(match.group(0)) if match else []
    names = [name for _, _, name in decls]
    if "aresetn" not in names or "aclk" not in names:
        raise RtlSimError(f"cannot read the port declarations of module {TOP} (no 'input aclk;' "
                          "and 'input aresetn;'): the harness wraps the Verilog that "
                          "tessera.hw.synth.export.verilog writes")
    wiring = ", ".join(f".{n}({'aresetn_q' if n == 'aresetn' else n})" for n in names)
    return "\n".join([
        f"module {SIM_TOP}({', '.join(names)});",
        *(f"  {kind} {width + ' ' if width else ''}{name};" for kind, width, name in decls),
        "  reg aresetn_q = 1'b0;",
        "  always @(posedge aclk) aresetn_q <= aresetn;",
        f"  {TOP} core({wiring});",
        "endmodule", ""])


def _plugin_modules() -> list[str]:
    """The modules of the intrinsic plug-ins (entry points ``tessera.intrinsics``), which
    ``tessera.isa`` loads: they register ALU ops, hardware included."""
    from importlib.metadata import entry_points
    return sorted(ep.value.split(":")[0] for ep in entry_points(group="tessera.intrinsics"))


def _module_file(name: str, plugins: tuple[str, ...]) -> Path | None:
    """The file of module ``name`` if it belongs to the core (``tessera``), the hardware
    (``tessera.hw``) or a plug-in; None for the other layers, which the hardware may not
    import."""
    import importlib.util

    import tessera
    parts = name.split(".")
    if any(f"{m}.".startswith(f"{name}.") or name.startswith(f"{m}.") for m in plugins):
        spec = importlib.util.find_spec(name)
        return Path(spec.origin) if spec is not None and spec.origin else None
    if parts[0] != "tessera":
        return None
    root, rest = ((_HW_ROOT, parts[2:]) if parts[1:2] == ["hw"]
                  else (Path(tessera.__file__).resolve().parent, parts[1:]))
    base = root.joinpath(*rest)
    for path in (base / "__init__.py", base.with_suffix(".py")) if rest else [root / "__init__.py"]:
        if path.is_file():
            return path
    return None


_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)",
                          re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)", re.MULTILINE)


def _imported_names(path: Path, module: str) -> set[str]:
    """Every module ``path`` (module ``module``) names in an import statement, lazy ones
    included, with ``from x import y`` also as ``x.y`` (y may be a submodule). Read with
    regular expressions, not parsed: a word in a docstring only adds a file to the key."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    text = path.read_text()
    names = {n.strip() for group in _IMPORT.findall(text) for n in group.split(",")}
    for origin, items in _FROM_IMPORT.findall(text):
        dots = len(origin) - len(origin.lstrip("."))
        base = package.split(".")[:len(package.split(".")) - dots + 1] if dots else []
        origin = ".".join(base + ([origin.lstrip(".")] if origin.lstrip(".") else []))
        names.add(origin)
        names.update(f"{origin}.{m.group(0)}" for m in re.finditer(r"\w+", items.split("#")[0]))
    return {n for n in names for n in _parents(n)}


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts) + 1)]


def export_sources() -> list[Path]:
    """The core, hardware and plug-in sources the Verilog export can import, transitively."""
    plugins = _plugin_modules()
    todo, found = [_EXPORT, *_parents(_EXPORT), *(p for m in plugins for p in _parents(m))], {}
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = found[name] = _module_file(name, tuple(plugins))
        if path is not None:
            todo.extend(_imported_names(path, name) - found.keys())
    return sorted({p for p in found.values() if p is not None})


def digest(data: object) -> str:
    """A short hash of JSON-able ``data`` (cache keys)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hook_file(hook: object) -> Path | None:
    """The source file of an ALU op's hardware hook (a ``"module:attribute"`` reference
    or the object), without importing a referenced module."""
    import importlib.util
    import inspect
    if hook is None:
        return None
    if isinstance(hook, str):
        spec = importlib.util.find_spec(hook.split(":", 1)[0])
        return Path(spec.origin) if spec is not None and spec.origin else None
    source = inspect.getsourcefile(hook if inspect.isclass(hook) or inspect.isfunction(hook)
                                   else type(hook))
    return Path(source) if source else None


def source_key(config: HwConfig) -> str:
    """What the exported Verilog depends on, found without exporting it: the config, the
    registered ALU ops and their hardware hooks' sources, the sources the export imports
    (:func:`export_sources`) and Amaranth's version."""
    from importlib.metadata import PackageNotFoundError, version

    from tessera.isa import ALU_OPS
    hooks = [(op.name, op.opcode, str(_hook_file(op.hardware) or "")) for op in ALU_OPS]
    try:
        amaranth = version("amaranth")
    except PackageNotFoundError:
        amaranth = ""
    return digest({"config": config.to_dict(), "amaranth": amaranth,
                   "ops": [(n, c, _file_digest(Path(f)) if f else "") for n, c, f in hooks],
                   "sources": [(str(p.relative_to(p.parents[1])), _file_digest(p))
                               for p in export_sources()]})
