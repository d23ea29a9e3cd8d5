"""The tensor pipeline: GEMM core and tensor ALU over the shared loop nest.

One operation issues every ``ii`` cycles (1 for GEMM, resets and immediate
ALU ops, ``ii_tensor`` for ALU ops with a tensor operand). An operation
issued in cycle ``t`` goes through:

* ``t``: read its uop;
* ``t+1``: form the buffer indices (uop + loop offsets), check them, read
  ``inp``/``wgt``/``acc[dst]`` (GEMM, ALU immediate) or ``acc[src]`` (ALU tensor);
* ``t+2``: GEMM multiply-accumulate into a register; ALU immediate: the op's
  hardware hook starts; ALU tensor: read ``acc[dst]``;
* ``t+3``: GEMM and resets write ``acc[dst]``; ALU tensor: the hook starts;
* ``t + write_latency``: the ALU writes ``acc[dst]`` (the hook's ``latency - 3``
  stages plus one output register).

These are the numbers of docs/timing.md (``GEMM_LATENCY``,
``AluTiming.write_latency``); reads are not transparent, so a read in cycle
``t'+1`` sees writes of cycles up to ``t'``, which is the hazard rule.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from tessera.config import HwConfig
from tessera.errors import ConfigError
from tessera.isa import ALU_OPS, INSN_BITS, get_isa
from tessera.isa.encoding import OPCODE_BITS
from tessera.isa.instructions import Opcode
from tessera.regmap import ErrorCode
from tessera.timing import COMPUTE_SETUP_CYCLES, GEMM_LATENCY

from .alu_ops import ALU_BASE_LATENCY, hardware_of
from tessera.regmap import ERROR_CODE_BITS
from .layouts import alu_layout, gemm_layout, uop_layout
from .ports import sram_read_signature, sram_write_signature

#: Pipeline stage at which every operation has read its rows and the GEMM sum is formed.
_GEMM_SUM_STAGE = 2
#: The ALU hook gets its operands at this stage (immediate form), one later with a tensor operand.
_ALU_HOOK_STAGE = 2
assert COMPUTE_SETUP_CYCLES == 1, "the pipeline latches the instruction in its one setup cycle"
assert GEMM_LATENCY == _GEMM_SUM_STAGE + 1
# A hook with no register stages writes at the immediate form's base latency.
assert ALU_BASE_LATENCY == _ALU_HOOK_STAGE + 1


def _alu_ops_with_timing():
    """Registered ALU ops whose hardware this build instantiates, with their timing."""
    ops = []
    for op in ALU_OPS:
        t = op.timing
        if t.ii_imm < 1 or t.ii_tensor < 2 or t.latency < ALU_BASE_LATENCY:
            raise ConfigError(f"ALU op {op.name}: the hardware needs ii_imm >= 1, ii_tensor >= 2 "
                              f"(two reads through one port) and latency >= 3, not {t}")
        ops.append((op, hardware_of(op)))
    return ops


class TensorPipeline(wiring.Component):
    """Executes GEMM and ALU instructions (started by the compute module)."""

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        c = config
        isa = get_isa(c)
        self.lanes = c.batch * c.block_out
        super().__init__({
            "start": In(1), "insn": In(INSN_BITS),
            "busy": Out(1), "error": Out(ERROR_CODE_BITS),
            "uop": Out(sram_read_signature(c.uop_index_bits, isa.uop_layout.bits)),
            "inp": Out(sram_read_signature(c.inp_index_bits, c.inp_entry_bytes * 8)),
            "wgt": Out(sram_read_signature(c.wgt_index_bits, c.wgt_entry_bytes * 8)),
            "acc_rd": Out(sram_read_signature(c.acc_index_bits, c.acc_entry_bytes * 8)),
            "acc_wr": Out(sram_write_signature(c.acc_index_bits, c.acc_entry_bytes * 8)),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        c = self.config
        ops = _alu_ops_with_timing()
        gl, al = gemm_layout(c), alu_layout(c)
        g = data.View(gl, self.insn[:gl.size])
        a = data.View(al, self.insn[:al.size])

        # ---------------------------------------------------- the instruction
        is_alu = Signal()
        reset = Signal()
        uop_begin = Signal.like(g.uop_begin)
        uop_end = Signal.like(g.uop_end)
        iter_out, iter_in = Signal.like(g.iter_out), Signal.like(g.iter_in)
        wide = c.acc_index_bits + c.loop_bits + 1
        factors = {k: (Signal(wide, name=f"{k}_fo"), Signal(wide, name=f"{k}_fi"))
                   for k in ("dst", "src", "wgt")}
        alu_op = Signal.like(a.alu_op)
        use_imm = Signal()
        imm = Signal.like(a.imm)
        ii = Signal(range(max([2] + [max(o.timing.ii_imm, o.timing.ii_tensor) for o, _ in ops]) + 1))
        lat_max = max([GEMM_LATENCY] + [o.timing.write_latency(False) for o, _ in ops])
        wlat = Signal(range(lat_max + 1))

        new_alu = self.insn[:OPCODE_BITS] == Opcode.ALU
        new_reset = g.reset
        new_n_zero = (g.uop_end <= g.uop_begin) | (g.iter_out == 0) | (g.iter_in == 0)
        start_err = Signal(ERROR_CODE_BITS)
        with m.If(g.uop_end > c.uop_depth):
            m.d.comb += start_err.eq(ErrorCode.UOP_BOUNDS)
        with m.Elif(new_alu & ~new_reset):
            m.d.comb += start_err.eq(ErrorCode.ALU_OP)
            with m.Switch(a.alu_op):
                for op, _ in ops:
                    with m.Case(op.opcode):
                        m.d.comb += start_err.eq(0)

        # ---------------------------------------------------- the loop nest
        issuing = Signal()
        phase = Signal.like(ii)
        u = Signal.like(uop_end)
        i_cnt, o_cnt = Signal.like(iter_in), Signal.like(iter_out)
        cur = {k: Signal(wide + 1, name=f"{k}_cur") for k in factors}
        base = {k: Signal(wide + 1, name=f"{k}_base") for k in factors}
        drain = Signal(range(lat_max + 1))
        killed = Signal()
        m.d.comb += self.busy.eq(issuing | (drain != 0))
        with m.If(drain != 0):
            m.d.sync += drain.eq(drain - 1)

        with m.If(self.start):
            m.d.sync += [is_alu.eq(new_alu), reset.eq(new_reset), uop_begin.eq(g.uop_begin),
                         uop_end.eq(g.uop_end), iter_out.eq(g.iter_out), iter_in.eq(g.iter_in),
                         alu_op.eq(a.alu_op), use_imm.eq(a.use_imm), imm.eq(a.imm),
                         factors["dst"][0].eq(g.dst_factor_out), factors["dst"][1].eq(g.dst_factor_in),
                         u.eq(g.uop_begin), i_cnt.eq(0), o_cnt.eq(0), phase.eq(0), killed.eq(0),
                         self.error.eq(start_err),
                         issuing.eq(~new_n_zero & (start_err == 0))]
            with m.If(new_alu):
                m.d.sync += [factors["src"][0].eq(a.src_factor_out),
                             factors["src"][1].eq(a.src_factor_in),
                             factors["wgt"][0].eq(0), factors["wgt"][1].eq(0)]
            with m.Else():
                m.d.sync += [factors["src"][0].eq(g.src_factor_out),
                             factors["src"][1].eq(g.src_factor_in),
                             factors["wgt"][0].eq(g.wgt_factor_out),
                             factors["wgt"][1].eq(g.wgt_factor_in)]
            m.d.sync += [cur[k].eq(0) for k in factors] + [base[k].eq(0) for k in factors]
            # Issue interval and write latency of this instruction.
            m.d.sync += [ii.eq(1), wlat.eq(GEMM_LATENCY)]
            with m.If(new_alu & ~new_reset):
                with m.Switch(a.alu_op):
                    for op, _ in ops:
                        with m.Case(op.opcode):
                            t = op.timing
                            m.d.sync += [ii.eq(Mux(a.use_imm, t.ii_imm, t.ii_tensor)),
                                         wlat.eq(Mux(a.use_imm, t.write_latency(True),
                                                     t.write_latency(False)))]

        issue = Signal()
        m.d.comb += issue.eq(issuing & (phase == 0))
        with m.If(issuing):
            m.d.sync += phase.eq(Mux(phase + 1 == ii, 0, phase + 1))
        with m.If(issue):
            last_u = u + 1 == uop_end
            last_i = i_cnt + 1 == iter_in
            last_o = o_cnt + 1 == iter_out
            with m.If(~last_u):
                m.d.sync += u.eq(u + 1)
            with m.Else():
                m.d.sync += u.eq(uop_begin)
                with m.If(~last_i):
                    m.d.sync += [i_cnt.eq(i_cnt + 1)]
                    m.d.sync += [cur[k].eq(cur[k] + factors[k][1]) for k in factors]
                with m.Else():
                    m.d.sync += i_cnt.eq(0)
                    with m.If(~last_o):
                        m.d.sync += o_cnt.eq(o_cnt + 1)
                        m.d.sync += [base[k].eq(base[k] + factors[k][0]) for k in factors]
                        m.d.sync += [cur[k].eq(base[k] + factors[k][0]) for k in factors]
                    with m.Else():
                        m.d.sync += [issuing.eq(0), drain.eq(wlat)]

        # ------------------------------------------------- stage 0 -> 1
        m.d.comb += [self.uop.addr.eq(u), self.uop.en.eq(1)]
        v1 = Signal()
        cur1 = {k: Signal.like(cur[k], name=f"{k}_cur1") for k in cur}
        m.d.sync += [v1.eq(issue)] + [cur1[k].eq(cur[k]) for k in cur]

        # ------------------------------------------------- stage 1: indices
        ul = uop_layout(c)
        uop = data.View(ul, self.uop.data[:ul.size])
        idx = {k: Signal(wide + 2, name=f"{k}_idx") for k in cur}
        m.d.comb += [idx["dst"].eq(uop.dst + cur1["dst"]), idx["src"].eq(uop.src + cur1["src"]),
                     idx["wgt"].eq(uop.wgt + cur1["wgt"])]
        tensor_alu = is_alu & ~reset & ~use_imm
        src_depth = Mux(is_alu, c.acc_depth, c.inp_depth)
        bad = Signal()
        m.d.comb += bad.eq((idx["dst"] >= c.acc_depth)
                           | (~reset & (~is_alu | tensor_alu) & (idx["src"] >= src_depth))
                           | (~reset & ~is_alu & (idx["wgt"] >= c.wgt_depth)))
        with m.If(v1 & bad & ~killed):
            m.d.sync += [self.error.eq(ErrorCode.INDEX_BOUNDS), killed.eq(1), issuing.eq(0),
                         drain.eq(wlat)]
        ok1 = Signal()
        m.d.comb += ok1.eq(v1 & ~bad & ~killed)
        m.d.comb += [self.inp.addr.eq(idx["src"]), self.inp.en.eq(1),
                     self.wgt.addr.eq(idx["wgt"]), self.wgt.en.eq(1), self.acc_rd.en.eq(1)]

        # Valid bits and destination rows travel down a delay line; the write taps it.
        valid = [Signal(name=f"valid{s}") for s in range(lat_max + 1)]
        dst = [Signal(c.acc_index_bits, name=f"dst{s}") for s in range(lat_max + 1)]
        m.d.comb += [valid[1].eq(ok1), dst[1].eq(idx["dst"])]
        for s in range(2, lat_max + 1):
            m.d.sync += [valid[s].eq(valid[s - 1]), dst[s].eq(dst[s - 1])]
        # The line is longer than a short-latency instruction's write stage: ops of the last
        # instruction still travel past it and must not reach a later, longer write tap.
        with m.If(self.start):
            m.d.sync += [valid[s].eq(0) for s in range(2, lat_max + 1)]

        # acc read port: dst at stage 1, except ALU tensor ops: src at 1, dst at 2.
        m.d.comb += self.acc_rd.addr.eq(Mux(tensor_alu & ~v1, dst[2],
                                            Mux(tensor_alu, idx["src"], idx["dst"])))

        # ------------------------------------------------- stage 2: GEMM sum
        lane_w = c.acc_width
        acc_lanes = [self.acc_rd.data.word_select(j, lane_w).as_signed() for j in range(self.lanes)]
        x = [[self.inp.data.word_select(b * c.block_in + k, c.inp_width).as_signed()
              for k in range(c.block_in)] for b in range(c.batch)]
        w = [[self.wgt.data.word_select(o * c.block_in + k, c.wgt_width).as_signed()
              for k in range(c.block_in)] for o in range(c.block_out)]
        products = {}
        for b in range(c.batch):
            for k in range(c.block_in):
                for o in range(c.block_out):
                    if (o, k, b) in products:
                        continue
                    if _PAIRED and o + 1 < c.block_out and c.inp_width == c.wgt_width == 8:
                        products[o, k, b], products[o + 1, k, b] = \
                            _paired_products(x[b][k], w[o][k], w[o + 1][k])
                    else:
                        products[o, k, b] = x[b][k] * w[o][k]
        sums = []
        for b in range(c.batch):
            for o in range(c.block_out):
                dot = _tree_sum([products[o, k, b] for k in range(c.block_in)])
                sums.append((acc_lanes[b * c.block_out + o] + dot)[:lane_w])
        gemm_sum = Signal(c.acc_entry_bytes * 8)
        m.d.sync += gemm_sum.eq(Cat(*sums))

        # ------------------------------------------------- ALU
        b_reg = [Signal(signed(lane_w), name=f"b{j}") for j in range(self.lanes)]
        m.d.sync += [b_reg[j].eq(acc_lanes[j]) for j in range(self.lanes)]
        alu_result = Signal(c.acc_entry_bytes * 8)
        op_results = {}
        for op, hw in ops:
            operand = hw.operand_of_imm(imm, len(imm))
            lanes_out = []
            for j in range(self.lanes):
                a_in = Signal(signed(lane_w), name=f"{op.name.lower()}_a{j}")
                b_in = Signal(signed(lane_w), name=f"{op.name.lower()}_b{j}")
                m.d.comb += [a_in.eq(acc_lanes[j]), b_in.eq(Mux(use_imm, operand, b_reg[j]))]
                lanes_out.append(hw.build(m, a_in, b_in)[:lane_w])
            op_results[op.opcode] = Cat(*lanes_out)
        with m.Switch(alu_op):
            for code, value in op_results.items():
                with m.Case(code):
                    m.d.sync += alu_result.eq(value)

        # ------------------------------------------------- the write
        write = Signal()
        row = Signal(c.acc_index_bits)
        with m.Switch(wlat):
            for s in range(GEMM_LATENCY, lat_max + 1):
                with m.Case(s):
                    m.d.comb += [write.eq(valid[s]), row.eq(dst[s])]
        m.d.comb += [self.acc_wr.en.eq(write), self.acc_wr.addr.eq(row),
                     self.acc_wr.data.eq(Mux(reset, 0, Mux(is_alu, alu_result, gemm_sum)))]
        return m


#: Two int8 products per multiplier (one DSP48 each on Xilinx parts): see _paired_products.
_PAIRED = True


def _paired_products(x, w_lo, w_hi):
    """``x * w_lo`` and ``x * w_hi`` (all int8) from one 25 x 8 multiplication.

    ``(w_hi << 16) + w_lo`` times ``x`` holds ``x * w_lo`` in its low 16 bits
    (it fits: |x * w| <= 2**14) and ``x * w_hi`` above, less the borrow a
    negative low product takes from bit 16, which bit 15 gives back. Halving
    the multipliers is what lets the 256 MACs of the pynq preset fit the
    xc7z020's 220 DSPs next to the tensor ALU.
    """
    product = ((w_hi << 16) + w_lo) * x
    lo = product[:16].as_signed()
    hi = (product[16:] + product[15])[:16].as_signed()
    return lo, hi


def _tree_sum(values):
    """A balanced adder tree (shallower than a chain)."""
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]
