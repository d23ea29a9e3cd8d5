"""What the load, compute and store modules share: token queues and the
in-order instruction sequencer.

A module takes the head of its command queue once every token queue the
instruction pops holds a token, takes those tokens in the same cycle (that
cycle is the instruction's first cycle), runs it, and in the cycle after its
last busy cycle pushes its tokens and may start the next instruction (see
docs/timing.md, "Time and instructions").
"""
from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
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
    """Runs one module's command queue in order, with its dependency tokens.

    ``start`` is high in an instruction's first cycle, with ``insn`` (the
    128-bit word) and ``start_index``; the executor it starts raises
    ``exec_busy`` from the next cycle for as long as the instruction runs.
    ``index`` holds the running instruction's index. ``halt`` stops new
    instructions from starting (after an error); ``idle`` is high when nothing
    runs and no token waits to be pushed.
    """

    def __init__(self, config: HwConfig, insn_bits: int) -> None:
        self.config = config
        self.insn_bits = insn_bits
        super().__init__({
            "cmd_rdy": In(1), "cmd_data": In(insn_bits + INDEX_BITS), "cmd_en": Out(1),
            "can_pop_prev": In(1), "can_pop_next": In(1), "pop_prev": Out(1), "pop_next": Out(1),
            "can_push_prev": In(1), "can_push_next": In(1),
            "push_prev": Out(1), "push_next": Out(1),
            "exec_busy": In(1), "halt": In(1),
            "start": Out(1), "insn": Out(insn_bits), "start_index": Out(INDEX_BITS),
            "index": Out(INDEX_BITS), "idle": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        flags = dep_flag_offsets(self.config)
        word = self.cmd_data[:self.insn_bits]
        m.d.comb += [self.insn.eq(word), self.start_index.eq(self.cmd_data[self.insn_bits:])]

        active = Signal()                 # an instruction started and has not pushed yet
        want_prev, want_next = Signal(), Signal()   # its push flags
        ended = Signal()
        m.d.comb += ended.eq(active & ~self.exec_busy)

        # The previous instruction's pushes go out in the cycle after its last busy cycle.
        can_push = Signal()
        m.d.comb += can_push.eq((~want_prev | self.can_push_prev) & (~want_next | self.can_push_next))
        pushing = Signal()
        m.d.comb += [pushing.eq(ended & can_push),
                     self.push_prev.eq(pushing & want_prev),
                     self.push_next.eq(pushing & want_next)]

        # The next instruction may start in that same cycle if its tokens are there.
        need_prev = word[flags["pop_prev"]]
        need_next = word[flags["pop_next"]]
        tokens_ok = (~need_prev | self.can_pop_prev) & (~need_next | self.can_pop_next)
        free = ~active | pushing
        m.d.comb += self.start.eq(free & self.cmd_rdy & tokens_ok & ~self.halt)
        m.d.comb += [self.cmd_en.eq(self.start),
                     self.pop_prev.eq(self.start & need_prev),
                     self.pop_next.eq(self.start & need_next),
                     self.idle.eq(~active)]

        with m.If(self.start):
            m.d.sync += [active.eq(1), want_prev.eq(word[flags["push_prev"]]),
                         want_next.eq(word[flags["push_next"]]), self.index.eq(self.start_index)]
        with m.Elif(pushing):
            m.d.sync += active.eq(0)
        return m
