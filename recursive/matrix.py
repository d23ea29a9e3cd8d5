"""Matrix values on the accelerator (MV-RNN): tile-blocked rows, both orientations,
per-node weights.

A node's ``R x C`` matrix takes ``R * C / b`` rows of ``b`` lanes (``b`` the block) in
*tile-blocked* order: row ``r`` of block ``c`` of the matrix sits at
``((r // b) * (C / b) + c) * b + r % b``. That one order serves every use:

* in the input buffer its rows feed a GEMM (any affine order does);
* in the weight buffer it *is* the weight tiles: tile ``(r // b, c)`` holds rows
  ``r`` of the matrix over lanes of block ``c``, so a GEMM with it as weights computes
  ``matrix @ x`` for an input vector ``x``;
* in the accumulator and in DRAM, so a result is stored with one DMA.

A GEMM reduces over its input's lanes, so ``W @ M`` (MV-RNN's composition, from the
left) needs ``M``'s columns as weight-tile rows: the transposed matrix. A matrix state
is therefore kept in both orientations, ``M`` (array ``state:<s>``, the matvec's
weights) and ``M^T`` (array ``state:<s>^T``): ``M^T`` of a composition is a GEMM of the
children's ``M^T`` rows with the model's ``W`` as weights (``(W M)^T = M^T W^T``), ``M``
is a GEMM of ``W``'s rows (a constant input) with the children's ``M^T`` tiles as
weights. The two are the same int32 sums, so they are exact transposes.
"""
from __future__ import annotations

import numpy as np

from tessera.errors import CompileError
from tessera.isa import Load, MemType, Store
from tessera.compiler.accel.acctile import alu_insn
from tessera.compiler.accel.emit import Place
from tessera.compiler.accel.nest import dim

from .specialize import Value

#: Suffix of the transposed orientation's array and placeholders.
T = "^T"


