"""The compiler's graph IR: ONNX-style nodes over named tensors with static shapes.

A :class:`Graph` is what a model becomes after import (``tessera.compiler.frontend.onnx_import``)
and what the graph passes (folding, quantization, fusion, partitioning) rewrite. It
keeps ONNX's vocabulary (op types, attribute names, input order, ``""`` for an
omitted optional input), so an imported model maps one node to one node and a graph
can be written back as ONNX (``to_onnx``) and checked against onnxruntime.

Invariants (checked by :meth:`Graph.verify`, which every pass's test runs):

* each tensor is produced once: by a graph input, a constant, or one node output;
* ``nodes`` is in topological order: a node only reads tensors defined before it;
* every tensor has a :class:`Value` with a static shape and a dtype;
* graph outputs exist.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from tessera.errors import CompileError

__all__ = ["DTYPES", "Graph", "Node", "Value"]

#: Tensor element types the IR carries (ONNX names, lower case, as numpy spells them).
DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")


@dataclass
class Value:
    """A tensor: name, static shape, dtype, and its data when it is a constant."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.shape = tuple(int(d) for d in self.shape)
        if self.dtype not in DTYPES:
            raise CompileError(f"tensor {self.name!r} has dtype {self.dtype!r}, which the "
                               f"compiler does not handle (handled: {', '.join(DTYPES)})")
        if self.data is not None:
            self.data = np.asarray(self.data, dtype=self.dtype).reshape(self.shape)

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self) -> str:
        kind = "const " if self.is_const else ""
        return f"Value({self.name!r}, {kind}{self.dtype}{list(self.shape)})"


@dataclass
class Node:
    """One operation: an ONNX op type with its inputs, outputs and attributes."""

    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: ONNX operator domain ("" is the default domain).
    domain: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, i: int) -> str:
        """Input ``i``, or ``""`` when it is omitted (optional inputs at the end)."""
        return self.inputs[i] if i < len(self.inputs) else ""

    def __str__(self) -> str:
        return f"{self.op} {self.name!r}"


