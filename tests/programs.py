"""Small program-building utilities for the simulator tests.

:func:`single_shot` builds a fully synchronised program: every load-module LOAD
(inp, wgt) runs first, then every compute-module instruction (the uop LOAD, acc
and acc8 LOADs, GEMM and ALU instructions), then every STORE, then FINISH.
Dependency tokens enforce exactly that order, so tests need not think about them.

LOADs and STOREs name a DRAM segment instead of a ``dram_base``: see
:func:`load` and :func:`store`.
"""
from __future__ import annotations

import atexit
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from tessera.config import PRESETS, HwConfig
from tessera.isa import (Finish, Instruction, Load, MemType, Program, Store, Uop, get_isa,
                         module_of)
from tessera.sim import SimResult, simulate

I32_MIN, I32_MAX = -(2**31), 2**31 - 1


# ------------------------------------------------------------------ DMA specs
@dataclass(frozen=True)
class SegDma:
    """A LOAD or STORE (``kind``) at segment ``segment``, ``offset`` elements in."""

    kind: type[Load] | type[Store]
    segment: str
    mem: MemType
    offset: int = 0
    fields: Mapping[str, Any] = field(default_factory=dict)

    def resolve(self, program: Program) -> Load | Store:
        base = program.elem_addr(self.segment, self.mem, self.offset)
        return self.kind(mem=self.mem, dram_base=base, **self.fields)


def load(segment: str, mem: MemType, offset: int = 0, **fields: Any) -> SegDma:
    """A LOAD spec; ``x_stride`` defaults to ``x_size``, ``y_size``/``x_size`` to 1."""
    fields.setdefault("x_stride", fields.get("x_size", 1))
    return SegDma(Load, segment, MemType(mem), offset, fields)


def store(segment: str, offset: int = 0, **fields: Any) -> SegDma:
    """A STORE spec; ``x_stride`` defaults to ``x_size``."""
    fields.setdefault("x_stride", fields.get("x_size", 1))
    return SegDma(Store, segment, MemType.OUT, offset, fields)


# ------------------------------------------------------------------- builder
def single_shot(config: HwConfig, *, segments: Mapping[str, np.ndarray | int] = {},
                uops: Sequence[Uop] = (), loads: Sequence[SegDma | Load] = (),
                compute: Sequence[Instruction | SegDma] = (),
                stores: Sequence[SegDma | Store] = ()) -> Program:
    """A program that loads, computes, stores and finishes, fully synchronised.

    ``segments`` maps segment names to their initial data (raw bytes of any
    array) or a size in bytes (zero-filled). ``uops`` (if any) go into segment
    ``"uops"`` and are loaded into uop entries ``0..len(uops)-1`` first.
    ``compute`` may contain acc/acc8/uop LOAD specs: they run in program order
    with the GEMM/ALU instructions (all are compute-module instructions).
    """
    p = Program(config)
    if uops:
        p.add_uops("uops", list(uops))
    for name, data in segments.items():
        p.add_segment(name, data)

    resolved = [spec.resolve(p) if isinstance(spec, SegDma) else spec for spec in loads]
    load_mod = [insn for insn in resolved if module_of(insn) == "load"]
    comp: list[Instruction] = []
    if uops:
        comp.append(Load(mem=MemType.UOP, dram_base=p.elem_addr("uops", MemType.UOP),
                         y_size=1, x_size=len(uops), x_stride=len(uops)))
    comp += [insn for insn in resolved if module_of(insn) == "compute"]
    comp += [spec.resolve(p) if isinstance(spec, SegDma) else spec for spec in compute]
    if any(module_of(insn) != "compute" for insn in comp):
        raise ValueError("compute may hold compute-module instructions only")
    sts = [spec.resolve(p) if isinstance(spec, SegDma) else spec for spec in stores]
    finish = Finish()

    # load -> compute: the last load-module LOAD releases the first compute instruction.
    if load_mod:
        load_mod[-1] = load_mod[-1].replace(push_next=True)
        if comp:
            comp[0] = comp[0].replace(pop_prev=True)
        else:
            finish = finish.replace(pop_prev=True)
    # compute -> store -> FINISH.
    if sts:
        if not comp:
            raise ValueError("stores need at least one compute-module instruction before them")
        comp[-1] = comp[-1].replace(push_next=True)
        sts[0] = sts[0].replace(pop_prev=True)
        sts[-1] = sts[-1].replace(push_prev=True)
        finish = finish.replace(pop_next=True)
    p.emit(*load_mod, *comp, *sts, finish)
    return p


