"""``verify_program``: static checks of the dependency-token discipline of any program.

It checks, without running the data path:

1. **Balance**: every token queue gets as many pushes as pops, so nothing is
   left behind at the exit.
2. **Progress**: an untimed execution of fetch, the command queues and the
   three modules with the config's queue depths reaches FINISH (no deadlock;
   the system is monotone, so one schedule decides it for all). It yields the
   push each pop takes.
3. **Hazards covered**: for every pair of instructions of different modules,
   or of the compute module's two units, that touch the same entries or DRAM
   bytes (one of them writing), the earlier one (in program order) finishes
   before the later one starts, through in-order execution, the units an
   instruction waits for (``overlap``) and token pairs (vector clocks over
   the lanes load, GEMM unit, ALU unit, store). Every pair of instructions
   that can run at once on the two compute units uses different accumulator
   banks and token queues. FINISH must come after everything.
4. **Uop hazards** (optional): inside each GEMM/ALU no accumulator row is read
   fewer operations after a write than the pipeline needs (the rule the
   hardware does not check).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from tessera import timing
from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Alu, Finish, Gemm, Instruction, Program

from tessera.timing import compute_unit, units_awaited

from .access import (LANE_NAMES, LANE_OF_UNIT, MODULE_NAMES, SPACE_LANES, Access,
                     AccessAnalyzer, HazardTracker, acc_banks, lanes_of, module_index)
from tessera.errors import VerificationError

_QUEUES = ((0, 1), (1, 0), (1, 2), (2, 1))


def _qname(a: int, b: int) -> str:
    return f"{MODULE_NAMES[a]}->{MODULE_NAMES[b]}"


def _pops(insn: Instruction, m: int) -> list[tuple[int, int]]:
    q = []
    if insn.pop_prev:
        q.append((m - 1, m))
    if insn.pop_next:
        q.append((m + 1, m))
    return q


def _pushes(insn: Instruction, m: int) -> list[tuple[int, int]]:
    q = []
    if insn.push_prev:
        q.append((m, m - 1))
    if insn.push_next:
        q.append((m, m + 1))
    return q


@dataclass
class VerifyReport:
    """What :func:`verify_program` found in a correct program."""

    instructions: int
    tokens: dict[str, int]
    conflicts_checked: int


def _label(program: Program, i: int) -> str:
    return f"instruction {i} ({program.instructions[i].label})"


class _UntimedMachine:
    """Fetch, the command queues, the token queues and the three modules, run untimed:
    a module pops its instruction's tokens, then pushes, then retires it."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.insns = program.instructions
        self.cfg: HwConfig = program.config
        self.mods = [module_index(i) for i in self.insns]
        self.cmd: list[deque[int]] = [deque() for _ in range(3)]
        self.tq: dict[tuple[int, int], deque[int]] = {q: deque() for q in _QUEUES}
        self.cur: list[int | None] = [None, None, None]
        self.phase = ["", "", ""]
        self.pending: list[list[tuple[int, int]]] = [[], [], []]
        self.done: list[int] = []
        self.producers: dict[int, list[int]] = {}
        self.fetched = 0

    def fetch(self) -> bool:
        """Dispatch instructions while their module's command queue has room; True if any."""
        progress = False
        n = len(self.insns)
        while self.fetched < n and len(self.cmd[self.mods[self.fetched]]) < \
                self.cfg.cmd_queue_depth:
            self.cmd[self.mods[self.fetched]].append(self.fetched)
            self.fetched += 1
            progress = True
        return progress

    def advance(self, m: int) -> bool:
        """Run module ``m`` until it blocks on a token queue or idles; True if it moved."""
        cmd, tq, cur, phase, pending = self.cmd[m], self.tq, self.cur, self.phase, self.pending
        progress = False
        while True:
            if cur[m] is None:
                if not cmd:
                    return progress
                cur[m] = cmd.popleft()
                phase[m] = "pop"
                progress = True
            i = cur[m]
            if phase[m] == "pop":
                pops = _pops(self.insns[i], m)
                if not all(tq[q] for q in pops):
                    return progress
                self.producers[i] = [tq[q].popleft() for q in pops]
                phase[m] = "push"
                pending[m] = _pushes(self.insns[i], m)
                progress = True
            if phase[m] == "push":
                while pending[m] and len(tq[pending[m][0]]) < self.cfg.token_queue_depth:
                    tq[pending[m].pop(0)].append(i)
                    progress = True
                if pending[m]:
                    return progress
                self.done.append(i)
                cur[m] = None
                progress = True

    def deadlock_error(self) -> VerificationError:
        """What each module is stuck on, for a run that did not retire everything."""
        states = []
        for m in range(3):
            i = self.cur[m]
            if i is None:
                states.append(f"{MODULE_NAMES[m]}: idle")
            elif self.phase[m] == "pop":
                empty = [_qname(*q) for q in _pops(self.insns[i], m) if not self.tq[q]]
                states.append(f"{MODULE_NAMES[m]}: {_label(self.program, i)} waits for a token "
                              f"on {', '.join(empty)}")
            else:
                states.append(f"{MODULE_NAMES[m]}: {_label(self.program, i)} waits to push into "
                              f"the full {_qname(*self.pending[m][0])} queue")
        return VerificationError(
            "the program deadlocks: " + "; ".join(states)
            + f"; fetch dispatched {self.fetched} of {len(self.insns)} instructions; token "
            "queues: " + ", ".join(f"{_qname(*q)} {len(d)}" for q, d in self.tq.items()))


