"""The planning vocabulary the op lowerings of :mod:`.lower` are written in.

A :class:`Plan` is one CPU step before its kernel exists; :class:`NodeLowering` gives a
lowering its node's values, constants and kernel arguments, raising :class:`Unsupported`
(with what to do) when the CPU cannot run the node; :class:`Operands` collects the inputs
of one fused elementwise kernel. Planning is pure Python, so a node is checked without
generating IR.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..cpu import DTYPES as KERNEL_DTYPES, CpuKernel, E, TensorSpec, fused_elementwise
from ..frontend.graph import Graph, Node, Value

__all__ = ["QUANT_DTYPES", "LowerFn", "NodeLowering", "Operands", "Plan", "Unsupported",
           "first_input", "lower_view", "single_step"]

QUANT_DTYPES = ("int8", "uint8")


class Unsupported(Exception):
    """Raised while planning: the message says what is not supported and what to do."""


@dataclass
class Plan:
    """A step before its kernel exists: ``build`` makes it (None for a view)."""

    suffix: str | None                       # None: the node's own step (named as the node)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    build: Callable[[], CpuKernel] | None
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    shape: tuple[int, ...] | None = None


class NodeLowering:
    """What an op's lowering needs of its node: values, constants, specs, and checks that
    raise :class:`Unsupported`."""

    def __init__(self, graph: Graph, node: Node) -> None:
        self.graph = graph
        self.node = node

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attr(key, default)

    def value(self, name: str) -> Value:
        if name not in self.graph.values:
            raise Unsupported(f"tensor {name!r} is not in the graph")
        return self.graph.values[name]

    def input(self, i: int) -> Value:
        name = self.node.input(i)
        if not name:
            raise Unsupported(f"input {i} is missing")
        return self.value(name)

    def output(self, i: int = 0) -> Value:
        return self.value(self.node.outputs[i])

    def spec(self, name: str, dtypes: Sequence[str] = KERNEL_DTYPES) -> TensorSpec:
        """The kernel argument for tensor ``name``, whose dtype must be one of ``dtypes``."""
        value = self.value(name)
        self.require(value.dtype in dtypes,
                     f"tensor {name!r} is {value.dtype}; this op's CPU kernel takes "
                     f"{' or '.join(dtypes)} (cast it in the model)")
        return TensorSpec(value.shape, value.dtype)

    def const(self, name: str, what: str) -> np.ndarray:
        """The data of constant tensor ``name`` (the op's ``what``)."""
        data = self.graph.const(name) if name else None
        self.require(data is not None, f"its {what} ({name!r}) must be a constant: the CPU "
                     "kernels are generated for fixed values, and this one is computed "
                     "while the model runs")
        return data

    def optional_const(self, i: int, what: str) -> np.ndarray | None:
        name = self.node.input(i)
        if not name:
            return None
        data = self.const(name, what)
        return data if data.size else None

    def tmp(self, what: str) -> str:
        """Name of an intermediate tensor (or derived constant) of this node."""
        return f"{self.node.name}:{what}"

    def require(self, ok: bool, reason: str) -> None:
        if not ok:
            raise Unsupported(reason)

    def require_attrs(self, *keys: str) -> dict[str, Any]:
        """The node's attributes, which must include ``keys`` (the fused nodes' schema)."""
        missing = [k for k in keys if k not in self.node.attrs]
        self.require(not missing, f"attribute {missing[0] if missing else ''!r} is missing; "
                     "make the node with tessera.compiler.frontend.qdq.fuse_qdq")
        return self.node.attrs

    def rank4(self, name: str) -> None:
        shape = self.value(name).shape
        self.require(len(shape) == 4, f"input {name!r} has rank {len(shape)}; the CPU "
                     "kernel takes 2-D (NCHW, rank 4) tensors only")


class Operands:
    """The inputs of one fused elementwise kernel: tensors by name, in order, with the
    arrays of the constant ones."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.specs: list[TensorSpec] = []
        self.constants: dict[str, np.ndarray] = {}

    def add(self, name: str, spec: TensorSpec, data: np.ndarray | None = None) -> E:
        """Kernel input for tensor ``name`` (a constant if ``data`` is given)."""
        if name in self.names:
            return E.input(self.names.index(name))
        self.names.append(name)
        self.specs.append(spec)
        if data is not None:
            self.constants[name] = np.ascontiguousarray(data, dtype=spec.dtype).reshape(
                spec.shape)
        return E.input(len(self.names) - 1)

    def array(self, name: str, data: np.ndarray) -> E:
        """A derived constant array (e.g. per-channel scales)."""
        data = np.ascontiguousarray(data)
        return self.add(name, TensorSpec(data.shape, str(data.dtype)), data)

    def tensor(self, low: NodeLowering, name: str, dtypes: Sequence[str] = KERNEL_DTYPES) -> E:
        """Graph tensor ``name``: one-element constants become E.const (no input needed),
        other constants are passed as arrays, activations by name."""
        spec = low.spec(name, dtypes)
        data = low.graph.const(name)
        if data is not None and data.size == 1:
            return E.const(data.reshape(()).item())
        return self.add(name, spec, data)

    def plan(self, expr: E, output: str, shape: Sequence[int], dtype: str,
             suffix: str | None = None) -> Plan:
        if not self.specs:
            raise Unsupported("all its inputs are constants that import did not fold (a "
                              "result over the folding limit, FOLD_LIMIT_BYTES, stays a "
                              "node); a CPU kernel needs at least one computed input")
        specs, shape = tuple(self.specs), tuple(shape)

        def build() -> CpuKernel:
            return fused_elementwise(expr, specs, out_dtype=dtype, out_shape=shape)
        return Plan(suffix, tuple(self.names), (output,), build, dict(self.constants))


def single_step(low: NodeLowering, builder: Callable[..., CpuKernel], *args: Any,
                inputs: Sequence[str] | None = None, **kwargs: Any) -> list[Plan]:
    """One step running ``builder(*args, **kwargs)`` on the node's inputs (or ``inputs``),
    passing the constant ones as arrays."""
    names = tuple(inputs if inputs is not None else [n for n in low.node.inputs if n])
    constants = {n: low.graph.const(n) for n in names if low.graph.const(n) is not None}
    outputs = tuple(o for o in low.node.outputs if o)
    return [Plan(None, names, outputs, lambda: builder(*args, **kwargs), constants)]


def first_input(low: NodeLowering) -> str:
    """Name of the node's input 0 (the activation of most ops)."""
    return low.node.input(0)


def lower_view(low: NodeLowering) -> list[Plan]:
    """Flatten, Reshape, Squeeze, Unsqueeze, Identity, same-type Cast: the output is the
    input's data in another shape."""
    x = low.node.input(0)
    low.require(bool(x), "input 0 is missing")
    out = low.output()
    data = low.graph.const(x)
    constants = {} if data is None else {x: data}
    return [Plan(None, (x,), (out.name,), None, constants, out.shape)]


#: An op's lowering: its planned steps.
LowerFn = Callable[[NodeLowering], list[Plan]]
