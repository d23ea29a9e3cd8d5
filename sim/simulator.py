"""The cycle-level simulator: four concurrent modules, queues, tokens and DRAM.

Fetch reads the instruction stream in bursts and dispatches each instruction
to the load, compute or store command queue (stalling while it is full).
Each module runs its queue in order: it pops the tokens an instruction asks
for, executes it (data effect in :mod:`.datapath`, duration from
:mod:`tessera.timing`), then pushes its tokens. The run ends when FINISH
retires. All durations come from ``tessera.timing`` (docs/timing.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from tessera import timing
from tessera.config import MODULES, HwConfig
from tessera.errors import DeadlockError, HazardError, MissingFinishError, ProgramError
from tessera.isa import INSN_BYTES, Alu, Gemm, Load, Program

from .datapath import Datapath
from .dram import DramSystem
from .facts import InsnFacts, check_program, program_facts
from .kernel import BoundedQueue, Event, Kernel
from .stats import ModuleStats, SimStats, TraceEvent, write_chrome_trace


@dataclass
class _Running:
    """An instruction between its start and its last push."""

    facts: InsnFacts
    pushes: list[BoundedQueue]
    done: Event
    banks: frozenset[int] = frozenset()

    @property
    def index(self) -> int:
        return self.facts.index

    @property
    def insn(self):
        return self.facts.insn


@dataclass
class SimResult:
    """What a run produced: final DRAM, statistics and (if asked) the event trace."""

    program: Program
    dram: np.ndarray
    stats: SimStats
    trace: list[TraceEvent] | None
    datapath: Datapath

    def read(self, segment: str, dtype: np.dtype | str = np.uint8,
             shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A segment of the final DRAM, viewed as ``dtype`` and ``shape``."""
        return self.program.read(self.dram, segment, dtype, shape)

    def write_trace(self, path: str) -> None:
        if self.trace is None:
            raise ValueError("run the simulator with trace=True to record a trace")
        write_chrome_trace(self.trace, self.stats.config, path)


class Simulator:
    """Runs programs for one :class:`HwConfig`."""

    def __init__(self, config: HwConfig, *, trace: bool = False) -> None:
        self.config = config
        self.record_trace = trace
        self._current: _Run | None = None
        self._last_cycles = 0

    @property
    def cycles(self) -> int:
        """Simulated cycles of the run in progress, or of the last run once it has ended (0
        before the first), like the hardware's counter; safe to read from another thread
        for progress reports."""
        run = self._current
        return run.kernel.now if run is not None else self._last_cycles

    def run(self, program: Program) -> SimResult:
        """Run ``program`` to FINISH; raises a :class:`tessera.errors.ProgramError` on bad
        programs. The checks and timing of an instruction stream run lately are not
        derived again (:func:`~.facts.program_facts`)."""
        if program.config != self.config:
            raise ProgramError(f"the program was built for config {program.config.name!r}, "
                               f"this simulator runs {self.config.name!r}: rebuild it or use "
                               "tessera.sim.simulate(program)")
        stream = program.encode_instructions()
        facts = program_facts(self.config, stream, program.instructions)
        self._last_cycles = 0
        self._current = _Run(self.config, program, self.record_trace, stream, facts)
        try:
            return self._current.execute()
        finally:
            # Before clearing the run, so a concurrent read never sees 0 at the end.
            self._last_cycles = self._current.kernel.now
            self._current = None


def simulate(program: Program, *, trace: bool = False) -> SimResult:
    """Run ``program`` on the simulator of its own config."""
    return Simulator(program.config, trace=trace).run(program)


def validate_program(program: Program) -> bytes:
    """Static checks before a run: field ranges, semantic rules, a FINISH. Returns the
    encoded instruction stream (encoding is the field-range check)."""
    stream = program.encode_instructions()
    check_program(program.config, program.instructions)
    return stream


def _describe(state: str | tuple) -> str:
    """A module's state for a deadlock report: text, or a format and its arguments (kept
    apart while running: most states are never shown)."""
    return state if isinstance(state, str) else state[0].format(*state[1:])


