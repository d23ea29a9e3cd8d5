"""float32 convolutions: ONNX Conv and ConvTranspose over 1, 2 or 3 spatial dimensions,
with strides, dilations, pads, groups and a bias (the int8 ones are :mod:`.conv`'s).

Both normalise the spatial dimensions to three (``D, H, W``; a 1-D conv has ``D = H =
1``) and run per image and output channel:

* :func:`build_conv_float`: each image is copied once into a zero-padded scratch
  buffer, so no tap needs a bounds check. With 4 or more output channels per group
  (and enough work) the convolution is then an implicit-im2col GEMM per image and group,
  ``out[m, p] = sum_k w[m, k] * xpad[k's channel, p's window + k's tap]``, on
  :func:`.packed_gemm.emit_packed_gemm`, whose packed panels are gathered straight from the
  padded image (the im2col matrix is never stored whole). Otherwise (depthwise) ``out[m]
  = bias[m] + sum_c sum_taps w[m, c, tap] * xpad[c, o * stride + tap * dilation]``, the
  taps of one weight accumulated over a whole output plane whose innermost loop (along
  W) LLVM vectorises when the stride is 1.
* :func:`build_conv_transpose_float`: the scatter form, ``buf[i * stride + tap *
  dilation] += x[c, i] * w[c, m, tap]`` into a scratch buffer as large as the
  uncropped output, then the output is ``bias[m] + buf`` cropped by the begin pads.

Sums are not added in onnxruntime's im2col + SGEMM order, so results differ from it in
the last bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module, range_function
from .layout_ops import Scratch
from .packed_gemm import PACKED_MIN_MACS, Pack, PackedGemm, Rows, emit_packed_gemm

__all__ = ["build_conv_float", "build_conv_transpose_float", "conv_geometry",
           "conv_transpose_geometry", "conv_transpose_pads"]


@dataclass(frozen=True)
class _Geometry:
    """One convolution's sizes, spatial tuples normalised to 3 dimensions."""

    n: int
    c: int
    m: int
    group: int
    size: tuple[int, int, int]        # input spatial
    kernel: tuple[int, int, int]
    strides: tuple[int, int, int]
    dilations: tuple[int, int, int]
    begin: tuple[int, int, int]       # begin pads
    out: tuple[int, int, int]         # output spatial
    spatial: tuple[int, ...]          # output spatial, not normalised
    work: tuple[int, int, int]        # the scratch buffer: padded input / uncropped output

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.n, self.m, *self.spatial)

    @property
    def cg(self) -> int:
        return self.c // self.group

    @property
    def mg(self) -> int:
        return self.m // self.group

    @property
    def taps(self) -> int:
        return prod(self.kernel)


def _three(values: Sequence[int], fill: int) -> tuple[int, int, int]:
    return tuple([fill] * (3 - len(values)) + [int(v) for v in values])


def _check(op: str, x: TensorSpec, w: TensorSpec, bias: TensorSpec | None,
           spatial: int, attrs: dict[str, Sequence[int]]) -> None:
    if x.ndim != w.ndim or not 3 <= x.ndim <= 5:
        raise CpuKernelError(f"{op}: x and w must have the same rank, 3 to 5 (1-D to 3-D), "
                             f"got {x} and {w}")
    bad = [s for s in (x, w, *(() if bias is None else (bias,))) if s.dtype != "float32"]
    if bad:
        raise CpuKernelError(f"{op}: the CPU kernel takes float32 tensors, not {bad[0]}")
    for key, value in attrs.items():
        want = 2 * spatial if key == "pads" else spatial
        if len(value) != want or any(v < (0 if key == "pads" else 1) for v in value):
            raise CpuKernelError(f"{op}: {key} {list(value)} must be {want} "
                                 f"{'non-negative' if key == 'pads' else 'positive'} values")