#: The load module over two ports (a LOAD wgt's two-beat entries split, a beat per port),
#: DDR wide enough for every port at once.
TINY_2LOAD = PRESETS["tiny"].replace(name="tiny-2load", dram_ports=5,
                                     module_ports=(0, (1, 4), 2, 3), ddr_bytes_per_cycle=64.0)
#: GEMM cores that read a different channel block than they store (layers chain through
#: sub-block DMAs, compiler/accel/layout.py), with the DDR bandwidth of TINY_2LOAD.
TINY_8X4 = PRESETS["tiny"].replace(name="tiny-8x4", block_in=8, block_out=4,
                                   ddr_bytes_per_cycle=64.0)
TINY_4X8 = PRESETS["tiny"].replace(name="tiny-4x8", block_in=4, block_out=8, acc_depth=256,
                                   out_depth=256, ddr_bytes_per_cycle=64.0)

#: Configs the ``rtl`` backend runs (one Verilator build each): tiny ones in the default
#: test run (``tiny-2load``: :data:`TINY_2LOAD`); benchmarks/rtl_agreement.py sets
#: TESSERA_RTL_CONFIGS=pynq. On the ``pynq`` backend these configs run on the RTL-backed
#: simulated board, the others on the simulator-backed one.
RTL_CONFIGS = tuple(os.environ.get("TESSERA_RTL_CONFIGS",
                                   "tiny,tiny-b2,tiny-2load,tiny-8x4,tiny-4x8").split(","))
#: If set, every simulator-vs-device comparison appends a JSON line to this file.
RTL_REPORT = os.environ.get("TESSERA_RTL_REPORT")
#: Cycle agreement required when concurrent DRAM transfers shared bandwidth.
CONTENTION_TOLERANCE = 0.02
#: The backends of the Device API the semantic suites run on.
BACKENDS = ("sim", "rtl", "pynq")

_backend = "sim"


def use_backend(name: str) -> None:
    """Which Device API backend :func:`run` also runs each program on (``sim``, ``rtl`` or
    ``pynq``, the last through the simulated PYNQ board) and checks against the simulator."""
    global _backend
    assert name in BACKENDS, name
    _backend = name


def run(program: Program) -> SimResult:
    """Simulate ``program``, check no token is left behind, then run it through the Device
    API on the current backend and check that it agrees with the simulator."""
    result = simulate(program)
    assert not result.stats.leftover_tokens, result.stats.leftover_tokens
    assert_device_agrees(program, result, _backend)
    return result


_devices: dict[tuple[str, HwConfig], Any] = {}


def device(backend: str, config: HwConfig):
    """One long-lived device per backend, config and set of registered ALU ops (an RTL
    build has the hardware of the ops registered when it was made; reset to power-up
    before each run), closed when the test process exits."""
    from tessera.isa import ALU_OPS
    key = (backend, config, tuple((op.name, op.opcode) for op in ALU_OPS))
    if key not in _devices:
        from tessera.runtime import open_device

        if not _devices:
            atexit.register(_close_devices)
        if backend == "pynq":
            from tessera.runtime.pynq_sim import open_simulated_pynq

            model = "rtl" if config.name in RTL_CONFIGS else "sim"
            _devices[key] = open_simulated_pynq(config, model=model)
        else:
            _devices[key] = open_device(backend, config)
    return _devices[key]


def _close_devices() -> None:
    for dev in _devices.values():
        dev.close()
    _devices.clear()


