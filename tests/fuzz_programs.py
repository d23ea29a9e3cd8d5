"""Random valid programs for the sim-vs-RTL differential fuzzer.

Two families, both drawn from one integer seed:

* ``instructions``: a fully synchronised program (see :func:`tests.programs.single_shot`)
  of random LOADs (any memory type, strides, pads, unaligned rows), random
  GEMM and ALU loop nests over random uops, and random STOREs;
* ``pipeline``: the blocked GEMM kernel with random sizes, 1 or 2 virtual
  threads and a random epilogue, whose modules overlap and contend for DRAM.

Programs the simulator rejects (a hazard or a bound the random choice broke)
are drawn again, so every returned program is valid.
"""
from __future__ import annotations

import numpy as np

from tessera.config import HwConfig
from tessera.errors import ProgramError
from tessera.isa import ALU_OPS, Alu, Gemm, MemType, Program, Uop, get_isa
from tessera.isa import requant
from tessera.kernels.gemm import gemm_program
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
    names = ["SHR", "MAX", "MIN", "ADD", "SUB", "MUL"]
    epilogue = [(str(rng.choice(names)), int(rng.integers(-4, 9)))
                for _ in range(int(rng.integers(0, 3)))]
    epilogue = [(op, abs(imm) % 9 if op == "SHR" else imm) for op, imm in epilogue]
    return gemm_program(c, a, b, epilogue=epilogue, threads=int(rng.integers(1, 3)))


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

    loads = []
    for _ in range(int(rng.integers(0, 4))):
        mem = MemType.INP if rng.random() < 0.5 else MemType.WGT
        f = _dma_fields(rng, isa.depth(mem), pads=True)
        loads.append(load(mem.label, mem, int(rng.integers(0, 8)), **f))

    n_uops = int(rng.integers(1, 5))
    uops = [Uop(dst=int(rng.integers(0, c.acc_depth // 2)),
                src=int(rng.integers(0, min(c.inp_depth, c.acc_depth) // 2)),
                wgt=int(rng.integers(0, c.wgt_depth // 2))) for _ in range(n_uops)]
    compute = []
    for _ in range(int(rng.integers(1, 5))):
        kind = rng.random()
        if kind < 0.2:
            mem = MemType.ACC if rng.random() < 0.5 else MemType.ACC8
            f = _dma_fields(rng, c.acc_depth, pads=mem == MemType.ACC)
            compute.append(load(mem.label, mem, int(rng.integers(0, 8)), **f))
            continue
        loop = dict(uop_begin=0, uop_end=n_uops, iter_out=int(rng.integers(1, 4)),
                    iter_in=int(rng.integers(1, 3)),
                    dst_factor_out=int(rng.integers(0, 9)), dst_factor_in=int(rng.integers(0, 5)),
                    src_factor_out=int(rng.integers(0, 5)), src_factor_in=int(rng.integers(0, 3)))
        if kind < 0.55:
            compute.append(Gemm(reset=bool(rng.random() < 0.2), wgt_factor_out=int(rng.integers(0, 3)),
                                wgt_factor_in=int(rng.integers(0, 3)), **loop))
        else:
            op = ALU_OPS.by_name(str(rng.choice(["MIN", "MAX", "ADD", "SUB", "SHR", "MUL", "CLIP",
                                                 "REQUANT"])))
            use_imm = bool(rng.random() < 0.5)
            field = isa.layouts[Alu.opcode].field("imm")
            imm = int(rng.integers(field.lo, field.hi + 1))
            if op.name == "SHR":
                imm = int(rng.integers(-40, 40))
            elif op.name == "MUL":
                imm = int(rng.integers(-100, 100))
            elif op.name == "REQUANT" and field.width == 32:
                word = requant.pack_params(*requant.scale_to_params(
                    np.float32(rng.uniform(1e-3, 2.0))))
                imm = int(np.asarray(word, np.int64).reshape(-1)[0].astype(np.int32))
            compute.append(Alu(alu_op=op.opcode, use_imm=use_imm, imm=imm, **loop))

    stores = []
    for _ in range(int(rng.integers(1, 3))):
        f = _dma_fields(rng, c.acc_depth, pads=False)
        stores.append(store("out", int(rng.integers(0, 4)), **f))
    return single_shot(c, segments=segments, uops=uops, loads=loads, compute=compute,
                       stores=stores)
