"""CPU kernels' modules compiled ahead of time, as a compiled model carries them.

A :class:`CpuObjects` is one kernel's module (its IR and the runtime's call wrappers) as
object code for some CPU targets. It is kept with the kernel object
(:func:`attach_cpu_objects`, :func:`cpu_objects`; :func:`tessera.runtime.aot.prebuild`
builds them, the runtime loads them instead of JIT-compiling the IR) and stored in a
``.tsr`` (:func:`write_cpu_objects`, :func:`read_cpu_objects`) as blob sections
``cpuobj.<kernel digest>.<target name>``, one per distinct kernel and target, with the
targets' records in the manifest's ``cpu_targets``. Files without them load as before.
The compiler treats the objects and the targets' records as opaque data.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass
from typing import Sequence

from tessera.errors import ProgramFileError
from tessera.modelfile import ModelFile

from .kernel import CpuKernel
from .lower import CpuStep

__all__ = ["CpuObjects", "attach_cpu_objects", "cpu_objects", "kernel_digest",
           "read_cpu_objects", "write_cpu_objects"]


@dataclass(frozen=True)
class CpuObjects:
    """A CPU kernel's module compiled ahead of time: ``code`` maps a target's name to the
    object code, ``targets`` the name to the target's record (the runtime's
    ``CpuTarget.to_dict()``; opaque to the compiler)."""

    targets: dict[str, dict]
    code: dict[str, bytes]


#: id(kernel) -> its objects, for as long as the kernel lives (CpuKernel is a frozen
#: record of the IR; a side table keeps the objects off it and out of its equality).
_CPU_OBJECTS: dict[int, CpuObjects] = {}


def attach_cpu_objects(kernel: CpuKernel, objects: CpuObjects) -> None:
    """Keep ``objects`` with ``kernel`` (added to any it has; for as long as it lives):
    saving its model writes them, the runtime loads them instead of compiling its IR."""
    old = _CPU_OBJECTS.get(id(kernel))
    if old is None:
        weakref.finalize(kernel, _CPU_OBJECTS.pop, id(kernel), None)
    else:
        objects = CpuObjects({**old.targets, **objects.targets}, {**old.code, **objects.code})
    _CPU_OBJECTS[id(kernel)] = objects


def cpu_objects(kernel: CpuKernel) -> CpuObjects | None:
    """The objects attached to ``kernel`` (None: it has none)."""
    return _CPU_OBJECTS.get(id(kernel))


def kernel_digest(kernel: CpuKernel) -> str:
    """A short digest of everything a kernel's compiled module depends on (its record)."""
    text = json.dumps(kernel.to_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _object_section(kernel_id: str, target: str) -> str:
    return f"cpuobj.{kernel_id}.{target}"


def write_kernel_texts(kernel: CpuKernel, mf: ModelFile, k: int) -> dict:
    """Put step ``k``'s kernel IR (and its variants') into text sections of ``mf`` (not
    strings in the manifest); returns the kernel's manifest record."""
    mf.texts[f"kernel.{k}"] = kernel.ir
    record = {**kernel.to_dict(), "ir": None}
    if kernel.variants:     # (a kernel without keeps the record it always had)
        record["variants"] = {str(bits): None for bits, _ in kernel.variants}
        for bits, ir in kernel.variants:
            mf.texts[f"kernel.{k}.v{bits}"] = ir
    return record


def read_kernel_texts(record: dict, mf: ModelFile, k: int) -> dict:
    """Step ``k``'s kernel ``record`` (as :func:`write_kernel_texts` returned it) with its
    IR and its variants' read back from their sections."""
    variants = {bits: mf.text(f"kernel.{k}.v{bits}") for bits in record.get("variants", {})}
    return {**record, "ir": mf.text(f"kernel.{k}"), "variants": variants}


def write_cpu_objects(steps: Sequence, mf: ModelFile) -> dict[str, dict]:
    """Add the objects attached to the steps' kernels to ``mf`` (once per distinct
    kernel); return the records of their targets."""
    targets: dict[str, dict] = {}
    for step in steps:
        objects = cpu_objects(step.kernel) if isinstance(step, CpuStep) and step.kernel \
            else None
        if objects is None:
            continue
        kid = kernel_digest(step.kernel)
        for name, code in objects.code.items():
            mf.blobs[_object_section(kid, name)] = code
            targets[name] = objects.targets[name]
    return targets


def read_cpu_objects(steps: Sequence, mf: ModelFile, source: str) -> None:
    """Attach to the steps' kernels the objects ``mf`` holds for them."""
    targets = mf.manifest.get("cpu_targets") or {}
    if not isinstance(targets, dict) or not all(isinstance(t, dict)
                                                for t in targets.values()):
        raise ProgramFileError(f"{source}: the compiled model's cpu_targets is malformed; "
                               "recompile the model")
    for step in steps:
        if not targets or not isinstance(step, CpuStep) or step.kernel is None:
            continue
        kid = kernel_digest(step.kernel)
        code = {}
        for name in targets:
            blob = mf.blobs.get(_object_section(kid, name))
            if isinstance(blob, bytes):
                code[name] = blob
        if code:
            attach_cpu_objects(step.kernel, CpuObjects({n: targets[n] for n in code}, code))