class _Run:
    """The state of one simulation run."""

    def __init__(self, config: HwConfig, program: Program, record_trace: bool,
                 stream: bytes, facts: tuple[InsnFacts, ...]) -> None:
        self.config = config
        self.program = program
        self.facts = facts
        self.kernel = Kernel()
        self.dram = DramSystem(self.kernel, config)
        self.data = Datapath(config, program, stream)
        self.stats = SimStats(config)
        self.trace: list[TraceEvent] | None = [] if record_trace else None
        self.cmd = {m: BoundedQueue(self.kernel, f"{m} command queue", config.cmd_queue_depth,
                                    timing.CMD_QUEUE_LATENCY) for m in MODULES[1:]}
        self.tokens = {f"{a}->{b}": BoundedQueue(self.kernel, f"{a}->{b} token queue",
                                                 config.token_queue_depth, timing.TOKEN_LATENCY)
                       for a, b in (("load", "compute"), ("compute", "load"),
                                    ("compute", "store"), ("store", "compute"))}
        self.state = {m: "not started" for m in MODULES}
        self.running: dict[str, dict[int, InsnFacts]] = {m: {} for m in MODULES}
        self._busy_until: dict[str, int] = {}
        self.finished = Event(self.kernel)

    # ------------------------------------------------------------ driver
    def execute(self) -> SimResult:
        self.kernel.process(self._fetch())
        for m in MODULES[1:]:
            self.kernel.process(self._module(m))
        self.kernel.run(stop=self.finished)
        if not self.finished.triggered:
            raise DeadlockError(self._deadlock_report())
        self._check_nothing_pending()
        s = self.stats
        s.cycles = self.kernel.now
        s.gemm_ops, s.gemm_resets, s.alu_ops = (self.data.gemm_ops, self.data.gemm_resets,
                                                self.data.alu_ops)
        s.leftover_tokens = {k: len(q) for k, q in self.tokens.items() if len(q)}
        s.dram_contended = self.dram.contended
        return SimResult(self.program, self.data.dram, s, self.trace, self.data)

    def _deadlock_report(self) -> str:
        lines = [f"deadlock at cycle {self.kernel.now}: every module waits"]
        for m in MODULES:
            lines.append(f"  {m}: {_describe(self.state[m])}")
        lines.append("  token queues: " + ", ".join(f"{k} {len(q)}/{q.capacity}"
                                                    for k, q in self.tokens.items()))
        lines.append("  command queues: " + ", ".join(
            f"{m} {len(q)}/{q.capacity}" + (f" (next: instruction {q.items[0][1].index})" if len(q) else "")
            for m, q in self.cmd.items()))
        lines.append("check that every pop has a matching push in the other module")
        return "\n".join(lines)

    def _check_nothing_pending(self) -> None:
        index = self.finished.value
        pending = [f"{m} is still running instruction {i}" for m, r in self.running.items()
                   for i in r]
        pending += [f"{len(q)} instruction(s) wait in the {m} command queue"
                    for m, q in self.cmd.items() if len(q)]
        if self.state["fetch"] != "done":
            pending.append("fetch has not dispatched every instruction")
        if pending:
            raise MissingFinishError(
                f"FINISH retired at cycle {self.kernel.now} while " + "; ".join(pending)
                + ": make FINISH wait for them with dependency tokens, and put it last",
                index=index, where="FINISH")

    # ------------------------------------------------------------- fetch
    def _fetch(self) -> Iterator[Event | int]:
        k, cfg, st = self.kernel, self.config, self.stats.modules["fetch"]
        insns = self.facts
        chunk = timing.fetch_chunk_insns(cfg)
        port = cfg.port_of("fetch")
        for base in range(0, len(insns), chunk):
            n = min(chunk, len(insns) - base)
            beats = timing.fetch_chunk_beats(cfg, n)
            self.state["fetch"] = f"reading instructions {base}..{base + n - 1}"
            t0 = k.now
            yield cfg.dram_latency
            yield self.dram.transfer(port, beats, beats * cfg.bus_bytes)
            st.busy += beats
            st.wait_dram += k.now - t0 - beats
            self.stats.dram_read_bytes["insn"] = self.stats.dram_read_bytes.get("insn", 0) + n * INSN_BYTES
            for index in range(base, base + n):
                q = self.cmd[insns[index].module]
                t0 = k.now
                self.state["fetch"] = ("dispatching instruction {}: {} is full", index, q.name)
                while q.full:
                    yield q.changed()
                st.wait_queue += k.now - t0
                q.put(insns[index])
                st.instructions += 1
                yield timing.FETCH_DISPATCH_CYCLES
                st.busy += timing.FETCH_DISPATCH_CYCLES
        self.state["fetch"] = "done"

    # ----------------------------------------------------------- modules
    def _module(self, module: str) -> Iterator[Event | int]:
        """Issue ``module``'s commands in order, at most one per cycle.

        Load and store run one instruction at a time. Compute has two units
        (``tessera.timing.COMPUTE_UNITS``): an instruction waits only for the
        units ``units_awaited`` names, so a GEMM or ALU marked ``overlap`` may
        run beside the other unit's instruction.
        """
        k, st, q = self.kernel, self.stats.modules[module], self.cmd[module]
        running: dict[str, _Running] = {}   # unit -> the instruction occupying it
        last_start = -1
        while True:
            self.state[module] = "waiting for a command"
            while not q.ready():
                yield q.changed()
            facts = q.items[0][1]   # the command leaves the queue when it starts
            index, insn, taken = facts.index, facts.insn, facts.taken
            for unit in facts.awaited:
                while unit in running:
                    other = running[unit]
                    self.state[module] = ("instruction {0.index} ({0.insn.label}) waits for "
                                          "instruction {1.index} on the {2} unit", facts,
                                          other, unit)
                    yield other.done
            pops = [self.tokens[name] for name in facts.pops]
            pushes = [self.tokens[name] for name in facts.pushes]
            t0 = k.now
            while not all(tq.ready() for tq in pops):
                waiting = next(tq for tq in pops if not tq.ready())
                self.state[module] = ("instruction {0.index} ({0.insn.label}) waits for a "
                                      "token on the {1.name} (empty)", facts, waiting)
                yield waiting.changed()
            st.wait_token += k.now - t0
            if k.now <= last_start:
                yield last_start + 1 - k.now
            q.get()
            for tq in pops:
                tq.get()
            last_start = k.now
            run = _Running(facts, pushes, Event(k))
            banks = self._start(module, insn, index)
            if running:
                self._check_overlap(run, banks,
                                    [r for u, r in running.items() if u not in taken])
            run.banks = banks
            for unit in taken:
                running[unit] = run
            self.running[module][index] = facts
            k.process(self._finish(module, run, st, running))
            if facts.is_finish:
                yield run.done
                return

    def _start(self, module: str, insn, index: int) -> frozenset[int]:
        """Apply a compute instruction's data effect (at its start); its accumulator banks."""
        if isinstance(insn, Gemm):
            return self.data.gemm(insn, index)
        if isinstance(insn, Alu):
            return self.data.alu(insn, index)
        return frozenset()

    def _check_overlap(self, run: "_Running", banks: frozenset[int],
                       others: list["_Running"]) -> None:
        """An instruction starting beside another unit's must not share a bank or a push queue."""
        for other in others:
            shared = banks & other.banks
            queues = {q.name for q in run.pushes} & {q.name for q in other.pushes}
            if shared or queues:
                what = (f"accumulator bank {min(shared)} (rows of a bank go through one "
                        "port per cycle)" if shared else f"pushes into the {min(queues)}")
                raise HazardError(
                    f"{run.insn.label} starts (overlap) while instruction {other.index} "
                    f"({other.insn.label}) still runs on the other compute unit, and both use "
                    f"{what}: give them different banks and queues, or clear overlap",
                    index=run.index, where=run.insn.label)

    def _finish(self, module: str, run: "_Running", st: ModuleStats,
                running: dict[str, "_Running"]) -> Iterator[Event | int]:
        """Execute ``run`` for its duration, push its tokens, free its units."""
        k = self.kernel
        start = k.now
        facts = run.facts
        insn, index = facts.insn, facts.index
        self.state[module] = ("executing instruction {0.index} ({0.insn.label})", facts)
        if facts.dma is not None:
            yield from self._dma(module, facts, st)
        else:
            cycles, unit = facts.cycles, facts.unit
            if unit:
                self.stats.unit_busy[unit] = self.stats.unit_busy.get(unit, 0) + cycles
            # the module is busy while any of its units is
            st.busy += max(0, start + cycles - max(start, self._busy_until.get(module, 0)))
            self._busy_until[module] = max(self._busy_until.get(module, 0), start + cycles)
            yield cycles
        end = k.now
        for tq in run.pushes:
            self.state[module] = ("instruction {0.index} ({0.insn.label}) waits to push a "
                                  "token into the full {1.name} ({2}/{1.capacity})", facts, tq,
                                  len(tq))
            while tq.full:
                yield tq.changed()
            tq.put(index)
        st.wait_queue += k.now - end
        st.instructions += 1
        del self.running[module][index]
        for unit in facts.taken:
            if running.get(unit) is run:
                del running[unit]
        if self.trace is not None:
            self.trace.append(TraceEvent(module, insn.label, index, start, end, facts.unit or ""))
        if facts.is_finish:
            self.finished.succeed(index)
        run.done.succeed()

    def _dma(self, module: str, facts: InsnFacts, st: ModuleStats) -> Iterator[Event | int]:
        k, cfg, insn, cost = self.kernel, self.config, facts.insn, facts.dma
        is_load = isinstance(insn, Load)
        (self.data.load if is_load else self.data.store)(insn, facts.index)
        setup = timing.DMA_SETUP_CYCLES + cost.pad_cycles
        yield setup
        st.busy += setup
        if not cost.data_cycles:
            return
        nbytes = facts.dma_bytes
        book = self.stats.dram_read_bytes if is_load else self.stats.dram_write_bytes
        book[insn.mem.label] = book.get(insn.mem.label, 0) + nbytes
        t0 = k.now
        if is_load:
            yield cfg.dram_latency
        # A LOAD split over several ports streams an equal share of the beats on each.
        share = cost.beats * cfg.bus_bytes // cost.ports
        for flow in [self.dram.transfer(port, cost.data_cycles, share)
                     for port in cfg.ports_of(module)[:cost.ports]]:
            yield flow
        if not is_load:
            yield cfg.dram_latency  # the write response
        # Streaming at full rate is work; the latency and any contention slow-down are waiting.
        st.busy += cost.data_cycles
        st.wait_dram += k.now - t0 - cost.data_cycles
