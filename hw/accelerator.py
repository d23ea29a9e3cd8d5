"""The whole accelerator: control, fetch, load, compute, store, buffers, queues, AXI ports.

::

                 s_axi_control (AXI4-Lite)
                        |
                    [Control] -- start/finish/error --+
                        |                             |
    m_axi_p<fetch> -- [Fetch] --+-- load cmd FIFO --> [Load] -- inp, wgt buffers
                                +-- compute cmd FIFO -> [Compute] -- uop, acc, out buffers
                                |                   (GEMM unit, ALU unit; acc and out in
                                |                    ACC_BANKS banks by row)
                                +-- store cmd FIFO --> [Store]   (reads out)
    token queues: load->compute, compute->load, compute->store, store->compute

Every module's DMA goes through the AXI4 master of the DRAM port the config
assigns it (``tessera.regmap.axi_ports``; the load module's through each of its
ports when it has several). A ``start`` resets every module,
queue and FIFO (not the buffers), so a run never sees the state of the last.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, ResetInserter, Signal
from amaranth.lib import fifo, memory, wiring
from amaranth.lib.wiring import In, Out

from tessera.config import ACC_BANKS, HwConfig
from tessera.errors import ConfigError
from tessera.isa import INSN_BITS, get_isa
from tessera.regmap import ERROR_CODE_BITS, axi_ports

from .control import Control
from .fetch import TARGETS, Fetch
from .modules import ComputeModule, LoadModule, StoreModule, bank_addr, bank_of
from .ports import axi_lite_signature, axi_read_members, axi_signature, axi_write_members
from .sequencer import INDEX_BITS, TokenQueue

#: Token queues as (producer, consumer).
TOKEN_QUEUES = (("load", "compute"), ("compute", "load"), ("compute", "store"),
                ("store", "compute"))
#: Each module's previous and next neighbour (as in the simulator).
NEIGHBOURS = {"load": (None, "compute"), "compute": ("load", "store"), "store": ("compute", None)}


class Accelerator(wiring.Component):
    """The accelerator for one :class:`HwConfig`, with AXI ports named as in ``tessera.regmap``."""

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        self.ports = axi_ports(config)
        for p in self.ports:
            if len(p.readers) > 1:
                raise ConfigError(
                    f"DRAM port {p.index} is shared by {', '.join(p.readers)}: the RTL gives "
                    "each reading module its own AXI port; assign them different ports in "
                    f"module_ports (config {config.name!r})")
        members = {"s_axi_control": In(axi_lite_signature()), "interrupt": Out(1)}
        for p in self.ports:
            members[p.name] = Out(axi_signature(p.data_bits, read=p.reads, write=p.writer))
        super().__init__(members)

    def elaborate(self, platform) -> Module:
        m = Module()
        c = self.config
        m.submodules.control = ctrl = Control(c)
        wiring.connect(m, wiring.flipped(self.s_axi_control), ctrl.bus)
        m.d.comb += self.interrupt.eq(ctrl.interrupt)

        # A start clears the run state of everything below (buffers keep their contents).
        fetch = _run_scoped(m, ctrl, "fetch", Fetch(c))
        mods = {"load": _run_scoped(m, ctrl, "load", LoadModule(c)),
                "compute": _run_scoped(m, ctrl, "compute", ComputeModule(c)),
                "store": _run_scoped(m, ctrl, "store", StoreModule(c))}
        self._add_buffers(m, mods)
        self._connect_command_queues(m, ctrl, fetch, mods)
        self._connect_token_queues(m, ctrl, mods)
        _connect_errors(m, ctrl, fetch, mods)
        self._connect_axi_ports(m, {"fetch": fetch, **mods})
        return m

    def _add_buffers(self, m: Module, mods: dict) -> None:
        """The on-chip buffers, with the modules' write and read ports."""
        c = self.config
        isa = get_isa(c)
        uop = _buffer(m, "uop_buf", isa.uop_layout.bits, c.uop_depth)
        inp = _buffer(m, "inp_buf", c.inp_entry_bytes * 8, c.inp_depth)
        wgt = _buffer(m, "wgt_buf", c.wgt_entry_bytes * 8, c.wgt_depth)
        # The accumulator and its output mirror: ACC_BANKS banks by row, a port each.
        accs = [_buffer(m, f"acc_buf{b}", c.acc_entry_bytes * 8, c.acc_bank_rows)
                for b in range(ACC_BANKS)]
        outs = [_buffer(m, f"out_buf{b}", c.out_entry_bytes * 8, c.acc_bank_rows)
                for b in range(ACC_BANKS)]
        load, comp, store = mods["load"], mods["compute"], mods["store"]
        for mem, port in ((uop, comp.uop_wr), (inp, load.inp_wr), (wgt, load.wgt_wr),
                          *zip(accs, comp.acc_wr), *zip(outs, comp.out_wr)):
            wp = mem.write_port()
            m.d.comb += [wp.addr.eq(port.addr), wp.data.eq(port.data), wp.en.eq(port.en)]
        for mem, port in ((inp, comp.inp_rd), (wgt, comp.wgt_rd), *zip(accs, comp.acc_rd),
                          *((uop, p) for p in comp.uop_rd)):
            rp = mem.read_port()
            m.d.comb += [rp.addr.eq(port.addr), rp.en.eq(port.en), port.data.eq(rp.data)]
        self._connect_out_reads(m, store.out_rd, outs)

    def _connect_out_reads(self, m: Module, out_rd, outs: list) -> None:
        """The store reads the out bank of its row; the bank bit is registered with the read,
        so the data holds while en is low, as a single memory's would."""
        c = self.config
        out_bank = Signal(range(ACC_BANKS))
        with m.If(out_rd.en):
            m.d.sync += out_bank.eq(bank_of(c, out_rd.addr))
        for b, mem in enumerate(outs):
            rp = mem.read_port()
            m.d.comb += [rp.addr.eq(bank_addr(c, out_rd.addr)), rp.en.eq(out_rd.en)]
            with m.If(out_bank == b):
                m.d.comb += out_rd.data.eq(rp.data)

    def _connect_command_queues(self, m: Module, ctrl: Control, fetch: Fetch, mods: dict) -> None:
        """A run-scoped command FIFO from the fetch to each module's sequencer."""
        c = self.config
        for t in TARGETS:
            q = fifo.SyncFIFO(width=INSN_BITS + INDEX_BITS, depth=c.cmd_queue_depth)
            m.submodules[f"{t}_cmd"] = ResetInserter({"sync": ctrl.start})(q)
            seq = mods[t].seq
            m.d.comb += [q.w_data.eq(getattr(fetch, f"cmd_{t}_data")),
                         q.w_en.eq(getattr(fetch, f"cmd_{t}_en")),
                         getattr(fetch, f"cmd_{t}_rdy").eq(q.w_rdy),
                         seq.cmd_rdy.eq(q.r_rdy), seq.cmd_data.eq(q.r_data), q.r_en.eq(seq.cmd_en)]

    def _connect_token_queues(self, m: Module, ctrl: Control, mods: dict) -> None:
        """The run-scoped token queues of ``TOKEN_QUEUES``, each sequencer popping from and
        pushing to those it shares with its neighbours."""
        tokens = {}
        for a, b in TOKEN_QUEUES:
            q = TokenQueue(self.config.token_queue_depth)
            m.submodules[f"tokens_{a}_{b}"] = ResetInserter({"sync": ctrl.start})(q)
            tokens[a, b] = q
        for name, mod in mods.items():
            seq = mod.seq
            for side, other in zip(("prev", "next"), NEIGHBOURS[name]):
                if other is None:
                    continue
                inq, outq = tokens[other, name], tokens[name, other]
                m.d.comb += [getattr(seq, f"can_pop_{side}").eq(inq.can_pop),
                             inq.pop.eq(getattr(seq, f"pop_{side}")),
                             getattr(seq, f"can_push_{side}").eq(outq.can_push),
                             outq.push.eq(getattr(seq, f"push_{side}"))]

    def _connect_axi_ports(self, m: Module, engines: dict) -> None:
        """Each DRAM port's AXI master to the channels of the modules the config assigns
        it: the reading module's AR/R, the store's AW/W/B."""
        for p in self.ports:
            port = getattr(self, p.name)
            names = []
            if p.reads:
                names += [(p.readers[0], n) for n in axi_read_members(p.data_bits)]
            if p.writer:
                names += [("store", n) for n in axi_write_members(p.data_bits)]
            for module, name in names:
                src = getattr(_master(self.config, engines[module], module, p.index), name)
                dst = getattr(port, name)
                flow = axi_signature(p.data_bits).members[name].flow
                if flow == Out:
                    m.d.comb += dst.eq(src)
                else:
                    m.d.comb += src.eq(dst)