def abstract_run(program: Program) -> tuple[list[int], dict[int, list[int]]]:
    """Untimed execution: the completion order and, per instruction, the producers of its pops.

    Raises :class:`VerificationError` on a deadlock.
    """
    machine = _UntimedMachine(program)
    progress = True
    # Run to quiescence (not just to FINISH): a FINISH that retires too early then shows as
    # an uncovered dependency of FINISH, not as a missing clock.
    while progress:
        progress = machine.fetch()
        for m in range(3):
            if machine.advance(m):
                progress = True
    if len(machine.done) < len(program.instructions):
        raise machine.deadlock_error()
    return machine.done, machine.producers


def check_uop_hazards(program: Program, analyzer: AccessAnalyzer, index: int,
                      insn: Gemm | Alu) -> None:
    """Raise if an op of ``insn`` reads an accumulator row too soon after an op wrote it."""
    if insn.reset or insn.op_count == 0:
        return
    dst_u, src_u, _ = analyzer.uop_fields()
    u = slice(insn.uop_begin, insn.uop_end)
    o = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
    i = np.arange(insn.iter_in, dtype=np.int64)[None, :, None]
    dst = (dst_u[u][None, None, :] + o * insn.dst_factor_out + i * insn.dst_factor_in).ravel()
    if isinstance(insn, Gemm):
        distance = timing.gemm_hazard_distance()
        reads = [dst]
    else:
        timing_ = ALU_OPS.get(insn.alu_op).timing
        distance = timing_.hazard_distance(insn.use_imm)
        reads = [dst] if timing_.reads_dst else []
        if not insn.use_imm:
            reads.append((src_u[u][None, None, :] + o * insn.src_factor_out
                          + i * insn.src_factor_in).ravel())
    for d in range(1, distance):
        for r in reads:
            bad = np.nonzero(dst[:-d] == r[d:])[0]
            if bad.size:
                j = int(bad[0])
                raise VerificationError(
                    f"{_label(program, index)}: op {j + d} reads accumulator row "
                    f"{int(dst[j])} only {d} op(s) after op {j} wrote it; the pipeline needs "
                    f"{distance}", index=index)


def _check_finish(insns: list[Instruction]) -> None:
    """Raise unless FINISH is the last instruction and the only one."""
    if not insns or not isinstance(insns[-1], Finish):
        raise VerificationError("the program must end with FINISH")
    for i, insn in enumerate(insns[:-1]):
        if isinstance(insn, Finish):
            raise VerificationError("FINISH must be the last instruction (only one)", index=i)


