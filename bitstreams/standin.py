"""The dry run of a board flow: its Tcl under ``tclsh`` against the Vivado stand-in.

:func:`dry_run` executes the flow against ``vivado_standin.tcl``, which defines every
Vivado command the flow uses as a recorder that checks its options (UG835) and models
just enough of Vivado (IP packaging from the Verilog's ports, the catalog,
block-design objects, run and output files) to answer the flow's queries; the
:class:`FlowRecord` it returns says what the flow asked Vivado to build.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tessera.errors import HardwareToolError
from tessera.hwh import IP_INSTANCE, IP_MODULE

from .plan import TCL_NAME, VivadoProject

__all__ = ["DEFAULT_ANSWERS", "STANDIN", "Address", "Cell", "Core", "FlowRecord", "dry_run"]

#: The Vivado stand-in :func:`dry_run` executes the flow against.
STANDIN = Path(__file__).with_name("vivado_standin.tcl")


@dataclass(frozen=True)
class Cell:
    """A block-design cell the flow created."""

    name: str
    vlnv: str                          # for an IP; "" for a module reference
    type: str                          # "ip" or "module"
    reference: str                     # the module of a module reference
    properties: dict[str, str]


@dataclass(frozen=True)
class Address:
    """One ``assign_bd_address``: ``segment`` mapped at ``offset`` in ``space``."""

    space: str
    segment: str
    offset: int
    range: int


@dataclass(frozen=True)
class Core:
    """An IP the flow packaged: the pins and interfaces its cells have."""

    vlnv: str
    pins: tuple[str, ...]
    interfaces: tuple[str, ...]


@dataclass
class FlowRecord:
    """What a flow asked Vivado to do, from :func:`dry_run`.

    Object names are block-design paths without the leading ``/`` (``tessera_0/aclk``),
    file names are relative to the project folder when they are inside it.
    """

    commands: list[dict]                     # every recorded command: cmd, opts, args, notes
    stdout: str = ""
    part: str = ""
    board_part: str = ""
    cells: dict[str, Cell] = field(default_factory=dict)
    cores: dict[str, Core] = field(default_factory=dict)
    automations: list[tuple[str, str, str]] = field(default_factory=list)  # rule, object, config
    interface_nets: list[tuple[str, str]] = field(default_factory=list)
    nets: list[tuple[str, ...]] = field(default_factory=list)
    addresses: list[Address] = field(default_factory=list)
    runs: list[tuple[str, str]] = field(default_factory=list)       # (run, -to_step or "")
    files_added: list[str] = field(default_factory=list)
    reports: list[tuple[str, str]] = field(default_factory=list)    # (command, file)
    copies: list[tuple[str, str]] = field(default_factory=list)     # (source, destination)
    validated: bool = False

    def properties(self, cell: str) -> dict[str, str]:
        """The properties the flow set on ``cell`` (``CONFIG.*`` among them)."""
        return self.cells[cell].properties

    def connected(self) -> set[str]:
        """Every pin and interface pin some net connects."""
        return ({pin for net in self.nets for pin in net}
                | {end for net in self.interface_nets for end in net})

    def unconnected_ports(self, cell: str = IP_INSTANCE) -> list[str]:
        """The pins and interfaces of ``cell`` (a packaged IP) that nothing connects."""
        core = self.cores[self.cells[cell].vlnv]
        connected = self.connected()
        return [name for name in core.pins + core.interfaces
                if f"{cell}/{name}" not in connected]

    def net_of(self, pin: str) -> set[str]:
        """The pins on the net of ``pin`` (empty if none)."""
        pins: set[str] = set()
        for net in self.nets:
            if pin in net:
                pins.update(net)
        return pins

    def endpoints(self, cell: str, interface: str) -> list[str]:
        """Where the interface ``cell/interface`` leads: the interface pins at the far side
        of the AXI interconnects and SmartConnects on its way."""
        def peers(end: str) -> list[str]:
            return [b if a == end else a for a, b in self.interface_nets if end in (a, b)]

        found, seen, todo = [], set(), [f"{cell}/{interface}"]
        while todo:
            end = todo.pop()
            for peer in peers(end):
                if peer in seen:
                    continue
                seen.add(peer)
                owner, _, pin = peer.rpartition("/")
                if self._is_interconnect(owner):
                    # Through the interconnect: from a slave side to its master side and back.
                    side = "M" if pin.startswith("S") else "S"
                    todo += [f"{owner}/{p}" for p in self._interconnect_pins(owner)
                             if p.startswith(side) and f"{owner}/{p}" not in seen]
                else:
                    found.append(peer)
        return sorted(found)

    def _is_interconnect(self, cell: str) -> bool:
        vlnv = self.cells[cell].vlnv if cell in self.cells else ""
        return any(kind in vlnv for kind in (":axi_interconnect:", ":smartconnect:"))

    def _interconnect_pins(self, cell: str) -> set[str]:
        return {end.rpartition("/")[2] for net in self.interface_nets for end in net
                if end.rpartition("/")[0] == cell}

    def address_of(self, cell: str, interface: str) -> Address:
        """The assignment of ``cell/interface``: of its segment for a slave, of the segment
        its address space is given for a master (which must be exactly one)."""
        path = f"{cell}/{interface}"
        found = [a for a in self.addresses if a.segment.startswith(path + "/")] or \
                [a for a in self.addresses if a.space == path]
        if len(found) != 1:
            raise KeyError(f"{path} has {len(found)} address assignments, not one")
        return found[0]

    def masters(self) -> dict[str, list[Address]]:
        """Every address space given a segment, with its assignments."""
        spaces: dict[str, list[Address]] = {}
        for address in self.addresses:
            spaces.setdefault(address.space, []).append(address)
        return spaces


#: What the stand-in answers for properties only a real run knows: runs complete and
#: timing met. Other answers come from the flow's own ``tessera_expect`` (the values it
#: checks Vivado against), so by default the stand-in is a Vivado that agrees.
DEFAULT_ANSWERS = {"PROGRESS": "100%", "STATS.WNS": "0.125", "STATS.WHS": "0.010"}


def dry_run(project_or_tcl: VivadoProject | str | Path, *, tclsh: str | None = None,
            answers: Mapping[str, str] | None = None, verilog: str | Path | None = None,
            timeout: float = 120.0) -> FlowRecord:
    """Execute a flow's Tcl under ``tclsh`` with :data:`STANDIN` defining the Vivado commands
    as recorders, and return what it asked for.

    ``project_or_tcl``: a :class:`VivadoProject`, a project folder, a ``.tcl`` file, or Tcl
    text. It runs in a temporary copy of the folder (placeholders the stand-in writes never
    land in the project); Tcl text runs beside ``verilog`` when given. ``answers`` override
    what the stand-in's ``get_property`` says for properties the flow does not set (e.g.
    ``{"STATS.WNS": "-0.3"}``: a timing failure), over :data:`DEFAULT_ANSWERS`. ``tclsh``:
    the interpreter (default: ``tclsh`` on the PATH, else Python's ``tkinter.Tcl``).

    Raises :class:`~tessera.errors.HardwareToolError` when no Tcl interpreter is found, or
    the flow fails: a Tcl error (message and where), or the flow's own stop (exit code 1
    and its message, e.g. timing).
    """
    interpreter = _interpreter(tclsh)
    with tempfile.TemporaryDirectory(prefix="tessera-vivado-dry-run-") as tmp:
        run_dir = Path(tmp).resolve() / "project"
        run_dir.mkdir()
        script = _stage(project_or_tcl, run_dir, verilog)
        record_file = Path(tmp) / "record.jsonl"
        settings = {**DEFAULT_ANSWERS, **(answers or {})}
        args = [str(STANDIN), str(record_file), str(script),
                *(item for pair in settings.items() for item in pair)]
        try:
            done = subprocess.run(interpreter + args, cwd=run_dir, capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise HardwareToolError(f"the dry run of {script.name} did not finish within "
                                    f"{timeout:g} s") from None
        except OSError as exc:
            raise HardwareToolError(f"cannot run the Tcl interpreter {interpreter[0]}: "
                                    f"{exc.strerror}") from None
        entries = _read_record(record_file, run_dir)
        if done.returncode != 0:
            raise HardwareToolError(_failure(script.name, done))
        return _parse(entries, done.stdout)


def _interpreter(tclsh: str | None) -> list[str]:
    """The command that runs a Tcl script: ``tclsh`` when given, else one on the PATH,
    else Python's own Tcl."""
    if tclsh is not None:
        found = shutil.which(tclsh)
        if found is None:
            raise HardwareToolError(f"Tcl interpreter {tclsh!r} not found")
        return [found]
    for name in ("tclsh", "tclsh8.6"):
        found = shutil.which(name)
        if found:
            return [found]
    try:
        import tkinter  # noqa: F401 - only whether Python has Tcl
    except ImportError:
        raise HardwareToolError("no Tcl interpreter: install Tcl 8.6 (apt install tcl, "
                                "brew install tcl-tk) or a Python with tkinter") from None
    return [sys.executable, "-c", _TKINTER_TCLSH]