# ------------------------------------------------------------------------------ Conv
def conv_geometry(x: TensorSpec, w: TensorSpec, bias: TensorSpec | None = None,
                  strides: Sequence[int] | None = None, pads: Sequence[int] | None = None,
                  dilations: Sequence[int] | None = None, group: int = 1) -> _Geometry:
    """The checked geometry of :func:`build_conv_float` (its ``out`` is the output's
    spatial shape, normalised to 3-D); CpuKernelError if the arguments do not fit."""
    sp = x.ndim - 2
    strides, dilations = strides or [1] * sp, dilations or [1] * sp
    pads = pads or [0] * (2 * sp)
    _check("Conv", x, w, bias, sp, {"strides": strides, "dilations": dilations, "pads": pads})
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    if group < 1 or c % group or m % group or w.shape[1] * group != c:
        raise CpuKernelError(f"Conv: group {group} does not fit x {x} and w {w}")
    padded = [s + pads[i] + pads[i + sp] for i, s in enumerate(x.shape[2:])]
    out_sp = [(p - (k - 1) * d - 1) // s + 1
              for p, k, d, s in zip(padded, w.shape[2:], dilations, strides)]
    if any(o < 1 for o in out_sp):
        raise CpuKernelError(f"Conv: the window {list(w.shape[2:])} (dilations "
                             f"{list(dilations)}) is larger than the padded input {padded}")
    return _Geometry(n, c, m, group, _three(x.shape[2:], 1), _three(w.shape[2:], 1),
                     _three(strides, 1), _three(dilations, 1), _three(pads[:sp], 0),
                     _three(out_sp, 1), tuple(out_sp), _three(padded, 1))


def build_conv_float(x: TensorSpec, w: TensorSpec, bias: TensorSpec | None = None,
                     strides: Sequence[int] | None = None, pads: Sequence[int] | None = None,
                     dilations: Sequence[int] | None = None, group: int = 1,
                     name: str = "conv") -> CpuKernel:
    """float32 ONNX Conv: ``x [N, C, *S]``, ``w [M, C/group, *K]``, optional ``bias
    [M]``; ``pads`` are ONNX's (all begins, then all ends). A conv run as a GEMM has a
    parallel form over its output channels (per group)."""
    geo = conv_geometry(x, w, bias, strides, pads, dilations, group)
    out = TensorSpec(geo.out_shape, "float32")
    inputs = (x, w) if bias is None else (x, w, bias)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", inputs, (out,))
    gemm = _conv_gemm(geo) if out.size and _as_gemm(geo) else None
    if gemm is not None:
        _emit_conv_gemm(b, geo, gemm, fn.args, bias is not None, None)
    elif out.size:
        _emit_conv(b, geo, fn.args, geo.work, bias is not None)
    b.ret_void()
    parallel = gemm.row_blocks if gemm is not None and gemm.row_blocks > 1 else 0
    if parallel:
        fn, b, begin, end = range_function(module, "entry", inputs, (out,))
        _emit_conv_gemm(b, geo, gemm, fn.args, bias is not None, (begin, end))
        b.ret_void()
    macs = geo.n * geo.group * geo.mg * geo.cg * geo.taps * prod(geo.out)
    return CpuKernel(name, str(module), "entry", inputs, (out,), parallel=parallel,
                     macs=macs if gemm is not None else 0)


#: Output channels per group from which a convolution runs as a packed GEMM (below,
#: depthwise ones, packing its inputs costs as much as the loop nest's whole work).
_GEMM_MIN_CHANNELS = 4


def _as_gemm(geo: _Geometry) -> bool:
    macs = geo.mg * geo.cg * geo.taps * prod(geo.out)
    return geo.mg >= _GEMM_MIN_CHANNELS and macs >= PACKED_MIN_MACS


def _conv_gemm(geo: _Geometry) -> PackedGemm:
    """Per image and group ``out[m, p] = sum_k w[m, k] * col[k, p]`` (``k = c * taps +
    tap``, ``p`` the output pixel)."""
    depth, oplane = geo.cg * geo.taps, prod(geo.out)
    return PackedGemm(geo.mg, oplane, depth, (depth, 1), (oplane, 1))


