"""What the simulator needs to know of each instruction before it runs, derived once.

An instruction's module, token queues, compute units and duration (or DMA cost) follow
from its fields alone (the formulas of :mod:`tessera.timing`). :func:`program_facts`
derives them once per instruction stream and keeps the last few streams' facts, so a
runtime running one program again and again decodes, checks and times its stream once.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from tessera import timing
from tessera.config import HwConfig
from tessera.isa import (ALU_OPS, Alu, Finish, Gemm, Instruction, Load, Store,
                         check_instruction, get_isa, module_of)
from tessera.errors import MissingFinishError

#: Each module's previous and next module (the token-queue neighbours).
NEIGHBOURS = {"load": (None, "compute"), "compute": ("load", "store"), "store": ("compute", None)}
#: Instruction streams whose facts are kept (a runtime alternates between a few programs).
KEPT_STREAMS = 8


@dataclass(frozen=True, eq=False)
class InsnFacts:
    """One instruction with everything about it that does not depend on the run."""

    index: int
    insn: Instruction
    module: str
    #: Token queues (``"load->compute"``, ...) it pops before it starts and pushes at its end.
    pops: tuple[str, ...]
    pushes: tuple[str, ...]
    #: Compute units it waits for and occupies (``("main",)`` on load and store).
    awaited: tuple[str, ...]
    taken: tuple[str, ...]
    #: The compute unit it runs on ("gemm", "alu"; None for FINISH and DMA).
    unit: str | None
    #: Duration of a GEMM, ALU or FINISH.
    cycles: int
    #: A LOAD's or STORE's cost and the DRAM bytes it moves.
    dma: timing.DmaCost | None
    dma_bytes: int

    @property
    def is_finish(self) -> bool:
        return isinstance(self.insn, Finish)


def token_queues(module: str, insn: Instruction) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the token queues ``insn`` pops and pushes."""
    prev, nxt = NEIGHBOURS[module]
    pops = ((f"{prev}->{module}",) if insn.pop_prev else ()) + \
        ((f"{nxt}->{module}",) if insn.pop_next else ())
    pushes = ((f"{module}->{prev}",) if insn.push_prev else ()) + \
        ((f"{module}->{nxt}",) if insn.push_next else ())
    return pops, pushes


def insn_facts(config: HwConfig, index: int, insn: Instruction) -> InsnFacts:
    module = module_of(insn)
    pops, pushes = token_queues(module, insn)
    compute = module == "compute"
    awaited = timing.units_awaited(insn) if compute else ("main",)
    taken = timing.units_taken(insn) if compute else ("main",)
    cycles = (timing.gemm_cycles(insn) if isinstance(insn, Gemm) else
              timing.alu_cycles(insn) if isinstance(insn, Alu) else
              timing.finish_cycles() if compute else 0)
    dma, nbytes = None, 0
    if isinstance(insn, (Load, Store)):
        dma = timing.dma_cost(config, insn)
        nbytes = insn.y_size * insn.x_size * get_isa(config).elem_bytes(insn.mem)
    return InsnFacts(index, insn, module, pops, pushes, tuple(awaited), tuple(taken),
                     timing.compute_unit(insn) if compute else None, cycles, dma, nbytes)


def check_program(config: HwConfig, instructions: Sequence[Instruction]) -> None:
    """The semantic rules of every instruction, and a FINISH somewhere."""
    for index, insn in enumerate(instructions):
        check_instruction(insn, config, index)
    if not any(isinstance(i, Finish) for i in instructions):
        raise MissingFinishError(f"the program has no FINISH instruction "
                                 f"({len(instructions)} instructions); end it with FINISH")


#: Per (config, stream, ids of the registered ALU ops): the ops (held, so their ids stay
#: unique) and the facts. The checks depend on which ALU opcodes are registered.
_kept: OrderedDict[tuple, tuple[tuple, tuple[InsnFacts, ...]]] = OrderedDict()
_kept_lock = threading.Lock()     # runs of several devices may start at once


def program_facts(config: HwConfig, stream: bytes,
                  instructions: Sequence[Instruction] | None = None) -> tuple[InsnFacts, ...]:
    """The checked facts of every instruction of ``stream`` (encoded instructions; pass
    ``instructions`` when they are at hand, else the stream is decoded). Raises the
    program's :class:`~tessera.errors.ProgramError` when a rule is broken."""
    alu_ops = tuple(ALU_OPS)
    key = (config, stream, tuple(map(id, alu_ops)))
    with _kept_lock:
        kept = _kept.get(key)
        if kept is not None:
            _kept.move_to_end(key)
            return kept[1]
    insns = get_isa(config).decode_program(stream) if instructions is None else instructions
    check_program(config, insns)
    facts = tuple(insn_facts(config, i, insn) for i, insn in enumerate(insns))
    with _kept_lock:
        _kept[key] = (alu_ops, facts)
        if len(_kept) > KEPT_STREAMS:
            _kept.popitem(last=False)
    return facts