def _master(config: HwConfig, engine, module: str, port: int):
    """``module``'s AXI master on DRAM port ``port``: ``axi``, or for the load module's
    ``k``-th of several ports its ``axi<k>``."""
    k = config.ports_of(module).index(port)
    return getattr(engine, "axi" if k == 0 else f"axi{k}")


def _run_scoped(m: Module, ctrl: Control, name: str, component):
    """Add ``component`` as submodule ``name``, its run state cleared by a start."""
    m.submodules[name] = ResetInserter({"sync": ctrl.start})(component)
    return component


def _buffer(m: Module, name: str, width: int, depth: int) -> memory.Memory:
    """An on-chip buffer: a memory of ``depth`` entries of ``width`` bits, submodule ``name``."""
    mem = memory.Memory(shape=width, depth=depth, init=[])
    m.submodules[name] = mem
    return mem


def _connect_errors(m: Module, ctrl: Control, fetch: Fetch, mods: dict) -> None:
    """Errors, halt, finish: the first failing unit's error code and instruction index go
    to the control block, which halts the fetch and the modules and sees them stop."""
    codes = [("fetch", fetch.error_code, fetch.error_index)] + \
        [(n, mods[n].error, mods[n].error_index) for n in ("load", "compute", "store")]
    code, index = Signal(ERROR_CODE_BITS), Signal(INDEX_BITS)
    for _, c_sig, i_sig in reversed(codes):
        with m.If(c_sig != 0):
            m.d.comb += [code.eq(c_sig), index.eq(i_sig)]
    # Halting from the latched error (one cycle late) keeps the error paths free of
    # combinational loops; the failing executor itself has already stopped.
    halt = Signal()
    m.d.comb += [ctrl.error_code.eq(code), ctrl.error_index.eq(index),
                 halt.eq(ctrl.error),
                 ctrl.finish.eq(mods["compute"].finish),
                 ctrl.stopped.eq(~fetch.busy & ~Cat(*(mods[n].busy for n in mods)).any()),
                 fetch.run.eq(ctrl.running), fetch.halt.eq(halt),
                 fetch.insn_addr.eq(ctrl.insn_addr), fetch.insn_count.eq(ctrl.insn_count)]
    for mod in mods.values():
        # A module whose instruction failed starts nothing more, even before the latch.
        m.d.comb += mod.seq.halt.eq(halt | ~ctrl.running | (mod.error != 0))