def _emit_conv_gemm(b: ir.IRBuilder, geo: _Geometry, g: PackedGemm, args, has_bias: bool,
                    blocks: Rows) -> None:
    """The conv as GEMM ``g`` per image and group, whose packed panels are gathered
    from the zero-padded image (implicit im2col, never stored whole), for the output
    channels in ``blocks`` of each group (None: all); then their bias."""
    x, w, out = args[0], args[1], args[3 if has_bias else 2]
    scratch = Scratch(b)
    pplane, oplane = prod(geo.work), prod(geo.out)
    xp = scratch.alloc(U.F32, geo.c * pplane, name="xpad")
    U.fill(b, xp, geo.c * pplane, U.f32(0.0))
    panel = scratch.alloc(U.F32, g.panel_floats, name="panel")
    starts = scratch.alloc(U.I64, g.panel, name="starts")
    with U.for_range(b, geo.n, name="img") as n:
        _copy_padded(b, x, b.mul(n, U.i64(geo.c * prod(geo.size))), xp, geo, geo.work)
        with U.for_range(b, geo.group, name="grp") as gi:
            wg = U.element_ptr(b, w, b.mul(gi, U.i64(geo.mg * g.depth)))
            channel0 = b.mul(gi, U.i64(geo.mg))
            og = U.element_ptr(b, out, b.mul(b.add(b.mul(n, U.i64(geo.m)), channel0),
                                             U.i64(oplane)))
            pack = _im2col_pack(geo, xp, b.mul(gi, U.i64(geo.cg * pplane)), starts, g.panel)
            emit_packed_gemm(b, g, wg, pack, og, panel, blocks)
            if has_bias:
                _add_bias(b, args[2], channel0, og, g.row_span(b, blocks), oplane)
    scratch.release()


def _add_bias(b: ir.IRBuilder, bias: ir.Value, channel0: ir.Value, out: ir.Value,
              rows: tuple[ir.Value, ir.Value], plane: int) -> None:
    """``out[r, :plane] += bias[channel0 + r]`` for ``r`` in ``rows``."""
    with U.for_range(b, rows[1], start=rows[0], name="bc") as r:
        value = U.load(b, bias, b.add(channel0, r))
        with U.for_range(b, plane, name="bp") as i:
            o = b.add(b.mul(r, U.i64(plane)), i)
            U.store(b, b.fadd(U.load(b, out, o), value), out, o)


def _im2col_pack(geo: _Geometry, xp: ir.Value, cbase: ir.Value, starts: ir.Value,
                 width: int) -> Pack:
    """The panel packer of :func:`_emit_conv_gemm`: ``panel[k * width + jj] =
    xpad[cbase + c * plane + tap offset + start(p)]`` with ``start(p)`` the offset of
    output pixel ``p``'s window (computed once per panel into ``starts``)."""
    pstr = U.c_strides(geo.work)
    step = [s * p for s, p in zip(geo.strides, pstr)]
    tap_step = [d * p for d, p in zip(geo.dilations, pstr)]
    ostr = U.c_strides(geo.out)

    def pack(b: ir.IRBuilder, panel: ir.Value, j0: ir.Value, cols: int, k0: ir.Value,
             depth: int) -> None:
        with U.for_range(b, cols, name="ps") as jj:
            pix = b.add(j0, jj)
            o = [b.urem(b.udiv(pix, U.i64(st)), U.i64(d)) for st, d in zip(ostr, geo.out)]
            U.store(b, _dot(b, o, step), starts, jj)
        with U.for_range(b, depth, name="pk") as kk:
            k = b.add(k0, kk)
            c = b.udiv(k, U.i64(geo.taps))
            tap = [b.urem(b.udiv(k, U.i64(st)), U.i64(d))
                   for st, d in zip(U.c_strides(geo.kernel), geo.kernel)]
            src = b.add(b.add(cbase, b.mul(c, U.i64(prod(geo.work)))),
                        _dot(b, tap, tap_step))
            row = b.mul(kk, U.i64(width))
            with U.for_range(b, cols, name="pj") as jj:
                v = U.load(b, xp, b.add(src, U.load(b, starts, jj)))
                U.store(b, v, panel, b.add(row, jj))
            if cols < width:
                with U.for_range(b, width, start=cols, name="pz") as jj:
                    U.store(b, U.f32(0.0), panel, b.add(row, jj))
    return pack


