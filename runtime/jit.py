"""JIT for the CPU fallback kernels: LLVM IR text -> optimised (O3, loop and SLP
vectorisation, for the host CPU) machine code, cached in memory and on disk.

The disk cache stores object code under ``tessera.cache.cache_dir("llvm")``, one file
per module, keyed by sha256 of (IR text, host CPU name, CPU features, llvmlite version,
cache format version). Files are written atomically (temp file + ``os.replace``) so
concurrent processes can share the folder, and carry a checksum of their payload: a
corrupt or truncated file is ignored and rebuilt (never handed to LLVM, which may abort
on a malformed object).

Each compiled module gets its own MCJIT engine, so kernels may use the same symbol
names (every kernel's function may be called ``entry``).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from tessera.cache import cache_dir
from tessera.compiler.cpu.sparse_dots import specialize_for_host
from tessera.errors import CpuKernelError

#: Bump when the optimisation pipeline or the file layout changes.
CACHE_FORMAT = 1
_MAGIC = b"TESSOBJ1"
_DIGEST = 32


@lru_cache(maxsize=None)
def _init_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


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


def _target_machine() -> llvm.TargetMachine:
    cpu, features = host_cpu()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=cpu, features=features, opt=3,
                                        codemodel="jitdefault", jit=True)


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
    """Compiles LLVM IR for the host CPU. ``stats`` counts memory hits, disk hits and
    compilations (for tests and profiles)."""

    def __init__(self, cache_path: Path | None = None) -> None:
        _init_llvm()
        self.cache_path = Path(cache_path) if cache_path is not None else cache_dir("llvm")
        self.stats = {"memory_hits": 0, "disk_hits": 0, "compiled": 0}
        self._modules: dict[str, JitModule] = {}
        self._lock = threading.Lock()
        self._tm = _target_machine()

    def key(self, ir: str) -> str:
        """Cache key of ``ir`` on this host."""
        cpu, features = host_cpu()
        h = hashlib.sha256()
        for part in (ir, cpu, features, llvmlite.__version__, str(CACHE_FORMAT)):
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
            obj = self._read_cache(key)
            if obj is not None:
                self.stats["disk_hits"] += 1
            else:
                obj = self.emit_object(ir)
                self.stats["compiled"] += 1
                self._write_cache(key, obj)
            mod = JitModule(self._load(obj), key)
            self._modules[key] = mod
            return mod

    def optimize(self, ir: str) -> llvm.ModuleRef:
        """Parse, verify and optimise ``ir`` for the host (O3 with loop and SLP
        vectorisation); returns the optimised module (``str()`` gives its IR). Portable
        IR's helpers are first specialised for the host (``specialize_for_host``: the
        kernels' byte dot products to x86 ``vpdpbusd`` where it has them)."""
        try:
            mod = llvm.parse_assembly(specialize_for_host(ir))
            mod.verify()
        except RuntimeError as exc:
            raise CpuKernelError(f"invalid LLVM IR: {exc}") from exc
        mod.triple = self._tm.triple
        mod.data_layout = str(self._tm.target_data)
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_interleaving = True
        pto.loop_unrolling = True
        pb = llvm.create_pass_builder(self._tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return mod

    def emit_object(self, ir: str) -> bytes:
        """Object code of ``ir`` optimised for the host."""
        return self._tm.emit_object(self.optimize(ir))

    def emit_assembly(self, ir: str) -> str:
        """Host assembly of ``ir`` after optimisation (to check vectorisation)."""
        return self._tm.emit_assembly(self.optimize(ir))

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
