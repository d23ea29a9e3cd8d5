"""The load, compute and store modules: a sequencer plus the executors of each
instruction kind the module runs (LOAD/STORE engines, the tensor pipeline).

Each module exposes its :class:`~tessera.hw.sequencer.Sequencer` as ``seq``;
the top level connects the command queue and the token queues to it.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from tessera.config import HwConfig
from tessera.isa import INSN_BITS, MemType, Opcode, get_isa
from tessera.isa.encoding import OPCODE_BITS
from tessera.isa.instructions import LOAD_MODULE
from tessera.regmap import axi_id

from tessera.regmap import ERROR_CODE_BITS
from .dma import DmaReader, DmaWriter
from .layouts import mem_layout
from .ports import axi_read_members, axi_signature, sram_read_signature, sram_write_signature
from .sequencer import Sequencer
from .tensor import TensorPipeline


def _first_error(m: Module, target: Signal, codes: list) -> None:
    """``target`` = the first non-zero code (only one executor runs at a time anyway)."""
    for code in reversed(codes):
        with m.If(code != 0):
            m.d.comb += target.eq(code)


def _share_read_port(m: Module, axi, engines: dict, selected: Signal) -> None:
    """Engines of one module take turns on its AXI read port (one instruction at a time):
    the selected engine drives the master's outputs, and only it sees the handshakes."""
    members = axi_read_members(len(axi.rdata))
    for key, eng in engines.items():
        mine = selected == key
        for name, member in members.items():
            if member.flow == In:
                gated = name in ("arready", "rvalid")
                m.d.comb += getattr(eng.axi, name).eq(getattr(axi, name) & mine if gated
                                                      else getattr(axi, name))
    with m.Switch(selected):
        for key, eng in engines.items():
            with m.Case(key):
                m.d.comb += [getattr(axi, name).eq(getattr(eng.axi, name))
                             for name, member in members.items() if member.flow == Out]


def _mem_of(config: HwConfig, word) -> data.View:
    layout = mem_layout(config)
    return data.View(layout, word[:layout.size])


def _readers_for(config: HwConfig, module: str) -> dict[MemType, DmaReader]:
    return {mt: DmaReader(config, mt, axi_id(module))
            for mt, owner in LOAD_MODULE.items() if owner == module}


