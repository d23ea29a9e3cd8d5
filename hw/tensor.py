"""The tensor pipelines: the compute module's GEMM unit and ALU unit.

The compute module has one pipeline per execution unit
(``tessera.timing.COMPUTE_UNITS``, docs/timing.md "Compute units"): the GEMM
kind runs GEMM instructions (resets included) and holds the multiplier array;
the ALU kind runs ALU instructions (resets included) and holds the ALU ops'
hooks. Each has its own loop nest, uop read port and accumulator read and
write ports; the compute module routes the latter to the accumulator banks.

One operation issues every ``ii`` cycles: 1 for GEMM, resets, immediate ALU
ops and tensor ALU ops that ignore ``dst`` (``AluTiming.reads_dst`` false,
e.g. MOV); ``ii_tensor`` for the other tensor ALU ops. An operation issued in
cycle ``t`` goes through:

* ``t``: read its uop;
* ``t+1``: form the buffer indices (uop + loop offsets), check them, read
  ``inp``/``wgt``/``acc[dst]`` (GEMM, ALU immediate) or ``acc[src]`` (ALU tensor);
* ``t+2``: GEMM multiply-accumulate into a register; ALU immediate, and ALU
  tensor ops that ignore ``dst``: the op's hardware hook starts; other ALU
  tensor ops: read ``acc[dst]``;
* ``t+3``: GEMM and resets write ``acc[dst]``; those other ALU tensor ops: the
  hook starts;
* ``t + write_latency``: the ALU writes ``acc[dst]`` (the hook's ``latency - 3``
  stages plus one output register).

These are the numbers of docs/timing.md (``GEMM_LATENCY``,
``AluTiming.write_latency``); reads are not transparent, so a read in cycle
``t'+1`` sees writes of cycles up to ``t'``, which is the hazard rule.

The ALU kind also holds the table memory (``HwConfig.table_entries``; none when it is
0): a :class:`~tessera.hw.table.TableMemory` per lane, written through ``tbl_wr`` by
``LOAD tbl`` (every lane's copy gets the whole row) and read by the hooks of the ops
that ``reads_table``, each lane its own entry.
"""
from __future__ import annotations

from amaranth.hdl import Cat, EnableInserter, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from tessera.config import HwConfig
from tessera.errors import ConfigError
from tessera.isa import ALU_OPS, INSN_BITS, Alu, MemType, get_isa
from tessera.isa.intrinsics import TENSOR_OPERAND_CYCLES
from tessera.regmap import ERROR_CODE_BITS, ErrorCode
from tessera.timing import COMPUTE_SETUP_CYCLES, COMPUTE_UNITS, GEMM_LATENCY, compute_unit

from .alu_ops import ALU_BASE_LATENCY, hardware_of, hook_stages
from .dma import sram_addr_bits
from .layouts import alu_layout, gemm_layout, uop_layout
from .ports import sram_read_signature, sram_write_signature
from .table import TableMemory

#: Pipeline stage at which every operation has read its rows and the GEMM sum is formed.
_GEMM_SUM_STAGE = 2
#: The ALU hook gets its operands at this stage (immediate form, and tensor ops that ignore
#: ``dst``), one later for the other tensor ops (their second row arrives then).
_ALU_HOOK_STAGE = 2
assert COMPUTE_SETUP_CYCLES == 1, "the pipeline latches the instruction in its one setup cycle"
assert GEMM_LATENCY == _GEMM_SUM_STAGE + 1
# A hook with no register stages writes at the immediate form's base latency.
assert ALU_BASE_LATENCY == _ALU_HOOK_STAGE + 1
# The tensor form's second row is read one cycle after the first, through the same port.
assert TENSOR_OPERAND_CYCLES == 1

#: The unit whose pipeline runs ALU instructions (the other runs GEMMs).
ALU_UNIT = compute_unit(Alu())


