"""The timing model: cycle counts of every instruction as formulas.

This module is the executable form of ``docs/timing.md``; the simulator calls
these functions and nothing else for its durations, and the RTL implements the
same numbers. Change both the document and this module together.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import HwConfig
from .isa.encoding import INSN_BYTES, get_isa
from .isa.instructions import LOAD_MODULE, Alu, Gemm, Instruction, Load, MemType, _MemInsn
from .isa.intrinsics import ALU_OPS

#: Cycles a module spends decoding a LOAD/STORE and setting up its address generator.
DMA_SETUP_CYCLES = 2
#: Cycles a compute instruction (GEMM, ALU, FINISH) spends in decode before its first op.
COMPUTE_SETUP_CYCLES = 1
#: GEMM pipeline: uop read, operand read (inp, wgt, acc), multiply-add, acc write.
#: An op issued in cycle t writes its accumulator row in cycle t + GEMM_LATENCY.
GEMM_LATENCY = 3
#: Cycles the fetch module spends dispatching one instruction into a command queue.
FETCH_DISPATCH_CYCLES = 1
#: A command dispatched in cycle t can start executing in cycle t + CMD_QUEUE_LATENCY.
CMD_QUEUE_LATENCY = 1
#: A token pushed when an instruction completes at cycle t can be popped at t + TOKEN_LATENCY.
TOKEN_LATENCY = 0


#: The compute module's execution units. GEMM instructions run on the GEMM
#: core, ALU instructions on the tensor ALU; LOAD uop/acc/acc8 and FINISH take
#: the whole module. See docs/timing.md, "Compute units".
COMPUTE_UNITS = ("gemm", "alu")


def compute_unit(insn: Instruction) -> str | None:
    """The unit a compute instruction runs on, or ``None`` for one that takes both."""
    if isinstance(insn, Gemm):
        return "gemm"
    if isinstance(insn, Alu):
        return "alu"
    return None


def units_awaited(insn: Instruction) -> tuple[str, ...]:
    """The units whose earlier instructions must have ended before ``insn`` starts."""
    unit = compute_unit(insn)
    return (unit,) if unit is not None and insn.overlap else COMPUTE_UNITS


def units_taken(insn: Instruction) -> tuple[str, ...]:
    """The units ``insn`` occupies while it runs."""
    unit = compute_unit(insn)
    return (unit,) if unit is not None else COMPUTE_UNITS


def pipeline_cycles(ops: int, ii: int, latency: int) -> int:
    """Cycles from the first issue until the last write has landed: ``(ops-1)*ii + latency + 1``."""
    return (ops - 1) * ii + latency + 1 if ops > 0 else 0


def gemm_cycles(insn: Gemm) -> int:
    """GEMM (and GEMM reset): setup, then one op per cycle, then the pipeline drains."""
    return COMPUTE_SETUP_CYCLES + pipeline_cycles(insn.op_count, 1, GEMM_LATENCY)


def gemm_hazard_distance() -> int:
    """Ops closer than this that write and then read the same accumulator row conflict."""
    return GEMM_LATENCY


def alu_cycles(insn: Alu) -> int:
    """ALU: setup, then one op every ``ii`` cycles, then the op's pipeline drains.

    A reset ALU instruction runs at one row per cycle with the GEMM's latency.
    """
    if insn.reset:
        return COMPUTE_SETUP_CYCLES + pipeline_cycles(insn.op_count, 1, GEMM_LATENCY)
    timing = ALU_OPS.get(insn.alu_op).timing
    return COMPUTE_SETUP_CYCLES + pipeline_cycles(insn.op_count, timing.ii(insn.use_imm),
                                                  timing.write_latency(insn.use_imm))


def finish_cycles() -> int:
    return COMPUTE_SETUP_CYCLES


@dataclass(frozen=True)
class DmaCost:
    """The cost of one LOAD or STORE.

    ``beats``: bus beats on the DRAM ports (each ``bus_bytes`` wide), all ports together.
    ``ports``: how many ports the beats are split over, evenly (:func:`load_ports`).
    ``data_cycles``: cycles to stream the data with no contention, at most one
    beat per port and one SRAM entry per cycle, row by row.
    ``pad_cycles``: one cycle per zero-padding entry written (loads only).
    The instruction takes ``DMA_SETUP_CYCLES + pad_cycles``, then (if
    ``data_cycles``) ``dram_latency`` plus the streaming time of
    ``data_cycles`` (longer under contention); see docs/timing.md.
    """

    beats: int
    data_cycles: int
    pad_cycles: int
    ports: int = 1


def load_ports(config: HwConfig, mem: MemType) -> int:
    """How many DRAM ports a LOAD of ``mem`` reads over at once: the load module's ports
    (``HwConfig.ports_of``) when it runs the LOAD and an entry of ``mem`` spans a multiple
    of that many beats (port ``p`` then reads the ``p``-th equal piece of every entry),
    else 1 (an entry narrower than that would need more than one SRAM write per cycle)."""
    if LOAD_MODULE.get(mem) != "load":
        return 1
    ports = len(config.ports_of("load"))
    beats_per_entry = get_isa(config).elem_bytes(mem) // config.bus_bytes
    return ports if beats_per_entry and beats_per_entry % ports == 0 else 1


def dma_cost(config: HwConfig, insn: _MemInsn) -> DmaCost:
    """Beats and cycles of a LOAD/STORE (``x_size == 0``: a no-op with neither)."""
    if insn.is_nop:
        return DmaCost(0, 0, 0)
    elem = get_isa(config).elem_bytes(insn.mem)
    bus = config.bus_bytes
    rows = np.arange(insn.y_size, dtype=np.int64)
    starts = (insn.dram_base + rows * insn.x_stride) * elem
    beats = -(-(starts % bus + insn.x_size * elem) // bus)
    ports = load_ports(config, insn.mem) if isinstance(insn, Load) else 1
    # Split over ports, entries span whole beats, so every row's beats divide evenly.
    data_cycles = int(np.maximum(beats // ports, insn.x_size).sum())
    pads = 0
    if isinstance(insn, Load):
        total = (insn.y_pad_0 + insn.y_size + insn.y_pad_1) * (insn.x_pad_0 + insn.x_size + insn.x_pad_1)
        pads = total - insn.y_size * insn.x_size
    return DmaCost(int(beats.sum()), data_cycles, pads, ports)


def fetch_chunk_insns(config: HwConfig) -> int:
    """Instructions fetched per DRAM burst (one maximal burst, at least one instruction)."""
    return max(1, config.max_burst_beats * config.bus_bytes // INSN_BYTES)


def fetch_chunk_beats(config: HwConfig, insns: int) -> int:
    return -(-insns * INSN_BYTES // config.bus_bytes)

