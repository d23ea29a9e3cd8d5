"""CPU kernels compiled ahead of time: a compiled model's kernels as object code for
the CPUs that will run it, so its first inference compiles nothing.

:func:`prebuild` compiles each distinct CPU kernel's module (its IR, its parallel
dispatcher and the Python-call wrappers of :mod:`.cpu_abi`, laid out for the target's
pointer size) for each target of :func:`~.jit.cpu_target` -- by default this host
exactly and the CPU of the config's board -- and attaches the objects to the kernels
(:mod:`tessera.compiler.cpu.objects`), so that saving the model stores them in its
``.tsr``. Objects for this host are built from the IR specialised for it
(:func:`~tessera.compiler.cpu.sparse_dots.specialize_for_host`), the others from the
portable IR.

:func:`prebuilt_module` is what :func:`~.cpu.load_kernel` asks first: the object of a
kernel's targets that this host can run (:meth:`~.jit.CpuTarget.runs_here`: same
architecture and ABI, every feature the object was built with present), this host's
exact target first, loaded without compiling. A kernel without one, or whose object
cannot be loaded (a warning says which and why), is JIT-compiled from its IR as before.
"""
from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from tessera.compiler.cpu.kernel import CpuKernel
from tessera.compiler.cpu.lower import CpuStep
from tessera.compiler.cpu.objects import CpuObjects, attach_cpu_objects, cpu_objects
from tessera.errors import CpuKernelError

from .cpu_abi import module_functions, module_ir
from .jit import CpuTarget, JitModule, cpu_target, get_jit

if TYPE_CHECKING:       # loading a kernel needs no compiler beyond its record
    from tessera.compiler.model import CompiledModel

__all__ = ["DEFAULT_TARGETS", "prebuild", "prebuilt_module", "resolve_targets"]

#: What :func:`prebuild` compiles for unless told: this host exactly, and the CPU of the
#: board the model's config is for.
DEFAULT_TARGETS = ("host", "board")


def resolve_targets(names: Iterable[str | CpuTarget], config=None) -> list[CpuTarget]:
    """The distinct targets ``names`` stand for (see :func:`~.jit.cpu_target`)."""
    targets: dict[str, CpuTarget] = {}
    for name in names:
        for target in cpu_target(name, config):
            targets.setdefault(target.name, target)
    return list(targets.values())


def prebuild(compiled: "CompiledModel", targets: Sequence[str | CpuTarget] = DEFAULT_TARGETS,
             progress: Callable[[str, int, int], None] | None = None) -> dict[str, float]:
    """Compile every CPU kernel of ``compiled`` for ``targets`` (names or
    :class:`~.jit.CpuTarget`, see :func:`~.jit.cpu_target`) and attach the objects to the
    kernels: :meth:`CompiledModel.save` then writes them into the ``.tsr``, and loading
    the kernels here uses them. Targets a kernel already has objects for are skipped;
    objects come from the JIT's disk cache when it has them (and this host's go into it,
    so a later JIT of the same kernel here finds them).
    ``progress(stage, done, total)`` is called per kernel. Returns the seconds spent per
    target it built objects for."""
    resolved = resolve_targets(targets, compiled.config)
    kernels = list({id(s.kernel): s.kernel for s in compiled.steps
                    if isinstance(s, CpuStep) and s.kernel is not None}.values())
    jit = get_jit()
    seconds: dict[str, float] = {}
    for done, kernel in enumerate(kernels):
        code, have = {}, cpu_objects(kernel)
        for target in resolved:
            if have is not None and target.name in have.code:
                continue
            t0 = time.perf_counter()
            ir = module_ir(kernel, target.abi, vector_bits=target.vector_bits)
            code[target.name] = jit.object_for(ir, target)
            seconds[target.name] = seconds.get(target.name, 0.0) + time.perf_counter() - t0
        if code:
            attach_cpu_objects(kernel, CpuObjects({t.name: t.to_dict() for t in resolved
                                                   if t.name in code}, code))
        if progress is not None:
            progress("CPU objects", done + 1, len(kernels))
    return seconds


def prebuilt_module(kernel: CpuKernel) -> JitModule | None:
    """``kernel``'s module loaded from an object compiled ahead of time for a target this
    host runs (its exact target first), or None if it has none that fits. An object that
    fails to load is reported (RuntimeWarning: which kernel, which target, why) and
    skipped, so the caller JIT-compiles the IR."""
    objects = cpu_objects(kernel)
    if objects is None:
        return None
    for target in _runnable(kernel, objects):
        try:
            module = get_jit().load_object(objects.code[target.name])
            for name in module_functions(kernel):    # every one an object should have
                module.address(name)
            return module
        except CpuKernelError as exc:
            warnings.warn(f"CPU kernel {kernel.name!r}: its object for {target.name} "
                          f"({target.triple}) cannot be loaded ({exc}); compiling its IR "
                          "instead. Recompile the model to rebuild its CPU objects.",
                          RuntimeWarning, stacklevel=3)
    return None


def _runnable(kernel: CpuKernel, objects: CpuObjects) -> list[CpuTarget]:
    """The targets of ``objects`` this host can run, its exact target first."""
    found = []
    for name, record in objects.targets.items():
        try:
            target = CpuTarget.from_dict(record)
        except CpuKernelError as exc:
            warnings.warn(f"CPU kernel {kernel.name!r}: {exc}", RuntimeWarning, stacklevel=4)
            continue
        if name in objects.code and target.runs_here():
            found.append(target)
    return sorted(found, key=lambda t: not t.exactly_here())
