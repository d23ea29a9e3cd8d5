"""What the load, compute and store modules share: token queues and the
in-order instruction sequencer.

A module takes the head of its command queue once every token queue the
instruction pops holds a token and the execution units it waits for are free,
takes those tokens in the same cycle (that cycle is the instruction's first
cycle), runs it, and in the cycle after its last busy cycle pushes its tokens,
which frees its units; a freed unit may start the next instruction in that
same cycle (see docs/timing.md, "Time and instructions" and "Compute units").
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from tessera.isa import DEP_FLAGS, Opcode, get_isa
from tessera.config import HwConfig

#: Width of the instruction index that travels with each command (errors name it).
INDEX_BITS = 32


def dep_flag_offsets(config: HwConfig) -> dict[str, int]:
    """Bit positions of the four dependency flags (the same in every layout)."""
    layouts = get_isa(config).layouts
    offsets = {flag: layouts[Opcode.FINISH].field(flag).offset for flag in DEP_FLAGS}
    assert all(layouts[op].field(f).offset == o for op in Opcode for f, o in offsets.items())
    return offsets


class TokenQueue(wiring.Component):
    """A dependency-token queue: only a count, since tokens carry no data.

    A token pushed in cycle ``t`` can be popped in cycle ``t`` (TOKEN_LATENCY
    is 0: ``can_pop`` bypasses the push); a slot freed by a pop is usable in
    the next cycle (``can_push`` looks at the registered count only, which also
    keeps the push -> pop -> push path free of combinational loops).
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        super().__init__({"push": In(1), "pop": In(1), "can_push": Out(1), "can_pop": Out(1)})
        self.count = Signal(range(depth + 1))

    def elaborate(self, platform) -> Module:
        m = Module()
        m.d.comb += [self.can_push.eq(self.count < self.depth),
                     self.can_pop.eq((self.count > 0) | self.push)]
        m.d.sync += self.count.eq(self.count + self.push - self.pop)
        return m


class Sequencer(wiring.Component):
    """Runs one module's command queue in order, with its dependency tokens, over
    ``units`` execution units (1 for load and store, 2 for compute).

    ``start`` is high in an instruction's first cycle, with ``insn`` (the
    128-bit word) and ``start_index``. The module tells, combinationally from
    ``insn``, which units the head instruction waits for (``awaits``: each
    must be free) and which it occupies (``takes``, a subset of ``awaits``);
    both default to every unit. An instruction occupies its units from its
    start until it has pushed its tokens. Its executor raises
    ``exec_busy[u]`` (``u`` = the lowest unit it takes) from the next cycle
    for as long as it runs; in the first cycle after, the instruction pushes
    its tokens (when the queues have room) and frees all its units, which can
    start the next instruction in that same cycle. At most one instruction
    starts per cycle. When two units push into the same queue in one cycle
    the lower unit goes first and the other waits a cycle (no token is lost;
    the simulator refuses such programs anyway).

    ``index[u]`` holds the index of the instruction occupying (or last
    occupying) unit ``u``. ``halt`` stops new instructions from starting
    (after an error); ``idle`` is high when no unit is occupied.
    """

    def __init__(self, config: HwConfig, insn_bits: int, units: int = 1) -> None:
        self.config = config
        self.insn_bits = insn_bits
        self.units = units
        every = (1 << units) - 1
        super().__init__({
            "cmd_rdy": In(1), "cmd_data": In(insn_bits + INDEX_BITS), "cmd_en": Out(1),
            "can_pop_prev": In(1), "can_pop_next": In(1), "pop_prev": Out(1), "pop_next": Out(1),
            "can_push_prev": In(1), "can_push_next": In(1),
            "push_prev": Out(1), "push_next": Out(1),
            "awaits": In(units, init=every), "takes": In(units, init=every),
            "exec_busy": In(units), "halt": In(1),
            "start": Out(1), "insn": Out(insn_bits), "start_index": Out(INDEX_BITS),
            "index": Out(data.ArrayLayout(unsigned(INDEX_BITS), units)), "idle": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        n = self.units
        flags = dep_flag_offsets(self.config)
        word = self.cmd_data[:self.insn_bits]
        m.d.comb += [self.insn.eq(word), self.start_index.eq(self.cmd_data[self.insn_bits:])]

        # Per unit: occupied, and by an instruction led by which unit (its lowest one:
        # the leader holds the push flags, its exec_busy tells when the instruction ends).
        active = [Signal(name=f"active{u}") for u in range(n)]
        leader = [Signal(range(n), name=f"leader{u}") for u in range(n)]
        want_prev = [Signal(name=f"want_prev{u}") for u in range(n)]
        want_next = [Signal(name=f"want_next{u}") for u in range(n)]

        # A leading unit pushes in the cycle after its last busy cycle, when the queues have
        # room and no lower unit pushes into the same queue in this cycle.
        pushing = [Signal(name=f"pushing{u}") for u in range(n)]
        taken_prev, taken_next = Signal(name="taken_prev0"), Signal(name="taken_next0")
        for u in range(n):
            ended = active[u] & (leader[u] == u) & ~self.exec_busy[u]
            ok_prev = ~want_prev[u] | (self.can_push_prev & ~taken_prev)
            ok_next = ~want_next[u] | (self.can_push_next & ~taken_next)
            m.d.comb += pushing[u].eq(ended & ok_prev & ok_next)
            tp, tn = Signal(name=f"taken_prev{u + 1}"), Signal(name=f"taken_next{u + 1}")
            m.d.comb += [tp.eq(taken_prev | (pushing[u] & want_prev[u])),
                         tn.eq(taken_next | (pushing[u] & want_next[u]))]
            taken_prev, taken_next = tp, tn
        m.d.comb += [self.push_prev.eq(taken_prev), self.push_next.eq(taken_next)]

        # A unit is freed by its instruction's push (a following unit by its leader's).
        freed = [Signal(name=f"freed{u}") for u in range(n)]
        for u in range(n):
            with m.Switch(leader[u]):
                for v in range(n):
                    with m.Case(v):
                        m.d.comb += freed[u].eq(active[u] & pushing[v])
        free = Cat(*(~active[u] | freed[u] for u in range(n)))

        # The next instruction may start in that same cycle if its tokens are there.
        need_prev = word[flags["pop_prev"]]
        need_next = word[flags["pop_next"]]
        tokens_ok = (~need_prev | self.can_pop_prev) & (~need_next | self.can_pop_next)
        units_ok = (free | ~self.awaits).all()
        m.d.comb += self.start.eq(units_ok & self.cmd_rdy & tokens_ok & ~self.halt)
        m.d.comb += [self.cmd_en.eq(self.start),
                     self.pop_prev.eq(self.start & need_prev),
                     self.pop_next.eq(self.start & need_next),
                     self.idle.eq(~Cat(*active).any())]

        first = Signal(range(n))   # the lowest unit the starting instruction takes
        for u in reversed(range(n)):
            with m.If(self.takes[u]):
                m.d.comb += first.eq(u)
        for u in range(n):
            with m.If(self.start & self.takes[u]):
                m.d.sync += [active[u].eq(1), leader[u].eq(first),
                             want_prev[u].eq(word[flags["push_prev"]] & (first == u)),
                             want_next[u].eq(word[flags["push_next"]] & (first == u)),
                             self.index[u].eq(self.start_index)]
            with m.Elif(freed[u]):
                m.d.sync += active[u].eq(0)
        return m
