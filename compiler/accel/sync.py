"""``insert_dependency_tokens``: the pass that synchronises the three modules.

The input is a program whose instruction list, read in order, is the
intended sequential semantics (token flags, if any, are ignored). The load,
compute and store modules run concurrently, and so do the compute module's
two units (GEMM and ALU) for instructions marked ``overlap``, so every pair
of instructions of different modules or units that touch the same on-chip
entries or DRAM bytes, at least one of them writing (RAW, WAR, WAW), must be
ordered. The pass walks the list once over four *lanes* (load, GEMM unit,
ALU unit, store; :data:`~.access.LANE_NAMES`), each of which finishes its
instructions in order:

* For each instruction it finds, per other lane, the *latest* earlier
  instruction it conflicts with (:class:`~.access.HazardTracker`).
* It keeps a vector clock per instruction over the lanes: the latest of each
  lane's instructions known to have finished before this one starts
  (in-order starts of a module, the units an instruction waits for --
  ``tessera.timing.units_awaited`` -- and the tokens placed so far). A
  conflict already implied by the clock needs nothing.
* Between modules the conflicting instruction pushes a token towards this one
  and this one pops it. Pushes pair with pops in FIFO order, and the pass only
  ever appends the newest push and the newest pop of a queue, so the pairing
  is the intended one. A push goes exactly on the conflicting instruction
  when its own clock covers every other conflict of the waiting one (a store
  after an overlapped epilogue waits for the epilogue's last ALU instruction,
  which itself started after the tile's GEMMs ended), so the waiting is as
  short as possible (a loop-carried WAR between virtual threads waits for the
  tile ``threads`` steps back, not the previous one). A load/store token towards
  compute comes from the module's newest instruction instead when the exact one's push
  could find the queue full of tokens popped later in the program
  (:meth:`_TokenPlacer._token_source`).
* Between the two compute units there are no tokens: an ``overlap``
  instruction that conflicts with an unfinished instruction of the other
  unit, or shares an accumulator bank with the instruction it may run beside
  (:func:`~.verify.overlap_partner`), loses its ``overlap`` flag (it then waits
  for both units). So does one that would push into the same token queue as
  that instruction (checked once all tokens are placed).
* Load and store have no token queue between them (their conflicts are DRAM
  RAW/WAR between operators): the chain goes through the earliest compute
  instruction that already follows the store (or load), or through a no-op
  compute instruction inserted just before the waiting one (a *carrier*,
  which waits for both compute units).
* FINISH conflicts with everything: it waits for the last load and store.

Every push is paired with a pop, so the queues are balanced at the exit; every
pop's push comes earlier in program order, so fetch can never dispatch a
waiting instruction ahead of the one it waits for. Unrolled programs need no
tokens at the entry: the first use of a buffer half simply does not wait.
:func:`tessera.compiler.accel.verify.verify_program` re-checks all of this.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from tessera.isa import Alu, Finish, Gemm, Instruction, Program
from tessera.timing import compute_unit

from .access import (LANE_NAMES, LANE_OF_UNIT, MODULE_NAMES, SPACE_LANES, Access,
                     AccessAnalyzer, HazardTracker, acc_banks, lanes_of, module_index)
from tessera.errors import CompileError

LOAD, COMPUTE, STORE = 0, 1, 2
#: Lanes (vector clock entries, :data:`~.access.LANE_NAMES`).
L_LOAD, L_GEMM, L_ALU, L_STORE = 0, 1, 2, 3
_N = len(LANE_NAMES)
_MODULE_LANE = {LOAD: L_LOAD, STORE: L_STORE}
#: Compute instructions after the conflicting ones searched for a single token producer
#: before a carrier is inserted.
PRODUCER_SEARCH = 64


def push_flag(src: int, dst: int) -> str:
    """The flag module ``src`` sets to push a token towards module ``dst``."""
    return "push_next" if dst > src else "push_prev"


def pop_flag(dst: int, src: int) -> str:
    """The flag module ``dst`` sets to pop a token that module ``src`` pushed."""
    return "pop_prev" if src < dst else "pop_next"


@dataclass(eq=False)
class _Rec:
    insn: Instruction
    module: int
    lanes: tuple[int, ...]
    index: int = -1
    seq: dict[int, int] = field(default_factory=dict)
    before: list[int] = field(default_factory=lambda: [-1] * _N)
    after: list[int] = field(default_factory=lambda: [-1] * _N)
    flags: dict[str, bool] = field(default_factory=dict)
    carrier: bool = False
    #: Index of the instruction in the input program (-1: a carrier added here).
    source: int = -1
    banks: frozenset[int] = frozenset()
    partner: "_Rec | None" = None

    @property
    def overlap(self) -> bool:
        return isinstance(self.insn, (Gemm, Alu)) and self.insn.overlap


def carrier_instruction() -> Instruction:
    """The no-op compute instruction that carries tokens: a GEMM with an empty uop range
    (the cheapest compute instruction: decode only); it waits for both compute units."""
    return Gemm(uop_begin=0, uop_end=0)


@dataclass
class SyncStats:
    """What :func:`insert_dependency_tokens` placed."""

    tokens: dict[str, int]
    carriers: int
    #: GEMM/ALU instructions that run with ``overlap``, and those whose flag was cleared.
    overlaps: int = 0
    overlaps_cleared: int = 0
    #: For each output instruction, its index in the input program (-1: a carrier).
    sources: list[int] = field(default_factory=list)

    def map_bounds(self, bounds: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
        """Instruction ranges ``(name, first, end)`` of the input program as ranges of the
        output (a carrier belongs to the range of the instruction before it)."""
        sources = np.maximum.accumulate(np.asarray(self.sources, dtype=np.int64))
        return [(name, int(np.searchsorted(sources, s)), int(np.searchsorted(sources, e)))
                for name, s, e in bounds]


def _max(a: list[int], b: list[int]) -> list[int]:
    return [x if x > y else y for x, y in zip(a, b)]


def _covers(vc: list[int], needs: dict[int, int]) -> bool:
    """Whether clock ``vc`` already implies every lane's need."""
    return all(vc[lane] >= s for lane, s in needs.items())


