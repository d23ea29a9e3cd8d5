"""Random valid programs for the sim-vs-RTL differential fuzzer.

Two families, both drawn from one integer seed:

* ``instructions``: a fully synchronised program (see :func:`tests.programs.single_shot`)
  of random LOADs (any memory type, strides, pads, unaligned rows), random
  GEMM and ALU loop nests (MOV included; LUT, and LOADs of whole 256-entry tables
  into the ALU table memory, on configs that have one) over random uops, each nest
  in one accumulator bank, and random STOREs;
* ``pipeline``: the blocked GEMM kernel with random sizes, 1 or 2 virtual
  threads (the second one moved to the second accumulator bank) and a random
  epilogue, whose modules overlap and contend for DRAM.

In both, GEMM and ALU instructions get ``overlap`` where that is safe
(:func:`_add_overlaps`), so the compute units run side by side. Programs the
simulator rejects (a hazard or a bound the random choice broke) are drawn
again, so every returned program is valid.
"""
from __future__ import annotations

import numpy as np

from tessera.config import ACC_BANKS, HwConfig
from tessera.errors import ProgramError
from tessera.isa import (ALU_OPS, Alu, Gemm, Instruction, Load, MemType, Program, Store, Uop,
                         get_isa)
from tessera.isa import module_of, requant
from tessera.kernels.gemm import gemm_program, plan_gemm
from tessera.timing import COMPUTE_UNITS, compute_unit, units_awaited
from tessera.sim import SimResult, simulate

from tests.programs import load, single_shot, store

FAMILIES = ("instructions", "pipeline")


def random_program(config: HwConfig, seed: int, family: str | None = None
                   ) -> tuple[Program, SimResult]:
    """A random valid program and its simulation."""
    rng = np.random.default_rng(seed)
    family = family or FAMILIES[seed % len(FAMILIES)]
    build = {"instructions": _instructions, "pipeline": _pipeline}[family]
    for _ in range(50):
        try:   # a draw the kernel cannot tile, or the simulator refuses, is drawn again
            program = build(config, rng)
            return program, simulate(program)
        except ProgramError:
            continue
    raise RuntimeError(f"no valid {family} program from seed {seed}")


def _pipeline(config: HwConfig, rng: np.random.Generator) -> Program:
    c = config
    m = c.batch * int(rng.integers(1, 9))
    n = c.block_out * int(rng.integers(1, 9))
    k = c.block_in * int(rng.integers(1, 9))
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    names = ["SHR", "MAX", "MIN", "ADD", "SUB", "MUL", "MOV"]
    epilogue = [(str(rng.choice(names)), int(rng.integers(-4, 9)))
                for _ in range(int(rng.integers(0, 4)))]
    epilogue = [(op, abs(imm) % 9 if op == "SHR" else imm) for op, imm in epilogue]
    threads = 2 if rng.random() < 0.75 else 1
    plan = plan_gemm(c, m, n, k, threads, len(epilogue))
    program = gemm_program(c, a, b, epilogue=epilogue, threads=threads, plan=plan)
    if threads == 2:
        _second_thread_to_bank_1(program, plan.tile_m * plan.tile_n)
    _add_overlaps(program, rng, float(rng.uniform(0.3, 1.0)))
    return program


def _second_thread_to_bank_1(program: Program, tile_rows: int) -> None:
    """Move the second virtual thread's accumulator rows (from ``tile_rows``) to the first
    row of accumulator bank 1, so that its instructions can overlap the first thread's."""
    c, isa = program.config, program.isa
    shift = c.acc_bank_rows - tile_rows
    seg = program.segment("uops")
    uops = [u if u.dst < tile_rows else Uop(u.dst + shift, u.src, u.wgt)
            for u in _uops_of(program)]
    seg.data[:] = isa.encode_uops(uops)
    program.instructions = [
        insn.replace(sram_base=insn.sram_base + shift)
        if isinstance(insn, Store) and insn.sram_base >= tile_rows else insn
        for insn in program.instructions]


def _uops_of(program: Program) -> list[Uop]:
    isa = program.isa
    words = program.segment("uops").data.view(f"<u{isa.uop_bytes}")
    return [isa.decode_uop(int(w)) for w in words]