# Runs a Tcl script like tclsh does, in Python's own Tcl (tkinter.Tcl).
_TKINTER_TCLSH = """\
import os, sys, tkinter
tcl = tkinter.Tcl()
tcl.createcommand("standin_host_exit", lambda code=0: os._exit(int(code)))
tcl.eval("set argv {}")
for arg in sys.argv[2:]:
    tcl.call("lappend", "argv", arg)
tcl.setvar("argc", len(sys.argv) - 2)
tcl.setvar("argv0", sys.argv[1])
try:
    tcl.call("source", sys.argv[1])
except tkinter.TclError as exc:
    sys.stderr.write(f"{exc}\\n")
    sys.exit(1)
"""


def _stage(project_or_tcl: VivadoProject | str | Path, run_dir: Path,
           verilog: str | Path | None) -> Path:
    """Copy the flow (and the Verilog it packages) into ``run_dir``; the script's path."""
    if isinstance(project_or_tcl, VivadoProject):
        tcl_file, verilog = project_or_tcl.tcl, verilog or project_or_tcl.verilog
    elif isinstance(project_or_tcl, Path) or _is_path(project_or_tcl):
        path = Path(project_or_tcl)
        tcl_file = path / TCL_NAME if path.is_dir() else path
        if verilog is None and (tcl_file.parent / f"{IP_MODULE}.v").is_file():
            verilog = tcl_file.parent / f"{IP_MODULE}.v"
    else:
        tcl_file = None
    script = run_dir / TCL_NAME
    if tcl_file is None:
        script.write_text(str(project_or_tcl))
    elif not tcl_file.is_file():
        raise HardwareToolError(f"no flow script at {tcl_file}")
    else:
        shutil.copyfile(tcl_file, script)
    if verilog is not None:
        shutil.copyfile(verilog, run_dir / f"{IP_MODULE}.v")
    return script