def _emit_conv(b: ir.IRBuilder, geo: _Geometry, args, padded: tuple[int, int, int],
               has_bias: bool) -> None:
    x, w, out = args[0], args[1], args[-1]
    scratch = Scratch(b)
    pplane = prod(padded)
    xp = scratch.alloc(U.F32, geo.c * pplane, name="xpad")
    U.fill(b, xp, geo.c * pplane, U.f32(0.0))
    plane, oplane = prod(geo.size), prod(geo.out)
    pstr, ostr = U.c_strides(padded), U.c_strides(geo.out)
    with U.for_range(b, geo.n, name="img") as n:
        _copy_padded(b, x, b.mul(n, U.i64(geo.c * plane)), xp, geo, padded)
        with U.for_range(b, geo.m, name="oc") as m:
            g = b.udiv(m, U.i64(geo.mg))
            obase = b.mul(b.add(b.mul(n, U.i64(geo.m)), m), U.i64(oplane))
            init = U.load(b, args[2], m) if has_bias else U.f32(0.0)
            with U.for_range(b, oplane, name="init") as i:
                U.store(b, init, out, b.add(obase, i))
            with U.for_range(b, geo.cg, name="ci") as ci, \
                    U.nested_range(b, geo.kernel, name="k") as tap:
                wv = U.load(b, w, b.add(b.mul(b.add(b.mul(m, U.i64(geo.cg)), ci),
                                              U.i64(geo.taps)),
                                        _dot(b, tap, U.c_strides(geo.kernel))))
                cbase = b.mul(b.add(b.mul(g, U.i64(geo.cg)), ci), U.i64(pplane))
                tap_off = _dot(b, tap, [d * s for d, s in zip(geo.dilations, pstr)])
                with U.nested_range(b, geo.out, name="o") as o:
                    src = b.add(b.add(cbase, tap_off),
                                _dot(b, o, [s * p for s, p in zip(geo.strides, pstr)]))
                    dst = b.add(obase, _dot(b, o, ostr))
                    acc = b.fadd(U.load(b, out, dst), b.fmul(wv, U.load(b, xp, src)),
                                 flags=("contract",))
                    U.store(b, acc, out, dst)
    scratch.release()


def _copy_padded(b: ir.IRBuilder, x: ir.Value, base: ir.Value, xp: ir.Value,
                 geo: _Geometry, padded: tuple[int, int, int]) -> None:
    """Image at ``x[base:]`` (``C x size``) into the padded buffer's interior."""
    pstr = U.c_strides(padded)
    inner = _dot(b, [U.i64(p) for p in geo.begin], pstr)
    with U.for_range(b, geo.c, name="cc") as c, \
            U.nested_range(b, geo.size, name="s") as idx:
        src = b.add(base, b.add(b.mul(c, U.i64(prod(geo.size))),
                                _dot(b, idx, U.c_strides(geo.size))))
        dst = b.add(b.add(b.mul(c, U.i64(prod(padded))), inner), _dot(b, idx, pstr))
        U.store(b, U.load(b, x, src), xp, dst)


def _dot(b: ir.IRBuilder, idx: Sequence[ir.Value], strides: Sequence[int]) -> ir.Value:
    total: ir.Value = U.i64(0)
    for i, s in zip(idx, strides):
        if s:
            total = b.add(total, b.mul(i, U.i64(s)))
    return total