def _banks(config: HwConfig, insn: Gemm | Alu, uops: list[Uop]) -> set[int]:
    """The accumulator banks a GEMM or ALU touches: its dst rows, and an ALU's tensor operand."""
    rows = set()
    for o in range(insn.iter_out):
        for i in range(insn.iter_in):
            for u in uops[insn.uop_begin:insn.uop_end]:
                rows.add(u.dst + o * insn.dst_factor_out + i * insn.dst_factor_in)
                if isinstance(insn, Alu) and not insn.reset and not insn.use_imm:
                    rows.add(u.src + o * insn.src_factor_out + i * insn.src_factor_in)
    return {r // config.acc_bank_rows for r in rows}


def _add_overlaps(program: Program, rng: np.random.Generator, p: float) -> None:
    """Set ``overlap`` on GEMM and ALU instructions with probability ``p`` where it is safe.

    An overlapped instruction may run beside the instruction last started on the other
    unit (unless an instruction that waits for both units came between). Beside it, it
    must use other accumulator banks and push into other queues (else the simulator
    raises HazardError), and its tokens must not release anything that depends on the
    other instruction having ended: it pushes nothing to store (which could read the
    other's rows), and to load only beside an ALU (a GEMM reads the inp/wgt that load
    overwrites).
    """
    c = program.config
    uops = _uops_of(program) if any(s.name == "uops" for s in program.segments) else []
    last: dict[str, tuple[Instruction, set[int]] | None] = {u: None for u in COMPUTE_UNITS}
    for index, insn in enumerate(program.instructions):
        if module_of(insn) != "compute":
            continue
        unit = compute_unit(insn)
        if unit is None:                      # LOAD, FINISH: they wait for and take both
            last = {u: None for u in COMPUTE_UNITS}
            continue
        banks = _banks(c, insn, uops)
        other_unit = next(u for u in COMPUTE_UNITS if u != unit)
        other = last[other_unit]
        safe = True
        if other is not None:
            o_insn, o_banks = other
            safe = (not banks & o_banks and not insn.push_next
                    and not (insn.push_prev and (o_insn.push_prev or isinstance(o_insn, Gemm))))
        if safe and rng.random() < p:
            insn = insn.replace(overlap=True)
            program.instructions[index] = insn
        if len(units_awaited(insn)) == len(COMPUTE_UNITS):
            last[other_unit] = None           # it waited for the other unit to be free
        last[unit] = (insn, banks)


def _dma_fields(rng: np.random.Generator, depth: int, *, pads: bool) -> dict:
    y, x = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    f = dict(y_size=y, x_size=x, x_stride=x + int(rng.integers(0, 3)))
    if pads:
        f.update({p: int(rng.integers(0, 3)) if rng.random() < 0.4 else 0
                  for p in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")})
    rows = f.get("y_pad_0", 0) + y + f.get("y_pad_1", 0)
    cols = f.get("x_pad_0", 0) + x + f.get("x_pad_1", 0)
    f["sram_base"] = int(rng.integers(0, depth - rows * cols + 1))
    return f


def _table_ops(config: HwConfig) -> list[str]:
    """The ALU ops of ``config`` that read the table memory (LUT, when registered)."""
    return [op.name for op in ALU_OPS.available(config) if op.reads_table]


def _reachable_rows(config: HwConfig, mem: MemType) -> int:
    """Entries of ``mem`` a LOAD's ``sram_base`` can start at (a table memory may have
    more rows than the field, sized by the other buffers, can name)."""
    isa = get_isa(config)
    return min(isa.depth(mem), isa.layouts[Load.opcode].field("sram_base").hi + 1)


def _seed_rows(config: HwConfig, rng: np.random.Generator, rows: int, seg_entries: int
               ) -> list:
    """Mostly LOAD acc of random values into the rows the nests start at (the first
    ``rows`` of each bank), so their ops see values of every byte, not zeros."""
    bank, n = config.acc_bank_rows, min(rows, seg_entries)
    return [load("acc", MemType.ACC, int(rng.integers(0, seg_entries - n + 1)), x_size=n,
                 sram_base=b * bank) for b in range(ACC_BANKS) if rng.random() < 0.7]


def _table_loads(config: HwConfig, rng: np.random.Generator) -> tuple[list, int]:
    """Mostly a LOAD tbl of a whole 256-entry table of segment ``tbl`` into a random table
    slot; and the slot's first entry, the base LUTs mostly look up from."""
    rows = 256 // (config.batch * config.block_out)
    slot = int(rng.integers(0, _reachable_rows(config, MemType.TBL) // rows))
    if rng.random() < 0.2:
        return [], slot * 256
    return [load("tbl", MemType.TBL, int(rng.integers(0, config.table_rows // rows)) * rows,
                 x_size=rows, sram_base=slot * rows)], slot * 256


def _alu_imm(isa, name: str, rng: np.random.Generator, table_base: int) -> int:
    """A random immediate for ALU op ``name``: any value of the field, or one the op
    makes interesting (shift amounts around the saturation points, small factors,
    requantization parameters, a LUT base near the loaded table)."""
    field = isa.layouts[Alu.opcode].field("imm")
    imm = int(rng.integers(field.lo, field.hi + 1))
    if name == "SHR":
        imm = int(rng.integers(-40, 40))
    elif name == "MUL":
        imm = int(rng.integers(-100, 100))
    elif name == "REQUANT" and field.width == 32:
        word = requant.pack_params(*requant.scale_to_params(
            np.float32(rng.uniform(1e-3, 2.0))))
        imm = int(np.asarray(word, np.int64).reshape(-1)[0].astype(np.int32))
    elif name in _table_ops(isa.config) and rng.random() < 0.75:
        imm = table_base + int(rng.integers(-4, 5))
    return imm


def _instructions(config: HwConfig, rng: np.random.Generator) -> Program:
    c = config
    isa = get_isa(c)
    seg_entries = 64
    segments = {}
    for mem in (MemType.INP, MemType.WGT, MemType.ACC8):
        segments[mem.label] = rng.integers(-128, 128, seg_entries * isa.elem_bytes(mem),
                                           dtype=np.int8)
    acc = rng.integers(-2000, 2000, seg_entries * c.batch * c.block_out).astype(np.int32)
    segments["acc"] = acc
    segments["out"] = seg_entries * isa.elem_bytes(MemType.OUT)
    if c.table_entries:
        segments["tbl"] = rng.integers(-128, 128, c.table_entries, dtype=np.int8)

    loads = []
    for _ in range(int(rng.integers(0, 4))):
        mem = MemType.INP if rng.random() < 0.5 else MemType.WGT
        f = _dma_fields(rng, isa.depth(mem), pads=True)
        loads.append(load(mem.label, mem, int(rng.integers(0, 8)), **f))

    # One group of uops per accumulator bank: a nest over one group stays in its bank
    # (rows within the first quarter of it, plus loop offsets below a quarter on the presets).
    bank, quarter = c.acc_bank_rows, max(1, c.acc_bank_rows // 4)
    per_bank = int(rng.integers(1, 4))
    uops = [Uop(dst=b * bank + int(rng.integers(0, quarter)),
                src=b * bank + int(rng.integers(0, quarter)),
                wgt=int(rng.integers(0, c.wgt_depth // 2)))
            for b in range(ACC_BANKS) for _ in range(per_bank)]
    compute, table_base = _table_loads(c, rng) if c.table_entries else ([], 0)
    compute = _seed_rows(c, rng, quarter, seg_entries) + compute
    bank_of_last = 0
    for _ in range(int(rng.integers(1, 7))):
        kind = rng.random()
        if kind < 0.2:
            mem = MemType(rng.choice([MemType.ACC, MemType.ACC8]
                                     + ([MemType.TBL] if c.table_entries else [])))
            f = _dma_fields(rng, _reachable_rows(c, mem), pads=mem in (MemType.ACC, MemType.TBL))
            compute.append(load(mem.label, mem, int(rng.integers(0, 8)), **f))
            continue
        # Mostly the other bank than the last nest's: such neighbours may overlap.
        bank_of_last = ((bank_of_last + 1) % ACC_BANKS if rng.random() < 0.75
                        else int(rng.integers(0, ACC_BANKS)))
        group = bank_of_last * per_bank
        begin = group + int(rng.integers(0, per_bank))
        loop = dict(uop_begin=begin, uop_end=int(rng.integers(begin + 1, group + per_bank + 1)),
                    iter_out=int(rng.integers(1, 4)),
                    iter_in=int(rng.integers(1, 3)),
                    dst_factor_out=int(rng.integers(0, 9)), dst_factor_in=int(rng.integers(0, 5)),
                    src_factor_out=int(rng.integers(0, 5)), src_factor_in=int(rng.integers(0, 3)))
        if kind < 0.55:
            compute.append(Gemm(reset=bool(rng.random() < 0.2), wgt_factor_out=int(rng.integers(0, 3)),
                                wgt_factor_in=int(rng.integers(0, 3)), **loop))
        else:
            op = ALU_OPS.by_name(str(rng.choice(["MIN", "MAX", "ADD", "SUB", "SHR", "MUL", "CLIP",
                                                 "REQUANT", "MOV"] + 2 * _table_ops(c))))
            use_imm = bool(rng.random() < 0.5)
            imm = _alu_imm(isa, op.name, rng, table_base)
            compute.append(Alu(alu_op=op.opcode, use_imm=use_imm, imm=imm, **loop))

    stores = []
    for _ in range(int(rng.integers(1, 3))):
        f = _dma_fields(rng, c.acc_depth, pads=False)
        if rng.random() < 0.5:   # from a row the nests write, so their results are seen
            last = c.acc_depth - f["y_size"] * f["x_stride"]
            f["sram_base"] = min(last, max(0, int(rng.choice([u.dst for u in uops]))
                                           - int(rng.integers(0, 3))))
        stores.append(store("out", int(rng.integers(0, 4)), **f))
    program = single_shot(c, segments=segments, uops=uops, loads=loads, compute=compute,
                          stores=stores)
    _add_overlaps(program, rng, float(rng.uniform(0.3, 1.0)))
    return program