class Graph:
    """Nodes in topological order over :class:`Value` tensors (see the module doc)."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.values: dict[str, Value] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        #: The ONNX model's metadata_props (e.g. ``tessera.recurrent_state``).
        self.metadata: dict[str, str] = {}

    # ------------------------------------------------------------ building
    def add_value(self, name: str, shape: Sequence[int], dtype: str,
                  data: np.ndarray | None = None) -> Value:
        """Declare tensor ``name`` (replacing an earlier declaration)."""
        value = Value(name, tuple(shape), dtype, data)
        self.values[name] = value
        return value

    def add_const(self, name: str, data: np.ndarray) -> Value:
        """A constant tensor holding ``data`` (its dtype and shape)."""
        data = np.asarray(data)
        return self.add_value(name, data.shape, str(data.dtype), data)

    def add_input(self, name: str, shape: Sequence[int], dtype: str) -> Value:
        value = self.add_value(name, shape, dtype)
        self.inputs.append(name)
        return value

    def add_node(self, op: str, inputs: Sequence[str], outputs: Sequence[str], *,
                 name: str | None = None, index: int | None = None, domain: str = "",
                 **attrs: Any) -> Node:
        """Append a node (or insert it at ``index``); its outputs need values declared
        with :meth:`add_value` before :meth:`verify`."""
        node = Node(op, name or self.unique_name(op), list(inputs), list(outputs), dict(attrs),
                    domain)
        self.nodes.insert(len(self.nodes) if index is None else index, node)
        return node

    def unique_name(self, base: str) -> str:
        """A node or tensor name not used yet, derived from ``base``."""
        taken = {n.name for n in self.nodes} | set(self.values)
        if base not in taken:
            return base
        k = 1
        while f"{base}_{k}" in taken:
            k += 1
        return f"{base}_{k}"

    # ------------------------------------------------------------- queries
    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise CompileError(f"tensor {name!r} is not in graph {self.name!r}") from None

    def const(self, name: str) -> np.ndarray | None:
        """The data of tensor ``name`` if it is a constant, else None."""
        value = self.values.get(name)
        return None if value is None else value.data

    def producer(self, name: str) -> Node | None:
        """The node that outputs tensor ``name`` (None for inputs and constants)."""
        for node in self.nodes:
            if name in node.outputs:
                return node
        return None

    def consumers(self, name: str) -> list[Node]:
        """The nodes that read tensor ``name``, in graph order."""
        return [n for n in self.nodes if name in n.inputs]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise CompileError(f"no node named {name!r} in graph {self.name!r}")

    def ops(self) -> list[str]:
        """The op type of every node, in order."""
        return [n.op for n in self.nodes]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    # ------------------------------------------------------------- editing
    def remove_nodes(self, nodes: Iterable[Node]) -> None:
        doomed = {id(n) for n in nodes}
        self.nodes = [n for n in self.nodes if id(n) not in doomed]

    def rename_uses(self, old: str, new: str) -> None:
        """Make every reader of tensor ``old`` (nodes and graph outputs) read ``new``."""
        for node in self.nodes:
            node.inputs = [new if i == old else i for i in node.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]

    def remove_unused(self) -> int:
        """Drop nodes whose outputs nobody reads and values nothing refers to; returns
        how many nodes went."""
        removed = 0
        while True:
            used = set(self.outputs) | {i for n in self.nodes for i in n.inputs}
            dead = [n for n in self.nodes if not any(o in used for o in n.outputs)]
            if not dead:
                break
            self.remove_nodes(dead)
            removed += len(dead)
        referenced = (set(self.inputs) | set(self.outputs)
                      | {t for n in self.nodes for t in (*n.inputs, *n.outputs)})
        self.values = {k: v for k, v in self.values.items() if k in referenced}
        return removed

    def copy(self) -> "Graph":
        """A deep copy (constants included), for passes that must not touch the original."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------ checking
    def verify(self) -> None:
        """Raise :class:`CompileError` unless the invariants of the module doc hold."""
        defined: set[str] = set()
        for name in self.inputs:
            self._check_value(name, "graph input")
            if self.values[name].is_const:
                raise CompileError(f"graph input {name!r} is a constant")
            defined.add(name)
        defined |= {n for n, v in self.values.items() if v.is_const}
        for node in self.nodes:
            for t in node.inputs:
                if t and t not in defined:
                    where = ("is produced later (the nodes are not in topological order)"
                             if self.producer(t) is not None else "is never defined")
                    raise CompileError(f"{node} reads tensor {t!r}, which {where}")
            for t in node.outputs:
                if not t:  # an optional output left out (ONNX allows ['', 'Y_h'])
                    continue
                self._check_value(t, f"output of {node}")
                if t in defined:
                    raise CompileError(f"tensor {t!r} is defined twice (again as an output "
                                       f"of {node})")
                defined.add(t)
        for name in self.outputs:
            if name not in defined:
                raise CompileError(f"graph output {name!r} is never defined")

    def _check_value(self, name: str, what: str) -> None:
        if name not in self.values:
            raise CompileError(f"{what} {name!r} has no shape and dtype (Value) in the graph")

    def summary(self) -> str:
        """One line per node: op, name, input and output shapes."""
        lines = [f"graph {self.name!r}: {len(self.nodes)} nodes, inputs "
                 f"{[self.values[i] for i in self.inputs]}"]
        for n in self.nodes:
            ins = ", ".join(f"{self.values[i].dtype}{list(self.values[i].shape)}"
                            for i in n.inputs if i in self.values and not self.values[i].is_const)
            outs = ", ".join(f"{self.values[o].dtype}{list(self.values[o].shape)}"
                             for o in n.outputs if o in self.values)
            lines.append(f"  {n.op:<22} {n.name:<28} {ins} -> {outs}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self.nodes)} nodes>"
