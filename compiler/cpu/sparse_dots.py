"""The byte dot product of the int8 N:M kernels in fours (:mod:`.sparse`): portable in
the kernel IR, specialised for the host when the IR is compiled.

A kernel's IR is stored in the model file and JIT-compiled on whatever host runs the
model (this machine, an AVX2 laptop, the board's ARM CPU), so it must not name one
CPU's instructions: LLVM aborts the whole process on an intrinsic its target lacks.
:func:`dot4` therefore calls a helper of the kernel's module, ``tessera.dot4.<lanes>``
(internal, always inlined), whose body is plain IR arithmetic: right everywhere (the
bytes widened to int16 and multiplied-added in pairs like the int8 kernels' pairs,
:func:`madd`), but LLVM does not form ``vpdpbusd`` from it. Where the host has byte dot
products (:func:`.sparse_layout.host_byte_dots`: AVX512-VNNI), the JIT passes the IR through
:func:`specialize_for_host` before optimising it, which swaps each helper's definition
for one calling ``llvm.x86.avx512.vpdpbusd`` (64 multiply-adds per instruction).
"""
from __future__ import annotations

import re
from typing import Callable

import llvmlite.ir as ir

from . import irutil as U
from .sparse_layout import host_byte_dots

__all__ = ["dot4", "madd", "shuffle_mask", "specialize_for_host"]

_I16 = ir.IntType(16)
_HELPER = "tessera.dot4.{}"
_INTRINSIC = "llvm.x86.avx512.vpdpbusd.{}"
#: A helper's definition in a module's text as llvmlite writes it: the ``define`` line,
#: then the body up to the first line that is a closing brace alone.
_DEFINITION = re.compile(r'^define [^\n]*@"tessera\.dot4\.(\d+)"\(.*?^}$', re.M | re.S)


def shuffle_mask(indices) -> ir.Constant:
    """A ``shufflevector`` mask taking the elements ``indices``."""
    indices = list(indices)
    return ir.Constant(ir.VectorType(U.I32, len(indices)), indices)


def dot4(b: ir.IRBuilder, acc: ir.Value, x: ir.Value, w: ir.Value) -> ir.Value:
    """``acc`` plus, per int32 lane ``q``, ``sum_i x[4q + i] * w[4q + i]`` of unsigned
    bytes ``x`` and signed bytes ``w`` (int32 sums wrap): a call of the module's helper
    for ``acc``'s width, defined on first use with the portable body."""
    lanes = acc.type.count
    fn = b.module.globals.get(_HELPER.format(lanes)) or _define(b.module, lanes, _plain_sums)
    return b.call(fn, [acc, x, w])


def specialize_for_host(text: str) -> str:
    """``text``, a module's LLVM IR, for this host: where it has byte dot products, each
    :func:`dot4` helper's definition replaced by one calling ``vpdpbusd``. Unchanged
    elsewhere, for IR without the helpers and for IR already specialised."""
    if '@"tessera.dot4.' not in text or not host_byte_dots():
        return text
    return _DEFINITION.sub(_vnni_definition, text)


def _define(module: ir.Module, lanes: int, body: Callable) -> ir.Function:
    """The helper for ``lanes`` int32 lanes in ``module``, its result ``body(b, acc, x, w)``."""
    acc_ty, bytes_ty = ir.VectorType(U.I32, lanes), ir.VectorType(U.I8, 4 * lanes)
    fn = ir.Function(module, ir.FunctionType(acc_ty, [acc_ty, bytes_ty, bytes_ty]),
                     name=_HELPER.format(lanes))
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(body(b, *fn.args))
    return fn


def _plain_sums(b: ir.IRBuilder, acc: ir.Value, x: ir.Value, w: ir.Value) -> ir.Value:
    """The bytes widened to int16 (``x`` zero-, ``w`` sign-extended: the products fit
    int16, a pair's sum does not), adjacent products summed in int32 (:func:`madd`,
    x86 ``vpmaddwd``), then adjacent pairs added to ``acc``."""
    lanes = acc.type.count
    wide = ir.VectorType(_I16, 4 * lanes)
    p = madd(b, b.zext(x, wide), b.sext(w, wide))
    return b.add(acc, b.add(b.shuffle_vector(p, p, shuffle_mask(range(0, 2 * lanes, 2))),
                            b.shuffle_vector(p, p, shuffle_mask(range(1, 2 * lanes, 2)))))


def madd(b: ir.IRBuilder, x: ir.Value, w: ir.Value) -> ir.Value:
    """Lane ``q``: ``x[2q] * w[2q] + x[2q+1] * w[2q+1]`` in int32 (int16 operands)."""
    lanes = x.type.count
    wide = ir.VectorType(U.I32, lanes)
    p = b.mul(b.sext(x, wide), b.sext(w, wide), flags=["nsw"])
    return b.add(b.shuffle_vector(p, p, shuffle_mask(range(0, lanes, 2))),
                 b.shuffle_vector(p, p, shuffle_mask(range(1, lanes, 2))))


def _vnni_sums(b: ir.IRBuilder, acc: ir.Value, x: ir.Value, w: ir.Value) -> ir.Value:
    """The same sums in one x86 ``vpdpbusd`` (the non-saturating form: sums wrap)."""
    ty = acc.type
    name = _INTRINSIC.format(32 * ty.count)
    fn = b.module.globals.get(name) or ir.Function(b.module, ir.FunctionType(ty, [ty] * 3),
                                                   name=name)
    return b.call(fn, [acc, b.bitcast(x, ty), b.bitcast(w, ty)])


def _vnni_definition(match: re.Match) -> str:
    """The ``vpdpbusd`` helper and the intrinsic's declaration, in place of ``match``
    (returned as is if it already is that helper)."""
    lanes = int(match.group(1))
    intrinsic = _INTRINSIC.format(32 * lanes)
    if intrinsic in match.group(0):
        return match.group(0)
    module = ir.Module()
    helper = _define(module, lanes, _vnni_sums)
    return f"{helper}\n{module.globals[intrinsic]}".rstrip("\n")
