"""Running a batch of structures on a device: linearize, instantiate, launch, read back.

Every launch goes through the Device API (the DMA firewall checks each stream before it
starts) on any backend -- ``sim``, ``rtl``, or ``pynq`` (a board, or the simulated one in
tests). The model's segments (weights, the templates' uops, parameters and tables, the
embeddings) are written to a device once and stay there across runs (model
persistence); a run writes its zeroed state arrays (and its own input matrix, if it
gives one) and an instruction stream per launch. The launches of a ``"batch"`` or
``"node"`` run share those buffers, so the children's states one launch stores stay in
device memory for the next (as a framework's would).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tessera.errors import DeviceError, RunError
from tessera.isa import Program
from tessera.runtime import open_device
from tessera.runtime.device import Device, DeviceBuffer
from tessera.runtime.firewall import relocate

from .compiled import RecursiveModel, check_rows, input_matrix
from .matrix import untiled
from .program import Layout
from .structure import Linearized


@dataclass
class RecursiveResult:
    """What a run produced."""

    #: Each structure's result: its output node's output state, dequantized ``(S, width)``.
    outputs: np.ndarray
    #: Every node's int8 states, ``{state: (N, width)}``.
    states: dict[str, np.ndarray]
    lin: Linearized
    #: Accelerator cycles of each launch.
    cycles: list[int]
    #: Host seconds spent before the first launch: ``linearize``, ``instantiate``.
    host_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def launches(self) -> int:
        return len(self.cycles)


def _inputs(model: RecursiveModel, lin: Linearized, inputs: np.ndarray | None
            ) -> np.ndarray | None:
    """The int8 input matrix of a run (the model's embeddings when none is given)."""
    if inputs is None and model.embeddings is not None and model.cell.embed:
        check_rows(model.cell, lin, model.embeddings.shape[0], RunError, "run")
        return model.embeddings_q
    matrix = input_matrix(model.cell, lin, inputs, RunError, "run", (
        "pass inputs=<float matrix, one row per input index> (the model has no embeddings)"))
    return None if matrix is None else model.quantized.quantize_inputs(matrix)


def prepare(model: RecursiveModel, structures: Sequence[object],
            inputs: np.ndarray | None = None, launches: str = "tree"
            ) -> tuple[Linearized, list[Program], Layout, dict[str, float]]:
    """Linearize and instantiate (all host work before a launch), timed."""
    t0 = time.perf_counter()
    lin = model.linearize(structures)
    t1 = time.perf_counter()
    programs, layout = model.programs(lin, _inputs(model, lin, inputs), launches)
    t2 = time.perf_counter()
    return lin, programs, layout, {"linearize": t1 - t0, "instantiate": t2 - t1}


def _launch(device: Device, program: Program, buffers: dict[str, DeviceBuffer]) -> int:
    """Run ``program`` on buffers already holding its segments; its cycles."""
    insns = relocate(program, {n: b.address for n, b in buffers.items()})
    encoded = device.isa.encode_program(insns)
    stream = device.allocate(len(encoded), "instructions")
    try:
        stream.write(encoded)
        device.launch(stream, len(insns), buffers=list(buffers.values()))
        return device.wait().cycles
    finally:
        stream.free()


def read_states(model: RecursiveModel, layout: Layout, lin: Linearized,
                read) -> dict[str, np.ndarray]:
    """Every node's int8 states from the state arrays (``read(segment) -> bytes``)."""
    out = {}
    for s, e in model.cell.states.items():
        name = f"state:{s}"
        rows = np.asarray(read(name)).view(np.int8).reshape(-1, layout.row_bytes[name])
        rows = rows[:lin.num_nodes]
        out[s] = (untiled(rows.reshape(lin.num_nodes, -1, model.config.block_out), e.rows,
                          e.width, model.config.block_out) if e.rows > 1
                  else rows[:, :e.width].copy())
    return out


def _buffers(model: RecursiveModel, dev: Device, program: Program, resident: set[str]
             ) -> tuple[dict[str, DeviceBuffer], list[DeviceBuffer]]:
    """A buffer per segment of ``program``: the model's own segments (``resident``) stay on
    the device across runs (written once: model persistence), the run's are new. Returns
    every buffer and the run's (to free)."""
    kept = model.device_buffers.setdefault(dev, {})
    buffers, fresh = {}, []
    for seg in program.segments:
        buf = kept.get(seg.name) if seg.name in resident else None
        if buf is None or not buf.live or buf.size != seg.size:
            buf = dev.allocate(seg.size, seg.name)
            buf.write(seg.data)
            if seg.name in resident:
                kept[seg.name] = buf
            else:
                fresh.append(buf)
        buffers[seg.name] = buf
    return buffers, fresh


def run(model: RecursiveModel, structures: Sequence[object], inputs: np.ndarray | None = None,
        *, device: Device | None = None, backend: str = "sim", launches: str = "tree"
        ) -> RecursiveResult:
    """Run ``structures`` (see :func:`~.structure.linearize` for the forms) on ``device``
    (default: a new one of ``backend`` for the model's config). ``inputs``: the float
    matrix whose rows the nodes' input indices select (default the model's embeddings,
    kept on the device with the weights). ``launches``: ``"tree"`` (one program),
    ``"batch"`` or ``"node"`` (baselines)."""
    lin, programs, layout, host = prepare(model, structures, inputs, launches)
    resident = {s.name for s in programs[0].segments
                if not s.name.startswith(("state:", "scratch"))
                and (s.name != "input" or inputs is None)}
    own = device is None
    if not own and device.config != model.config:
        raise DeviceError(f"{model.cell.name} was compiled for config {model.config.name!r}; "
                          f"the device runs {device.config.name!r}: compile it for "
                          f"{device.config.name!r} or open a device for {model.config.name!r}")
    dev = open_device(backend, model.config) if own else device
    try:
        buffers, fresh = _buffers(model, dev, programs[0], resident)
        try:
            cycles = [_launch(dev, p, buffers) for p in programs]
            states = read_states(model, layout, lin, lambda n: buffers[n].read())
        finally:
            for buf in fresh:
                buf.free()
    finally:
        if own:
            dev.close()
    out = model.quantized.dequantize(model.cell.output, states[model.cell.output][lin.roots])
    return RecursiveResult(out, states, lin, cycles, host)