def _alu_ops_with_timing(config: HwConfig):
    """The ALU ops ``config`` has (``ALU_OPS.available``: those reading the table memory
    only with one), whose hardware this build instantiates, with their hooks."""
    ops = []
    for op in ALU_OPS.available(config):
        t = op.timing
        # Two rows through one read port take two cycles; an op ignoring dst reads one.
        min_ii_tensor = 1 + TENSOR_OPERAND_CYCLES if t.reads_dst else 1
        if t.ii_imm < 1 or t.ii_tensor < min_ii_tensor or t.latency < ALU_BASE_LATENCY:
            raise ConfigError(f"ALU op {op.name}: the hardware needs ii_imm >= 1, ii_tensor >= "
                              f"{min_ii_tensor} (the rows it reads through one port) and "
                              f"latency >= {ALU_BASE_LATENCY}, not {t}")
        hook_stages(op)    # a table reader needs its read's stage
        ops.append((op, hardware_of(op)))
    return ops


class TensorPipeline(wiring.Component):
    """One compute unit's pipeline: ``unit`` is ``"gemm"`` or ``"alu"``
    (``tessera.timing.COMPUTE_UNITS``); started by the compute module with the
    instruction of its kind. Only the GEMM kind has the ``inp`` and ``wgt``
    read ports. Each read port's ``en`` is high only in the cycles whose read the
    pipeline uses (the compute module gives ``acc_rd`` the bank then), so a memory
    may leave its output register alone in the others."""

    def __init__(self, config: HwConfig, unit: str) -> None:
        if unit not in COMPUTE_UNITS:
            raise ValueError(f"unit must be one of {COMPUTE_UNITS}, not {unit!r}")
        self.config = config
        self.unit = unit
        self.is_alu = unit == ALU_UNIT
        c = config
        isa = get_isa(c)
        self.lanes = c.batch * c.block_out
        members = {
            "start": In(1), "insn": In(INSN_BITS),
            "busy": Out(1), "error": Out(ERROR_CODE_BITS),
            "uop": Out(sram_read_signature(c.uop_index_bits, isa.uop_layout.bits)),
            "acc_rd": Out(sram_read_signature(c.acc_index_bits, c.acc_entry_bytes * 8)),
            "acc_wr": Out(sram_write_signature(c.acc_index_bits, c.acc_entry_bytes * 8)),
        }
        if not self.is_alu:
            members["inp"] = Out(sram_read_signature(c.inp_index_bits, c.inp_entry_bytes * 8))
            members["wgt"] = Out(sram_read_signature(c.wgt_index_bits, c.wgt_entry_bytes * 8))
        elif c.table_entries:
            # LOAD tbl's rows (the DMA drives it: In, seen from the pipeline).
            members["tbl_wr"] = In(sram_write_signature(sram_addr_bits(isa.depth(MemType.TBL)),
                                                        8 * isa.elem_bytes(MemType.TBL)))
        super().__init__(members)

    def elaborate(self, platform) -> Module:
        m = Module()
        p = _PipelineBuilder(self, m)
        start_err = p.check_instruction()
        p.add_loop_counters()
        p.latch_instruction(start_err)
        p.advance_loop_nest()
        p.add_index_stage()
        p.add_delay_line()
        p.add_acc_ports()
        return m