def assert_device_agrees(program: Program, sim: SimResult, backend: str = "rtl") -> None:
    """``program`` run through the Device API on ``backend``: its final DRAM is bit-identical
    to the simulator's, its cycle count equal (or within :data:`CONTENTION_TOLERANCE` when
    DRAM transfers contended).

    Buffers start zeroed on every backend (a power-up reset before each run), as in the
    simulator: the tests' programs may read buffer entries they never wrote.
    """
    import pytest

    if backend == "rtl" and program.config.name not in RTL_CONFIGS:
        pytest.skip(f"the rtl backend runs configs {RTL_CONFIGS} in the default test run")
    dev = device(backend, program.config)
    dev.reset()
    got = dev.run(program)
    expected = sim.dram[:program.insn_addr]
    if RTL_REPORT:
        with open(RTL_REPORT, "a") as f:
            f.write(json.dumps({
                "test": os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0],
                "backend": backend, "config": program.config.name,
                "instructions": len(program.instructions), "sim_cycles": sim.stats.cycles,
                "rtl_cycles": got.cycles, "contended": sim.stats.dram_contended,
                "dram_equal": bool(np.array_equal(got.dram, expected))}) + "\n")
    diff = np.nonzero(got.dram != expected)[0]
    assert diff.size == 0, (f"DRAM differs on {backend} at {diff.size} bytes, first at "
                            f"{int(diff[0]):#x}: sim {expected[diff[:8]]}, {backend} "
                            f"{got.dram[diff[:8]]}")
    if sim.stats.dram_contended:
        assert abs(got.cycles - sim.stats.cycles) <= CONTENTION_TOLERANCE * sim.stats.cycles, \
            (got.cycles, sim.stats.cycles)
    else:
        assert got.cycles == sim.stats.cycles, (got.cycles, sim.stats.cycles)


# ------------------------------------------------------------- data helpers
def out_dtype(config: HwConfig) -> type:
    return {8: np.int8, 16: np.int16, 32: np.int32}[config.out_width]


def out_bytes(config: HwConfig, entries: int) -> int:
    """Bytes of ``entries`` output-buffer entries in DRAM."""
    return entries * get_isa(config).elem_bytes(MemType.OUT)


def read_out(result: SimResult, segment: str, config: HwConfig, entries: int) -> np.ndarray:
    """The first ``entries`` output entries stored in ``segment``, as (entries, batch, block_out)."""
    n = entries * config.batch * config.block_out
    values = result.read(segment, out_dtype(config))[:n]
    return values.reshape(entries, config.batch, config.block_out)


def acc_entries(config: HwConfig, values: np.ndarray) -> np.ndarray:
    """``values`` reshaped to accumulator entries ``(n, batch, block_out)`` int32."""
    return np.asarray(values, dtype=np.int64).astype(np.int32).reshape(
        -1, config.batch, config.block_out)


def run_on_acc(config: HwConfig, acc_init: np.ndarray, compute: Sequence[Instruction],
               uops: Sequence[Uop] = (), store_rows: int | None = None
               ) -> tuple[SimResult, np.ndarray, np.ndarray]:
    """Load ``acc_init`` (n, batch, block_out) into acc rows 0..n-1, run ``compute``,
    store rows ``0..store_rows-1`` (default n).

    Returns the result, the final accumulator rows 0..n-1 (int64) and the stored
    output rows (int8 for the presets).
    """
    acc_init = acc_entries(config, acc_init)
    n = acc_init.shape[0]
    rows = n if store_rows is None else store_rows
    prog = single_shot(
        config, uops=uops,
        segments={"acc": acc_init, "out": out_bytes(config, rows)},
        loads=[load("acc", MemType.ACC, x_size=n)],
        compute=compute,
        stores=[store("out", x_size=rows)])
    result = run(prog)
    return result, result.datapath.acc[:n].astype(np.int64), read_out(result, "out", config, rows)


# ----------------------------------------------------- independent references
def wrap32(x):
    """Two's-complement wrap to int32, written out independently of the library.

    Takes a Python int or an integer array whose values fit int64.
    """
    if isinstance(x, int):
        return ((x + 2**31) % 2**32) - 2**31
    return ((np.asarray(x, dtype=np.int64) + 2**31) % 2**32) - 2**31


def sat8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.asarray(x, dtype=np.int64), -128, 127)
