"""A 3x3/2 max pool fused into the output tiles of the convolution it reads.

Run alone (:mod:`.pool`), ResNet's stem pool loads the whole convolution output back into
the accumulator (``LOAD acc8``, which takes the compute module) and spends a MOV and up to
eight MAXes per output on the ALU: 3.2x its DRAM bound. Fused, it works on the rows the
convolution's epilogue leaves in the accumulator, on the ALU beside the next tile's GEMMs,
and only the pooled rows are stored: the pool's input never goes through DRAM.

The tiling (:func:`fused_pool_plans`) makes that possible with no accumulator rows of its own:

* tiles span whole rows (``ow_t = ow``): no window crosses a tile sideways;
* ``oh_t`` is even and tiles start at even rows: a tile holds rows ``2y`` and ``2y+1`` of each
  of its pooled rows ``y``, and the window's top row ``2y-1`` of its first is the last row of
  the tile above;
* the output channels form two tiles, spatial-outer (output blocks innermost): the tile above is
  two tiles back, so in the same accumulator bank (the four pipeline regions alternate
  banks), its region not yet reused (the next tile's init runs after this epilogue on the
  ALU), and clear of the bank the next tile's GEMMs write -- the pool runs beside them.

Per tile (:meth:`FusedPool.insns`): the horizontal maxima in place on the even columns of
every row (a MAX with the column to the right, then the left), then per pooled row ``y`` a
MOV of row ``2y``'s even columns to its first ``ow/2`` entries (contiguous, for the store), a
MAX with row ``2y+1`` and one with row ``2y-1`` (this tile's, or the tile above's last row;
none in the first row, the padding). Odd rows stay intact: the tile below reads its top one.
Padding never takes part, as in :mod:`.pool`: the result equals the unfused program's.

When every epilogue step is a non-decreasing function of the accumulator (a per-channel
ADD of the bias or a zero point, REQUANT, whose scales are never negative, clamps, shifts;
none that can wrap: :func:`epilogue_commutes`), the maximum of the results is the result
of the maximum: the pool then runs on the raw accumulators and the epilogue on the pooled
entries alone, a quarter of the rows (``zcu104``'s conv1 was bound by its ALU).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Sequence

from tessera.config import HwConfig
from tessera.errors import CLI, PYTHON, CompileError
from tessera.isa import Instruction, MemType, Store

from .acctile import alu_insn
from .convcost import estimate_conv_cycles
from .convplan import ConvGeom, ConvPlan, Tile, conv_plan_fits
from .emit import Emitter, TensorInfo, plane_dmas
from .epilogue import EpiloguePlan
from .nest import dim
from .ops import Conv2d, Op, Pool2d, Residual

#: The pool this module fuses: kernel, stride, top/left padding.
KERNEL, STRIDE, PAD = (3, 3), (2, 2), 1
#: Output-channel tiles per band of rows: the tile above is this many tiles back.
CHANNEL_TILES = 2
#: ALU ops that are non-decreasing in the accumulator whatever their operand (REQUANT's
#: scales are never negative; a wrapping ADD is excluded by ``EpiloguePlan.may_wrap``).
NON_DECREASING_OPS = frozenset({"ADD", "MAX", "MIN", "CLIP", "SHR", "REQUANT"})


def epilogue_commutes(ep: EpiloguePlan) -> bool:
    """Whether ``ep``'s steps commute with a max pool (module doc): plain ALU steps on the
    tile's own rows, each non-decreasing, none wrapping."""
    return not ep.may_wrap and all(
        st.kind == "alu" and st.op in NON_DECREASING_OPS and st.table is None
        and st.src is None and st.dst == "acc" for st in ep.steps)