class _PipelineBuilder:
    """Builds one :class:`TensorPipeline`'s logic, stage by stage; the signals a step
    creates for later steps are its attributes. Pairs of signals are unpacked into locals
    first, the form that gives their Verilog names (Amaranth's tracer names them from it)."""

    def __init__(self, pipe: TensorPipeline, m: Module) -> None:
        self.pipe, self.m = pipe, m
        c = self.c = pipe.config
        is_alu = self.is_alu = pipe.is_alu
        self.ops = ops = _alu_ops_with_timing(c) if is_alu else []
        layout = alu_layout(c) if is_alu else gemm_layout(c)
        f = self.f = data.View(layout, pipe.insn[:layout.size])
        self.kinds = ("dst", "src") if is_alu else ("dst", "src", "wgt")
        self.wide = c.acc_index_bits + c.loop_bits + 1
        self.lat_max = max([GEMM_LATENCY] + [o.timing.write_latency(imm) for o, _ in ops
                                             for imm in (False, True)])
        self.ii_max = max([1] + [max(o.timing.ii_imm, o.timing.ii_tensor) for o, _ in ops])
        self._add_instruction_registers(f)

    def _add_instruction_registers(self, f: data.View) -> None:
        """The registers that hold the running instruction (latched at ``start``)."""
        self.reset = Signal()
        self.uop_begin = Signal.like(f.uop_begin)
        self.uop_end = Signal.like(f.uop_end)
        iter_out, iter_in = Signal.like(f.iter_out), Signal.like(f.iter_in)
        self.iter_out, self.iter_in = iter_out, iter_in
        self.factors = {k: (Signal(self.wide, name=f"{k}_fo"), Signal(self.wide, name=f"{k}_fi"))
                        for k in self.kinds}
        self.use_imm = Signal()
        self.two_reads = Signal()     # a tensor op that reads src, then dst a cycle later
        self.ii = Signal(range(self.ii_max + 1), init=1)
        self.wlat = Signal(range(self.lat_max + 1), init=GEMM_LATENCY)
        if self.is_alu:
            self.alu_op = Signal.like(f.alu_op)
            # The immediate as the running op's lane operand, and which op runs (none for a
            # reset): decoded once at start, so the hooks share one operand mux per lane and
            # only the running op's hooks are clocked (a simulator evaluates no other).
            self.imm_operand = Signal(signed(self.c.acc_width), name="imm_operand")
            self.op_sel = {op.opcode: Signal(name=f"sel_{op.name.lower()}") for op, _ in self.ops}

    def check_instruction(self) -> Signal:
        """The error code of the instruction on ``insn`` (0 if it may start)."""
        m, f, c = self.m, self.f, self.c
        start_err = Signal(ERROR_CODE_BITS)
        with m.If(f.uop_end > c.uop_depth):
            m.d.comb += start_err.eq(ErrorCode.UOP_BOUNDS)
        if self.is_alu:
            with m.Elif(~f.reset):
                m.d.comb += start_err.eq(ErrorCode.ALU_OP)
                with m.Switch(f.alu_op):
                    for op, _ in self.ops:
                        with m.Case(op.opcode):
                            m.d.comb += start_err.eq(0)
        return start_err

    def add_loop_counters(self) -> None:
        """The loop nest's counters and buffer offsets, and the drain count that keeps
        ``busy`` up until the last write."""
        m, kinds, wide = self.m, self.kinds, self.wide
        self.issuing = Signal()
        self.phase = Signal(range(self.ii_max + 1))
        self.u = Signal.like(self.uop_end)
        i_cnt, o_cnt = Signal.like(self.iter_in), Signal.like(self.iter_out)
        self.i_cnt, self.o_cnt = i_cnt, o_cnt
        self.cur = {k: Signal(wide + 1, name=f"{k}_cur") for k in kinds}
        self.base = {k: Signal(wide + 1, name=f"{k}_base") for k in kinds}
        self.drain = drain = Signal(range(self.lat_max + 1))
        self.killed = Signal()
        m.d.comb += self.pipe.busy.eq(self.issuing | (drain != 0))
        with m.If(drain != 0):
            m.d.sync += drain.eq(drain - 1)

    def latch_instruction(self, start_err: Signal) -> None:
        """At ``start``: latch the instruction, reset the loop nest and issue unless the
        instruction failed its check or runs no operation."""
        m, f, kinds, factors = self.m, self.f, self.kinds, self.factors
        new_n_zero = (f.uop_end <= f.uop_begin) | (f.iter_out == 0) | (f.iter_in == 0)
        with m.If(self.pipe.start):
            m.d.sync += [self.reset.eq(f.reset), self.uop_begin.eq(f.uop_begin),
                         self.uop_end.eq(f.uop_end), self.iter_out.eq(f.iter_out),
                         self.iter_in.eq(f.iter_in), self.u.eq(f.uop_begin),
                         self.i_cnt.eq(0), self.o_cnt.eq(0), self.phase.eq(0),
                         self.killed.eq(0), self.pipe.error.eq(start_err),
                         self.issuing.eq(~new_n_zero & (start_err == 0))]
            m.d.sync += [factors[k][0].eq(getattr(f, f"{k}_factor_out")) for k in kinds]
            m.d.sync += [factors[k][1].eq(getattr(f, f"{k}_factor_in")) for k in kinds]
            m.d.sync += ([self.cur[k].eq(0) for k in kinds]
                         + [self.base[k].eq(0) for k in kinds])
        if self.is_alu:
            self._latch_alu_timing()

    def _latch_alu_timing(self) -> None:
        """At ``start``: the ALU op, its operand form, and the issue interval, write
        latency and reads of this instruction (a reset: one row per cycle written at
        GEMM_LATENCY, like a GEMM reset)."""
        m, f = self.m, self.f
        ii, wlat, two_reads = self.ii, self.wlat, self.two_reads
        with m.If(self.pipe.start):
            m.d.sync += [self.alu_op.eq(f.alu_op), self.use_imm.eq(f.use_imm)]
            m.d.sync += [ii.eq(1), wlat.eq(GEMM_LATENCY), two_reads.eq(0)]
            m.d.sync += [sel.eq(~f.reset & (f.alu_op == code)) for code, sel in self.op_sel.items()]
            with m.If(~f.reset):
                with m.Switch(f.alu_op):
                    for op, hw in self.ops:
                        with m.Case(op.opcode):
                            t = op.timing
                            m.d.sync += [ii.eq(Mux(f.use_imm, t.ii_imm, t.ii_tensor)),
                                         wlat.eq(Mux(f.use_imm, t.write_latency(True),
                                                     t.write_latency(False))),
                                         two_reads.eq(~f.use_imm & t.reads_dst),
                                         self.imm_operand.eq(hw.operand_of_imm(f.imm,
                                                                               len(f.imm)))]

    def advance_loop_nest(self) -> None:
        """Issue an operation every ``ii`` cycles and step the uop, inner and outer loops
        (and their buffer offsets); after the last one, drain the pipeline."""
        m, kinds, factors = self.m, self.kinds, self.factors
        issuing, phase, u, i_cnt, o_cnt = self.issuing, self.phase, self.u, self.i_cnt, self.o_cnt
        cur, base = self.cur, self.base
        self.issue = issue = Signal()
        m.d.comb += issue.eq(issuing & (phase == 0) if self.is_alu else issuing)
        if self.is_alu:
            with m.If(issuing):
                m.d.sync += phase.eq(Mux(phase + 1 == self.ii, 0, phase + 1))
        with m.If(issue):
            last_u = u + 1 == self.uop_end
            last_i = i_cnt + 1 == self.iter_in
            last_o = o_cnt + 1 == self.iter_out
            with m.If(~last_u):
                m.d.sync += u.eq(u + 1)
            with m.Else():
                m.d.sync += u.eq(self.uop_begin)
                with m.If(~last_i):
                    m.d.sync += [i_cnt.eq(i_cnt + 1)]
                    m.d.sync += [cur[k].eq(cur[k] + factors[k][1]) for k in kinds]
                with m.Else():
                    m.d.sync += i_cnt.eq(0)
                    with m.If(~last_o):
                        m.d.sync += o_cnt.eq(o_cnt + 1)
                        m.d.sync += [base[k].eq(base[k] + factors[k][0]) for k in kinds]
                        m.d.sync += [cur[k].eq(base[k] + factors[k][0]) for k in kinds]
                    with m.Else():
                        m.d.sync += [issuing.eq(0), self.drain.eq(self.wlat)]

    def add_index_stage(self) -> None:
        """Stages 0 and 1: read the uop, form the buffer indices and check them (an index
        out of bounds kills the instruction); the GEMM kind reads ``inp`` and ``wgt``."""
        m, c, kinds, pipe = self.m, self.c, self.kinds, self.pipe
        m.d.comb += [pipe.uop.addr.eq(self.u), pipe.uop.en.eq(self.issue)]
        self.v1 = v1 = Signal()
        cur1 = {k: Signal.like(self.cur[k], name=f"{k}_cur1") for k in kinds}
        m.d.sync += [v1.eq(self.issue)] + [cur1[k].eq(self.cur[k]) for k in kinds]

        ul = uop_layout(c)
        uop = data.View(ul, pipe.uop.data[:ul.size])
        self.idx = idx = {k: Signal(self.wide + 2, name=f"{k}_idx") for k in kinds}
        m.d.comb += [idx[k].eq(getattr(uop, k) + cur1[k]) for k in kinds]
        self.tensor = tensor = Signal()    # an ALU op with a tensor operand (src is an acc row)
        if self.is_alu:
            m.d.comb += tensor.eq(~self.reset & ~self.use_imm)
        bad = Signal()
        if self.is_alu:
            m.d.comb += bad.eq((idx["dst"] >= c.acc_depth) | (tensor & (idx["src"] >= c.acc_depth)))
        else:
            m.d.comb += bad.eq((idx["dst"] >= c.acc_depth)
                               | (~self.reset & ((idx["src"] >= c.inp_depth)
                                                 | (idx["wgt"] >= c.wgt_depth))))
        with m.If(v1 & bad & ~self.killed):
            m.d.sync += [pipe.error.eq(ErrorCode.INDEX_BOUNDS), self.killed.eq(1),
                         self.issuing.eq(0), self.drain.eq(self.wlat)]
        self.ok1 = ok1 = Signal()
        m.d.comb += ok1.eq(v1 & ~bad & ~self.killed)
        if not self.is_alu:
            m.d.comb += [pipe.inp.addr.eq(idx["src"]), pipe.inp.en.eq(v1),
                         pipe.wgt.addr.eq(idx["wgt"]), pipe.wgt.en.eq(v1)]

    def add_delay_line(self) -> None:
        """Valid bits and destination rows travel down a delay line; the write taps it."""
        m, lat_max = self.m, self.lat_max
        self.valid = valid = [Signal(name=f"valid{s}") for s in range(lat_max + 1)]
        self.dst = dst = [Signal(self.c.acc_index_bits, name=f"dst{s}")
                          for s in range(lat_max + 1)]
        m.d.comb += [valid[1].eq(self.ok1), dst[1].eq(self.idx["dst"])]
        for s in range(2, lat_max + 1):
            m.d.sync += [valid[s].eq(valid[s - 1]), dst[s].eq(dst[s - 1])]
        # The line is longer than a short-latency instruction's write stage: ops of the last
        # instruction still travel past it and must not reach a later, longer write tap.
        with m.If(self.pipe.start):
            m.d.sync += [valid[s].eq(0) for s in range(2, lat_max + 1)]

    def add_acc_ports(self) -> None:
        """The accumulator read port, the unit's datapath (multiply-accumulate or ALU
        hooks) and the write of its result at the instruction's write latency."""
        m, c, pipe, idx = self.m, self.c, self.pipe, self.idx
        valid, dst = self.valid, self.dst
        # acc read port: dst at stage 1, except ALU tensor ops: src at 1 (and dst at 2 for
        # ops that read it).
        if self.is_alu:
            m.d.comb += [pipe.acc_rd.addr.eq(Mux(self.two_reads & ~self.v1, dst[2],
                                                 Mux(self.tensor, idx["src"], idx["dst"]))),
                         pipe.acc_rd.en.eq(self.v1 | (self.two_reads & valid[2]))]
        else:
            m.d.comb += [pipe.acc_rd.addr.eq(idx["dst"]), pipe.acc_rd.en.eq(self.v1)]
        lane_w = c.acc_width
        acc_lanes = [pipe.acc_rd.data.word_select(j, lane_w).as_signed()
                     for j in range(pipe.lanes)]

        write = Signal()
        row = Signal(c.acc_index_bits)
        result = Signal(c.acc_entry_bytes * 8)
        if self.is_alu:
            self._alu(acc_lanes, result)
            with m.Switch(self.wlat):
                for s in range(GEMM_LATENCY, self.lat_max + 1):
                    with m.Case(s):
                        m.d.comb += [write.eq(valid[s]), row.eq(dst[s])]
        else:
            self._gemm(acc_lanes, result)
            m.d.comb += [write.eq(valid[GEMM_LATENCY]), row.eq(dst[GEMM_LATENCY])]
        m.d.comb += [pipe.acc_wr.en.eq(write), pipe.acc_wr.addr.eq(row),
                     pipe.acc_wr.data.eq(result)]

    def _gemm(self, acc_lanes: list, gemm_sum: Signal) -> None:
        """Stage 2: the multiply-accumulate of every lane into ``gemm_sum`` (a register;
        zero for a reset, as a synchronous reset of the register rather than a mux)."""
        c, pipe = self.c, self.pipe
        x = [[pipe.inp.data.word_select(b * c.block_in + k, c.inp_width).as_signed()
              for k in range(c.block_in)] for b in range(c.batch)]
        w = [[pipe.wgt.data.word_select(o * c.block_in + k, c.wgt_width).as_signed()
              for k in range(c.block_in)] for o in range(c.block_out)]
        products = {}
        for b in range(c.batch):
            for k in range(c.block_in):
                for o in range(c.block_out):
                    if (o, k, b) in products:
                        continue
                    if pairs_products(c) and o + 1 < c.block_out:
                        products[o, k, b], products[o + 1, k, b] = \
                            _paired_products(self.m, x[b][k], w[o][k], w[o + 1][k])
                    else:
                        products[o, k, b] = x[b][k] * w[o][k]
        sums = []
        for b in range(c.batch):
            for o in range(c.block_out):
                dot = _tree_sum([products[o, k, b] for k in range(c.block_in)])
                sums.append((acc_lanes[b * c.block_out + o] + dot)[:c.acc_width])
        # Loaded only for a valid operation (the write stage reads nothing else): idle cycles
        # leave the products unevaluated in a simulator.
        with self.m.If(self.valid[_GEMM_SUM_STAGE]):
            self.m.d.sync += gemm_sum.eq(Mux(self.reset, 0, Cat(*sums)))

    def _alu(self, acc_lanes: list, alu_result: Signal) -> None:
        """The ALU ops' hooks on every lane; the selected op's result goes to ``alu_result``
        (the output register; zero for a reset). The accumulator lane ``a`` is the row read
        last cycle; the operand ``b`` is the immediate, or the ``src`` row: read two cycles
        ago (``b_reg``) by ops that also read ``dst``, last cycle by ops that ignore it.
        ``two_reads`` tells which, so one operand mux per lane serves every op.

        Each op's hooks are clocked only while the pipeline is busy with that op
        (:meth:`_add_hooks`), and the output register only while the pipeline is busy: a
        valid operation only travels while both hold, so the results are those of hooks
        clocked every cycle, and a simulator (Verilator) skips the idle ops' logic."""
        m, lanes, busy = self.m, self.pipe.lanes, self.pipe.busy
        lane_w = self.c.acc_width
        b_reg = [Signal(signed(lane_w), name=f"b{j}") for j in range(lanes)]
        with m.If(busy):
            m.d.sync += [b_reg[j].eq(acc_lanes[j]) for j in range(lanes)]
        a_in = [Signal(signed(lane_w), name=f"a_in{j}") for j in range(lanes)]
        b_in = [Signal(signed(lane_w), name=f"b_in{j}") for j in range(lanes)]
        m.d.comb += [a_in[j].eq(acc_lanes[j]) for j in range(lanes)]
        m.d.comb += [b_in[j].eq(Mux(self.use_imm, self.imm_operand,
                                    Mux(self.two_reads, b_reg[j], acc_lanes[j])))
                     for j in range(lanes)]
        op_results = self._add_hooks(a_in, b_in, self._add_tables())
        with m.If(busy):
            with m.Switch(self.alu_op):
                for code, value in op_results.items():
                    with m.Case(code):
                        m.d.sync += alu_result.eq(value)
            with m.If(self.reset):
                m.d.sync += alu_result.eq(0)

    def _add_hooks(self, a_in: list, b_in: list, tables: list) -> dict:
        """Every op's hooks on every lane, in a submodule per op whose registers (the hooks'
        stages, table reads included) are enabled while the pipeline is busy with that op;
        returns each opcode's result row."""
        m, lanes, lane_w = self.m, self.pipe.lanes, self.c.acc_width
        op_results = {}
        for op, hw in self.ops:
            hooks = Module()
            lanes_out = [hw.build(hooks, a_in[j], b_in[j],
                                  *((tables[j],) if op.reads_table else ()))[:lane_w]
                         for j in range(lanes)]
            clocked = Signal(name=f"{op.name.lower()}_en")
            m.d.comb += clocked.eq(self.pipe.busy & self.op_sel[op.opcode])
            m.submodules[f"op_{op.name.lower()}"] = EnableInserter(clocked)(hooks)
            op_results[op.opcode] = Cat(*lanes_out)
        return op_results

    def _add_tables(self) -> list[TableMemory]:
        """A copy of the table memory per lane (none without one), each written every
        row ``tbl_wr`` brings."""
        c, m, pipe = self.c, self.m, self.pipe
        if not c.table_entries:
            return []
        tables = []
        for j in range(pipe.lanes):
            table = TableMemory(c.table_entries, pipe.lanes, name=f"tbl{j}")
            m.submodules[f"tbl{j}"] = table
            table.write(m, pipe.tbl_wr.addr, pipe.tbl_wr.data, pipe.tbl_wr.en)
            tables.append(table)
        return tables