# --------------------------------------------------------------------- ConvTranspose
def conv_transpose_pads(size: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                        dilations: Sequence[int], output_padding: Sequence[int],
                        pads: Sequence[int] | None, output_shape: Sequence[int] | None,
                        auto_pad: str) -> list[int]:
    """ONNX ConvTranspose's pads (begins, then ends): from ``output_shape`` or
    ``auto_pad`` SAME_* (the total padding split, the odd one at the end for
    SAME_UPPER, at the beginning otherwise, as onnxruntime does), else ``pads``."""
    sp = len(size)
    full = [s * (i - 1) + op + (k - 1) * d + 1
            for i, k, s, d, op in zip(size, kernel, strides, dilations, output_padding)]
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [i * s for i, s in zip(size, strides)]
    if output_shape is None:
        return list(pads) if pads else [0] * (2 * sp)
    total = [f - o for f, o in zip(full, output_shape)]
    upper = auto_pad == "SAME_UPPER"
    begins = [t // 2 if upper else t - t // 2 for t in total]
    return begins + [t - b for t, b in zip(total, begins)]


def conv_transpose_geometry(x: TensorSpec, w: TensorSpec, bias: TensorSpec | None = None,
                            strides: Sequence[int] | None = None,
                            pads: Sequence[int] | None = None,
                            dilations: Sequence[int] | None = None,
                            output_padding: Sequence[int] | None = None,
                            group: int = 1) -> _Geometry:
    """The checked geometry of :func:`build_conv_transpose_float`."""
    sp = x.ndim - 2
    strides, dilations = strides or [1] * sp, dilations or [1] * sp
    pads, output_padding = pads or [0] * (2 * sp), output_padding or [0] * sp
    _check("ConvTranspose", x, w, bias, sp,
           {"strides": strides, "dilations": dilations, "pads": [*pads[:sp], *[0] * sp]})
    n, c, mg = x.shape[0], x.shape[1], w.shape[1]
    if group < 1 or c % group or w.shape[0] != c:
        raise CpuKernelError(f"ConvTranspose: group {group} does not fit x {x} and w {w}")
    full = [s * (i - 1) + op + (k - 1) * d + 1 for i, k, s, d, op in
            zip(x.shape[2:], w.shape[2:], strides, dilations, output_padding)]
    out_sp = [f - pads[i] - pads[i + sp] for i, f in enumerate(full)]
    if any(o < 1 for o in out_sp):
        raise CpuKernelError(f"ConvTranspose: pads {list(pads)} leave no output of {full}")
    # A negative end pad (an output_shape past the full output) reads zeros past it.
    work = [max(f, p + o) for f, p, o in zip(full, pads, out_sp)]
    return _Geometry(n, c, mg * group, group, _three(x.shape[2:], 1), _three(w.shape[2:], 1),
                     _three(strides, 1), _three(dilations, 1), _three(pads[:sp], 0),
                     _three(out_sp, 1), tuple(out_sp), _three(work, 1))


def build_conv_transpose_float(x: TensorSpec, w: TensorSpec, bias: TensorSpec | None = None,
                               strides: Sequence[int] | None = None,
                               pads: Sequence[int] | None = None,
                               dilations: Sequence[int] | None = None,
                               output_padding: Sequence[int] | None = None, group: int = 1,
                               name: str = "conv_transpose") -> CpuKernel:
    """float32 ONNX ConvTranspose: ``x [N, C, *S]``, ``w [C, M/group, *K]``, optional
    ``bias [M]``; explicit ``pads`` (:func:`conv_transpose_pads` resolves output_shape
    and auto_pad into them; begins non-negative, ends may be negative: the output then
    runs past the full result, those elements being the bias) and ``output_padding``."""
    geo = conv_transpose_geometry(x, w, bias, strides, pads, dilations, output_padding, group)
    out = TensorSpec(geo.out_shape, "float32")
    inputs = (x, w) if bias is None else (x, w, bias)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", inputs, (out,))
    if out.size:
        _emit_conv_transpose(b, geo, fn.args, geo.work, bias is not None)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", inputs, (out,))


def _emit_conv_transpose(b: ir.IRBuilder, geo: _Geometry, args,
                         full: tuple[int, int, int], has_bias: bool) -> None:
    x, w, out = args[0], args[1], args[-1]
    scratch = Scratch(b)
    buf = scratch.alloc(U.F32, prod(full), name="full")
    plane, oplane = prod(geo.size), prod(geo.out)
    fstr, istr = U.c_strides(full), U.c_strides(geo.size)
    with U.for_range(b, geo.n, name="img") as n, U.for_range(b, geo.m, name="oc") as m:
        g, mm = b.udiv(m, U.i64(geo.mg)), b.urem(m, U.i64(geo.mg))
        U.fill(b, buf, prod(full), U.f32(0.0))
        with U.for_range(b, geo.cg, name="ci") as ci, \
                U.nested_range(b, geo.kernel, name="k") as tap:
            c = b.add(b.mul(g, U.i64(geo.cg)), ci)
            wv = U.load(b, w, b.add(b.mul(b.add(b.mul(c, U.i64(geo.mg)), mm),
                                          U.i64(geo.taps)),
                                    _dot(b, tap, U.c_strides(geo.kernel))))
            xbase = b.mul(b.add(b.mul(n, U.i64(geo.c)), c), U.i64(plane))
            tap_off = _dot(b, tap, [d * s for d, s in zip(geo.dilations, fstr)])
            with U.nested_range(b, geo.size, name="i") as i:
                dst = b.add(tap_off, _dot(b, i, [s * f for s, f in zip(geo.strides, fstr)]))
                acc = b.fadd(U.load(b, buf, dst),
                             b.fmul(wv, U.load(b, x, b.add(xbase, _dot(b, i, istr)))),
                             flags=("contract",))
                U.store(b, acc, buf, dst)
        init = U.load(b, args[2], m) if has_bias else None
        obase = b.mul(b.add(b.mul(n, U.i64(geo.m)), m), U.i64(oplane))
        begin = _dot(b, [U.i64(p) for p in geo.begin], fstr)
        with U.nested_range(b, geo.out, name="o") as o:
            v = U.load(b, buf, b.add(begin, _dot(b, o, fstr)))
            if init is not None:
                v = b.fadd(v, init)
            U.store(b, v, out, b.add(obase, _dot(b, o, U.c_strides(geo.out))))
    scratch.release()