def fusion_reason(conv: Conv2d, pool: Pool2d, conv_shape: tuple[int, int, int, int]
                  ) -> str | None:
    """Why ``pool`` (reading ``conv``'s output of shape ``conv_shape``) cannot run in
    ``conv``'s tiles, by its form alone (None: it can, if a tiling fits:
    :func:`fused_pool_plans`)."""
    h, w = conv_shape[2:]
    if pool.kind != "max" or pool.epilogue or pool.kernel != KERNEL or pool.stride != STRIDE:
        return "only a 3x3/2 max pool without epilogue stages is fused"
    if pool.padding[:2] != (PAD, PAD) or h % 2 or w % 2 or \
            pool.output_shape(conv_shape)[2:] != (h // 2, w // 2):
        return "the pool must pad the top and left by one and halve an even-sized image"
    if type(conv) is not Conv2d or conv.pool is not None or \
            any(isinstance(s, Residual) for s in conv.epilogue):
        return "the producer must be a plain convolution without a residual epilogue"
    return None


def fused_pool_plans(g: ConvGeom, config: HwConfig, ep: EpiloguePlan, threads: int
                     ) -> list[ConvPlan]:
    """The tilings of convolution ``g`` that can carry the pool (see the module doc), best
    estimate first; empty when none fits (then the pool runs alone)."""
    if threads < 2 or g.OB < CHANNEL_TILES:
        return []
    ob_t = -(-g.OB // CHANNEL_TILES)
    plans = []
    for nb_t in sorted({1, g.NB}):
        for oh_t in range(2, g.oh + 1, 2):
            for j_t in range(1, g.J + 1):
                p = ConvPlan(nb_t, ob_t, oh_t, g.ow, j_t, threads, "spatial", ramp=0,
                             pipeline=True)
                if not isinstance(conv_plan_fits(g, p, config, ep), str):
                    plans.append(replace(p, est_cycles=int(estimate_conv_cycles(g, p, config,
                                                                                 ep))))
    return sorted(plans, key=lambda p: p.est_cycles)


def carries_pool(g: ConvGeom, p: object) -> bool:
    """Whether the tiles of plan ``p`` are laid out as the fused pool needs (module doc)."""
    return (isinstance(p, ConvPlan) and p.pipelined and p.ramp == 0 and p.order == "spatial"
            and p.ow_t == g.ow and p.oh_t % 2 == 0 and -(-g.OB // p.ob_t) == CHANNEL_TILES)


def check_pool_plan(where: str, name: str, g: ConvGeom, p: ConvPlan, config: HwConfig) -> None:
    """Raise unless the tiles of a forced plan ``p`` are laid out as the pool needs."""
    if not carries_pool(g, p):
        raise CompileError(
            f"{where}: the tiling {p.describe(config)} cannot carry the fused max pool: it "
            f"needs pipelined spatial-outer tiles of whole rows ({g.ow} columns), an even "
            "height, two output-channel tiles and no halved end tiles",
            op=name, fix={PYTHON: "force no plan for this convolution (the compiler then "
                          "picks one that carries the pool), or compile with fuse_pools=False",
                          CLI: "the CLI forces no tilings: report this as a bug"})


class FusedPool:
    """The pool's instructions and stores per convolution tile (module doc); ``oh_t``: the
    tiles' height (the last may be shorter), ``ow``: the convolution output's width."""

    def __init__(self, em: Emitter, pool: Pool2d, out: TensorInfo, oh_t: int, ow: int) -> None:
        self.em, self.pool, self.out, self.oh_t, self.w = em, pool, out, oh_t, ow
        self.where = f"pool {pool.name!r} (fused)"
        self.elem = em.elem(out.place, MemType.OUT)

    def insns(self, t: Tile, base: int, above: int) -> list[Instruction]:
        """Pool tile ``t`` (rows from ``base``; the tile above's from ``above``) in place."""
        w, half, pooled = self.w, self.w // 2, (t.oy1 - t.oy0) // 2
        planes = (t.nb1 - t.nb0, t.ob1 - t.ob0)   # image and output blocks of the tile

        def op(name: str, rows: int, step: int, cols: int, dst_x: int, dst0: int, src0: int,
               src_px: int = t.pixels) -> Instruction:
            """``name`` over ``rows`` rows ``step`` apart and ``cols`` columns: each reads
            every other column from ``src0`` into columns ``dst_x`` apart from ``dst0``."""
            dims = [dim("nb", planes[0], dst=planes[1] * t.pixels, src=planes[1] * src_px),
                    dim("ob", planes[1], dst=t.pixels, src=src_px),
                    dim("y", rows, dst=step, src=step), dim("x", cols, dst=dst_x, src=2)]
            return alu_insn(self.em, name, dims, (dst0, src0), use_imm=False, where=self.where)
        # Horizontal maxima of every row on its even columns: right neighbour, left neighbour.
        insns = [op("MAX", 2 * pooled, w, half, 2, base, base + 1)]
        if half > 1:
            insns.append(op("MAX", 2 * pooled, w, half - 1, 2, base + 2, base + 1))
        # Pooled row y, compacted into the first entries of row 2y: rows 2y, 2y+1, 2y-1.
        insns += [op("MOV", pooled, 2 * w, half, 1, base, base),
                  op("MAX", pooled, 2 * w, half, 1, base, base + w)]
        if pooled > 1:
            insns.append(op("MAX", pooled - 1, 2 * w, half, 1, base + 2 * w, base + w))
        if t.oy0 > 0:
            insns.append(op("MAX", 1, 2 * w, half, 1, base, above + (self.oh_t - 1) * w,
                            src_px=self.oh_t * w))
        return insns

    def pooled_dims(self, t: Tile) -> tuple[tuple[int, int], ...]:
        """Where tile ``t``'s pooled entries lie in each of its planes, as ``(count,
        stride)`` loops: the first ``ow/2`` entries of every other row."""
        return (((t.oy1 - t.oy0) // 2, 2 * self.w), (self.w // 2, 1))

    def items(self, epilogue: list[Instruction], t: Tile, region: int, regions: int,
              region_base: Callable[[int], int], *, after: bool = False) -> list[list]:
        """The work items of tile ``t`` (in accumulator ``region`` of ``regions``, each
        starting at ``region_base(r)``) after its GEMMs: its ``epilogue``, the pool and, with
        the last, the pooled stores (``after``: the pool first, the epilogue of the pooled
        entries after it)."""
        base = region_base(region)
        above = region_base((region - CHANNEL_TILES) % regions)     # the tile above's
        pool = self.insns(t, base, above)
        items = [[i] for i in ([*pool, *epilogue] if after else [*epilogue, *pool])]
        items[-1] += self.stores(t, base)
        return items

    def stores(self, t: Tile, base: int) -> list[Store]:
        """The stores of tile ``t``'s pooled rows (each the first ``ow/2`` entries of its row
        ``2y``)."""
        ob_n, px, half = t.ob1 - t.ob0, t.pixels, self.w // 2
        layout = self.out.layout.view(self.em.config.block_out)
        planes = [(((nb - t.nb0) * ob_n + (ob - t.ob0)) * px + (2 * y - t.oy0) * self.w,
                   layout.entry(nb, ob, y, 0))
                  for nb in range(t.nb0, t.nb1) for ob in range(t.ob0, t.ob1)
                  for y in range(t.oy0 // 2, t.oy1 // 2)]
        return plane_dmas(Store, mem=MemType.OUT, sram_base=base, dram_base=self.elem,
                          planes=planes, rows=1, cols=half, row_stride=layout.row_stride,
                          elem_stride=layout.pixel_stride, max_fields=self.em.max_dma)


def fuse_conv_pools(ops: list[Op], shapes: dict[str, tuple[int, int, int, int]],
                    outputs: Sequence[str], config: HwConfig, threads: int,
                    plans: Mapping[str, object]) -> list[Op]:
    """``ops`` with each max pool fused into the convolution it reads where it can be
    (:func:`fusion_reason`, a tiling fits, the convolution's output is read by the pool
    alone and is no program output, and no forced plan says otherwise); the convolutions'
    outputs that no longer exist leave ``shapes``."""
    readers: dict[str, int] = {}
    for op in ops:
        for t in op.inputs:
            readers[t] = readers.get(t, 0) + 1
    producer = {op.output: op for op in ops}
    fused: dict[str, Op | None] = {}   # by name: a convolution with its pool, or None
    for pool in ops:
        conv = producer.get(pool.input) if isinstance(pool, Pool2d) else None
        if conv is None or readers[pool.input] != 1 or pool.input in outputs:
            continue
        if not isinstance(conv, Conv2d) or fusion_reason(conv, pool, shapes[pool.input]):
            continue
        forced = plans.get(conv.name)
        g = ConvGeom.of(conv, shapes[conv.input], config)
        from .conv import conv_epilogue    # conv.py imports this module
        ep = conv_epilogue(conv, g.o, config, f"conv2d {conv.name!r}")
        if forced is not None and not carries_pool(g, forced) or \
                not fused_pool_plans(g, config, ep, threads):
            continue
        fused[conv.name] = replace(conv, output=pool.output, pool=pool)
        fused[pool.name] = None
        del shapes[pool.input]
    return [fused.get(op.name, op) for op in ops if fused.get(op.name, op) is not None]