def _is_path(text: str) -> bool:
    """Whether ``text`` names an existing file or folder (rather than being Tcl)."""
    if "\n" in text:
        return False
    try:
        return Path(text).exists()
    except OSError:          # e.g. a line of Tcl longer than a file name may be
        return False


def _read_record(path: Path, run_dir: Path) -> list[dict]:
    """The stand-in's record (one JSON object per command), with paths in ``run_dir``
    made relative to it."""
    if not path.is_file():
        return []
    prefix = str(run_dir) + "/"

    def local(value):
        if isinstance(value, str):
            return value.replace(prefix, "") if prefix in value else value
        if isinstance(value, list):
            return [local(v) for v in value]
        if isinstance(value, dict):
            return {k: local(v) for k, v in value.items()}
        return value

    return [local(json.loads(line, strict=False))
            for line in path.read_text().splitlines() if line.strip()]


def _failure(script: str, done: subprocess.CompletedProcess) -> str:
    """The message of a failed dry run: the flow's own ERROR lines, or the Tcl error."""
    stderr = done.stderr.strip()
    if done.returncode == 1 and "ERROR: [tessera]" in stderr:
        reasons = [line.split("] ", 1)[1] for line in stderr.splitlines()
                   if line.startswith("ERROR: [tessera]")]
        return f"the flow {script} stopped (exit code 1): " + "; ".join(reasons)
    lines = stderr.splitlines()
    message = lines[0].removeprefix("Tcl error: ") if lines else done.stdout[-2000:]
    where = re.search(r'\(file "[^"]*?([^"/]+)" line (\d+)\)', stderr)
    command = re.search(r'while executing\n"([^\n]*)', stderr)
    if where:
        message += f" ({where[1]} line {where[2]}"
        message += f": {command[1]})" if command else ")"
    return f"the flow {script} failed under the Vivado stand-in: {message}"


