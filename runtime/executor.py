"""Running compiled models: :class:`Model`, one executor over every backend.

A :class:`~tessera.compiler.model.CompiledModel` is a list of steps. The executor keeps
the model's tensors on the host by name and runs each step in order:

* an accelerator segment: its program is loaded on the device once
  (:meth:`~.device.Device.load`: a buffer per segment, weights and microcode written,
  the stream relocated); each run writes only the input segments, launches (through
  the DMA firewall), waits and reads back only the output segments;
* a CPU step: its LLVM kernel (JIT-compiled once per model and cached) on the host;
* a view: a reshape.

``Model.run(inputs, backend="sim")`` returns the outputs and a
:class:`~.profile.Profile`. The same model runs on ``sim``, ``rtl`` and ``pynq`` (pass
``device=`` to reuse an open device, e.g. a board).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from tessera.compiler.model import AccelStep, CompiledModel
from tessera.errors import DeviceError, RunError

from .device import Device, LoadedProgram
from .profile import LayerProfile, Profile, layer_profiles

__all__ = ["Model"]


Progress = Callable[[str, int, int], None]


class Model:
    """A compiled model ready to run; ``tessera.compile`` and ``tessera.load`` return one."""

    def __init__(self, compiled: CompiledModel) -> None:
        self.compiled = compiled
        self._kernels: dict[int, Any] = {}
        self._devices: dict[str, Device] = {}
        # (device, step index) -> the step's program resident on that device.
        self._loaded: dict[tuple[int, int], LoadedProgram] = {}

    # ------------------------------------------------------------------ info
    @property
    def config(self):
        return self.compiled.config

    @property
    def inputs(self):
        return self.compiled.inputs

    @property
    def outputs(self):
        return self.compiled.outputs

    @property
    def placements(self):
        return self.compiled.placements

    def summary(self) -> str:
        """The placement of every node with its reason."""
        return self.compiled.summary()

    def save(self, path: str | Path) -> Path:
        """Write the compiled model file (``.tsr``)."""
        return self.compiled.save(path)

    @classmethod
    def load(cls, path: str | Path) -> "Model":
        """Read a ``.tsr`` file (needs only the runtime's dependencies)."""
        return cls(CompiledModel.load(path))

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}{list(t.shape)}:{t.dtype}" for t in self.inputs)
        return (f"Model({self.compiled.source!r}, config {self.config.name!r}, inputs {ins}, "
                f"{len(self.compiled.steps)} steps)")

    # ------------------------------------------------------------------ running
    def device(self, backend: str = "sim", **options: Any) -> Device:
        """The device this model runs on for ``backend`` (opened once, then reused)."""
        if backend not in self._devices:
            from . import open_device
            if backend == "sim":
                options.setdefault("trace", True)
            self._devices[backend] = open_device(backend, self.config, **options)
        return self._devices[backend]

    def close(self) -> None:
        """Free the model's programs on every device it ran on, close the devices it
        opened."""
        for loaded in self._loaded.values():
            if loaded.live:
                loaded.free()
        self._loaded.clear()
        for dev in self._devices.values():
            dev.close()
        self._devices.clear()

    def run(self, inputs: Mapping[str, np.ndarray] | np.ndarray, *, backend: str = "sim",
            device: Device | None = None, progress: Progress | None = None,
            timeout: float | None = None) -> tuple[dict[str, np.ndarray], Profile]:
        """Run the model; returns ``({output name: array}, profile)``.

        ``inputs`` maps input names to arrays of the model's shapes and dtypes (a single
        array for a one-input model); a list or tuple is refused rather than matched to
        the inputs by position, since it reads as well as a batch of feeds. ``device``
        overrides ``backend`` with an open device of the model's config.
        ``progress(segment, cycles, estimate)`` is called while an accelerator segment
        runs (``estimate``: the sum of its layers' roofline bounds).
        """
        if device is not None and not isinstance(device, Device):
            raise RunError(f"device is a {type(device).__name__}, not a Device: pass "
                           "model.device(backend) or one from tessera.runtime.open_device, "
                           "or only backend=")
        dev = device if device is not None else self.device(backend)
        if dev.config != self.config:
            raise DeviceError(f"the model was compiled for config {self.config.name!r}, the "
                              f"device runs {dev.config.name!r}")
        env = self._checked_inputs(inputs)
        profile = Profile(dev.backend, self.config)
        places = {p.node: p for p in self.compiled.placements}
        started = time.perf_counter()
        steps = self.compiled.steps
        for k, step in enumerate(steps):
            if isinstance(step, AccelStep):
                loaded = self._resident(k, step, dev)
                self._run_accel(step, loaded, env, profile, timeout, progress)
            else:
                kernel = self._kernel(k, step)     # JIT compilation is not the layer's time
                t0 = time.perf_counter()
                self._run_cpu(step, kernel, env)
                secs = time.perf_counter() - t0
                node = step.name.split(":")[0]
                target = places[node].target if node in places else "cpu"
                if target == "cpu":
                    profile.cpu_seconds += secs
                profile.layers.append(LayerProfile(step.name, step.op, target, step.name,
                                                   secs))
        if progress is not None:
            progress("done", 1, 1)
        profile.wall_seconds = time.perf_counter() - started
        return {t.name: env[t.name] for t in self.outputs}, profile

    def _checked_inputs(self, inputs) -> dict[str, np.ndarray]:
        """``inputs`` as ``{input name: contiguous array}``, or :class:`RunError` saying
        what is wrong with them (the container, a name, a shape, a dtype, a value)."""
        sigs = self.inputs
        names = [t.name for t in sigs]
        example = "{" + ", ".join(f"{n!r}: array" for n in names) + "}"
        if isinstance(inputs, np.ndarray):
            if len(sigs) != 1:
                raise RunError(f"the model has {len(sigs)} inputs ({', '.join(names)}): "
                               f"pass {example}")
            inputs = {sigs[0].name: inputs}
        if not isinstance(inputs, Mapping):
            raise RunError(f"inputs is a {type(inputs).__name__}; pass a dict of input name "
                           f"to array, {example}" + (
                               " (or the array itself: the model has one input)"
                               if len(sigs) == 1 else ""))
        unknown = set(inputs) - set(names)
        if unknown:
            raise RunError(f"unknown input(s) {sorted(map(str, unknown))}; the model's inputs "
                           f"are {names}")
        return {t.name: self._checked_input(t, inputs) for t in sigs}

    @staticmethod
    def _checked_input(t, inputs: Mapping) -> np.ndarray:
        """Input ``t`` (a :class:`TensorSig`) from ``inputs``, checked against it."""
        if t.name not in inputs:
            raise RunError(f"input {t.name!r} ({t.dtype}{list(t.shape)}) was not given")
        try:
            x = np.asarray(inputs[t.name])
        except (TypeError, ValueError) as exc:
            raise RunError(f"input {t.name!r} is not an array ({exc})") from None
        if x.shape != tuple(t.shape):
            raise RunError(f"input {t.name!r} has shape {list(x.shape)}, the model was "
                           f"compiled for {list(t.shape)}")
        if x.dtype != np.dtype(t.dtype):
            raise RunError(f"input {t.name!r} has dtype {x.dtype}, the model expects "
                           f"{t.dtype} (convert it with .astype(np.{t.dtype}))")
        if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
            raise RunError(f"input {t.name!r} holds NaN or infinite values")
        return np.ascontiguousarray(x)

    def _kernel(self, k: int, step):
        """Step ``k``'s loaded CPU kernel (JIT-compiled on first use; None for a view)."""
        if step.kernel is None:
            return None
        if k not in self._kernels:
            from .cpu import load_kernel  # llvmlite loads only when a model has CPU steps
            self._kernels[k] = load_kernel(step.kernel)
        return self._kernels[k]

    @staticmethod
    def _run_cpu(step, kernel, env: dict[str, np.ndarray]) -> None:
        from .cpu import run_cpu_step
        run_cpu_step(step, kernel, env)

    def _resident(self, k: int, step: AccelStep, dev: Device) -> LoadedProgram:
        """Step ``k``'s program loaded on ``dev`` (weights written on first use, kept until
        :meth:`close` or until the device's buffers are freed)."""
        key = (id(dev), k)
        loaded = self._loaded.get(key)
        if loaded is None or loaded.device is not dev or not loaded.live:
            loaded = self._loaded[key] = dev.load(step.program.program)
        return loaded

    def _run_accel(self, step: AccelStep, loaded: LoadedProgram, env: dict[str, np.ndarray],
                   profile: Profile, timeout: float | None,
                   progress: Progress | None) -> None:
        cp = step.program
        feeds = {}
        for name in step.inputs:
            # A kernel-position packed input keeps the name of the one it replaces.
            packed = name in cp.input_transforms or name not in cp.tensors
            feeds[name] = env[name] if packed else env[name].reshape(cp.tensors[name].layout.shape)
        estimate = max(1, int(sum(x.bound_cycles for x in step.layers)))
        report = None if progress is None else (
            lambda cycles: progress(step.name, min(cycles, estimate), estimate))
        result = loaded.run(cp.input_segments(feeds), read=cp.output_segments,
                            timeout=timeout, progress=report)
        for name in step.outputs:
            env[name] = cp.read(result, name).reshape(step.shapes[name])
        trace = None
        sim_result = getattr(loaded.device, "last_result", None)
        if sim_result is not None and sim_result.trace is not None:
            trace = sim_result.trace
        rows = layer_profiles(cp.program, cp.op_bounds, trace, result.cycles)
        info = {x.name: x for x in step.layers}
        spans = []
        for name, cycles, gemm, dram, span in rows:
            layer = info.get(name)
            seconds = self.config.cycles_to_seconds(cycles) if cycles is not None else 0.0
            profile.layers.append(LayerProfile(
                name, layer.kind if layer else "", "accelerator", step.name, seconds, cycles,
                gemm, dram, layer.macs if layer else 0, layer.bound_cycles if layer else None,
                layer.bound_by if layer else ""))
            if span is not None:
                spans.append((name, *span))
        profile.accel_cycles += result.cycles
        if trace is not None:
            profile.traces.append((step.name, list(trace), spans))
