"""DmaReader and DmaWriter against the AxiDram model in Amaranth's simulator.

Data is checked against a numpy computation of the block written here from
the LOAD/STORE semantics (docs, ``Datapath.load``/``store``), cycles against
``tessera.timing.dma_cost`` and against an independent count, bursts against
a greedy split computed here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.config import PRESETS, HwConfig
from tessera.hw.harness.axi_dram import AxiDram, AxiEvent
from tessera.hw.dma_reader import DmaReader
from tessera.hw.dma_writer import DmaWriter
from tessera.isa import Load, MemType, Opcode, Store, get_isa
from tessera.regmap import ErrorCode
from tessera.timing import DMA_SETUP_CYCLES, dma_cost, load_ports

TINY, PYNQ, ZCU104 = PRESETS["tiny"], PRESETS["pynq"], PRESETS["zcu104"]
#: No preset has an element exactly one beat wide; this one does for inp and out (16 B).
PYNQ_B16 = PYNQ.replace(name="pynq-bus16", bus_bytes=16)
#: The load module reading over two ports: wgt entries (two beats) split on tiny, inp and
#: wgt on zcu104 (its preset); tiny's inp entries (half a beat) do not.
TINY_2LOAD = TINY.replace(name="tiny-2load", dram_ports=5, module_ports=(0, (1, 4), 2, 3))
CONFIGS = [TINY, PYNQ, ZCU104, PYNQ_B16, TINY_2LOAD]
#: The presets' output entries are at most two beats or two lanes; these are wider/narrower.
PYNQ_OUT32 = PYNQ.replace(name="pynq-out32", out_width=32)          # 8 beats
TINY_BUS16 = TINY.replace(name="tiny-bus16", bus_bytes=16)          # 4 lanes
STORE_CONFIGS = CONFIGS + [PYNQ_OUT32, TINY_BUS16]
LOAD_MEMS = [MemType.INP, MemType.WGT, MemType.ACC, MemType.UOP, MemType.ACC8]
FIELDS = ("sram_base", "dram_base", "y_size", "x_size", "x_stride",
          "y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1", "pad_value")
DRAM_BYTES = 1 << 15
READER_ID, WRITER_ID = 1, 3
#: Far more than any instruction here needs, even starved of bandwidth.
TIMEOUT_CYCLES = 20_000


# ------------------------------------------------------------------ reference


def eb_of(config: HwConfig, mem: MemType) -> int:
    return get_isa(config).elem_bytes(mem)


def block_shape(insn) -> tuple[int, int]:
    if isinstance(insn, Store):
        return insn.y_size, insn.x_size
    return (insn.y_pad_0 + insn.y_size + insn.y_pad_1, insn.x_pad_0 + insn.x_size + insn.x_pad_1)


def row_beats(config: HwConfig, insn) -> list[tuple[int, int]]:
    """(first beat address, beats) of each row, by plain integer arithmetic."""
    eb, bus = eb_of(config, insn.mem), config.bus_bytes
    out = []
    for y in range(insn.y_size):
        first = (insn.dram_base + y * insn.x_stride) * eb
        last = first + insn.x_size * eb - 1
        out.append((first // bus * bus, last // bus - first // bus + 1))
    return out


def byte_span(config: HwConfig, insn) -> tuple[int, int]:
    """The DRAM bytes [lo, hi) an instruction's rows touch, whole beats included."""
    beats = row_beats(config, insn)
    return (min(a for a, _ in beats), max(a + n * config.bus_bytes for a, n in beats))


def split(config: HwConfig, insn) -> int:
    """Ports a LOAD reads over: the load module's, when the entry is as many whole beats."""
    beats = eb_of(config, insn.mem) // config.bus_bytes
    ports = len(config.ports_of("load"))
    mine = isinstance(insn, Load) and insn.mem in (MemType.INP, MemType.WGT)
    return ports if mine and beats and beats % ports == 0 else 1


