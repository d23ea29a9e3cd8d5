"""JIT for the CPU fallback kernels: LLVM IR text -> optimised (O3, loop and SLP
vectorisation, for the host CPU) machine code, cached in memory and on disk.

The disk cache stores object code under ``tessera.cache.cache_dir("llvm")``, one file
per module, keyed by sha256 of (IR text, target triple, CPU name, CPU features,
llvmlite version, cache format version). Files are written atomically (temp file + ``os.replace``) so
concurrent processes can share the folder, and carry a checksum of their payload: a
corrupt or truncated file is ignored and rebuilt (never handed to LLVM, which may abort
on a malformed object).

Each compiled module gets its own MCJIT engine, so kernels may use the same symbol
names (every kernel's function may be called ``entry``).

Ahead of time, the same pipeline emits object code for other CPUs (:class:`CpuTarget`:
this host exactly, a portable x86-64 level, the boards' ARM cores; :func:`cpu_target`
names them): :meth:`Jit.object_for` (disk cached like the JIT), and
:meth:`Jit.load_object` loads such an object into an engine without compiling anything
(after :meth:`CpuTarget.runs_here` said this host can run it and :func:`check_object`
that it is a relocatable ELF object for this machine).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import llvmlite
import llvmlite.binding as llvm

from tessera.boards import BOARD_CPUS, BOARDS, Board
from tessera.cache import cache_dir
from tessera.compiler.cpu.sparse_dots import specialize_for_host
from tessera.compiler.cpu.vector_width import vector_bits_of
from tessera.config import HwConfig
from tessera.errors import CLI, PYTHON, CpuKernelError

from .cpu_abi import NATIVE, Abi

#: Bump when the optimisation pipeline, the key or the file layout changes.
CACHE_FORMAT = 2
_MAGIC = b"TESSOBJ1"
_DIGEST = 32


@lru_cache(maxsize=None)
def _init_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@lru_cache(maxsize=None)
def _init_all_targets() -> None:
    # Other CPUs' back ends, for objects compiled ahead of time for them.
    _init_llvm()
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


@lru_cache(maxsize=None)
def host_cpu() -> tuple[str, str]:
    """(cpu name, feature string) of the host, as LLVM sees them (e.g. ``"znver3"``,
    ``"+avx2,+fma,..."``)."""
    _init_llvm()
    features = llvm.get_host_cpu_features().flatten()
    # On AMD hosts with SSE4a, LLVM's SLP vectoriser sometimes picks SSE4a's
    # ``insertq`` to build vectors; it is microcoded and ~60x slower than the shuffles
    # it replaces here (a 16x56x56 depthwise conv: 1.78 ms with it, 29 us without).
    # Nothing else in the kernels needs SSE4a. The feature string is part of the
    # cache key, so objects built with ``insertq`` are not reused.
    if "+sse4a" in features.split(","):
        features += ",-sse4a"
    return llvm.get_host_cpu_name(), features


#: ELF ``e_machine`` of each architecture family (:func:`arch_family`).
ELF_MACHINES = {"x86_64": 62, "arm": 40, "aarch64": 183}
#: x86-64-v3 (the psABI level: Haswell, Zen 1 and later) in LLVM's feature names: what a
#: host must have to run objects built for it.
X86_64_V3 = ("avx", "avx2", "bmi", "bmi2", "cmov", "cx16", "cx8", "f16c", "fma", "fxsr",
             "lzcnt", "mmx", "movbe", "popcnt", "sahf", "sse", "sse2", "sse3", "sse4.1",
             "sse4.2", "ssse3", "xsave")

def arch_family(triple: str) -> str:
    """The architecture family of ``triple`` as objects are interchangeable within it:
    ``x86_64``, ``arm`` (any 32-bit ARM or Thumb), ``aarch64`` (or ``arm64``), else the
    triple's first component."""
    arch = triple.split("-", 1)[0]
    if arch.startswith(("arm", "thumb")) and arch != "arm64":
        return "arm"
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(arch, arch)


def _triple_abi(triple: str) -> tuple[str, str, str]:
    """(family, system, environment) of ``triple``: what must match for a host to load
    an object (a soft-float ``gnueabi`` host cannot call ``gnueabihf`` code)."""
    parts = triple.split("-")
    return arch_family(triple), parts[2] if len(parts) > 2 else "", \
        parts[3] if len(parts) > 3 else ""


