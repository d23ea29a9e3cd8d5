"""``insert_dependency_tokens``: the pass that synchronises the three modules.

The input is a program whose instruction list, read in order, is the
intended sequential semantics (token flags, if any, are ignored). The load,
compute and store modules run concurrently, so every pair of instructions of
different modules that touch the same on-chip entries or DRAM bytes, at
least one of them writing (RAW, WAR, WAW), must be ordered by dependency
tokens. The pass walks the list once:

* For each instruction it finds, per other module, the *latest* earlier
  instruction it conflicts with (:class:`~.access.HazardTracker`).
* It keeps a vector clock per instruction: for each module, the latest of its
  instructions known to have finished before this one starts (through
  in-order execution and the tokens placed so far). A conflict already
  implied by the clock needs nothing.
* Otherwise the conflicting instruction pushes a token towards this one and
  this one pops it. Pushes pair with pops in FIFO order, and the pass only
  ever appends the newest push and the newest pop of a queue, so the pairing
  is the intended one. A push goes exactly on the conflicting instruction, so
  the waiting is as short as possible (a loop-carried WAR between virtual
  threads waits for the tile ``threads`` steps back, not the previous one).
* Load and store have no token queue between them (their conflicts are DRAM
  RAW/WAR between operators): the chain goes through the earliest compute
  instruction that already follows the store (or load), or through a no-op
  compute instruction inserted just before the waiting one (a *carrier*).
* FINISH conflicts with everything: it waits for the last load and store.

Every push is paired with a pop, so the queues are balanced at the exit; every
pop's push comes earlier in program order, so fetch can never dispatch a
waiting instruction ahead of the one it waits for. Unrolled programs need no
tokens at the entry: the first use of a buffer half simply does not wait.
:func:`tessera.compiler.verify.verify_program` re-checks all of this.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from tessera.isa import Finish, Gemm, Instruction, Program

from .access import MODULE_NAMES, AccessAnalyzer, HazardTracker, module_index
from tessera.errors import CompileError

LOAD, COMPUTE, STORE = 0, 1, 2


def push_flag(src: int, dst: int) -> str:
    """The flag module ``src`` sets to push a token towards module ``dst``."""
    return "push_next" if dst > src else "push_prev"


def pop_flag(dst: int, src: int) -> str:
    """The flag module ``dst`` sets to pop a token that module ``src`` pushed."""
    return "pop_prev" if src < dst else "pop_next"


@dataclass
class _Rec:
    insn: Instruction
    module: int
    seq: int = -1
    vc: list[int] = field(default_factory=lambda: [-1, -1, -1])
    flags: dict[str, bool] = field(default_factory=dict)
    carrier: bool = False


def carrier_instruction() -> Instruction:
    """The no-op compute instruction that carries tokens: a GEMM with an empty uop range
    (the cheapest compute instruction: decode only)."""
    return Gemm(uop_begin=0, uop_end=0)


@dataclass
class SyncStats:
    """What :func:`insert_dependency_tokens` placed."""

    tokens: dict[str, int]
    carriers: int


def insert_dependency_tokens(program: Program) -> Program:
    """A copy of ``program`` with the dependency tokens (and carriers) it needs.

    The instruction list must end with its only FINISH. Existing token flags
    are discarded. ``program.sync_stats`` (a :class:`SyncStats`) tells what was
    placed.
    """
    insns = program.instructions
    if not insns or not isinstance(insns[-1], Finish) or any(
            isinstance(i, Finish) for i in insns[:-1]):
        raise CompileError("insert_dependency_tokens needs a program whose last instruction is "
                           "its only FINISH")
    analyzer = AccessAnalyzer(program)
    tracker = HazardTracker(analyzer.space_sizes())
    entries: list[list[_Rec]] = [[], [], []]
    # compute_vc[m][k]: vc[m] of compute instruction k (non-decreasing in k), for bisecting.
    compute_vc: list[list[int]] = [[], [], []]
    frontier = [[-1, -1, -1] for _ in range(3)]
    out: list[_Rec] = []

    def append(rec: _Rec, vc: list[int]) -> None:
        m = rec.module
        rec.seq = len(entries[m])
        vc[m] = rec.seq
        rec.vc = vc
        frontier[m] = vc
        entries[m].append(rec)
        if m == COMPUTE:
            for k in range(3):
                compute_vc[k].append(vc[k])
        out.append(rec)

    def link(producer: _Rec, consumer: _Rec, vc: list[int]) -> list[int]:
        pf = push_flag(producer.module, consumer.module)
        assert not producer.flags.get(pf), "a producer would push twice on one queue"
        producer.flags[pf] = True
        consumer.flags[pop_flag(consumer.module, producer.module)] = True
        return [max(a, b) for a, b in zip(vc, producer.vc)]

    for insn in insns:
        clean = insn.replace(pop_prev=False, pop_next=False, push_prev=False, push_next=False)
        m = module_index(insn)
        acc = analyzer.access(insn)
        need = tracker.needs(m, acc)
        if isinstance(insn, Finish):
            need = [len(entries[k]) - 1 if k != m else -1 for k in range(3)]
        rec = _Rec(clean, m)
        vc = list(frontier[m])
        if m == COMPUTE:
            for k in (LOAD, STORE):
                if need[k] > vc[k]:
                    vc = link(entries[k][need[k]], rec, vc)
        else:
            other = STORE if m == LOAD else LOAD
            target = need[COMPUTE]
            if need[other] > vc[other]:
                k = bisect.bisect_left(compute_vc[other], need[other])
                if k == len(compute_vc[other]):
                    # No compute instruction follows the conflicting one yet: insert a carrier.
                    carrier = _Rec(carrier_instruction(), COMPUTE, carrier=True)
                    cvc = link(entries[other][need[other]], carrier, list(frontier[COMPUTE]))
                    append(carrier, cvc)
                    k = carrier.seq
                target = max(target, k)
            if target > vc[COMPUTE]:
                vc = link(entries[COMPUTE][target], rec, vc)
        append(rec, vc)
        tracker.record(m, rec.seq, acc)

    new = Program(program.config, [r.insn.replace(**r.flags) if r.flags else r.insn for r in out],
                  program.segments)
    tokens = {f"{MODULE_NAMES[a]}->{MODULE_NAMES[b]}": 0
              for a, b in ((0, 1), (1, 0), (1, 2), (2, 1))}
    for r in out:
        for flag, on in r.flags.items():
            if on and flag.startswith("push"):
                dst = r.module + (1 if flag == "push_next" else -1)
                tokens[f"{MODULE_NAMES[r.module]}->{MODULE_NAMES[dst]}"] += 1
    new.sync_stats = SyncStats(tokens, sum(r.carrier for r in out))  # type: ignore[attr-defined]
    return new