def expected_cycles(config: HwConfig, insn) -> int:
    """docs/timing.md counted directly (not through dma_cost)."""
    if insn.x_size == 0:
        return DMA_SETUP_CYCLES
    data = sum(max(beats // split(config, insn), insn.x_size)
               for _, beats in row_beats(config, insn))
    if isinstance(insn, Store):
        return DMA_SETUP_CYCLES + (data + config.dram_latency if data else 0)
    rows, cols = block_shape(insn)
    pads = rows * cols - insn.y_size * insn.x_size
    return DMA_SETUP_CYCLES + pads + (config.dram_latency + data if data else 0)


def timing_cycles(config: HwConfig, insn) -> int:
    """The same count from tessera.timing (what the simulator uses)."""
    c = dma_cost(config, insn)
    if isinstance(insn, Store):
        return DMA_SETUP_CYCLES + (c.data_cycles + config.dram_latency if c.data_cycles else 0)
    return DMA_SETUP_CYCLES + c.pad_cycles + (config.dram_latency + c.data_cycles
                                              if c.data_cycles else 0)


def expected_bursts(config: HwConfig, insn, piece: int = 0) -> list[tuple[int, int]]:
    """Greedy split of each row (or of the ``piece``-th piece of each entry, when the LOAD
    reads over several ports): at most max_burst_beats, never across 4 KiB."""
    bus, out, n_pieces = config.bus_bytes, [], split(config, insn)
    spans = row_beats(config, insn)
    if n_pieces > 1:
        eb = eb_of(config, insn.mem)
        size = eb // n_pieces
        spans = [((insn.dram_base + y * insn.x_stride + x) * eb + piece * size, size // bus)
                 for y in range(insn.y_size) for x in range(insn.x_size)]
    for addr, beats in spans:
        while beats:
            n = min(beats, config.max_burst_beats, (4096 - addr % 4096) // bus)
            out.append((addr, n))
            addr, beats = addr + n * bus, beats - n
    return out


def expected_error(config: HwConfig, insn, dram_bytes: int) -> ErrorCode:
    if insn.x_size == 0:
        return ErrorCode.NONE
    eb = eb_of(config, insn.mem)
    rows, cols = block_shape(insn)
    if insn.sram_base + rows * cols > get_isa(config).depth(insn.mem):
        return ErrorCode.SRAM_BOUNDS
    if insn.y_size == 0:
        return ErrorCode.NONE
    end = (insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb
    if end > 1 << 32:
        return ErrorCode.DRAM_ADDRESS
    if any(a + n * config.bus_bytes > dram_bytes for a, n in row_beats(config, insn)):
        return ErrorCode.AXI_RESPONSE
    return ErrorCode.NONE


def pad_entry(config: HwConfig, mem: MemType, value: int) -> np.ndarray:
    """The bytes of a pad entry: ``value`` in two's complement in every lane (a uop is one
    lane; acc8 lanes are 8 bits in DRAM and in the engine's entries)."""
    eb = eb_of(config, mem)
    lane = {MemType.UOP: 8 * eb, MemType.INP: config.inp_width, MemType.WGT: config.wgt_width,
            MemType.ACC: config.acc_width, MemType.ACC8: 8}[mem]
    word = value % (1 << lane)
    return np.frombuffer(b"".join(word.to_bytes(lane // 8, "little")
                                  for _ in range(8 * eb // lane)), np.uint8)


def apply_load(config: HwConfig, insn: Load, dram: np.ndarray, sram: np.ndarray) -> None:
    """The LOAD's effect on ``sram`` (entries x bytes), DRAM bytes outside the array as zero."""
    err = expected_error(config, insn, dram.size)
    if insn.x_size == 0 or err in (ErrorCode.SRAM_BOUNDS, ErrorCode.DRAM_ADDRESS):
        return
    eb = eb_of(config, insn.mem)
    rows, cols = block_shape(insn)
    block = np.zeros((rows, cols, eb), dtype=np.uint8)
    block[:, :] = pad_entry(config, insn.mem, insn.pad_value)
    padded = np.concatenate([dram, np.zeros(1 << 16, np.uint8)])
    for y in range(insn.y_size):
        a = (insn.dram_base + y * insn.x_stride) * eb
        if a < dram.size:
            row = padded[a:a + insn.x_size * eb]
        else:
            row = np.zeros(insn.x_size * eb, np.uint8)
        block[insn.y_pad_0 + y, insn.x_pad_0:insn.x_pad_0 + insn.x_size] = \
            row.reshape(insn.x_size, eb)
    sram[insn.sram_base:insn.sram_base + rows * cols] = block.reshape(-1, eb)


def apply_store(config: HwConfig, insn: Store, dram: np.ndarray, sram: np.ndarray) -> None:
    """The STORE's effect on ``dram``, row by row (later rows win where they overlap)."""
    err = expected_error(config, insn, dram.size)
    if insn.x_size == 0 or err in (ErrorCode.SRAM_BOUNDS, ErrorCode.DRAM_ADDRESS):
        return
    eb = eb_of(config, insn.mem)
    for y in range(insn.y_size):
        a = (insn.dram_base + y * insn.x_stride) * eb
        src = sram[insn.sram_base + y * insn.x_size:insn.sram_base + (y + 1) * insn.x_size]
        row = src.reshape(-1)
        n = max(0, min(row.size, dram.size - a))
        dram[a:a + n] = row[:n]


# -------------------------------------------------------------------- harness


@dataclass
class Outcome:
    insn: object
    start: int
    end: int
    error: int


@dataclass
class Engine:
    """One DMA engine in a simulation, with its SRAM image and its instructions."""

    dut: object
    port: int
    insns: list
    sram: np.ndarray
    delay: int = 0
    outcomes: list = field(default_factory=list)
    sram_log: list = field(default_factory=list)    # (cycle, addr) of every SRAM access
    w_log: list = field(default_factory=list)       # (cycle, wlast) of every W handshake


def make_reader(config, mem, insns, rng, port=0, delay=0) -> Engine:
    """A reader over as many ports as a LOAD of ``mem`` uses on ``config``: port ``port``,
    then ``port + 8``, ..."""
    dut = DmaReader(config, mem, READER_ID, ports=load_ports(config, mem))
    sram = rng.integers(0, 256, (dut.depth, dut.elem_bytes), dtype=np.uint8)
    return Engine(dut, port, list(insns), sram, delay)


def make_writer(config, insns, rng, port=0, delay=0) -> Engine:
    dut = DmaWriter(config, WRITER_ID)
    sram = rng.integers(0, 256, (dut.depth, dut.elem_bytes), dtype=np.uint8)
    return Engine(dut, port, list(insns), sram, delay)


def run(config: HwConfig, engines: list[Engine], dram: np.ndarray, **dram_args) -> AxiDram:
    """Simulate ``engines`` side by side, each running its instructions back to back."""
    top = Module()
    for i, e in enumerate(engines):
        top.submodules[f"e{i}"] = e.dut
    sim = Simulator(top)
    sim.add_clock(1e-8)
    model = AxiDram(config, dram, check_comb=True, **dram_args)
    model.attach(sim, {e.port + 8 * p: axi for e in engines for p, axi in enumerate(e.dut.axis)})
    for e in engines:
        sim.add_process(_sram_model(e))
        if isinstance(e.dut, DmaWriter):
            sim.add_process(_w_monitor(e))
        sim.add_testbench(_driver(e))
    sim.run()
    return model


def _sram_model(e: Engine):
    port, eb = e.dut.sram, e.dut.elem_bytes
    if isinstance(e.dut, DmaReader):
        async def writes(ctx):
            cycle = 0
            async for _, _, en, addr, data in ctx.tick().sample(port.en, port.addr, port.data):
                if en:
                    e.sram[addr] = np.frombuffer(data.to_bytes(eb, "little"), np.uint8)
                    e.sram_log.append((cycle, addr))
                cycle += 1
        return writes

    async def reads(ctx):
        cycle = 0
        async for _, _, en, addr in ctx.tick().sample(port.en, port.addr):
            if en:
                ctx.set(port.data, int.from_bytes(e.sram[addr].tobytes(), "little"))
                e.sram_log.append((cycle, addr))
            cycle += 1
    return reads


def _w_monitor(e: Engine):
    axi = e.dut.axi

    async def monitor(ctx):
        cycle = 0
        async for _, _, valid, ready, last in ctx.tick().sample(axi.wvalid, axi.wready, axi.wlast):
            if valid and ready:
                e.w_log.append((cycle, last))
            cycle += 1
    return monitor


def _driver(e: Engine):
    dut = e.dut

    async def driver(ctx):
        now = 0
        for _ in range(e.delay):
            await ctx.tick()
            now += 1
        for insn in e.insns:
            # The next instruction starts in the cycle the previous one ends.
            ctx.set(dut.insn, {f: getattr(insn, f) for f in FIELDS})
            ctx.set(dut.start, 1)
            start = now
            await ctx.tick()
            now += 1
            ctx.set(dut.start, 0)
            while ctx.get(dut.busy):
                await ctx.tick()
                now += 1
                if now - start > TIMEOUT_CYCLES:
                    raise AssertionError(f"{insn} still busy after {TIMEOUT_CYCLES} cycles")
            e.outcomes.append(Outcome(insn, start, now, ctx.get(dut.error)))
    return driver


def random_dram(rng, size=DRAM_BYTES) -> np.ndarray:
    return rng.integers(0, 256, size, dtype=np.uint8)


def check_cycles(config, o: Outcome, err: ErrorCode) -> int:
    """E - S of one instruction: 2 when a setup check fails, else the timing.md formula."""
    if err in (ErrorCode.SRAM_BOUNDS, ErrorCode.DRAM_ADDRESS):
        cycles = DMA_SETUP_CYCLES
    else:
        cycles = timing_cycles(config, o.insn)
        assert cycles == expected_cycles(config, o.insn)
    assert o.end - o.start == cycles, (o, cycles)
    return cycles


def sram_base_max(config: HwConfig) -> int:
    return get_isa(config).layouts[Opcode.LOAD].field("sram_base").hi


def check_reader(config, mem, insns, *, seed=0, dram_bytes=DRAM_BYTES):
    """Run ``insns`` on a reader; check SRAM, errors, cycles and bursts; return the run."""
    rng = np.random.default_rng(seed)
    dram = random_dram(rng, dram_bytes)
    e = make_reader(config, mem, insns, rng)
    expected = e.sram.copy()
    model = run(config, [e], dram.copy())
    for insn in insns:
        apply_load(config, insn, dram, expected)
    np.testing.assert_array_equal(e.sram, expected)
    ars = [ev for ev in model.log if ev.kind == "AR"]
    for o in e.outcomes:
        err = expected_error(config, o.insn, dram.size)
        assert o.error == err, o
        cycles = check_cycles(config, o, err)
        for piece in range(len(e.dut.axis)):
            mine = [ev for ev in ars if o.start <= ev.cycle < o.end and ev.port == 8 * piece]
            want = [] if cycles == 2 else expected_bursts(config, o.insn, piece)
            assert [(ev.addr, ev.beats) for ev in mine] == want, (o, piece)
            if want:
                assert [ev.cycle for ev in mine] == list(range(
                    o.start + 2 + dma_cost(config, o.insn).pad_cycles,
                    o.start + 2 + dma_cost(config, o.insn).pad_cycles + len(want)))
        writes = [(c, a) for c, a in e.sram_log if o.start <= c < o.end]
        rows, cols = block_shape(o.insn)
        n = 0 if cycles == 2 else rows * cols
        assert sorted(a for _, a in writes) == list(range(o.insn.sram_base,
                                                          o.insn.sram_base + n)), o
        if n:
            # Pads from S+2, one per cycle; reads right after; the last entry lands in E-1.
            pads = dma_cost(config, o.insn).pad_cycles
            assert [c for c, _ in writes[:pads]] == list(range(o.start + 2, o.start + 2 + pads))
            assert writes[-1][0] == o.end - 1
    assert all(ev.id == READER_ID for ev in ars)
    return e, model


def check_writer(config, insns, *, seed=0, dram_bytes=DRAM_BYTES):
    rng = np.random.default_rng(seed)
    dram = random_dram(rng, dram_bytes)
    e = make_writer(config, insns, rng)
    expected = dram.copy()
    model = run(config, [e], dram)
    for insn in insns:
        apply_store(config, insn, expected, e.sram)
    np.testing.assert_array_equal(dram, expected)
    aws = [ev for ev in model.log if ev.kind == "AW"]
    for o in e.outcomes:
        err = expected_error(config, o.insn, dram.size)
        assert o.error == err, o
        cycles = check_cycles(config, o, err)
        mine = [(ev.addr, ev.beats) for ev in aws if o.start <= ev.cycle < o.end]
        want = [] if cycles == 2 else expected_bursts(config, o.insn)
        assert mine == want, o
        # W beats from S+2 to S+1+data_cycles, wlast on each burst's last beat, and each
        # burst's AW no later than its first beat.
        beats = [(c, last) for c, last in e.w_log if o.start <= c < o.end]
        ends = list(np.cumsum([n for _, n in want]))
        assert [i + 1 for i, (_, last) in enumerate(beats) if last] == ends, o
        if want:
            assert beats[0][0] >= o.start + 2
            assert beats[-1][0] == o.start + 1 + dma_cost(config, o.insn).data_cycles
            firsts = [beats[0][0]] + [beats[i][0] for i in ends[:-1]]
            aw_cycles = [ev.cycle for ev in aws if o.start <= ev.cycle < o.end]
            assert all(a <= w for a, w in zip(aw_cycles, firsts)), o
        responses = [ev for ev in model.log if ev.kind == "B" and o.start <= ev.cycle < o.end]
        assert len(responses) == len(want)
        if want:
            assert responses[-1].cycle == o.end - 1
    assert all(ev.id == WRITER_ID for ev in aws)
    return e, model


# ---------------------------------------------------------------- fixed cases


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("mem", LOAD_MEMS, ids=lambda m: m.label)
def test_load_basic(config, mem):
    insns = [Load(mem=mem, dram_base=3, x_size=3, y_size=2, x_stride=5),
             Load(mem=mem, dram_base=1, x_size=1, y_size=1, x_stride=1, sram_base=7),
             Load(mem=mem, dram_base=2, x_size=2, y_size=3, x_stride=1, sram_base=1,
                  y_pad_0=1, x_pad_1=1)]
    check_reader(config, mem, insns)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("pad", ["y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"])
def test_load_each_pad_alone(config, pad):
    insn = Load(mem=MemType.INP, dram_base=5, x_size=3, y_size=2, x_stride=7, sram_base=2,
                **{pad: 2})
    e, model = check_reader(config, MemType.INP, [insn])
    (o,) = e.outcomes
    rows, cols = block_shape(insn)
    pads = rows * cols - 6
    # Pads first, one per cycle from S+2, then the first read; the last entry lands in E-1.
    assert [c for c, _ in e.sram_log[:pads]] == list(range(o.start + 2, o.start + 2 + pads))
    assert model.log[0].cycle == o.start + 2 + pads
    assert e.sram_log[-1][0] == o.end - 1


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("mem", LOAD_MEMS, ids=lambda m: m.label)
@pytest.mark.parametrize("pad_value", [-128, -1, 1, 127])
def test_load_pad_value(config, mem, pad_value):
    insn = Load(mem=mem, dram_base=2, x_size=2, y_size=2, x_stride=3, sram_base=1,
                y_pad_0=1, y_pad_1=1, x_pad_0=1, x_pad_1=2, pad_value=pad_value)
    check_reader(config, mem, [insn], seed=pad_value % 256)


def test_load_max_pads():
    insn = Load(mem=MemType.INP, dram_base=1, x_size=2, y_size=2, x_stride=2,
                y_pad_0=15, y_pad_1=15, x_pad_0=15, x_pad_1=15)
    check_reader(PYNQ, MemType.INP, [insn])
    # tiny's 128-entry buffer takes the maximal pads one axis at a time.
    check_reader(TINY, MemType.INP, [
        Load(mem=MemType.INP, dram_base=1, x_size=2, y_size=2, x_stride=3, x_pad_0=15, x_pad_1=15),
        Load(mem=MemType.INP, dram_base=1, x_size=1, y_size=2, x_stride=3, y_pad_0=15, y_pad_1=15),
    ])


@pytest.mark.parametrize("config, mem, x_size, y_size, stride, base, pads, cycles", [
    # tiny inp: 4 B entries, 8 B beats. Rows at bytes 4 and 24: 2 beats each but 3 entries,
    # (1+2) x (3+1) - 6 = 6 pads: 2 + 6 + 8 + 6.
    (TINY, MemType.INP, 3, 2, 5, 1, (1, 0, 0, 1), 22),
    # pynq uop: 4 B; bytes [4, 16) -> 2 beats, 3 entries: 2 + 32 + 3.
    (PYNQ, MemType.UOP, 3, 1, 3, 1, (0, 0, 0, 0), 37),
    # pynq wgt: 256 B = 32 beats per entry; 2 rows of 2: 2 + 32 + 128.
    (PYNQ, MemType.WGT, 2, 2, 3, 2, (0, 0, 0, 0), 162),
    # zcu104 uop: 4 lanes of 4 B in a 16 B beat; 5 entries from lane 3 -> 3 beats, 5 cycles.
    (ZCU104, MemType.UOP, 5, 1, 5, 3, (0, 0, 0, 0), 2 + 40 + 5),
    # zcu104 acc: 128 B = 8 beats; 1 pad row of 1 entry + 2 x 1: 2 + 1 + 40 + 16.
    (ZCU104, MemType.ACC, 1, 2, 1, 0, (1, 0, 0, 0), 59),
])
def test_load_cycles_by_hand(config, mem, x_size, y_size, stride, base, pads, cycles):
    insn = Load(mem=mem, dram_base=base, x_size=x_size, y_size=y_size, x_stride=stride,
                y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3])
    assert expected_cycles(config, insn) == timing_cycles(config, insn) == cycles
    e, _ = check_reader(config, mem, [insn])
    assert e.outcomes[0].end - e.outcomes[0].start == cycles


@pytest.mark.parametrize("config", [TINY, PYNQ, ZCU104], ids=lambda c: c.name)
@pytest.mark.parametrize("mem", [MemType.UOP, MemType.INP, MemType.WGT], ids=lambda m: m.label)
def test_load_across_4k_boundary(config, mem):
    eb = eb_of(config, mem)
    below = 4096 // eb - 1           # the element just below the boundary
    insns = [Load(mem=mem, dram_base=below, x_size=3, y_size=1, x_stride=3),
             Load(mem=mem, dram_base=below - 1, x_size=2, y_size=2, x_stride=4096 // eb)]
    if eb < config.bus_bytes:
        # Narrow, unaligned rows straddling the boundary in the middle of a burst.
        insns.append(Load(mem=mem, dram_base=4096 // eb - 5, x_size=40, y_size=1, x_stride=1))
    _, model = check_reader(config, mem, insns)
    assert any(ev.addr == 4096 for ev in model.log)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_load_long_rows_split_into_bursts(config):
    eb = eb_of(config, MemType.UOP)
    x = config.max_burst_beats * config.bus_bytes // eb + 3
    check_reader(config, MemType.UOP, [Load(mem=MemType.UOP, dram_base=1, x_size=x, y_size=2,
                                            x_stride=x + 5)])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_load_nop_and_pad_only(config):
    nop = Load(mem=MemType.INP, x_size=0, y_size=3, y_pad_0=2, x_pad_0=1, sram_base=1)
    pad_only = Load(mem=MemType.INP, x_size=3, y_size=0, y_pad_0=2, y_pad_1=1, x_pad_1=1,
                    sram_base=4)
    empty = Load(mem=MemType.INP, x_size=2, y_size=0)
    e, model = check_reader(config, MemType.INP, [nop, pad_only, empty])
    assert not model.log
    o_nop, o_pad, o_empty = e.outcomes
    assert o_nop.end - o_nop.start == 2
    assert o_pad.end - o_pad.start == 2 + 3 * 4
    assert o_empty.end - o_empty.start == 2


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("mem", [MemType.INP, MemType.ACC], ids=lambda m: m.label)
def test_load_errors(config, mem):
    eb, depth = eb_of(config, mem), get_isa(config).depth(mem)
    top = (1 << 32) // eb
    insns = [
        # Exactly fills the buffer: fine. One more entry: SRAM_BOUNDS.
        Load(mem=mem, sram_base=depth - 6, x_size=2, y_size=2, x_stride=2, x_pad_0=1),
        Load(mem=mem, sram_base=depth - 5, x_size=2, y_size=2, x_stride=2, x_pad_0=1),
        Load(mem=mem, sram_base=depth - 3, x_size=0, y_size=1),        # a nop is never checked
        Load(mem=mem, sram_base=depth - 1, x_size=1, y_size=0, y_pad_0=2),
        # The last byte at 2**32 - 1 is addressable (but outside the DRAM array: SLVERR);
        # one element further is DRAM_ADDRESS.
        Load(mem=mem, dram_base=top - 3, x_size=3, y_size=1, x_stride=3, y_pad_1=1),
        Load(mem=mem, dram_base=top - 3, x_size=4, y_size=1, x_stride=3),
        Load(mem=mem, dram_base=top - 10, x_size=3, y_size=3, x_stride=4),
        Load(mem=mem, dram_base=top - 10, x_size=3, y_size=3, x_stride=3),
    ]
    e, _ = check_reader(config, mem, insns)
    assert [o.error for o in e.outcomes] == [
        0, ErrorCode.SRAM_BOUNDS, 0, ErrorCode.SRAM_BOUNDS, ErrorCode.AXI_RESPONSE,
        ErrorCode.DRAM_ADDRESS, ErrorCode.DRAM_ADDRESS, ErrorCode.AXI_RESPONSE]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_load_partly_outside_dram(config):
    """Beats past the array read as zeros with SLVERR; the load still completes in time."""
    eb = eb_of(config, MemType.INP)
    size = 4096
    insn = Load(mem=MemType.INP, dram_base=size // eb - 1, x_size=3, y_size=2, x_stride=1)
    e, _ = check_reader(config, MemType.INP, [insn, Load(mem=MemType.INP, x_size=1)],
                        dram_bytes=size)
    assert [o.error for o in e.outcomes] == [ErrorCode.AXI_RESPONSE, 0]


# -------------------------------------------------------------------- writer


@pytest.mark.parametrize("config", STORE_CONFIGS, ids=lambda c: c.name)
def test_store_basic(config):
    check_writer(config, [
        Store(dram_base=3, x_size=3, y_size=2, x_stride=5, sram_base=4),
        Store(dram_base=1, x_size=1, y_size=1, x_stride=1),
        Store(dram_base=2, x_size=5, y_size=3, x_stride=2, sram_base=9),   # overlapping rows
        Store(x_size=0, y_size=4),
        Store(x_size=3, y_size=0),
    ])


@pytest.mark.parametrize("config, x_size, y_size, stride, base, cycles", [
    # tiny out: 4 B entries in 8 B beats, one entry per cycle: 2 + 6 + 8.
    (TINY, 3, 2, 5, 1, 16),
    # pynq out: 16 B = 2 beats per entry: 2 + 2 * 8 + 32 (test_timing's case).
    (PYNQ, 4, 2, 8, 0, 50),
    # zcu104 out: 32 B = 2 beats: 2 + 6 + 40.
    (ZCU104, 3, 1, 3, 7, 48),
    # pynq-bus16 out: one beat per entry: 2 + 4 + 32.
    (PYNQ_B16, 2, 2, 9, 1, 38),
])
def test_store_cycles_by_hand(config, x_size, y_size, stride, base, cycles):
    insn = Store(dram_base=base, x_size=x_size, y_size=y_size, x_stride=stride, sram_base=2)
    assert expected_cycles(config, insn) == timing_cycles(config, insn) == cycles
    e, _ = check_writer(config, [insn])
    assert e.outcomes[0].end - e.outcomes[0].start == cycles


@pytest.mark.parametrize("config", STORE_CONFIGS, ids=lambda c: c.name)
def test_store_across_4k_and_long_rows(config):
    eb = eb_of(config, MemType.OUT)
    x = config.max_burst_beats * config.bus_bytes // eb + 3
    _, model = check_writer(config, [
        Store(dram_base=4096 // eb - 1, x_size=3, y_size=2, x_stride=4096 // eb),
        Store(dram_base=4096 // eb - 5, x_size=x, y_size=2, x_stride=x + 1, sram_base=3),
    ])
    assert any(ev.kind == "AW" and ev.addr == 4096 for ev in model.log)


@pytest.mark.parametrize("config", STORE_CONFIGS, ids=lambda c: c.name)
def test_store_errors(config):
    eb, depth = eb_of(config, MemType.OUT), get_isa(config).depth(MemType.OUT)
    top = (1 << 32) // eb
    insns = [
        Store(sram_base=depth - 4, x_size=2, y_size=2, x_stride=2),
        Store(sram_base=depth - 3, x_size=2, y_size=2, x_stride=2),
        Store(sram_base=depth - 1, x_size=2, y_size=1),
        Store(sram_base=depth - 1, x_size=0, y_size=5),
        Store(dram_base=top - 3, x_size=3, y_size=1, x_stride=3),
        Store(dram_base=top - 2, x_size=3, y_size=1, x_stride=3),
        Store(dram_base=5, x_size=1, y_size=1),
    ]
    e, _ = check_writer(config, insns)
    assert [o.error for o in e.outcomes] == [
        0, ErrorCode.SRAM_BOUNDS, ErrorCode.SRAM_BOUNDS, 0, ErrorCode.AXI_RESPONSE,
        ErrorCode.DRAM_ADDRESS, 0]


# ---------------------------------------------------------------- hypothesis


@st.composite
def dma_insn(draw, config: HwConfig, mem: MemType, store: bool,
             region: tuple[int, int] = (0, DRAM_BYTES)):
    """A LOAD/STORE of ``mem`` whose rows lie in the DRAM byte ``region`` (if they fit)."""
    eb, depth = eb_of(config, mem), get_isa(config).depth(mem)
    first, elems = -(-region[0] // eb), region[1] // eb
    x = draw(st.integers(0, 6 if eb < 64 else 3))
    y = draw(st.integers(0, 3))
    stride = draw(st.integers(0, 9))
    pads = (0, 0, 0, 0) if store else tuple(draw(st.sampled_from([0, 0, 1, 2, 15]))
                                            for _ in range(4))
    span = (y - 1) * stride + x if x and y else 0
    base = draw(st.integers(first, max(first, elems - span)))
    pad_field = get_isa(config).layouts[Opcode.LOAD].field("pad_value")
    pad_value = 0 if store else draw(st.sampled_from([0, -1, pad_field.lo, pad_field.hi])
                                     | st.integers(pad_field.lo, pad_field.hi))
    cls = Store if store else Load
    insn = cls(mem=mem, dram_base=base, x_size=x, y_size=y, x_stride=stride,
               y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3],
               pad_value=pad_value)
    rows, cols = block_shape(insn)
    # Mostly in bounds; now and then one entry too many.
    limit = max(0, depth - rows * cols) + draw(st.sampled_from([0, 0, 0, 0, 1]))
    sram_base = draw(st.integers(0, limit))
    return insn.replace(sram_base=min(sram_base, sram_base_max(config)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@given(data=st.data())
def test_load_random(config, data):
    mem = data.draw(st.sampled_from(LOAD_MEMS))
    insns = data.draw(st.lists(dma_insn(config, mem, False), min_size=1, max_size=3))
    check_reader(config, mem, insns, seed=len(insns))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("config", STORE_CONFIGS, ids=lambda c: c.name)
@given(data=st.data())
def test_store_random(config, data):
    insns = data.draw(st.lists(dma_insn(config, MemType.OUT, True), min_size=1, max_size=3))
    check_writer(config, insns, seed=len(insns))


# ---------------------------------------------------------------- contention


@pytest.mark.parametrize("config", [TINY, PYNQ, ZCU104, PYNQ_OUT32, TINY_BUS16],
                         ids=lambda c: c.name)
def test_two_ports_compete(config):
    """A reader and a writer on two ports, with DDR bandwidth for less than one beat a cycle."""
    bus = config.bus_bytes
    cfg = config.replace(name=config.name + "-starved", ddr_bytes_per_cycle=0.75 * bus)
    rng = np.random.default_rng(7)
    dram = random_dram(rng)
    loads = [Load(mem=MemType.INP, dram_base=3, x_size=9, y_size=3, x_stride=11, y_pad_0=1),
             Load(mem=MemType.INP, dram_base=100, x_size=4, y_size=2, x_stride=4, sram_base=50)]
    stores = [Store(dram_base=4096 // eb_of(cfg, MemType.OUT) - 2, x_size=7, y_size=3,
                    x_stride=9, sram_base=5),
              Store(dram_base=500, x_size=2, y_size=2, x_stride=3)]
    spans = [byte_span(cfg, insn) for insn in loads + stores]
    assert all(a[1] <= b[0] or b[1] <= a[0] for i, a in enumerate(spans) for b in spans[i + 1:])
    reader = make_reader(cfg, MemType.INP, loads, rng, port=0)
    writer = make_writer(cfg, stores, rng, port=1, delay=3)
    expected_sram, expected_dram = reader.sram.copy(), dram.copy()
    run(cfg, [reader, writer], dram)
    # The DRAM regions are disjoint (checked above), so the order between them is moot.
    for insn in loads:
        apply_load(cfg, insn, expected_dram, expected_sram)
    for insn in stores:
        apply_store(cfg, insn, expected_dram, writer.sram)
    np.testing.assert_array_equal(reader.sram, expected_sram)
    np.testing.assert_array_equal(dram, expected_dram)
    assert all(o.error == 0 for o in reader.outcomes + writer.outcomes)
    slow = [o.end - o.start - timing_cycles(cfg, o.insn) for o in reader.outcomes + writer.outcomes]
    assert all(s >= 0 for s in slow) and sum(slow) > 0


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("config", [TINY, ZCU104, PYNQ_OUT32, TINY_2LOAD], ids=lambda c: c.name)
@given(data=st.data())
def test_random_contention(config, data):
    """Random loads and stores side by side on two ports, at several DDR budgets."""
    ddr = data.draw(st.sampled_from([0.25, 0.5, 1.0, 1.5])) * config.bus_bytes
    cfg = config.replace(name=f"{config.name}-ddr{ddr}", ddr_bytes_per_cycle=ddr)
    half = DRAM_BYTES // 2          # loads read the lower half, stores write the upper one
    loads = data.draw(st.lists(dma_insn(cfg, MemType.INP, False, (0, half)),
                               min_size=1, max_size=3))
    stores = data.draw(st.lists(dma_insn(cfg, MemType.OUT, True, (half, DRAM_BYTES)),
                                min_size=1, max_size=3))
    delays = data.draw(st.tuples(st.integers(0, 20), st.integers(0, 20)))
    rng = np.random.default_rng(len(loads) + 4 * len(stores))
    dram = random_dram(rng)
    reader = make_reader(cfg, MemType.INP, loads, rng, port=0, delay=delays[0])
    writer = make_writer(cfg, stores, rng, port=1, delay=delays[1])
    expected_sram, expected_dram = reader.sram.copy(), dram.copy()
    run(cfg, [reader, writer], dram)
    for insn in loads:
        apply_load(cfg, insn, expected_dram, expected_sram)
    for insn in stores:
        apply_store(cfg, insn, expected_dram, writer.sram)
    np.testing.assert_array_equal(reader.sram, expected_sram)
    np.testing.assert_array_equal(dram, expected_dram)
    for o in reader.outcomes + writer.outcomes:
        err = expected_error(cfg, o.insn, dram.size)
        assert o.error == err, o
        if err in (ErrorCode.SRAM_BOUNDS, ErrorCode.DRAM_ADDRESS):
            assert o.end - o.start == DMA_SETUP_CYCLES
        else:
            assert o.end - o.start >= timing_cycles(cfg, o.insn)


def test_two_readers_share_ddr():
    """Two readers, one beat per cycle of DDR between them: each gets about half."""
    cfg = TINY.replace(name="tiny-shared", ddr_bytes_per_cycle=8.0)
    rng = np.random.default_rng(3)
    dram = random_dram(rng)
    a = make_reader(cfg, MemType.ACC, [Load(mem=MemType.ACC, dram_base=5, x_size=6, y_size=2,
                                            x_stride=6)], rng, port=0)
    b = make_reader(cfg, MemType.WGT, [Load(mem=MemType.WGT, dram_base=100, x_size=6, y_size=2,
                                            x_stride=7, x_pad_0=1)], rng, port=2)
    want_a, want_b = a.sram.copy(), b.sram.copy()
    run(cfg, [a, b], dram.copy())
    apply_load(cfg, a.insns[0], dram, want_a)
    apply_load(cfg, b.insns[0], dram, want_b)
    np.testing.assert_array_equal(a.sram, want_a)
    np.testing.assert_array_equal(b.sram, want_b)
    # 24 beats each at half rate: about 24 extra cycles each beyond the uncontended time.
    for e in (a, b):
        (o,) = e.outcomes
        assert timing_cycles(cfg, o.insn) + 16 <= o.end - o.start <= timing_cycles(cfg, o.insn) + 30


def test_axi_event_log_records_handshakes():
    _, model = check_writer(TINY, [Store(dram_base=2, x_size=2, y_size=1, x_stride=2)])
    kinds = [ev.kind for ev in model.log]
    assert kinds == ["AW", "B"]
    assert isinstance(model.log[0], AxiEvent) and model.log[1].resp == 0
