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
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tessera.compiler.model import AccelStep, CompiledModel
from tessera.errors import DeviceError, RunError
from tessera.hostmodel import HostModel, get_host_model
from tessera.schedule import ACCELERATOR, CPU, ScheduledTask

from .dataflow import UnitRun, run_units
from .device import Device, LoadedProgram
from .plan import Unit, frame_units, node_of, project_board
from .profile import LayerProfile, Profile, StreamResult, layer_profiles

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

    def save(self, path: str | Path, cpu_targets: Sequence[str] = ("host", "board")) -> Path:
        """Write the compiled model file (``.tsr``) with its CPU kernels compiled ahead of
        time for ``cpu_targets`` (:func:`tessera.runtime.aot.prebuild`; ``()``: none), so
        that its first run on those CPUs compiles nothing."""
        from .aot import prebuild
        prebuild(self.compiled, cpu_targets)
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
            timeout: float | None = None, parallel: bool = False,
            host: HostModel | str | None = None) -> tuple[dict[str, np.ndarray], Profile]:
        """Run the model; returns ``({output name: array}, profile)``.

        ``inputs`` maps input names to arrays of the model's shapes and dtypes (a single
        array for a one-input model); a list or tuple is refused rather than matched to
        the inputs by position, since it reads as well as a batch of feeds. ``device``
        overrides ``backend`` with an open device of the model's config.
        ``progress(segment, cycles, estimate)`` is called while an accelerator segment
        runs (``estimate``: the sum of its layers' roofline bounds). ``parallel`` runs
        independent steps at once (CPU kernels on a pool of the host's cores beside the
        running accelerator segment; outputs are bit-identical to a sequential run).
        ``host`` is the board CPU the profile projects the latency for (its
        :class:`~tessera.hostmodel.HostModel`, a built-in's name, ``"local"`` or a file;
        by default the one the model was placed for).
        """
        dev = self._open(backend, device)
        hostmodel = self._host(host)
        env = self._checked_inputs(inputs)
        profile = self._run_frames([env], {}, dev, hostmodel, timeout, progress, parallel)
        return {t.name: env[t.name] for t in self.outputs}, profile

    def stream(self, frames: Sequence[Mapping[str, np.ndarray] | np.ndarray], *,
               state: Mapping[str, str] | None = None, backend: str = "sim",
               device: Device | None = None, pipelined: bool = True,
               host: HostModel | str | None = None, timeout: float | None = None,
               progress: Progress | None = None) -> StreamResult:
        """Run a sequence of inputs (e.g. video frames) through the model.

        ``pipelined`` (default) lets step k of frame f run beside step k+1 of frame f-1:
        CPU steps on a pool of the host's cores, segments one at a time on the
        accelerator; outputs are bit-identical to running the frames one by one.
        ``state`` maps each recurrent state input to the output carried into it from the
        previous frame (default: what the model declared, ONNX metadata
        ``tessera.recurrent_state``); the first frame's state comes from its feed, or is
        zero. Returns every frame's outputs with the throughput and per-frame latency,
        projected for ``host``'s board and measured here.
        """
        dev = self._open(backend, device)
        hostmodel = self._host(host)
        state = self._checked_state(self.compiled.state if state is None else state)
        envs = self._frame_envs(frames, state)
        profile = self._run_frames(envs, state, dev, hostmodel, timeout, progress, pipelined)
        return StreamResult([{t.name: env[t.name] for t in self.outputs} for env in envs],
                            profile)

    def _run_frames(self, envs: list[dict[str, np.ndarray]], state: Mapping[str, str],
                    dev: Device, hostmodel: HostModel, timeout: float | None,
                    progress: Progress | None, parallel: bool) -> Profile:
        """Run every frame's steps (one env per frame, ``state`` carried between them);
        the profile of the first frame's layers, with the board projection and the
        measured schedule of them all."""
        units = frame_units(self.compiled, len(envs), state)
        started = time.perf_counter()
        runs = self._execute(units, envs, state, dev, timeout, progress, parallel,
                             hostmodel.cores)
        if progress is not None:
            progress("done", 1, 1)
        profile = Profile(dev.backend, self.config, wall_seconds=time.perf_counter() - started)
        self._fill_profile(profile, units, runs)
        profile.board = project_board(self.compiled, units, hostmodel,
                                      profile.segment_seconds, parallel)
        steps = self.compiled.steps
        profile.measured = [ScheduledTask(steps[u.step].name, r.lane, r.start, r.end,
                                          _kind(steps[u.step]), u.frame)
                            for u, r in zip(units, runs)]
        return profile

    def _checked_state(self, state: Mapping[str, str]) -> dict[str, str]:
        """``state`` after checking each pair names an input and an output of one shape
        and dtype (RunError naming the pair otherwise)."""
        ins = {t.name: t for t in self.inputs}
        outs = {t.name: t for t in self.outputs}
        for name, source in state.items():
            if name not in ins or source not in outs:
                raise RunError(f"state {name!r} <- {source!r}: {name!r} must be a model input "
                               f"({sorted(ins)}) and {source!r} an output ({sorted(outs)})")
            a, b = ins[name], outs[source]
            if (tuple(a.shape), a.dtype) != (tuple(b.shape), b.dtype):
                raise RunError(f"state {name!r} is {a.dtype}{list(a.shape)} but {source!r}, "
                               f"carried into it, is {b.dtype}{list(b.shape)}")
        return dict(state)

    def _frame_envs(self, frames, state: Mapping[str, str]) -> list[dict[str, np.ndarray]]:
        """One env per frame: its checked feed; the state inputs only in the first
        (zeros where not given), carried from frame to frame afterwards."""
        if isinstance(frames, (np.ndarray, Mapping)) or not len(frames):
            raise RunError("frames must be a non-empty sequence of feeds (one per frame)")
        envs = []
        for f, feed in enumerate(frames):
            feed = {self.inputs[0].name: feed} if isinstance(feed, np.ndarray) else dict(feed)
            given = sorted(set(state) & set(feed))
            if f and given:
                raise RunError(f"frame {f} gives state input(s) {given}, which are carried "
                               "from the previous frame; give them only in frame 0")
            # Zeros stand in for the state the feed does not give: the first frame's
            # initial state; in later frames, only while the feed is checked.
            zeros = {t.name: np.zeros(t.shape, t.dtype) for t in self.inputs
                     if t.name in state and t.name not in feed}
            env = self._checked_inputs({**zeros, **feed})
            envs.append(env if f == 0 else {k: v for k, v in env.items() if k not in zeros})
        return envs

    def _host(self, host: HostModel | str | None) -> HostModel:
        """The host model a run projects onto: ``host``, else the one the model was
        placed for, else the config's board's."""
        return get_host_model(host if host is not None else self.compiled.host,
                              self.config.name)

    def _open(self, backend: str, device: Device | None) -> Device:
        if device is not None and not isinstance(device, Device):
            raise RunError(f"device is a {type(device).__name__}, not a Device: pass "
                           "model.device(backend) or one from tessera.runtime.open_device, "
                           "or only backend=")
        dev = device if device is not None else self.device(backend)
        if dev.config != self.config:
            raise DeviceError(f"the model was compiled for config {self.config.name!r}, the "
                              f"device runs {dev.config.name!r}")
        return dev

    def _execute(self, units: list[Unit], envs: list[dict[str, np.ndarray]],
                 state: Mapping[str, str], dev: Device, timeout: float | None,
                 progress: Progress | None, parallel: bool, cores: int) -> list[UnitRun]:
        """Run ``units`` (steps of frames, one env per frame) in order or in parallel."""
        steps = self.compiled.steps
        for k, step in enumerate(steps):            # JIT and loads before any timing
            if isinstance(step, AccelStep):
                self._resident(k, step, dev)
            else:
                self._kernel(k, step)

        def carry_state(unit: Unit) -> None:
            # The previous frame's state outputs, handed over before the unit starts
            # (its deps include their writers).
            env = envs[unit.frame]
            for name in steps[unit.step].inputs:
                if unit.frame and name in state and name not in env:
                    env[name] = envs[unit.frame - 1][state[name]]

        def run_unit(unit: Unit):
            step, env = steps[unit.step], envs[unit.frame]
            if isinstance(step, AccelStep):
                return self._run_accel(step, self._resident(unit.step, step, dev), env,
                                       timeout, progress)
            t0 = time.perf_counter()
            self._run_cpu(step, self._kernel(unit.step, step), env,
                          1 if parallel else None)
            return time.perf_counter() - t0

        resource = (lambda u: ACCELERATOR if isinstance(steps[u.step], AccelStep) else CPU)
        return run_units(units, resource, run_unit, cores=cores, parallel=parallel,
                         before=carry_state)

    def _fill_profile(self, profile: Profile, units: list[Unit], runs: list[UnitRun]) -> None:
        """Add the first frame's step results to ``profile``, in step order."""
        places = {p.node: p for p in self.compiled.placements}
        for unit, r in zip(units, runs):
            if unit.frame:
                continue
            step = self.compiled.steps[unit.step]
            if isinstance(step, AccelStep):
                cycles, layers, trace = r.result
                profile.layers += layers
                profile.accel_cycles += cycles
                profile.segment_seconds[unit.step] = self.config.cycles_to_seconds(cycles)
                if trace is not None:
                    profile.traces.append(trace)
                continue
            node = node_of(step.name)
            target = places[node].target if node in places else "cpu"
            if target == "cpu":
                profile.cpu_seconds += r.result
            profile.layers.append(LayerProfile(step.name, step.op, target, step.name,
                                               r.result))

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
    def _run_cpu(step, kernel, env: dict[str, np.ndarray], threads: int | None) -> None:
        from .cpu import run_cpu_step
        run_cpu_step(step, kernel, env, threads=threads)

    def _resident(self, k: int, step: AccelStep, dev: Device) -> LoadedProgram:
        """Step ``k``'s program loaded on ``dev`` (weights written on first use, kept until
        :meth:`close` or until the device's buffers are freed)."""
        key = (id(dev), k)
        loaded = self._loaded.get(key)
        if loaded is None or loaded.device is not dev or not loaded.live:
            loaded = self._loaded[key] = dev.load(step.program.program)
        return loaded

    def _run_accel(self, step: AccelStep, loaded: LoadedProgram, env: dict[str, np.ndarray],
                   timeout: float | None, progress: Progress | None):
        """Run one segment on ``env``: ``(cycles, layer profiles, trace or None)``."""
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
        sim_result = getattr(loaded.device, "last_result", None)
        trace = sim_result.trace if sim_result is not None else None
        rows = layer_profiles(cp.program, cp.op_bounds, trace, result.cycles)
        info = {x.name: x for x in step.layers}
        layers, spans = [], []
        for (name, cycles, gemm, dram, span), (_, first, end) in zip(rows, cp.op_bounds):
            layer = info.get(name)
            kind = layer.kind if layer else ""
            if first == end and layers:     # fused: it ran in the operator before it
                kind += f" (in {layers[-1].name})"
            seconds = self.config.cycles_to_seconds(cycles) if cycles is not None else 0.0
            layers.append(LayerProfile(
                name, kind, "accelerator", step.name, seconds, cycles,
                gemm, dram, layer.macs if layer else 0, layer.bound_cycles if layer else None,
                layer.bound_by if layer else ""))
            if span is not None:
                spans.append((name, *span))
        return result.cycles, layers, (None if trace is None
                                       else (step.name, list(trace), spans))


def _kind(step) -> str:
    """A step's kind on the timeline."""
    if isinstance(step, AccelStep):
        return "segment"
    return "view" if step.kernel is None else "cpu op"