def _bd_path(handle: str) -> str:
    """A block-design object's path without the leading ``/``."""
    return handle.lstrip("/")


def _size(text: str) -> int:
    """An address or range as ``assign_bd_address`` takes it: ``0x10000`` or ``64K``."""
    match = re.fullmatch(r"(\d+)([KMGT])", text)
    if match:
        return int(match[1]) << (10 * " KMGT".index(match[2]))
    return int(text, 0)


def _parse(entries: list[dict], stdout: str) -> FlowRecord:
    """The :class:`FlowRecord` of the stand-in's recorded commands."""
    record = FlowRecord(commands=entries, stdout=stdout)
    for entry in entries:
        cmd, opts, args = entry["cmd"], entry.get("opts", {}), entry.get("args", [])
        notes = entry.get("notes", {})
        if cmd == "create_project":
            record.part = opts.get("-part", "")
        elif cmd == "set_property":
            props = notes.get("properties", {})
            for obj in notes.get("objects", []):
                name = _bd_path(obj)
                if name in record.cells:
                    record.cells[name].properties.update(props)
                elif obj == notes.get("project") and "board_part" in props:
                    record.board_part = props["board_part"]
        elif cmd == "ipx::infer_core":
            core = notes["core"]
            record.cores[core["vlnv"]] = Core(core["vlnv"], tuple(core["pins"]),
                                              tuple(core["interfaces"]))
        elif cmd == "create_bd_cell":
            name = args[0]
            record.cells[name] = Cell(name, opts.get("-vlnv", ""), opts.get("-type", ""),
                                      opts.get("-reference", ""), {})
        elif cmd == "apply_bd_automation":
            record.automations.append((opts.get("-rule", ""), _bd_path(args[0]),
                                       opts.get("-config", "")))
        elif cmd == "connect_bd_intf_net":
            record.interface_nets.append((_bd_path(args[0]), _bd_path(args[1])))
        elif cmd == "connect_bd_net":
            record.nets.append(tuple(_bd_path(p) for p in notes["pins"]))
        elif cmd == "assign_bd_address":
            record.addresses.append(Address(_bd_path(opts["-target_address_space"]),
                                            _bd_path(args[0]), _size(opts["-offset"]),
                                            _size(opts["-range"])))
        elif cmd == "validate_bd_design":
            record.validated = True
        elif cmd == "launch_runs":
            record.runs += [(run, opts.get("-to_step", "")) for run in notes["runs"]]
        elif cmd == "add_files":
            record.files_added += notes["files"]
        elif cmd.startswith("report_") or cmd == "write_bitstream":
            record.reports.append((cmd, opts.get("-file", args[0] if args else "")))
        elif cmd == "file copy":
            record.copies.append((notes["source"], notes["destination"]))
    return record