class LoadModule(wiring.Component):
    """Runs LOAD inp/wgt: one 2-D DMA engine per buffer, sharing the module's AXI port."""

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        c = config
        self.seq = Sequencer(config, INSN_BITS)
        self.readers = _readers_for(config, "load")
        super().__init__({
            "axi": Out(axi_signature(c.bus_bytes * 8, write=False)),
            "inp_wr": Out(sram_write_signature(c.inp_index_bits, c.inp_entry_bytes * 8)),
            "wgt_wr": Out(sram_write_signature(c.wgt_index_bits, c.wgt_entry_bytes * 8)),
            "error": Out(ERROR_CODE_BITS), "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.seq = seq = self.seq
        for mt, eng in self.readers.items():
            m.submodules[f"dma_{mt.label}"] = eng
        sel = Signal(range(max(MemType) + 1))
        mem = _mem_of(self.config, seq.insn)
        with m.If(seq.start):
            m.d.sync += sel.eq(mem.mem)
        for mt, eng in self.readers.items():
            m.d.comb += [eng.insn.eq(mem), eng.start.eq(seq.start & (mem.mem == mt))]
        _share_read_port(m, self.axi, self.readers, sel)
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
            "error": Out(ERROR_CODE_BITS), "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.seq = seq = self.seq
        m.submodules.dma = eng = self.writer
        m.d.comb += [eng.insn.eq(_mem_of(self.config, seq.insn)), eng.start.eq(seq.start)]
        wiring.connect(m, wiring.flipped(self.axi), eng.axi)
        wiring.connect(m, wiring.flipped(self.out_rd), eng.sram)
        m.d.comb += [self.busy.eq(eng.busy), seq.exec_busy.eq(eng.busy),
                     self.error.eq(eng.error)]
        return m


class ComputeModule(wiring.Component):
    """Runs LOAD uop/acc/acc8, GEMM, ALU and FINISH.

    Every accumulator write is mirrored into the output buffer, saturated to
    the output width (the output buffer mirrors the accumulator, see
    docs/timing.md). ``finish`` is high in the one cycle FINISH executes.
    """

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        c = config
        isa = get_isa(c)
        self.seq = Sequencer(config, INSN_BITS)
        self.readers = _readers_for(config, "compute")
        self.pipeline = TensorPipeline(config)
        super().__init__({
            "axi": Out(axi_signature(c.bus_bytes * 8, write=False)),
            "uop_wr": Out(sram_write_signature(c.uop_index_bits, isa.uop_layout.bits)),
            "uop_rd": Out(sram_read_signature(c.uop_index_bits, isa.uop_layout.bits)),
            "inp_rd": Out(sram_read_signature(c.inp_index_bits, c.inp_entry_bytes * 8)),
            "wgt_rd": Out(sram_read_signature(c.wgt_index_bits, c.wgt_entry_bytes * 8)),
            "acc_rd": Out(sram_read_signature(c.acc_index_bits, c.acc_entry_bytes * 8)),
            "acc_wr": Out(sram_write_signature(c.acc_index_bits, c.acc_entry_bytes * 8)),
            "out_wr": Out(sram_write_signature(c.acc_index_bits, c.out_entry_bytes * 8)),
            "finish": Out(1), "error": Out(ERROR_CODE_BITS), "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        c = self.config
        m.submodules.seq = seq = self.seq
        m.submodules.pipeline = pipe = self.pipeline
        for mt, eng in self.readers.items():
            m.submodules[f"dma_{mt.label}"] = eng
        opcode = seq.insn[:OPCODE_BITS]
        mem = _mem_of(c, seq.insn)
        is_load = opcode == Opcode.LOAD

        sel = Signal(range(max(MemType) + 1))
        with m.If(seq.start & is_load):
            m.d.sync += sel.eq(mem.mem)
        for mt, eng in self.readers.items():
            m.d.comb += [eng.insn.eq(mem), eng.start.eq(seq.start & is_load & (mem.mem == mt))]
        _share_read_port(m, self.axi, self.readers, sel)
        m.d.comb += [pipe.insn.eq(seq.insn),
                     pipe.start.eq(seq.start & ((opcode == Opcode.GEMM) | (opcode == Opcode.ALU))),
                     self.finish.eq(seq.start & (opcode == Opcode.FINISH))]

        # Buffers: uop from its DMA; inp/wgt/uop reads by the pipeline.
        uop_dma = self.readers[MemType.UOP]
        m.d.comb += [self.uop_wr.addr.eq(uop_dma.sram.addr), self.uop_wr.data.eq(uop_dma.sram.data),
                     self.uop_wr.en.eq(uop_dma.sram.en)]
        for port, src in ((self.uop_rd, pipe.uop), (self.inp_rd, pipe.inp), (self.wgt_rd, pipe.wgt),
                          (self.acc_rd, pipe.acc_rd)):
            wiring.connect(m, wiring.flipped(port), src)

        # Accumulator writes: the acc and acc8 DMAs or the pipeline (one runs at a time).
        lanes = c.batch * c.block_out
        acc8 = self.readers[MemType.ACC8].sram
        acc8_wide = Cat(*(_sign_extend(acc8.data.word_select(j, 8), c.acc_width)
                          for j in range(lanes)))
        acc = self.readers[MemType.ACC].sram
        wr = self.acc_wr
        with m.If(acc.en):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(acc.addr), wr.data.eq(acc.data)]
        with m.Elif(acc8.en):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(acc8.addr), wr.data.eq(acc8_wide)]
        with m.Else():
            m.d.comb += [wr.en.eq(pipe.acc_wr.en), wr.addr.eq(pipe.acc_wr.addr),
                         wr.data.eq(pipe.acc_wr.data)]
        m.d.comb += [self.out_wr.en.eq(wr.en), self.out_wr.addr.eq(wr.addr),
                     self.out_wr.data.eq(Cat(*(_saturate(wr.data.word_select(j, c.acc_width),
                                                         c.out_width)
                                               for j in range(lanes))))]

        busy = Cat(pipe.busy, *(e.busy for e in self.readers.values())).any()
        m.d.comb += [self.busy.eq(busy), seq.exec_busy.eq(busy)]
        _first_error(m, self.error, [pipe.error] + [e.error for e in self.readers.values()])
        return m


def _sign_extend(value, width: int):
    return Cat(value, value[-1].replicate(width - len(value)))


def _saturate(value, width: int):
    """Clamp a signed lane to ``width`` signed bits (the output buffer's values)."""
    v = value.as_signed()
    hi, lo = (1 << (width - 1)) - 1, -(1 << (width - 1))
    return Mux(v > hi, hi, Mux(v < lo, lo, v))[:width]