def _check_balance(insns: list[Instruction]) -> dict[tuple[int, int], list[int]]:
    """``[pushes, pops]`` per token queue; raise unless every queue is balanced."""
    counts = {q: [0, 0] for q in _QUEUES}
    for insn in insns:
        m = module_index(insn)
        for q in _pushes(insn, m):
            if q not in counts:
                raise VerificationError(f"{insn.label} pushes towards a module that does not "
                                        "exist", index=insns.index(insn))
            counts[q][0] += 1
        for q in _pops(insn, m):
            if q not in counts:
                raise VerificationError(f"{insn.label} pops from a module that does not exist",
                                        index=insns.index(insn))
            counts[q][1] += 1
    for q, (pushes, pops) in counts.items():
        if pushes != pops:
            raise VerificationError(f"the {_qname(*q)} token queue gets {pushes} pushes but "
                                    f"{pops} pops: tokens would be "
                                    + ("left behind" if pushes > pops else "missing"))
    return counts


@dataclass
class _LaneOrder:
    """Where each instruction sits on the lanes and what bounds its start."""

    #: Per instruction, its lanes and its sequence number on each.
    lanes: list[tuple[int, ...]]
    seq: list[dict[int, int]]
    #: Per lane, its instructions in order.
    per_lane: list[list[int]]
    #: Per instruction, the lane predecessors it waits for.
    awaited: list[list[int]]
    #: Per instruction, the module's previous instruction (in-order starts).
    prev_start: list[int | None]


def _lane_order(insns: list[Instruction]) -> _LaneOrder:
    """Sequence every instruction on its lanes (program order)."""
    lanes = [lanes_of(i) for i in insns]
    order = _LaneOrder(lanes=lanes, seq=[{} for _ in insns], per_lane=[[] for _ in LANE_NAMES],
                       awaited=[], prev_start=[])
    last_of_module: dict[int, int] = {}
    for i, insn in enumerate(insns):
        m = module_index(insn)
        order.prev_start.append(last_of_module.get(m))
        last_of_module[m] = i
        wait_lanes = (tuple(LANE_OF_UNIT[u] for u in units_awaited(insn)) if m == 1
                      else lanes[i])
        order.awaited.append([order.per_lane[lane][-1] for lane in wait_lanes
                              if order.per_lane[lane]])
        for lane in lanes[i]:
            order.seq[i][lane] = len(order.per_lane[lane])
            order.per_lane[lane].append(i)
    return order


def _start_clocks(completion: list[int], producers: dict[int, list[int]],
                  order: _LaneOrder) -> list[list[int]]:
    """Per instruction, the vector clock over lanes of what has ended before it starts.

    Built in completion order: every edge points to an earlier-completed instruction.
    """
    n = len(order.lanes)
    vc_before: list[list[int] | None] = [None] * n
    vc_after: list[list[int] | None] = [None] * n
    for i in completion:
        v = [-1] * len(LANE_NAMES)
        # started after the module's previous instruction started, after its awaited lane
        # predecessors ended, and after the producers of its tokens ended
        sources = ([vc_after[j] for j in order.awaited[i]]
                   + [vc_after[p] for p in producers.get(i, [])])
        if order.prev_start[i] is not None:
            sources.append(vc_before[order.prev_start[i]])
        for src in sources:
            v = [max(x, y) for x, y in zip(v, src)]  # type: ignore[arg-type]
        vc_before[i] = v
        after = list(v)
        for lane, s_ in order.seq[i].items():
            after[lane] = s_
        vc_after[i] = after
    return vc_before  # type: ignore[return-value]


