"""Compiler rules from the intrinsic registry: which ALU intrinsics implement a graph node.

Every :class:`~tessera.isa.Intrinsic` may carry ``patterns``: :class:`Pattern` objects,
each a matcher over one kind of fused integer node (``node_op``, e.g. ``QLookup`` or
``QAdd``) and its lowering to epilogue stages (:mod:`.ops`): the ALU steps, with any
constant tables, that compute the node's output from the int8 value of one of its inputs
(the *value* operand) held in the accumulator. :func:`match_node` asks every intrinsic the
config's tensor ALU has (``ALU_OPS.available(config)``) and takes the cheapest exact
lowering, in ALU cycles per accumulator row, then the one loading fewer tables; an
approximate lowering only when the node asks for one (an ``approximate`` attribute, set by
:func:`~.relu_sum.mark_approximate_activations`) and no exact one exists. The stages then
join the epilogue of the operator writing the value operand (a convolution's
requantization, then the table: :func:`~.lower.fuse_into_producer`), or run as an
elementwise operator of their own (:func:`~.lower.lower_node`).

Built-in intrinsics take the same path: :func:`attach_builtin_patterns` gives ADD the
fixed-point QAdd, CLIP the lookups that are only a clamp, MAX the ReLU-sum approximation
(:mod:`.builtin_patterns`). A user's intrinsic registered from their own module with
``patterns=(Pattern(...),)`` is picked up by ``tessera.compile`` without editing any
Tessera file; unregistered, or on a config without it, the node falls back to what was
used before (another intrinsic's pattern, or the CPU). docs/extending.md walks through
one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tessera.config import HwConfig
from tessera.errors import CompileError
from tessera.isa import ALU_OPS, Intrinsic, resolve

from ..frontend.graph import Graph, Node
from .ops import Residual, Stage

__all__ = ["BYTES", "Match", "Pattern", "PatternContext", "attach_builtin_patterns",
           "match_node", "patterns_of"]


@dataclass(frozen=True)
class PatternContext:
    """What a pattern's lowering sees: the node, its graph, the config, and which input
    is the value operand (the one already in the accumulator)."""

    graph: Graph
    node: Node
    config: HwConfig
    value: int = 0

    def const(self, index: int) -> np.ndarray | None:
        """The constant data of input ``index`` (``None``: not a constant)."""
        name = self.node.inputs[index] if index < len(self.node.inputs) else ""
        return self.graph.const(name) if name else None

    def shape(self, index: int = 0) -> tuple[int, ...]:
        return self.graph.value(self.node.inputs[index]).shape

    def lookup_table(self) -> np.ndarray:
        """The 256 int8 entries of a ``QLookup``, indexed by the input's byte (entry k is
        the output for the int8 value whose byte is k; :data:`BYTES` lists those values).
        The accelerator runs lookups int8 -> int8 (uint8 tensors are shifted by then)."""
        table = self.const(1)
        dtypes = {self.graph.value(t).dtype for t in (self.node.inputs[0], self.node.outputs[0])}
        if table is None or table.size != 256 or dtypes != {"int8"}:
            raise CompileError(f"a lookup runs on the accelerator as int8 -> int8 with a "
                               f"constant 256-entry table, not {'/'.join(sorted(dtypes))}")
        return np.asarray(table, dtype=np.int8).reshape(256)


#: Every int8 value in the order of a byte-indexed table: ``BYTES[k]`` has the byte ``k``.
BYTES = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.int64)


@dataclass(frozen=True)
class Pattern:
    """A graph pattern an intrinsic implements.

    ``lower(ctx)`` returns the stages computing the node's output from its value operand
    ``ctx.value``, or ``None`` when the node is not this pattern's case; it raises
    :class:`CompileError` to say why a node it recognises cannot run (the reason the
    placement reports). ``operands``: the inputs that may be the value operand (a binary
    op's either input). ``approximate``: the stages only approximate the node.
    """

    node_op: str
    lower: Callable[[PatternContext], Sequence[Stage] | None]
    operands: tuple[int, ...] = (0,)
    approximate: bool = False
    doc: str = ""
    #: ``describe(ctx, stages) -> str``: what the placement report says about the lowering
    #: (an approximation's error, say); ``None``: the intrinsic's name and ``doc``.
    describe: Callable[[PatternContext, tuple[Stage, ...]], str] | None = None


@dataclass(frozen=True)
class Match:
    """The lowering :func:`match_node` chose: whose pattern, its stages and cost."""

    intrinsic: str
    pattern: Pattern
    value: int
    stages: tuple[Stage, ...]
    cycles_per_row: int
    tables: int

    @property
    def residuals(self) -> tuple[str, ...]:
        return tuple(s.tensor for s in self.stages if isinstance(s, Residual))

    def describe(self, graph: Graph, node: Node, config: HwConfig) -> str:
        """The placement report's words for this lowering."""
        if self.pattern.describe is not None:
            ctx = PatternContext(graph, node, config, self.value)
            return self.pattern.describe(ctx, self.stages)
        what = f": {self.pattern.doc}" if self.pattern.doc else ""
        return f"{self.intrinsic} pattern{what}, {self.cycles_per_row} ALU cycle(s) per row"


def patterns_of(op: Intrinsic) -> tuple[Pattern, ...]:
    """The patterns of ``op`` (a ``"module:attribute"`` reference resolved)."""
    found = resolve(op.patterns) or ()
    bad = [p for p in found if not isinstance(p, Pattern)]
    if bad:
        raise CompileError(f"ALU op {op.name}: patterns must be Pattern objects, not {bad[0]!r}")
    return tuple(found)


def match_node(graph: Graph, node: Node, config: HwConfig, value: int | None = None
               ) -> Match | None:
    """The cheapest lowering of ``node`` by a pattern of the config's intrinsics (module
    doc), with ``value`` as the value operand when given; ``None`` when none applies.

    Raises :class:`CompileError` with the patterns' reasons when some recognised the node
    but none could lower it.
    """
    attach_builtin_patterns()
    found: list[Match] = []
    reasons: list[str] = []
    for op in ALU_OPS.available(config):
        for pattern in patterns_of(op):
            if pattern.node_op != node.op or (pattern.approximate
                                              and not node.attrs.get("approximate")):
                continue
            for operand in pattern.operands:
                # The value operand is a computed tensor (a constant has no producer whose
                # epilogue could hold the stages, nor rows to start from).
                if (value is not None and operand != value
                        or graph.value(node.inputs[operand]).is_const):
                    continue
                try:
                    stages = pattern.lower(PatternContext(graph, node, config, operand))
                except CompileError as exc:
                    reasons.append(f"{op.name}: {exc}")
                    continue
                if stages is not None:
                    found.append(_costed(op.name, pattern, operand, tuple(stages), graph, node,
                                         config))
    if found:
        return min(found, key=lambda m: (m.pattern.approximate, m.cycles_per_row, m.tables))
    if reasons:
        raise CompileError("; ".join(reasons), op=node.name)
    return None


def _costed(name: str, pattern: Pattern, value: int, stages: tuple[Stage, ...], graph: Graph,
            node: Node, config: HwConfig) -> Match:
    """A :class:`Match` with the ALU cycles per row its stages take once lowered."""
    from .epilogue import plan_epilogue

    shape = graph.value(node.outputs[0]).shape
    channels = shape[1] if len(shape) > 1 else 1
    plan = plan_epilogue(stages, channels=channels, config=config, acc_range=(-128, 127),
                         where=f"{node.op} node {node.name!r}")
    cycles = 0
    for st in plan.steps:
        op = ALU_OPS.by_name("ADD" if st.kind == "residual" else st.op)
        cycles += op.timing.ii(st.kind != "residual" and st.imm is not None)
    return Match(name, pattern, value, stages, cycles, len(plan.tables))


#: The built-in ops' patterns, by op name, as references into :mod:`.builtin_patterns`
#: (resolved when first matched, so this module imports nothing it does not need).
_BUILTIN_PATTERNS = {"ADD": "tessera.compiler.accel.builtin_patterns:ADD_PATTERNS",
                     "CLIP": "tessera.compiler.accel.builtin_patterns:CLIP_PATTERNS",
                     "MAX": "tessera.compiler.accel.builtin_patterns:MAX_PATTERNS"}


def attach_builtin_patterns() -> None:
    """Fill the ``patterns`` slot of the built-in ALU ops (idempotent; an op a user
    re-registered with patterns of its own keeps them)."""
    for name, ref in _BUILTIN_PATTERNS.items():
        op = ALU_OPS.by_name(name, default=None)
        if op is not None and not op.patterns:
            ALU_OPS.register(dataclasses.replace(op, patterns=ref), replace=True)
