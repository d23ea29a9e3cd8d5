"""The cell vocabulary: what one node of a recursive model computes.

A cell is a small expression DAG over per-node vectors. Leaves of the DAG are the
node's own input (:func:`node_input`, a row of the caller's input matrix, zero for a
node without one) and its children's states (:func:`child`, zero for an absent
child); the operations are linear maps (:func:`linear`, any number of ``(W, x)`` terms
and a bias), elementwise ``+``, ``-``, ``*`` and the activations :func:`sigmoid`,
:func:`tanh`, :func:`relu`. A :class:`Cell` names the expressions that become the
node's new states (``h``, or ``h`` and ``c`` for an LSTM), the structure kind
(``sequence``, ``tree``, ``dag``) and the declared maximum number of children::

    x, h0, h1 = node_input(E), child("h", 0, H), child("h", 1, H)
    cell = Cell("TreeFC", "tree", 2, {"h": tanh(linear((W, x), (Wl, h0), (Wr, h1), bias=b))})

Every expression has a float meaning (numpy, :mod:`.reference`) and, once quantized
(:mod:`.quantize`), an exact int8 meaning the accelerator reproduces bit for bit.
A child-sum model sums its children with :func:`child_sum`; an N-ary one gives each
slot its own weights. Weights are float numpy arrays ``(out, in)``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from tessera.errors import CompileError

#: Elementwise operations and activations, by expression ``op``.
BINARY = ("add", "sub", "mul")
UNARY = ("sigmoid", "tanh", "relu", "rescale")
_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Expr:
    """One per-node vector of the cell (identity is the object: a shared sub-expression
    is computed once)."""

    op: str
    width: int
    args: tuple["Expr", ...] = ()
    #: Rows per node: 1 for a vector, the row count of a matrix value (MV-RNN).
    rows: int = 1
    #: ``child``: the state read and the child slot.
    state: str = ""
    slot: int = 0
    #: ``linear``: one ``(width, arg.width)`` matrix per argument, and the bias.
    weights: tuple[np.ndarray, ...] = ()
    bias: np.ndarray | None = None
    #: A stable number for messages and dictionaries of per-expression data.
    uid: int = field(default_factory=lambda: next(_ids))

    def __add__(self, other: "Expr") -> "Expr":
        return _binary("add", self, other)

    def __sub__(self, other: "Expr") -> "Expr":
        return _binary("sub", self, other)

    def __mul__(self, other: "Expr") -> "Expr":
        return _binary("mul", self, other)

    @property
    def label(self) -> str:
        """``linear#12``, ``child(h,1)#3``: how messages name the expression."""
        what = f"child({self.state},{self.slot})" if self.op == "child" else self.op
        return f"{what}#{self.uid}"


def _binary(op: str, a: Expr, b: Expr) -> Expr:
    if (a.rows, a.width) != (b.rows, b.width):
        raise CompileError(f"{op} of {a.label} ({a.rows}x{a.width}) and {b.label} "
                           f"({b.rows}x{b.width}): elementwise operands need the same shape")
    if a.rows > 1:
        raise CompileError(f"{op} of matrices {a.label} and {b.label}: elementwise operations "
                           "take vectors")
    return Expr(op, a.width, (a, b))


def node_input(width: int) -> Expr:
    """The node's input row (zero for a node without an input)."""
    return Expr("input", int(width))


def child(state: str, slot: int, width: int) -> Expr:
    """State ``state`` of the node's child in ``slot`` (zero when the node has no such child)."""
    return Expr("child", int(width), state=state, slot=int(slot))


def child_sum(state: str, width: int, max_children: int) -> Expr:
    """The sum of every child's ``state`` (child-sum models)."""
    total = child(state, 0, width)
    for k in range(1, max_children):
        total = total + child(state, k, width)
    return total


def child_matrix(state: str, slot: int, size: int) -> Expr:
    """Matrix state ``state`` (``size x size``) of the node's child in ``slot`` (zero when
    absent)."""
    return Expr("child", int(size), rows=int(size), state=state, slot=int(slot))


def matvec(m: Expr, x: Expr) -> Expr:
    """``m @ x``: a per-node matrix (a child's matrix state) times a vector."""
    if m.rows <= 1 or x.rows != 1 or m.width != x.width:
        raise CompileError(f"matvec of {m.label} ({m.rows}x{m.width}) and {x.label} "
                           f"({x.rows}x{x.width}): needs a matrix and a vector of its width")
    return Expr("matvec", m.rows, (m, x))