def _pushes(rec: _Rec) -> set[str]:
    return {f for f in ("push_prev", "push_next") if rec.flags.get(f)}


def _token_counts(out: list[_Rec]) -> dict[str, int]:
    """Pushes per token queue (``"load->compute"``, ...) in the placed records."""
    tokens = {f"{MODULE_NAMES[a]}->{MODULE_NAMES[b]}": 0
              for a, b in ((0, 1), (1, 0), (1, 2), (2, 1))}
    for r in out:
        for flag, on in r.flags.items():
            if on and flag.startswith("push"):
                dst = r.module + (1 if flag == "push_next" else -1)
                tokens[f"{MODULE_NAMES[r.module]}->{MODULE_NAMES[dst]}"] += 1
    return tokens


class _TokenPlacer:
    """Per-call state of :func:`insert_dependency_tokens`: the records placed so far (per
    lane, per module, compute ones indexed for the producer search) and the overlap partners."""

    def __init__(self, program: Program) -> None:
        self.analyzer = AccessAnalyzer(program)
        self.tracker = HazardTracker(self.analyzer.space_sizes(), _N, SPACE_LANES)
        self.bank_rows = program.config.acc_bank_rows
        self.lane_recs: list[list[_Rec]] = [[] for _ in range(_N)]
        self.last_of_module: list[_Rec | None] = [None, None, None]
        # Compute instructions in program order, and their clocks' load/store entries
        # (non-decreasing: a compute instruction starts after the previous one started).
        self.crecs: list[_Rec] = []
        self.cindex: list[int] = []
        self.cclock: dict[int, list[int]] = {L_LOAD: [], L_STORE: []}
        # The instruction an overlap GEMM (ALU) may run beside: the latest ALU (GEMM) one,
        # unless an instruction that waited for both units came since (verify.overlap_partner).
        self.partner_of: dict[str, _Rec | None] = {"gemm": None, "alu": None}
        self.last_push: dict[tuple[int, int], int] = {}    # queue -> index of its newest push
        # Output index of each pop of the load->compute and store->compute queues, in order.
        self.pops: dict[int, list[int]] = {L_LOAD: [], L_STORE: []}
        self.token_depth = program.config.token_queue_depth
        self.out: list[_Rec] = []

    # ------------------------------------------------------------ clocks and tokens
    def base_before(self, rec: _Rec, overlap: bool) -> list[int]:
        """The clock ``rec`` starts with before any token: its module's in-order start and,
        for compute, the ends of the units it waits for (only its own with ``overlap``)."""
        v = [-1] * _N
        prev = self.last_of_module[rec.module]
        if rec.module == COMPUTE:
            if prev is not None:
                v = list(prev.before)
            unit = compute_unit(rec.insn)
            lanes = (LANE_OF_UNIT[unit],) if overlap and unit is not None else (L_GEMM, L_ALU)
            for lane in lanes:
                if self.lane_recs[lane]:
                    v = _max(v, self.lane_recs[lane][-1].after)
        elif prev is not None:
            v = list(prev.after)
        return v

    def link(self, producer: _Rec, consumer: _Rec, vc: list[int]) -> list[int]:
        """Pair a push on ``producer`` with a pop on ``consumer``; ``vc`` advanced by it."""
        pf = push_flag(producer.module, consumer.module)
        assert not producer.flags.get(pf), "a producer would push twice on one queue"
        producer.flags[pf] = True
        consumer.flags[pop_flag(consumer.module, producer.module)] = True
        self.last_push[(producer.module, consumer.module)] = producer.index
        return _max(vc, producer.after)

    def append(self, rec: _Rec, before: list[int]) -> None:
        """Place ``rec`` next in the output, starting at clock ``before``, on its lanes."""
        rec.index = len(self.out)
        rec.before = before
        after = list(before)
        for lane in rec.lanes:
            rec.seq[lane] = len(self.lane_recs[lane])
            after[lane] = rec.seq[lane]
            self.lane_recs[lane].append(rec)
        rec.after = after
        self.last_of_module[rec.module] = rec
        if rec.module == COMPUTE:
            self._index_compute(rec)
        self.out.append(rec)

    def _index_compute(self, rec: _Rec) -> None:
        """Record compute ``rec`` for the producer search and as the next overlap partner."""
        self.crecs.append(rec)
        self.cindex.append(rec.index)
        for lane, lst in self.cclock.items():
            lst.append(rec.before[lane])
        unit = compute_unit(rec.insn)
        if unit is None:
            self.partner_of["gemm"] = self.partner_of["alu"] = None
        else:
            other = "alu" if unit == "gemm" else "gemm"
            self.partner_of[other] = rec
            if not rec.overlap:
                self.partner_of[unit] = None

    # ------------------------------------------------------------ one instruction
    def place(self, source: int, insn: Instruction) -> None:
        """Append input instruction ``source`` with the tokens (and carriers) it needs."""
        clean = insn.replace(pop_prev=False, pop_next=False, push_prev=False, push_next=False)
        m = module_index(insn)
        acc = self.analyzer.access(insn)
        lanes = lanes_of(insn)
        need = self.tracker.needs(lanes, acc)
        if isinstance(insn, Finish):
            need = [len(self.lane_recs[k]) - 1 if k not in lanes else -1 for k in range(_N)]
        rec = _Rec(clean, m, lanes, source=source)
        if m == COMPUTE:
            vc = self._order_compute(rec, need, acc)
        else:
            vc = self._order_load_store(rec, need)
        self.append(rec, vc)
        for lane in lanes:
            self.tracker.record(lane, rec.seq[lane], acc)

    def _order_compute(self, rec: _Rec, need: list[int], acc: Access) -> list[int]:
        """The start clock of compute ``rec``: its load/store conflicts each pop a token."""
        rec.banks = acc_banks(acc, self.bank_rows)
        if rec.overlap:
            self._drop_unsafe_overlap(rec, need)
        vc = self.base_before(rec, rec.overlap)
        for lane in (L_LOAD, L_STORE):
            if need[lane] > vc[lane]:
                vc = self.link(self._token_source(lane, need[lane]), rec, vc)
                self.pops[lane].append(len(self.out))
        return vc

    def _token_source(self, lane: int, need: int) -> _Rec:
        """The load/store instruction that pushes the next compute instruction's token: the
        conflicting one (``need`` on ``lane``), unless the token queue could then hold
        ``token_queue_depth`` tokens whose pops all come after it in the program (a row of
        small stores each read by a later tile: the push could wait for a pop that fetch
        has not reached). Then the lane's newest instruction, which implies it, pushes: a
        compute instruction after it needs no token from the ones before."""
        producer = self.lane_recs[lane][need]
        pops = self.pops[lane]
        if len(pops) >= self.token_depth and pops[-self.token_depth] > producer.index:
            return self.lane_recs[lane][-1]
        return producer

    def _drop_unsafe_overlap(self, rec: _Rec, need: list[int]) -> None:
        """Clear ``rec``'s overlap flag if it conflicts with an unfinished instruction of the
        other unit or shares an accumulator bank with the instruction it may run beside."""
        unit = compute_unit(rec.insn)
        other_lane = L_ALU if unit == "gemm" else L_GEMM
        rec.partner = self.partner_of[unit]
        vc = self.base_before(rec, True)
        if need[other_lane] > vc[other_lane] or (
                rec.partner is not None and rec.partner.banks & rec.banks):
            rec.insn = rec.insn.replace(overlap=False)
            rec.partner = None

    def _order_load_store(self, rec: _Rec, need: list[int]) -> list[int]:
        """The start clock of load/store ``rec``: one token from a compute instruction (or a
        carrier) whose end implies its compute conflicts and its store/load conflict."""
        other = _MODULE_LANE[STORE if rec.module == LOAD else LOAD]
        vc = self.base_before(rec, False)
        needs = {lane: need[lane] for lane in (L_GEMM, L_ALU) if need[lane] > vc[lane]}
        if need[other] > vc[other]:
            needs[other] = need[other]
        if not needs:
            return vc
        for lane in (L_GEMM, L_ALU):
            needs.setdefault(lane, -1)
        through = other if other in needs else None
        producer = self._existing_producer(rec, needs, through)
        if producer is None:
            producer = self._insert_carrier(needs, through)
        return self.link(producer, rec, self.base_before(rec, False))

    def _existing_producer(self, consumer: _Rec, needs: dict[int, int],
                           other: int | None) -> _Rec | None:
        """A placed compute instruction whose end implies every need and that may still
        push towards ``consumer`` (``other``: the lane of the load/store conflict that goes
        through compute), or ``None``."""
        newest = self.last_push.get((COMPUTE, consumer.module), -1)
        cands = [self.lane_recs[lane][s] for lane, s in needs.items()
                 if lane in (L_GEMM, L_ALU) and s >= 0]
        if other is not None:
            k = bisect.bisect_left(self.cclock[other], needs[other])
            if k < len(self.crecs):
                cands.append(self.crecs[k])
        cands.sort(key=lambda r: r.index)
        # A later compute instruction (e.g. one that waited for both units) may cover them all.
        if cands:
            k = bisect.bisect_right(self.cindex, cands[-1].index)
            cands += self.crecs[k:k + PRODUCER_SEARCH]
        return next((c for c in cands if c.index > newest and _covers(c.after, needs)), None)

    def _insert_carrier(self, needs: dict[int, int], other: int | None) -> _Rec:
        """Append a carrier (waiting for both compute units and, through a token, for
        ``other``'s conflict) to push the token no placed instruction can."""
        carrier = _Rec(carrier_instruction(), COMPUTE, (L_GEMM, L_ALU), carrier=True)
        cvc = self.base_before(carrier, False)
        if other is not None and needs[other] > cvc[other]:
            cvc = self.link(self.lane_recs[other][needs[other]], carrier, cvc)
        self.append(carrier, cvc)
        return carrier

    # ------------------------------------------------------------ the result
    def clear_overlaps_sharing_queues(self) -> None:
        """An overlap instruction must not push into a queue its partner pushes into."""
        for r in self.out:
            if r.overlap and r.partner is not None and _pushes(r) & _pushes(r.partner):
                r.insn = r.insn.replace(overlap=False)

    def result(self, program: Program) -> Program:
        """The placed instructions as a copy of ``program``, with its ``sync_stats``."""
        out = self.out
        requested = sum(1 for i in program.instructions
                        if isinstance(i, (Gemm, Alu)) and i.overlap)
        kept = sum(1 for r in out if r.overlap)
        new = Program(program.config,
                      [r.insn.replace(**r.flags) if r.flags else r.insn for r in out],
                      program.segments)
        new.sync_stats = SyncStats(_token_counts(out),  # type: ignore[attr-defined]
                                   sum(r.carrier for r in out), kept, requested - kept,
                                   [r.source for r in out])
        return new


def insert_dependency_tokens(program: Program) -> Program:
    """A copy of ``program`` with the dependency tokens (and carriers) it needs.

    The instruction list must end with its only FINISH. Existing token flags
    are discarded; ``overlap`` flags are kept where they are safe and cleared
    elsewhere. ``program.sync_stats`` (a :class:`SyncStats`) tells what was
    placed.
    """
    insns = program.instructions
    if not insns or not isinstance(insns[-1], Finish) or any(
            isinstance(i, Finish) for i in insns[:-1]):
        raise CompileError("insert_dependency_tokens needs a program whose last instruction is "
                           "its only FINISH")
    placer = _TokenPlacer(program)
    for source, insn in enumerate(insns):
        placer.place(source, insn)
    placer.clear_overlaps_sharing_queues()
    return placer.result(program)