def _check_hazards(program: Program, order: _LaneOrder, vc_before: list[list[int]],
                   uop_hazards: bool) -> int:
    """Raise unless every conflict is ordered by the clocks (and each overlap pair, and
    optionally each GEMM/ALU's uops, is safe); the number of conflicts checked."""
    insns = program.instructions
    analyzer = AccessAnalyzer(program)
    tracker = HazardTracker(analyzer.space_sizes(), len(LANE_NAMES), SPACE_LANES)
    checked = 0
    banks: list[frozenset[int]] = []
    for i, insn in enumerate(insns):
        own = order.lanes[i]
        acc = analyzer.access(insn)
        banks.append(acc_banks(acc, program.config.acc_bank_rows))
        _check_overlap_pair(program, i, banks)
        if uop_hazards and isinstance(insn, (Gemm, Alu)):
            check_uop_hazards(program, analyzer, i, insn)
        need = tracker.needs(own, acc)
        if isinstance(insn, Finish):
            need = [len(order.per_lane[k]) - 1 if k not in own else -1
                    for k in range(len(LANE_NAMES))]
        for k in range(len(LANE_NAMES)):
            if k not in own and need[k] >= 0:
                checked += 1
                if vc_before[i][k] < need[k]:
                    raise _uncovered(program, order, tracker, i, acc, k, need[k])
        for lane in own:
            tracker.record(lane, order.seq[i][lane], acc)
    return checked


def _uncovered(program: Program, order: _LaneOrder, tracker: HazardTracker, i: int,
               acc: Access, lane: int, seq: int) -> VerificationError:
    """The error for instruction ``i``, whose conflict with instruction ``seq`` of ``lane``
    nothing orders."""
    insns = program.instructions
    insn = insns[i]
    j = order.per_lane[lane][seq]
    if isinstance(insn, Finish):
        what, detail = "must retire after it", "FINISH ends the program"
    else:
        what = "must start after it finishes"
        detail = tracker.culprit(order.lanes[i][0], acc, lane, seq)
    fix = ("a token is missing" if module_index(insns[j]) != module_index(insn)
           else "clear its overlap flag or add a token")
    return VerificationError(
        f"{_label(program, i)} {what}, {_label(program, j)} ({detail}), but no "
        f"chain of dependency tokens or unit order guarantees it: {fix}", index=i)


def verify_program(program: Program, *, uop_hazards: bool = True) -> VerifyReport:
    """Check ``program``'s dependency tokens; raise :class:`VerificationError` if unsafe."""
    insns = program.instructions
    _check_finish(insns)
    counts = _check_balance(insns)
    completion, producers = abstract_run(program)
    order = _lane_order(insns)
    checked = _check_hazards(program, order, _start_clocks(completion, producers, order),
                             uop_hazards)
    return VerifyReport(len(insns), {_qname(*q): c[0] for q, c in counts.items()}, checked)


def overlap_partner(insns: list[Instruction], index: int) -> int | None:
    """The earlier instruction that may still run on the other compute unit when
    instruction ``index`` (a GEMM/ALU with ``overlap``) starts, or ``None``.

    Only the other unit's latest instruction can, and only if everything issued
    since is an ``overlap`` instruction of this unit (anything else waits for
    both units).
    """
    insn = insns[index]
    unit = compute_unit(insn)
    if unit is None or not insn.overlap:
        return None
    for j in range(index - 1, -1, -1):
        other = insns[j]
        if module_index(other) != 1:
            continue
        other_unit = compute_unit(other)
        if other_unit is None:
            return None
        if other_unit != unit:
            return j
        if not other.overlap:
            return None
    return None


def _check_overlap_pair(program: Program, index: int, banks: list[frozenset[int]]) -> None:
    """Raise unless instruction ``index`` and the instruction it may run beside on the
    other compute unit use different accumulator banks and token queues (docs/timing.md)."""
    insns = program.instructions
    j = overlap_partner(insns, index)
    if j is None:
        return
    shared = banks[index] & banks[j]
    queues = set(_pushes(insns[index], 1)) & set(_pushes(insns[j], 1))
    if shared or queues:
        what = (f"accumulator bank {min(shared)}" if shared
                else f"the {_qname(*min(queues))} token queue")
        raise VerificationError(
            f"{_label(program, index)} may run beside {_label(program, j)} on the other compute "
            f"unit (overlap) and both use {what}: use the other bank or queue, or clear "
            "overlap", index=index)