#: Two int8 products per multiplier (one DSP48 each on Xilinx parts): see _paired_products.
_PAIRED = True


def pairs_products(config: HwConfig) -> bool:
    """Whether the GEMM core computes its products in pairs (int8 inputs and weights)."""
    return _PAIRED and config.inp_width == config.wgt_width == 8


def gemm_multipliers(config: HwConfig) -> int:
    """The GEMM core's multipliers, each a DSP48 at least on Xilinx parts: one per pair of
    neighbouring output lanes' products when :func:`pairs_products`, else one per MAC."""
    per_input = (config.block_out + 1) // 2 if pairs_products(config) else config.block_out
    return config.batch * config.block_in * per_input


def _paired_products(m: Module, x, w_lo, w_hi):
    """``x * w_lo`` and ``x * w_hi`` (all int8) from one 25 x 8 multiplication.

    ``(w_hi << 16) + w_lo`` times ``x`` holds ``x * w_lo`` in its low 16 bits
    (it fits: |x * w| <= 2**14) and ``x * w_hi`` above, less the borrow a
    negative low product takes from bit 16, which bit 15 gives back. Halving
    the multipliers is what lets the 256 MACs of the pynq preset fit the
    xc7z020's 220 DSPs next to the tensor ALU.

    The product is a signal of its own: an expression used three times would be exported
    as three multiplications (merged by synthesis, but each evaluated by Verilator).
    """
    packed = (w_hi << 16) + w_lo
    product = Signal(signed(len(packed) + len(x)), name="pair_product")
    m.d.comb += product.eq(packed * x)
    lo = product[:16].as_signed()
    hi = (product[16:] + product[15])[:16].as_signed()
    return lo, hi


def _tree_sum(values):
    """A balanced adder tree (shallower than a chain)."""
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]