def left_linear(*terms: tuple[np.ndarray, Expr], bias: np.ndarray) -> Expr:
    """``sum(W @ M for W, M in terms) + bias`` on per-node matrices ``M`` (MV-RNN's
    composition); ``bias`` is a matrix of the result's shape."""
    mats = tuple(np.asarray(w, dtype=np.float64) for w, _ in terms)
    if not terms or any(m.rows <= 1 for _, m in terms):
        raise CompileError("left_linear needs (W, matrix) terms")
    out, cols = mats[0].shape[0], terms[0][1].width
    for w, (_, m) in zip(mats, terms):
        if w.shape != (out, m.rows) or m.width != cols:
            raise CompileError(f"left_linear: weight {w.shape} for {m.label} "
                               f"({m.rows}x{m.width}); expected ({out}, {m.rows}) and width "
                               f"{cols}")
    b = np.asarray(bias, dtype=np.float64)
    if b.shape != (out, cols):
        raise CompileError(f"left_linear: bias of shape {b.shape}, expected ({out}, {cols})")
    return Expr("mlinear", cols, tuple(m for _, m in terms), rows=out, weights=mats, bias=b)


def linear(*terms: tuple[np.ndarray, Expr], bias: np.ndarray | None = None) -> Expr:
    """``sum(W @ x for W, x in terms) + bias``; every ``W`` is ``(out, x.width)``."""
    if not terms:
        raise CompileError("linear needs at least one (W, x) term")
    mats = tuple(np.asarray(w, dtype=np.float64) for w, _ in terms)
    out = mats[0].shape[0]
    for w, (_, x) in zip(mats, terms):
        if w.ndim != 2 or w.shape != (out, x.width) or x.rows != 1:
            raise CompileError(f"linear: weight of shape {w.shape} for {x.label} of width "
                               f"{x.width}; expected ({out}, {x.width})")
    b = np.zeros(out) if bias is None else np.asarray(bias, dtype=np.float64).reshape(-1)
    if b.shape != (out,):
        raise CompileError(f"linear: bias of shape {b.shape}, expected ({out},)")
    return Expr("linear", out, tuple(x for _, x in terms), weights=mats, bias=b)


def _unary(op: str, x: Expr) -> Expr:
    if x.rows != 1:
        raise CompileError(f"{op} of the matrix {x.label}: activations take vectors")
    return Expr(op, x.width, (x,))


def sigmoid(x: Expr) -> Expr:
    return _unary("sigmoid", x)


def tanh(x: Expr) -> Expr:
    return _unary("tanh", x)


def relu(x: Expr) -> Expr:
    return _unary("relu", x)


def topological(roots: list, key=lambda x: x.uid) -> list:
    """Every node ``roots`` depend on through ``.args``, each once and after its arguments
    (iterative; ``key`` tells nodes apart: an expression's uid by default)."""
    order: list = []
    seen: set = set()
    stack: list = [(r, False) for r in reversed(roots)]
    while stack:
        e, ready = stack.pop()
        if ready:
            order.append(e)
        elif key(e) not in seen:
            seen.add(key(e))
            stack.append((e, True))
            stack.extend((a, False) for a in reversed(e.args) if key(a) not in seen)
    return order


KINDS = ("sequence", "tree", "dag")


@dataclass(frozen=True, eq=False)
class Cell:
    """A recursive model's cell: the node's new states as expressions.

    ``kind``: the structures it runs on (``sequence``, ``tree``, ``dag``);
    ``max_children``: the most children (predecessors) a node may have; ``states``:
    state name -> expression; ``output``: the state a structure's result is read from.
    """

    name: str
    kind: str
    max_children: int
    states: Mapping[str, Expr]
    output: str = "h"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CompileError(f"cell {self.name!r}: kind {self.kind!r} is not one of "
                               f"{', '.join(KINDS)}")
        if self.max_children < 1:
            raise CompileError(f"cell {self.name!r}: max_children must be at least 1")
        if self.output not in self.states:
            raise CompileError(f"cell {self.name!r}: output state {self.output!r} is not one "
                               f"of its states {list(self.states)}")
        for e in self.exprs:
            self._check(e)

    def _check(self, e: Expr) -> None:
        if e.op != "child":
            return
        if e.state not in self.states:
            raise CompileError(f"cell {self.name!r}: {e.label} reads state {e.state!r}, which "
                               f"the cell does not produce (states: {list(self.states)})")
        st = self.states[e.state]
        if (e.rows, e.width) != (st.rows, st.width):
            raise CompileError(f"cell {self.name!r}: {e.label} is {e.rows}x{e.width} but state "
                               f"{e.state!r} is {st.rows}x{st.width}")
        if not 0 <= e.slot < self.max_children:
            raise CompileError(f"cell {self.name!r}: {e.label} reads slot {e.slot}; the cell "
                               f"declares at most {self.max_children} children")

    @property
    def exprs(self) -> list[Expr]:
        """Every expression, arguments first."""
        return topological(list(self.states.values()))

    @property
    def embed(self) -> int:
        """Width of the node input (0: the cell reads none)."""
        return max((e.width for e in self.exprs if e.op == "input"), default=0)

    def width(self, state: str) -> int:
        return self.states[state].width
