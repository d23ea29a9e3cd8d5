"""The load, compute and store modules: a sequencer plus the executors of each
instruction kind the module runs (LOAD/STORE engines, the tensor pipeline).

Each module exposes its :class:`~tessera.hw.sequencer.Sequencer` as ``seq``;
the top level connects the command queue and the token queues to it.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from tessera.config import ACC_BANKS, HwConfig
from tessera.isa import INSN_BITS, Alu, Finish, Gemm, Instruction, Load, MemType, Opcode, get_isa
from tessera.isa.encoding import OPCODE_BITS
from tessera.regmap import axi_id
from tessera.timing import COMPUTE_UNITS, compute_unit, load_ports, units_awaited, units_taken

from tessera.regmap import ERROR_CODE_BITS
from .dma import load_modules
from .dma_reader import DmaReader
from .dma_writer import DmaWriter
from .layouts import alu_layout, gemm_layout, mem_layout
from .ports import axi_read_members, axi_signature, sram_read_signature, sram_write_signature
from .sequencer import INDEX_BITS, Sequencer
from .tensor import TensorPipeline


def _first_error(m: Module, target: Signal, codes: list, index: Signal | None = None,
                 indices: list | None = None) -> None:
    """``target`` = the first non-zero code, ``index`` the matching entry of ``indices``
    (the index of the instruction that failed)."""
    for i in reversed(range(len(codes))):
        with m.If(codes[i] != 0):
            m.d.comb += target.eq(codes[i])
            if index is not None:
                m.d.comb += index.eq(indices[i])


def acc_bank_row_bits(config: HwConfig) -> int:
    """Bits of a row index within an accumulator bank: a row's bank is its index's top
    bits (``row // acc_bank_rows``), its address in the bank the low bits."""
    rows = config.acc_bank_rows
    assert rows * ACC_BANKS == config.acc_depth and rows & (rows - 1) == 0, \
        "banks of a power-of-two number of rows"
    return rows.bit_length() - 1


def bank_of(config: HwConfig, row):
    """The bank of an accumulator (or output buffer) row index ``row``."""
    return row[acc_bank_row_bits(config):]


def bank_addr(config: HwConfig, row):
    """The address of ``row`` within its bank."""
    return row[:acc_bank_row_bits(config)]


def _serves(eng: DmaReader, mem) -> Value:
    """``mem`` (a memory-type Value) is one of those ``eng`` serves."""
    return Cat(*(mem == mt for mt in eng.mems)).any()


def _share_read_port(m: Module, axi, engines: dict, selected: Signal, piece: int = 0) -> None:
    """Engines of one module take turns on its AXI read port (one instruction at a time):
    the engine serving the ``selected`` memory type drives the master's outputs, and only
    it sees the handshakes. ``piece``: which of the module's ports ``axi`` is (its
    ``piece``-th, served by the engines reading over more than ``piece`` ports)."""
    members = axi_read_members(len(axi.rdata))
    engines = {mt: eng for mt, eng in engines.items() if len(eng.axis) > piece}
    for eng in engines.values():
        mine = _serves(eng, selected)
        for name, member in members.items():
            if member.flow == In:
                gated = name in ("arready", "rvalid")
                m.d.comb += getattr(eng.axis[piece], name).eq(
                    getattr(axi, name) & mine if gated else getattr(axi, name))
    with m.Switch(selected):
        for eng in engines.values():
            with m.Case(*eng.mems):
                m.d.comb += [getattr(axi, name).eq(getattr(eng.axis[piece], name))
                             for name, member in members.items() if member.flow == Out]


def _mem_of(config: HwConfig, word) -> data.View:
    layout = mem_layout(config)
    return data.View(layout, word[:layout.size])


#: Memory types whose LOADs run on another type's DMA engine: tbl rows are acc8 rows
#: (``batch x block_out`` int8 lanes), so one reader serves both (a reader less: its
#: address generator, checks and block-size DSP).
_SHARED_READERS = {MemType.TBL: MemType.ACC8}


def _readers_for(config: HwConfig, module: str) -> dict[MemType, DmaReader]:
    """The DMA engines of ``module``'s LOADs, by the first memory type each serves."""
    mems = [mt for mt, owner in load_modules(config).items() if owner == module]
    return {mt: DmaReader(config, mt, axi_id(module),
                          also=tuple(s for s, host in _SHARED_READERS.items()
                                     if host == mt and s in mems), ports=load_ports(config, mt))
            for mt in mems if mt not in _SHARED_READERS}


class LoadModule(wiring.Component):
    """Runs LOAD inp/wgt: one 2-D DMA engine per buffer, sharing the module's AXI ports
    (``axi``, then ``axi1``... when the config gives the load module several: the engines
    whose entries split over them read a piece of each entry from each)."""

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        c = config
        self.seq = Sequencer(config, INSN_BITS)
        self.readers = _readers_for(config, "load")
        #: The AXI masters' member names, one per port of ``config.ports_of("load")``.
        self.axi_names = ("axi",) + tuple(f"axi{p}" for p in range(1, len(c.ports_of("load"))))
        super().__init__({
            **{name: Out(axi_signature(c.bus_bytes * 8, write=False))
               for name in self.axi_names},
            "inp_wr": Out(sram_write_signature(c.inp_index_bits, c.inp_entry_bytes * 8)),
            "wgt_wr": Out(sram_write_signature(c.wgt_index_bits, c.wgt_entry_bytes * 8)),
            "error": Out(ERROR_CODE_BITS), "error_index": Out(INDEX_BITS), "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.seq = seq = self.seq
        m.d.comb += self.error_index.eq(seq.index[0])
        for mt, eng in self.readers.items():
            m.submodules[f"dma_{mt.label}"] = eng
        sel = Signal(range(max(MemType) + 1))
        mem = _mem_of(self.config, seq.insn)
        with m.If(seq.start):
            m.d.sync += sel.eq(mem.mem)
        for eng in self.readers.values():
            m.d.comb += [eng.insn.eq(mem), eng.start.eq(seq.start & _serves(eng, mem.mem))]
        for piece, name in enumerate(self.axi_names):
            _share_read_port(m, getattr(self, name), self.readers, sel, piece)
        for mt, port in ((MemType.INP, self.inp_wr), (MemType.WGT, self.wgt_wr)):
            m.d.comb += [port.addr.eq(self.readers[mt].sram.addr),
                         port.data.eq(self.readers[mt].sram.data),
                         port.en.eq(self.readers[mt].sram.en)]
        busy = Cat(*(e.busy for e in self.readers.values())).any()
        m.d.comb += [self.busy.eq(busy), seq.exec_busy.eq(busy)]
        _first_error(m, self.error, [e.error for e in self.readers.values()])
        return m


class StoreModule(wiring.Component):
    """Runs STORE: the 2-D DMA engine from the output buffer."""

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        c = config
        self.seq = Sequencer(config, INSN_BITS)
        self.writer = DmaWriter(config, axi_id("store"))
        super().__init__({
            "axi": Out(axi_signature(c.bus_bytes * 8, read=False)),
            "out_rd": Out(sram_read_signature(c.acc_index_bits, c.out_entry_bytes * 8)),
            "error": Out(ERROR_CODE_BITS), "error_index": Out(INDEX_BITS), "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.seq = seq = self.seq
        m.d.comb += self.error_index.eq(seq.index[0])
        m.submodules.dma = eng = self.writer
        m.d.comb += [eng.insn.eq(_mem_of(self.config, seq.insn)), eng.start.eq(seq.start)]
        wiring.connect(m, wiring.flipped(self.axi), eng.axi)
        wiring.connect(m, wiring.flipped(self.out_rd), eng.sram)
        m.d.comb += [self.busy.eq(eng.busy), seq.exec_busy.eq(eng.busy),
                     self.error.eq(eng.error)]
        return m


def _unit_mask(units: tuple[str, ...]) -> int:
    """A bit per compute unit (bit ``i``: ``COMPUTE_UNITS[i]``)."""
    return sum(1 << COMPUTE_UNITS.index(u) for u in units)


def _masks(insn: Instruction) -> tuple[int, int]:
    """The units ``insn`` waits for and the units it occupies (tessera.timing)."""
    return _unit_mask(units_awaited(insn)), _unit_mask(units_taken(insn))


class ComputeModule(wiring.Component):
    """Runs LOAD uop/acc/acc8/tbl, GEMM, ALU and FINISH on two execution units.

    The sequencer has one unit per entry of ``tessera.timing.COMPUTE_UNITS``,
    each with its :class:`TensorPipeline` (GEMM, ALU); an instruction waits for
    and occupies the units ``units_awaited``/``units_taken`` name (the
    ``overlap`` bit lets a GEMM or ALU start beside the other unit's
    instruction), and LOADs and FINISH take both. The accumulator and the
    output buffer are ``ACC_BANKS`` banks by row (``acc_rd``, ``acc_wr``,
    ``out_wr``: one port per bank): each pipeline's reads and writes go to the
    bank of their row, the GEMM pipeline (and the acc/acc8 DMA) first when
    both units want one bank in a cycle, which a valid program never does
    (docs/timing.md, "Compute units"). Every accumulator write is mirrored
    into the output buffer, saturated to the output width. ``finish`` is high
    in the one cycle FINISH executes; ``error_index`` names the instruction
    whose unit reports ``error``. LOAD tbl writes the ALU pipeline's table memory
    (a config with ``table_entries`` = 0 has neither).
    """

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        c = config
        isa = get_isa(c)
        self.seq = Sequencer(config, INSN_BITS, units=len(COMPUTE_UNITS))
        self.readers = _readers_for(config, "compute")
        self.pipelines = {unit: TensorPipeline(config, unit) for unit in COMPUTE_UNITS}
        row_bits = acc_bank_row_bits(c)
        super().__init__({
            "axi": Out(axi_signature(c.bus_bytes * 8, write=False)),
            "uop_wr": Out(sram_write_signature(c.uop_index_bits, isa.uop_layout.bits)),
            "uop_rd": Out(sram_read_signature(c.uop_index_bits, isa.uop_layout.bits)
                          ).array(len(COMPUTE_UNITS)),
            "inp_rd": Out(sram_read_signature(c.inp_index_bits, c.inp_entry_bytes * 8)),
            "wgt_rd": Out(sram_read_signature(c.wgt_index_bits, c.wgt_entry_bytes * 8)),
            "acc_rd": Out(sram_read_signature(row_bits, c.acc_entry_bytes * 8)).array(ACC_BANKS),
            "acc_wr": Out(sram_write_signature(row_bits, c.acc_entry_bytes * 8)).array(ACC_BANKS),
            "out_wr": Out(sram_write_signature(row_bits, c.out_entry_bytes * 8)).array(ACC_BANKS),
            "finish": Out(1), "error": Out(ERROR_CODE_BITS), "error_index": Out(INDEX_BITS),
            "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.seq = seq = self.seq
        pipes = [self.pipelines[unit] for unit in COMPUTE_UNITS]
        for unit, pipe in self.pipelines.items():
            m.submodules[f"{unit}_unit"] = pipe
        for mt, eng in self.readers.items():
            m.submodules[f"dma_{mt.label}"] = eng
        opcode = seq.insn[:OPCODE_BITS]
        self._assign_units(m, opcode)
        self._run_loads(m, opcode == Opcode.LOAD)

        # ---- buffer reads: a uop port per unit; inp/wgt for the GEMM unit
        gemm = self.pipelines[compute_unit(Gemm())]
        for port, src in ((self.inp_rd, gemm.inp), (self.wgt_rd, gemm.wgt),
                          *zip(self.uop_rd, (p.uop for p in pipes))):
            wiring.connect(m, wiring.flipped(port), src)
        self._acc_reads(m, [gemm.acc_rd] + [p.acc_rd for p in pipes if p is not gemm])
        self._acc_writes(m, gemm, pipes)
        self._report_status(m, pipes)
        return m

    def _assign_units(self, m: Module, opcode) -> None:
        """The units the head instruction waits for and occupies; its unit's pipeline
        starts a GEMM or ALU, and ``finish`` marks a FINISH."""
        c, seq = self.config, self.seq
        kinds = {Opcode.GEMM: (Gemm, gemm_layout(c)), Opcode.ALU: (Alu, alu_layout(c))}
        others = _masks(Finish())
        assert _masks(Load(mem=MemType.UOP)) == others
        with m.Switch(opcode):
            for op, (cls, layout) in kinds.items():
                overlap = data.View(layout, seq.insn[:layout.size]).overlap
                with m.Case(op):
                    (aw0, tk0), (aw1, tk1) = _masks(cls(overlap=False)), _masks(cls(overlap=True))
                    m.d.comb += [seq.awaits.eq(Mux(overlap, aw1, aw0)),
                                 seq.takes.eq(Mux(overlap, tk1, tk0))]
            with m.Default():
                m.d.comb += [seq.awaits.eq(others[0]), seq.takes.eq(others[1])]
        for unit, pipe in self.pipelines.items():
            op = next(op for op, (cls, _) in kinds.items() if compute_unit(cls()) == unit)
            m.d.comb += [pipe.insn.eq(seq.insn), pipe.start.eq(seq.start & (opcode == op))]
        m.d.comb += self.finish.eq(seq.start & (opcode == Opcode.FINISH))

    def _run_loads(self, m: Module, is_load) -> None:
        """LOAD uop/acc/acc8/tbl: start the DMA of the memory type, which takes the AXI
        port; the uop DMA writes the uop buffer, the acc8 DMA the ALU's table memory when
        the LOAD is a tbl one (``load_mem``, the memory type latched at its start)."""
        seq = self.seq
        mem = _mem_of(self.config, seq.insn)
        self.load_mem = sel = Signal(range(max(MemType) + 1))
        with m.If(seq.start & is_load):
            m.d.sync += sel.eq(mem.mem)
        for eng in self.readers.values():
            m.d.comb += [eng.insn.eq(mem), eng.start.eq(seq.start & is_load & _serves(eng, mem.mem))]
        _share_read_port(m, self.axi, self.readers, sel)
        uop_dma = self.readers[MemType.UOP]
        m.d.comb += [self.uop_wr.addr.eq(uop_dma.sram.addr), self.uop_wr.data.eq(uop_dma.sram.data),
                     self.uop_wr.en.eq(uop_dma.sram.en)]
        if self.config.table_entries:
            rows = self.readers[_SHARED_READERS[MemType.TBL]].sram
            tbl_wr = self.pipelines[compute_unit(Alu())].tbl_wr
            m.d.comb += [tbl_wr.addr.eq(rows.addr), tbl_wr.data.eq(rows.data),
                         tbl_wr.en.eq(rows.en & (sel == MemType.TBL))]

    def _acc_writes(self, m: Module, gemm: TensorPipeline, pipes: list) -> None:
        """Accumulator writes: the acc and acc8 DMAs share the GEMM unit's stream (a LOAD
        runs alone); each stream goes to the bank of its row, and to the output buffer
        saturated."""
        c = self.config
        lanes = c.batch * c.block_out
        acc8 = self.readers[MemType.ACC8].sram
        acc8_en = acc8.en & (self.load_mem == MemType.ACC8) if self.config.table_entries \
            else acc8.en
        acc8_wide = Cat(*(_sign_extend(acc8.data.word_select(j, 8), c.acc_width)
                          for j in range(lanes)))
        acc = self.readers[MemType.ACC].sram
        g_wr = Signal.like(gemm.acc_wr.data, name="gemm_stream_data")
        g_row = Signal.like(gemm.acc_wr.addr, name="gemm_stream_row")
        g_en = Signal(name="gemm_stream_en")
        with m.If(acc.en):
            m.d.comb += [g_en.eq(1), g_row.eq(acc.addr), g_wr.eq(acc.data)]
        with m.Elif(acc8_en):
            m.d.comb += [g_en.eq(1), g_row.eq(acc8.addr), g_wr.eq(acc8_wide)]
        with m.Else():
            m.d.comb += [g_en.eq(gemm.acc_wr.en), g_row.eq(gemm.acc_wr.addr),
                         g_wr.eq(gemm.acc_wr.data)]
        streams = [(g_en, g_row, g_wr)] + [(p.acc_wr.en, p.acc_wr.addr, p.acc_wr.data)
                                           for p in pipes if p is not gemm]
        # Saturated per stream (not after the bank muxes): fewer LUTs in yosys' estimate.
        saturated = [Cat(*(_saturate(d.word_select(j, c.acc_width), c.out_width)
                           for j in range(lanes))) for _, _, d in streams]
        for b in range(ACC_BANKS):
            acc_wr, out_wr = self.acc_wr[b], self.out_wr[b]
            for i, (en, row, wdata) in enumerate(streams):
                with (m.If if i == 0 else m.Elif)(en & (bank_of(c, row) == b)):
                    m.d.comb += [acc_wr.en.eq(1), acc_wr.addr.eq(bank_addr(c, row)),
                                 acc_wr.data.eq(wdata),
                                 out_wr.en.eq(1), out_wr.addr.eq(bank_addr(c, row)),
                                 out_wr.data.eq(saturated[i])]

    def _report_status(self, m: Module, pipes: list) -> None:
        """Busy per unit and overall, and the first error with its instruction's index."""
        seq = self.seq
        dma_busy = Cat(*(e.busy for e in self.readers.values())).any()
        m.d.comb += [seq.exec_busy[u].eq(pipe.busy | dma_busy) for u, pipe in enumerate(pipes)]
        m.d.comb += self.busy.eq(Cat(dma_busy, *(p.busy for p in pipes)).any())
        # A LOAD's index is kept by the lowest unit it takes (like its push flags).
        load_lead = min(COMPUTE_UNITS.index(u) for u in units_taken(Load(mem=MemType.UOP)))
        dmas = list(self.readers.values())
        _first_error(m, self.error, [p.error for p in pipes] + [e.error for e in dmas],
                     self.error_index,
                     [seq.index[u] for u in range(len(pipes))] + [seq.index[load_lead]] * len(dmas))

    def _acc_reads(self, m: Module, readers: list) -> None:
        """Each bank's read port serves the first reader (by priority) that reads one of
        its rows this cycle, else the last; a reader gets the data of the bank its last
        cycle's address was in."""
        c = self.config
        for b in range(ACC_BANKS):
            port = self.acc_rd[b]
            # Enabled only for a read some pipeline uses (an idle bank's data holds).
            wanted = Cat(*(r.en & (bank_of(c, r.addr) == b) for r in readers)).any()
            m.d.comb += [port.en.eq(wanted), port.addr.eq(bank_addr(c, readers[-1].addr))]
            for r in reversed(readers[:-1]):
                with m.If(r.en & (bank_of(c, r.addr) == b)):
                    m.d.comb += port.addr.eq(bank_addr(c, r.addr))
        for i, r in enumerate(readers):
            sel = Signal(range(ACC_BANKS), name=f"acc_rd_bank{i}")
            m.d.sync += sel.eq(bank_of(c, r.addr))
            with m.Switch(sel):
                for b in range(ACC_BANKS):
                    with m.Case(b):
                        m.d.comb += r.data.eq(self.acc_rd[b].data)


def _sign_extend(value, width: int):
    return Cat(value, value[-1].replicate(width - len(value)))


def _saturate(value, width: int):
    """Clamp a signed lane to ``width`` signed bits (the output buffer's values)."""
    v = value.as_signed()
    hi, lo = (1 << (width - 1)) - 1, -(1 << (width - 1))
    return Mux(v > hi, hi, Mux(v < lo, lo, v))[:width]