def enabled_features(features: str) -> set[str]:
    """The features an LLVM feature string (``"+avx2,-sse4a,..."``) turns on (the last
    mention of each wins, as in LLVM)."""
    on: dict[str, bool] = {}
    for f in filter(None, features.split(",")):
        on[f[1:]] = f[0] == "+"
    return {f for f, enabled in on.items() if enabled}


@dataclass(frozen=True)
class CpuTarget:
    """A CPU that kernel modules are compiled for: LLVM triple, CPU name and feature
    string; ``requires``, the features a host must have to run the code (LLVM names);
    ``abi``, the CPython layouts its wrappers assume; ``host_ir``: the IR is specialised
    for the compiling host (:func:`specialize_for_host`) rather than left portable."""

    name: str
    triple: str
    cpu: str
    features: str = ""
    requires: tuple[str, ...] = ()
    abi: Abi = NATIVE
    host_ir: bool = False

    @property
    def vector_bits(self) -> int:
        """Width of its widest vector registers: the IR variant of a kernel its objects
        are compiled from (:meth:`CpuKernel.ir_for`)."""
        return vector_bits_of(set(self.requires) | enabled_features(self.features))

    def runs_here(self) -> bool:
        """Whether this process can load and run objects built for this target: same
        architecture family, OS and ABI as the host, the same CPython layouts, and every
        required feature present."""
        if _triple_abi(self.triple) != _triple_abi(llvm.get_default_triple()):
            return False
        return self.abi == NATIVE and set(self.requires) <= enabled_features(host_cpu()[1])

    def exactly_here(self) -> bool:
        """Whether this is the target :func:`cpu_target` ``("host")`` gives here."""
        return self == host_target()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "triple": self.triple, "cpu": self.cpu,
                "features": self.features, "requires": list(self.requires),
                "abi": self.abi.to_dict(), "host_ir": self.host_ir}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CpuTarget":
        """The target :meth:`to_dict` wrote; CpuKernelError if malformed."""
        try:
            return cls(str(d["name"]), str(d["triple"]), str(d["cpu"]), str(d["features"]),
                       tuple(str(f) for f in d["requires"]), Abi.from_dict(d["abi"]),
                       bool(d["host_ir"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CpuKernelError(f"malformed CPU target record {dict(d)!r}: {exc!r}; "
                                 "recompile the model") from None


@lru_cache(maxsize=None)
def host_target() -> CpuTarget:
    """This host exactly: its triple, CPU and features (as the JIT compiles for it)."""
    cpu, features = host_cpu()
    triple = llvm.get_default_triple()
    requires = tuple(sorted(enabled_features(features)))
    # Named by its features too: hosts with one CPU name may differ in them, and a
    # board's own host target must not take its portable board target's name.
    tag = hashlib.sha256(features.encode()).hexdigest()[:8]
    return CpuTarget(f"{arch_family(triple)}-{cpu}-{tag}", triple, cpu, features, requires,
                     NATIVE, host_ir=True)


def board_target(board: Board | str) -> CpuTarget:
    """The CPU of ``board`` (a :class:`~tessera.boards.Board` or its name)."""
    board = board if isinstance(board, Board) else BOARDS[board]
    triple, features, requires = BOARD_CPUS[board.ps.arch]
    bits = 32 if arch_family(triple) == "arm" else 64
    return CpuTarget(f"{arch_family(triple)}-{board.host}", triple, board.host, features,
                     requires, Abi.for_pointer_bytes(bits // 8))


#: A portable x86-64 target: any host of that level runs its objects.
PORTABLE_X86 = CpuTarget("x86_64-v3", "x86_64-unknown-linux-gnu", "x86-64-v3", "",
                         X86_64_V3, Abi.for_pointer_bytes(8))


def cpu_target(name: str | CpuTarget, config: HwConfig | None = None) -> list[CpuTarget]:
    """The targets ``name`` stands for: ``"host"`` (this host exactly), ``"x86-64-v3"``
    (portable x86-64), a board's name (``pynq-z1``, ``pynq-z2``, ``zcu104``), ``"board"``
    (the CPU of the boards whose part ``config`` targets), ``"none"`` or a
    :class:`CpuTarget`."""
    if isinstance(name, CpuTarget):
        return [name]
    if name == "none":
        return []
    if name == "host":
        return [host_target()]
    if name == "x86-64-v3":
        return [PORTABLE_X86]
    if name in BOARDS:
        return [board_target(name)]
    if name == "board" and config is not None:
        return list(dict.fromkeys(board_target(b) for b in BOARDS.values()
                                  if b.part == config.part))
    choices = f"host, board (with a config), x86-64-v3, none or a board ({', '.join(BOARDS)})"
    raise CpuKernelError(f"unknown CPU target {name!r}", fix={
        PYTHON: f"give prebuild(..., targets=[...]) names from: {choices}",
        CLI: f"give --cpu-targets names from: {choices}"})


def _target_machine(target: CpuTarget | None = None) -> llvm.TargetMachine:
    if target is None:
        cpu, features = host_cpu()
        machine = llvm.Target.from_default_triple()
    else:
        _init_all_targets()
        cpu, features = target.cpu, target.features
        machine = llvm.Target.from_triple(target.triple)
    # jitdefault: the code model MCJIT loads on every host (large on x86-64).
    return machine.create_target_machine(cpu=cpu, features=features, opt=3,
                                         codemodel="jitdefault", jit=True)


def check_object(obj: bytes) -> None:
    """Raise CpuKernelError unless ``obj`` is a little-endian relocatable ELF object for
    this host's architecture and pointer size (LLVM may abort the process on an object
    for another machine, so none reaches it unchecked)."""
    want = ELF_MACHINES.get(arch_family(llvm.get_default_triple()))
    if len(obj) < 20 or obj[:4] != b"\x7fELF":
        raise CpuKernelError("not an ELF object")
    elf_class, data = obj[4], obj[5]
    e_type, e_machine = struct.unpack_from("<HH", obj, 16)
    if data != 1 or elf_class != {4: 1, 8: 2}.get(NATIVE.pointer) or e_type != 1 \
            or e_machine != want:
        raise CpuKernelError(f"an ELF object for machine {e_machine} (class {elf_class}, "
                             f"type {e_type}), not a relocatable object for this host "
                             f"(machine {want})")


class JitModule:
    """One compiled module, loaded into its own MCJIT engine (kept alive with it)."""

    def __init__(self, engine: llvm.ExecutionEngine, key: str) -> None:
        self._engine = engine
        self.key = key

    def address(self, name: str) -> int:
        """Address of function ``name``; CpuKernelError if the module has none."""
        addr = self._engine.get_function_address(name)
        if not addr:
            raise CpuKernelError(f"compiled module has no function {name!r}")
        return addr

    def global_address(self, name: str) -> int:
        """Address of global variable ``name``; CpuKernelError if the module has none."""
        addr = self._engine.get_global_value_address(name)
        if not addr:
            raise CpuKernelError(f"compiled module has no global {name!r}")
        return addr


class Jit:
    """Compiles LLVM IR for the host CPU (and, ahead of time, for other targets); loads
    objects. ``stats`` counts memory hits, disk hits and compilations (for tests and
    profiles)."""

    def __init__(self, cache_path: Path | None = None) -> None:
        _init_llvm()
        self.cache_path = Path(cache_path) if cache_path is not None else cache_dir("llvm")
        self.stats = {"memory_hits": 0, "disk_hits": 0, "compiled": 0}
        #: Objects compiled ahead of time loaded by :meth:`load_object`.
        self.objects_loaded = 0
        self._modules: dict[str, JitModule] = {}
        self._lock = threading.Lock()
        self._tm = _target_machine()

    def key(self, ir: str, target: CpuTarget | None = None) -> str:
        """Cache key of ``ir`` compiled for ``target`` (None: this host)."""
        target = target or host_target()
        h = hashlib.sha256()
        for part in (ir, target.triple, target.cpu, target.features, llvmlite.__version__,
                     str(CACHE_FORMAT)):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def compile(self, ir: str) -> JitModule:
        """Optimise and JIT ``ir`` (or fetch it from the memory / disk cache). Invalid
        IR raises CpuKernelError with LLVM's message."""
        ir = specialize_for_host(ir)    # the key is of the IR compiled on this host
        key = self.key(ir)
        with self._lock:
            mod = self._modules.get(key)
            if mod is not None:
                self.stats["memory_hits"] += 1
                return mod
            mod = JitModule(self._load(self._cached_object(ir, key, None)), key)
            self._modules[key] = mod
            return mod

    def object_for(self, ir: str, target: CpuTarget) -> bytes:
        """Object code of ``ir`` for ``target`` (from the disk cache or emitted and
        cached): specialised for the host first if ``target.host_ir``."""
        if target.host_ir:
            ir = specialize_for_host(ir)
        with self._lock:
            return self._cached_object(ir, self.key(ir, target), target)

    def _cached_object(self, ir: str, key: str, target: CpuTarget | None) -> bytes:
        obj = self._read_cache(key)
        if obj is not None:
            self.stats["disk_hits"] += 1
        else:
            obj = self.emit_object(ir, target)
            self.stats["compiled"] += 1
            self._write_cache(key, obj)
        return obj

    def load_object(self, obj: bytes) -> JitModule:
        """Load object code compiled ahead of time (for a target that
        :meth:`CpuTarget.runs_here`) into an engine of its own, compiling nothing; the
        same object is loaded once per process. CpuKernelError if it is not an object
        for this host (:func:`check_object`) or LLVM cannot load it."""
        key = "object:" + hashlib.sha256(obj).hexdigest()
        with self._lock:
            mod = self._modules.get(key)
            if mod is not None:
                self.stats["memory_hits"] += 1
                return mod
            check_object(obj)
            try:
                mod = JitModule(self._load(obj), key)
            except RuntimeError as exc:
                raise CpuKernelError(f"LLVM cannot load the object: {exc}") from None
            self.objects_loaded += 1
            self._modules[key] = mod
            return mod

    def optimize(self, ir: str, target: CpuTarget | None = None) -> llvm.ModuleRef:
        """Parse, verify and optimise ``ir`` for ``target`` (None: the host; O3 with loop
        and SLP vectorisation); returns the optimised module (``str()`` gives its IR).
        For the host, portable IR's helpers are first specialised
        (``specialize_for_host``: the kernels' byte dot products to x86 ``vpdpbusd``
        where it has them); other targets get the portable IR."""
        tm = self._tm if target is None else _target_machine(target)
        if target is None or target.host_ir:
            ir = specialize_for_host(ir)
        try:
            mod = llvm.parse_assembly(ir)
            mod.verify()
        except RuntimeError as exc:
            raise CpuKernelError(f"invalid LLVM IR: {exc}") from exc
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_interleaving = True
        pto.loop_unrolling = True
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return mod

    def emit_object(self, ir: str, target: CpuTarget | None = None) -> bytes:
        """Object code of ``ir`` optimised for ``target`` (None: the host)."""
        tm = self._tm if target is None else _target_machine(target)
        return tm.emit_object(self.optimize(ir, target))

    def emit_assembly(self, ir: str, target: CpuTarget | None = None) -> str:
        """Assembly of ``ir`` optimised for ``target`` (None: the host), to check
        vectorisation or time a loop with llvm-mca."""
        tm = self._tm if target is None else _target_machine(target)
        return tm.emit_assembly(self.optimize(ir, target))

    def _load(self, obj: bytes) -> llvm.ExecutionEngine:
        # MCJIT takes ownership of its target machine, so each engine gets its own.
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target_machine())
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        return engine

    def _cache_file(self, key: str) -> Path:
        return self.cache_path / f"{key}.o"

    def _read_cache(self, key: str) -> bytes | None:
        try:
            data = self._cache_file(key).read_bytes()
        except OSError:
            return None
        head = len(_MAGIC) + _DIGEST
        if len(data) <= head or not data.startswith(_MAGIC):
            return None
        obj = data[head:]
        if hashlib.sha256(obj).digest() != data[len(_MAGIC):head]:
            return None
        return obj

    def _write_cache(self, key: str, obj: bytes) -> None:
        # The cache is an optimisation: an unwritable folder must not fail the compile.
        with contextlib.suppress(OSError):
            self.cache_path.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_path, prefix=f".{key[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_MAGIC + hashlib.sha256(obj).digest() + obj)
                os.replace(tmp, self._cache_file(key))
            except BaseException:
                os.unlink(tmp)
                raise


_jit: Jit | None = None
_jit_lock = threading.Lock()


def get_jit() -> Jit:
    """The process-wide Jit (created on first use, caching under
    ``cache_dir("llvm")`` as resolved then)."""
    global _jit
    with _jit_lock:
        if _jit is None:
            _jit = Jit()
        return _jit
