"""A quantized cell specialised for one kind of chunk of nodes, ready to lower.

A chunk of a batch is a *variant*: whether its nodes have children (a leaf chunk reads
none: every :func:`~.cell.child` is zero) and whether any of them has an input (else
every :func:`~.cell.node_input` is zero). Zeros fold away with the int8 meaning
unchanged (:mod:`.reference`): a linear map drops the terms that read zeros (a term's
contribution to the int32 sum is 0), ``a + 0`` is ``a`` rescaled (``R(0) = 0``), ``a *
0`` is 0, and an operation on constants is the constant it evaluates to. That is how
leaves are specialised -- TreeLSTM's leaves keep three of their eleven GEMMs.

The result is a graph of :class:`Value` s: gathered rows (the node inputs and children's
states a chunk reads by DMA), constants, linear maps (GEMMs, with a following sigmoid
or tanh fused into their epilogue when they are its only reader) and ALU operations.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cell import Expr, topological
from .quantize import QuantizedCell
from .reference import value_shape


@dataclass(frozen=True)
class Variant:
    """The kind of chunk a program template serves."""

    children: bool
    inputs: bool

    @property
    def key(self) -> str:
        return ("inner" if self.children else "leaf") + ("+x" if self.inputs else "")


@dataclass(eq=False)
class Value:
    """One per-node vector (or matrix) of a specialised cell.

    ``kind``: ``gather`` (``source`` ``"input"`` or a state name, ``slot``), ``const``
    (``const``: int8 values), ``linear`` (``terms``: int8 matrices and their
    arguments; ``table``: a fused activation), ``mlinear`` (the same on per-node
    matrices, from the left), ``matvec`` (a child's matrix times a vector) or ``alu``
    (``op`` and ``args``).
    """

    kind: str
    width: int
    expr: Expr | None = None
    args: list["Value"] = field(default_factory=list)
    op: str = ""
    source: str = ""
    slot: int = 0
    const: np.ndarray | None = None
    terms: list[np.ndarray] = field(default_factory=list)
    bias: np.ndarray | None = None
    multipliers: list[float] = field(default_factory=list)
    table: np.ndarray | None = None
    #: Rows per node (1: a vector; a matrix value's row count).
    rows: int = 1

    @property
    def is_zero(self) -> bool:
        return self.kind == "const" and not np.any(self.const)

    @property
    def label(self) -> str:
        if self.kind == "gather":
            return f"{self.source}[{self.slot}]" if self.source != "input" else "input"
        return self.expr.label if self.expr is not None else self.kind


@dataclass
class Specialized:
    """Values in evaluation order, and the value of each state."""

    values: list[Value]
    states: dict[str, Value]


def _const(e: Expr, values) -> Value:
    shape = value_shape(e, 1)[1:]
    return Value("const", e.width, rows=e.rows,
                 const=np.asarray(values, dtype=np.int64).reshape(shape))


def _value_of(a: Value) -> np.ndarray:
    """A constant argument's values for one node (int_op's batch of 1)."""
    return a.const[None]


def _fold_linear(q: QuantizedCell, e: Expr, args: list[Value]) -> Value:
    keep = [(w, a) for w, a in zip(q.weights[e.uid], args) if not a.is_zero]
    if all(a.kind == "const" for _, a in keep):
        return _const(e, q.int_op(e, [_value_of(a) for a in args]))
    return Value(e.op, e.width, e, [a for _, a in keep], rows=e.rows, terms=[w for w, _ in keep],
                 bias=q.bias[e.uid], multipliers=q.multipliers[e.uid])


def _fold(q: QuantizedCell, e: Expr, args: list[Value]) -> Value:
    """The value of ``e`` given its arguments' (folding zeros and constants)."""
    if e.op in ("linear", "mlinear"):
        return _fold_linear(q, e, args)
    if all(a.kind == "const" for a in args):
        return _const(e, q.int_op(e, [_value_of(a) for a in args]))
    m = q.multipliers.get(e.uid, [])
    if e.op in ("mul", "matvec") and any(a.is_zero for a in args):
        return _const(e, np.zeros(value_shape(e, 1)[1:]))
    if e.op == "matvec":
        return Value("matvec", e.width, e, list(args), multipliers=list(m))
    if e.op in ("add", "sub") and args[1].is_zero:
        return Value("alu", e.width, e, [args[0]], op="rescale", multipliers=[m[0]])
    if e.op == "add" and args[0].is_zero:
        return Value("alu", e.width, e, [args[1]], op="rescale", multipliers=[m[1]])
    table = q.tables.get(e.uid)
    return Value("alu", e.width, e, list(args), op=e.op, multipliers=list(m), table=table)


def specialize(q: QuantizedCell, variant: Variant) -> Specialized:
    """``q``'s cell for chunks of ``variant``: zeros folded, activations fused."""
    env: dict[int, Value] = {}
    for e in q.cell.exprs:
        if e.op == "input":
            env[e.uid] = (Value("gather", e.width, e, source="input") if variant.inputs
                          else _const(e, np.zeros(e.width)))
        elif e.op == "child":
            env[e.uid] = (Value("gather", e.width, e, rows=e.rows, source=e.state, slot=e.slot)
                          if variant.children else _const(e, np.zeros(value_shape(e, 1)[1:])))
        else:
            env[e.uid] = _fold(q, e, [env[a.uid] for a in e.args])
    states = {s: env[e.uid] for s, e in q.cell.states.items()}
    values = _reachable(list(states.values()))
    _fuse_activations(values, states)
    return Specialized(_reachable(list(states.values())), states)


def _reachable(roots: list[Value]) -> list[Value]:
    """Values ``roots`` depend on, arguments first, each once."""
    return topological(roots, key=id)


def _fuse_activations(values: list[Value], states: dict[str, Value]) -> None:
    """A sigmoid/tanh whose argument is a linear map read by nothing else becomes that
    map's epilogue: the activation takes over the map's place (its ``table``)."""
    readers: dict[int, int] = {}
    for v in values:
        for a in v.args:
            readers[id(a)] = readers.get(id(a), 0) + 1
    stored = {id(v) for v in states.values()}
    for v in values:
        if v.kind != "alu" or v.op not in ("sigmoid", "tanh"):
            continue
        lin = v.args[0]
        if (lin.kind == "linear" and lin.table is None and readers.get(id(lin)) == 1
                and id(lin) not in stored):
            v.kind, v.args, v.terms = "linear", lin.args, lin.terms
            v.bias, v.multipliers = lin.bias, lin.multipliers
