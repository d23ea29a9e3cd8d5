"""The intrinsic registry: every ALU operation is a registered :class:`Intrinsic`.

An intrinsic carries its opcode, its exact integer semantics in numpy (the
golden model the simulator runs), its timing entry, and slots that later layers
fill: a hardware hook the Amaranth ALU instantiates and the graph patterns the
compiler may lower to it. Built-ins go through the same :func:`register_alu_op`
a user calls from their own module::

    from tessera.isa import Intrinsic, register_alu_op
    register_alu_op(Intrinsic("ABSDIFF", 9, lambda a, b: np.abs(a - b)))

Semantics functions take ``a`` (the accumulator values at ``dst``) and ``b``
(the operand: accumulator values at ``src``, or the immediate turned into a
lane value by ``imm_to_operand``), both int64 arrays holding int32 values, and
return int64. The result is wrapped to the accumulator width (two's
complement), so an op that should saturate must do so itself. An op declaring
``reads_table`` also gets ``table``: the ALU table memory (``HwConfig.table_entries``
int8 entries, loaded by ``LOAD tbl``) as a flat int64 array; a config without that
memory leaves such ops out (:func:`alu_op_available`).

Plug-ins: a package that registers intrinsics names a callable in the
``tessera.intrinsics`` entry-point group (``[project.entry-points."tessera.intrinsics"]``
in its pyproject); the registry calls each once, the first time it is read. The
``hardware`` and ``patterns`` slots may hold a ``"module:attribute"`` reference instead
of the object, resolved by the layer that uses it (:func:`resolve`), so registering an
op imports neither Amaranth nor the compiler.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import RegistryError
from . import requant

#: 16 ALU opcodes; the built-ins use 0..7, the rest is free for extensions. The registry
#: owns the opcode space; the encoding sizes the ``alu_op`` field from it.
ALU_OP_BITS = 4

Semantics = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class AluTiming:
    """Timing of one ALU op (see docs/timing.md).

    ``ii_imm``/``ii_tensor``: cycles between consecutive row operations with an
    immediate or a tensor operand (a tensor operand needs a second accumulator
    read through the same port). ``latency``: cycles from issuing a row
    operation with an immediate to writing its result; with a tensor operand
    the result is written one cycle later (:data:`TENSOR_OPERAND_CYCLES`), the
    second read. An op whose result does not depend on ``a`` (``reads_dst``
    false, e.g. MOV) reads only the operand row: its tensor form is as fast as
    the immediate form. A row read fewer than ``hazard_distance`` operations
    after a write to it would see the old value.
    """

    ii_imm: int = 1
    ii_tensor: int = 2
    latency: int = 3
    reads_dst: bool = True

    def ii(self, use_imm: bool) -> int:
        return self.ii_imm if use_imm else self.ii_tensor

    def write_latency(self, use_imm: bool) -> int:
        """Cycles from issue to the result's write, for the immediate or the tensor form."""
        second_read = not use_imm and self.reads_dst
        return self.latency + TENSOR_OPERAND_CYCLES if second_read else self.latency

    def hazard_distance(self, use_imm: bool) -> int:
        """Operations between a write and the first read that sees it: every operation
        reads its rows (``src`` first) the cycle after it issues."""
        return -(-self.write_latency(use_imm) // self.ii(use_imm))


#: Extra cycles of the tensor form: the operand row is read in a second cycle.
TENSOR_OPERAND_CYCLES = 1


def _sign_extend(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def immediate_as_is(imm: int, imm_bits: int) -> int:
    """Default immediate decoding: the signed immediate is the operand value."""
    return imm


@dataclass(frozen=True)
class Intrinsic:
    """A tensor-ALU operation.

    ``hardware`` is the hook the Amaranth tensor ALU instantiates per lane
    (filled by the hardware layer); ``patterns`` are the graph patterns the
    compiler may lower to this op (filled by the compiler layer). Either may be a
    ``"module:attribute"`` reference (module doc). ``reads_table``: the semantics take
    the ALU table memory as a third argument, and the op exists only on configs with
    one.
    """

    name: str
    opcode: int
    semantics: Semantics
    timing: AluTiming = AluTiming()
    imm_to_operand: Callable[[int, int], int] = immediate_as_is
    doc: str = ""
    hardware: Any = None
    patterns: Any = ()
    reads_table: bool = False

    def apply(self, a: np.ndarray, b: np.ndarray, acc_bits: int = 32,
              table: np.ndarray | None = None) -> np.ndarray:
        """``op(a, b)`` (``op(a, b, table)`` for an op that ``reads_table``) wrapped to
        ``acc_bits`` two's complement (int64 result)."""
        args = [a.astype(np.int64), b.astype(np.int64)]
        if self.reads_table:
            if table is None:
                raise RegistryError(f"ALU op {self.name} reads the table memory: pass table=")
            args.append(np.asarray(table, dtype=np.int64))
        return wrap(np.asarray(self.semantics(*args), dtype=np.int64), acc_bits)


def alu_op_available(op: Intrinsic | None, config: Any) -> bool:
    """Whether ``config``'s tensor ALU has ``op``: it is registered and, if it reads the
    table memory, the config has one."""
    return op is not None and (not op.reads_table or config.table_entries > 0)


def resolve(ref: Any) -> Any:
    """A hook slot's object: ``ref`` itself, or the attribute a ``"module:attribute"``
    string names (imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"cannot resolve the hook reference {ref!r}: {exc}") from None


def wrap(values: np.ndarray, bits: int) -> np.ndarray:
    """Two's-complement wrap-around of int64 values to ``bits`` bits."""
    half = 1 << (bits - 1)
    return ((values + half) & ((1 << bits) - 1)) - half


def saturate(values: np.ndarray, bits: int) -> np.ndarray:
    """Clamp values to the signed range of ``bits`` bits."""
    return np.clip(values, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)


class IntrinsicRegistry:
    """Opcode- and name-indexed intrinsics of one functional unit."""

    def __init__(self, unit: str, opcode_bits: int) -> None:
        self.unit = unit
        self.opcode_bits = opcode_bits
        self._by_opcode: dict[int, Intrinsic] = {}
        self._plugin_group: str | None = None

    def plugins_from(self, group: str) -> None:
        """Load the plug-ins of entry-point ``group`` the first time the registry is read."""
        self._plugin_group = group

    def load_plugins(self) -> None:
        """Call every registration function of the entry-point group, once (module doc).

        A plug-in that fails to load is an error naming it: a half-registered ISA would
        make programs decode differently from what their compiler meant."""
        group, self._plugin_group = self._plugin_group, None
        if group is None:
            return
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            try:
                ep.load()()
            except Exception as exc:
                raise RegistryError(f"{self.unit} plug-in {ep.name!r} ({ep.value}) failed to "
                                    f"register: {exc}") from exc

    @property
    def _ops(self) -> dict[int, Intrinsic]:
        self.load_plugins()
        return self._by_opcode

    def register(self, op: Intrinsic, *, replace: bool = False) -> Intrinsic:
        limit = 1 << self.opcode_bits
        if not 0 <= op.opcode < limit:
            raise RegistryError(f"{self.unit} opcode of {op.name} must be in [0, {limit - 1}], "
                                f"not {op.opcode}")
        if not op.name.isidentifier() or op.name.upper() != op.name:
            raise RegistryError(f"{self.unit} op name must be an upper-case identifier, "
                                f"not {op.name!r}")
        named = self.by_name(op.name, default=None)
        clash = self._ops.get(op.opcode)
        if not replace:
            if named is not None:
                raise RegistryError(f"{self.unit} op {op.name} is already registered "
                                    f"(opcode {named.opcode}); pass replace=True to redefine it")
            if clash is not None:
                raise RegistryError(f"{self.unit} opcode {op.opcode} is taken by {clash.name}; "
                                    f"free opcodes: {self.free_opcodes()}")
        for old in (named, clash):
            if old is not None:
                self._ops.pop(old.opcode, None)
        self._ops[op.opcode] = op
        return op

    def unregister(self, name: str) -> None:
        op = self.by_name(name)
        del self._ops[op.opcode]

    def get(self, opcode: int) -> Intrinsic | None:
        return self._ops.get(opcode)

    def by_name(self, name: str, default: Any = KeyError) -> Intrinsic:
        for op in self._ops.values():
            if op.name == name.upper():
                return op
        if default is KeyError:
            raise KeyError(f"no {self.unit} op named {name!r}; registered: {self.names()}")
        return default

    def names(self) -> list[str]:
        return [op.name for op in self]

    def available(self, config: Any) -> list[Intrinsic]:
        """The registered ops ``config``'s tensor ALU has (:func:`alu_op_available`)."""
        return [op for op in self if alu_op_available(op, config)]

    def free_opcodes(self) -> list[int]:
        return [i for i in range(1 << self.opcode_bits) if i not in self._ops]

    def __iter__(self) -> Iterator[Intrinsic]:
        return iter(sorted(self._ops.values(), key=lambda op: op.opcode))

    def __contains__(self, key: str | int) -> bool:
        """``"MAX" in ALU_OPS`` or ``1 in ALU_OPS`` (by name or by opcode)."""
        if isinstance(key, int):
            return key in self._ops
        return self.by_name(key, default=None) is not None

    @contextmanager
    def temporarily(self, op: Intrinsic) -> Iterator[Intrinsic]:
        """Register ``op`` for the duration of a ``with`` block (tests, experiments)."""
        self.register(op)
        try:
            yield op
        finally:
            self.unregister(op.name)


#: The tensor ALU's registry.
ALU_OPS = IntrinsicRegistry("ALU", ALU_OP_BITS)


def register_alu_op(op: Intrinsic, *, replace: bool = False) -> Intrinsic:
    """Register a tensor-ALU op (from any module; no tessera file needs editing)."""
    return ALU_OPS.register(op, replace=replace)


# --------------------------------------------------------------- built-ins
CLIP_HALF_BITS = 16


def clip_operand(lo: int, hi: int) -> int:
    """The tensor-operand lane value of CLIP's bounds: ``lo`` in bits 0..15, ``hi`` in 16..31."""
    for name, v in (("lo", lo), ("hi", hi)):
        if not -(1 << 15) <= v < 1 << 15:
            raise RegistryError(f"CLIP {name} bound must fit 16 signed bits, not {v}")
    return _sign_extend((lo & 0xFFFF) | (hi & 0xFFFF) << 16, 32)


def clip_imm(lo: int, hi: int, imm_bits: int) -> int:
    """The immediate of CLIP with bounds ``lo``/``hi``: two signed halves of the immediate."""
    half = imm_bits // 2
    for name, v in (("lo", lo), ("hi", hi)):
        if not -(1 << (half - 1)) <= v < 1 << (half - 1):
            raise RegistryError(f"CLIP {name} bound must fit {half} signed bits with a "
                                f"{imm_bits}-bit immediate, not {v}; use a tensor operand")
    return _sign_extend((lo & ((1 << half) - 1)) | (hi & ((1 << half) - 1)) << half, imm_bits)


def _clip_imm_to_operand(imm: int, imm_bits: int) -> int:
    half = imm_bits // 2
    return clip_operand(_sign_extend(imm, half), _sign_extend(imm >> half, half))


def _clip(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lo = ((b & 0xFFFF) ^ 0x8000) - 0x8000
    hi = (((b >> 16) & 0xFFFF) ^ 0x8000) - 0x8000
    return np.minimum(np.maximum(a, lo), hi)


def _shr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    right = np.right_shift(a, np.clip(b, 0, 31))
    left = np.left_shift(a, np.clip(-b, 0, 32))  # wraps to zero at 32 once wrapped to int32
    return np.where(b >= 0, right, left)


def _mov(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return b


_FAST = AluTiming(ii_imm=1, ii_tensor=2, latency=3)

for _op in (
    Intrinsic("MIN", 0, np.minimum, _FAST, doc="min(a, b)"),
    Intrinsic("MAX", 1, np.maximum, _FAST, doc="max(a, b); MAX 0 is ReLU"),
    Intrinsic("ADD", 2, np.add, _FAST, doc="a + b, wrapping"),
    Intrinsic("SUB", 3, np.subtract, _FAST, doc="a - b, wrapping"),
    Intrinsic("SHR", 4, _shr, _FAST,
              doc="arithmetic a >> b; a negative b shifts left (wrapping); amounts saturate "
                  "at 31 right and 32 left"),
    Intrinsic("MUL", 5, np.multiply, AluTiming(ii_imm=1, ii_tensor=2, latency=4),
              doc="a * b, wrapping (low 32 bits of the product)"),
    Intrinsic("CLIP", 6, _clip, _FAST, imm_to_operand=_clip_imm_to_operand,
              doc="min(max(a, lo), hi); operand lane = lo | hi << 16 (see clip_operand), "
                  "immediate = lo | hi << imm_bits/2 (see clip_imm)"),
    Intrinsic("MOV", 8, _mov, AluTiming(ii_imm=1, ii_tensor=1, latency=3,
                                                  reads_dst=False),
              doc="b: copies the operand row (tensor form, one row per cycle: it reads only "
                  "src) or fills with the immediate; initialises accumulators with a bias"),
    Intrinsic("REQUANT", 7, requant.requantize_packed, AluTiming(ii_imm=1, ii_tensor=2, latency=6),
              doc="onnxruntime's float32 requantization, bit-exact, without the zero point "
                  "and clamp (follow with ADD zp and CLIP); operand lane = M | shift << 24 "
                  "(see requant.pack_params), per channel; as an immediate it needs a "
                  "32-bit immediate field"),
):
    register_alu_op(_op)

#: After the built-ins, so a plug-in sees them (and cannot take their opcodes).
ALU_OPS.plugins_from("tessera.intrinsics")