def tiled(m: np.ndarray, block: int) -> np.ndarray:
    """``(..., R, C)`` matrices as ``(..., R * C / block, block)`` tile-blocked rows."""
    *lead, r, c = m.shape
    t = m.reshape(*lead, r // block, block, c // block, block)
    return np.swapaxes(t, -3, -2).reshape(*lead, r * c // block, block)


def untiled(rows: np.ndarray, r: int, c: int, block: int) -> np.ndarray:
    """Inverse of :func:`tiled`."""
    *lead, _, _ = rows.shape
    t = rows.reshape(*lead, r // block, c // block, block, block)
    return np.swapaxes(t, -3, -2).reshape(*lead, r, c)


class MatrixLowering:
    """The matrix parts of :class:`~.template.TemplateBuilder` (a mixin: it uses the
    builder's emitter, allocation and plans)."""

    # ------------------------------------------------------------ layout
    def check_matrix(self, v: Value) -> None:
        b = self.c.block_out
        if v.rows % b or v.width % b:
            raise CompileError(f"{self.name}: the {v.rows}x{v.width} matrix {v.label} must be "
                               f"a multiple of the {b}-lane block in both dimensions")
        need = 2 * v.rows * v.width // b
        if need > self.c.acc_depth // 2:
            raise CompileError(
                f"{self.name}: one node's {v.rows}x{v.width} matrix {v.label} takes {need} "
                f"accumulator rows in its two orientations; config {self.c.name!r} has "
                f"{self.c.acc_depth} (rows are not tiled): use a hidden size of at most "
                f"{int((self.c.acc_depth * b / 4) ** 0.5) // b * b} or a config with a larger "
                "accumulator (acc_depth)")

    def tiles(self, v: Value) -> int:
        """Weight tiles of one node's matrix ``v``."""
        return v.rows * v.width // (self.c.block_out * self.c.block_in)

    def matrix_readers(self, v: Value) -> tuple[bool, bool]:
        """Whether ``v`` (a child's matrix) is read by a matvec, by a composition."""
        kinds = {r.kind for r in self.readers[id(v)]}
        return "matvec" in kinds, "mlinear" in kinds

    def matrix_segments(self, v: Value) -> None:
        nbytes = self.n * v.rows * v.width
        for form in ("", T):
            self.em.add_segment(f"gather:{v.source}{form}:{v.slot}", nbytes)

    # ----------------------------------------------------------- gathers
    def take_wgt(self, count: int, what: str) -> int:
        base = self.wgt_top
        self.wgt_top += count
        if self.wgt_top > self.c.wgt_depth:
            raise CompileError(f"{self.name}: {what} needs weight-buffer entries up to "
                               f"{self.wgt_top}; config {self.c.name!r} has {self.c.wgt_depth}")
        return base

    def matrix_gather(self, v: Value, inp: list[int]) -> None:
        """A child's matrix: its tiles into the weight buffer (``M`` for a matvec, ``M^T``
        for a composition) and its ``M^T`` rows into the input buffer (composition)."""
        self.check_matrix(v)
        by_matvec, by_comp = self.matrix_readers(v)
        tiles = self.n * self.tiles(v)
        forms = ([""] if by_matvec else []) + ([T] if by_comp else [])
        for form in forms:
            base = self.wgt_of[(id(v), form)] = self.take_wgt(tiles, v.label)
            self.em.emit(self._matrix_dma(v, form, MemType.WGT, base, tiles))
        if by_comp:
            self.inp_of[id(v)] = self._take_inp(inp, v)
            self.em.emit(self._matrix_dma(v, T, MemType.INP, self.inp_of[id(v)], self.rows(v)))

    def _matrix_dma(self, v: Value, form: str, mem: MemType, base: int, count: int) -> Load:
        seg = f"gather:{v.source}{form}:{v.slot}"
        return Load(mem=mem, sram_base=base, dram_base=self.em.elem(Place(seg), mem),
                    y_size=1, x_size=count, x_stride=count)

    # -------------------------------------------------------- constants
    def matrix_params(self, v: Value) -> list[np.ndarray]:
        """The int32 rows a matrix value starts from (its bias, or a constant's values), in
        each orientation: ``[M rows, M^T rows]``."""
        start = v.bias if v.kind == "mlinear" else v.const
        b = self.c.block_out
        return [tiled(start, b), tiled(start.T, b)]

    def init_matrix(self, v: Value, bases: list[int]) -> None:
        """Each orientation's rows set to its parameter rows, node by node (ALU MOV)."""
        per_node = v.rows * v.width // self.c.block_out
        for base, prow in zip(bases, self.matrix_rows_at[id(v)]):
            self.em.emit(alu_insn(self.em, "MOV", [dim("node", self.n, dst=per_node),
                                                   dim("rows", per_node, dst=1, src=1)],
                                  (base, prow), use_imm=False, where=f"{self.name}: {v.label}"))

    # ------------------------------------------------------------ GEMMs
    def emit_composition(self, v: Value, bases: list[int]) -> None:
        """``sum_k W_k @ M_k`` in both orientations, then its rescale."""
        self.check_matrix(v)
        b, wb = self.c.block_out, self.weights.bases[self.variant.key]
        out_b, col_b = v.rows // b, v.width // b
        self.init_matrix(v, bases)
        for k, (w, a) in enumerate(zip(v.terms, v.args)):
            in_b = a.rows // b
            # M^T rows j: M_k^T rows (input) with W_k's tiles (weights).
            dims = [dim("node", self.n, dst=v.width * out_b, src=a.width * in_b)] + [
                dim("J", v.width // b, dst=out_b * b, src=in_b * b), dim("r", b, dst=1, src=1),
                dim("ob", out_b, dst=b, wgt=in_b), dim("ib", in_b, src=b, wgt=1)]
            self.gemm(dims, (bases[1], self.inp_of[id(a)], wb[self._key(w)]), v)
            # M rows o: W_k's rows (a constant input) with M_k^T's tiles (weights).
            dims = [dim("node", self.n, dst=v.rows * col_b, wgt=self.tiles(a)),
                    dim("O", out_b, dst=col_b * b, src=in_b * b), dim("r", b, dst=1, src=1),
                    dim("cb", col_b, dst=b, wgt=in_b), dim("ib", in_b, src=b, wgt=1)]
            self.gemm(dims, (bases[0], self.const_inp[(id(v), k)], self.wgt_of[(id(a), T)]), v)
        for base in bases:
            self._apply_plan(self.plans[id(v)][0], v, base)

    def const_rows(self, v: Value, inp: list[int]) -> None:
        """Load each composition weight's rows (tile-blocked) into the input buffer."""
        b = self.c.block_out
        for k, w in enumerate(v.terms):
            rows = tiled(w.astype(np.int8), b)
            seg = self.em.add_segment(f"wrows.{v.label}.{k}", rows)
            base = self.const_inp[(id(v), k)] = inp[0]
            inp[0] += rows.shape[0]
            self.em.emit(Load(mem=MemType.INP, sram_base=base, dram_base=self.em.elem(
                Place(seg), MemType.INP), y_size=1, x_size=rows.shape[0], x_stride=rows.shape[0]))

    def emit_matvec(self, v: Value, base: int) -> None:
        """``M @ x`` with each node's ``M`` tiles as its weights."""
        m, x = v.args
        ob = v.width // self.c.block_out
        self._apply_plan(self.plans[id(v)][0], v, base, init=True)
        self._emit_gemm(v, ob, x.width // self.c.block_in,
                        (base, self.inp_of[id(x)], self.wgt_of[(id(m), "")]),
                        node_wgt=self.tiles(m))
        self._apply_plan(self.plans[id(v)][0], v, base)

    def store_matrix(self, s: str, v: Value, bases: list[int]) -> None:
        r = self.rows(v)
        for form, base in zip(("", T), bases):
            self.em.emit(Store(mem=MemType.OUT, sram_base=base, dram_base=self.em.elem(
                Place(f"out:{s}{form}"), MemType.OUT), y_size=1, x_size=r, x_stride=r))
