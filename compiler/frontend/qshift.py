"""uint8 activations on an int8 accelerator: :func:`shift_uint8_to_int8`.

onnxruntime quantizes activations to uint8 or int8 (``activation_type``); the accelerator
multiplies int8. An 8-bit tensor matters to the integer kernels only through ``x - x_zp``,
which is the same for the uint8 value ``x`` with zero point ``zp`` and for the int8 value
``x - 128`` with zero point ``zp - 128``: convolutions, dense layers, max and global
average pools and every requantization (whose clamp ``[qmin - zp, qmax - zp]`` moves with
the zero point) give the same result, shifted by 128. So, after QDQ fusion and before
placement, uint8 tensors become int8 in the graph, and both backends and the golden
model see int8 alone:

* the tensor holds ``x - 128`` (the uint8 byte with its top bit flipped);
* a QuantizeLinear writing it or a DequantizeLinear reading it gets the zero point
  ``zp - 128`` of type int8 (exact: ``rint(x / s) + zp`` saturated and ``(q - zp) * s``
  move with the zero point);
* a fused node reading or writing it gets its zero points and ``y_min``/``y_max`` minus
  128 and the attribute ``from_uint8 = 1``. Two of onnxruntime's kernels are not
  shift-invariant, because they add the zero point in float32 before rounding:
  QLinearAdd and QLinearAveragePool. Their golden model and lowerings read
  ``from_uint8`` and compute on the model's uint8 values and zero points (stored + 128),
  then shift the result back (:func:`model_domain`, :func:`qadd_reference`);
* a ``QLookup`` (:mod:`.qlookup`) of uint8 ``x`` and ``y`` keeps its meaning with its
  table's values minus 128 (the table is a uint8 constant it reads, shifted with its
  tensors) and re-indexed: the stored byte of the model's value ``u`` is ``u ^ 0x80``, so
  entry ``b`` moves to ``b ^ 0x80``. On the accelerator every lookup is then int8 -> int8;
* ops that only move stored values (:data:`MOVERS`) carry the shift through; a uint8
  constant one of them reads (e.g. concatenated) is shifted too;
* at the graph's boundary the host converts: a uint8 graph input is shifted by the first
  CPU steps, ``DequantizeLinear(x, 1, 128) -> QuantizeLinear(., 1, int8 0)`` (``x - 128``
  exactly), and a uint8 graph output back by the last ones (``+ 128``), so the model's
  interface keeps its types. (onnxruntime's QDQ models take and return float, so this is
  rare: the Q of the input and the DQ of the output absorb the shift.)

A connected set of uint8 tensors (through movers and fused nodes) is shifted as a whole,
and only when every node touching it is one of those or a Q/DQ with constant parameters;
otherwise (a Cast reads it, say) it stays uint8 and its nodes run on the CPU, which
takes uint8.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .graph import Graph, Node
from .qdq import DOMAIN
from .qlinear import qlinear_add_reference

__all__ = ["MOVERS", "SHIFT", "model_domain", "on_model_values", "qadd_reference", "shift_uint8_to_int8"]

#: uint8 value - SHIFT = the stored int8 value.
SHIFT = 128
#: Standard ops that only move their 8-bit inputs' values to their outputs.
MOVERS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity",
                    "Concat", "Split", "Slice", "Gather", "DepthToSpace", "SpaceToDepth",
                    "MaxPool"})
#: Fused-node attributes in the stored domain (zero points and clamp bounds).
_STORED_ATTRS = ("x_zero_point", "a_zero_point", "b_zero_point", "y_zero_point", "y_min",
                 "y_max")


def shift_uint8_to_int8(graph: Graph) -> int:
    """Store the uint8 activations of ``graph`` as int8, in place (see the module doc).

    Returns the number of tensors shifted; the graph still verifies.
    """
    shifted = 0
    for group in _uint8_groups(graph):
        if _shiftable(graph, group):
            _shift(graph, group)
            shifted += len(group)
    return shifted


def model_domain(attrs: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """``(offset, attrs)`` of a fused node as onnxruntime computes it: for a node shifted
    from uint8, 128 and its zero points and clamp bounds plus 128; else 0 and ``attrs``.
    Its stored values plus ``offset`` are the model's values."""
    if not attrs.get("from_uint8"):
        return 0, dict(attrs)
    return SHIFT, {k: v + SHIFT if k in _STORED_ATTRS else v for k, v in attrs.items()}


def qadd_reference(a: np.ndarray, b: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """onnxruntime's QLinearAdd (:func:`~.qlinear.qlinear_add_reference`) of the stored
    operands ``a`` and ``b`` of a fused QAdd with attributes ``attrs``, computed on the
    model's values (uint8 for a node shifted from uint8); int64, stored domain."""
    return on_model_values(qlinear_add_reference, a, b, attrs)


def on_model_values(reference, a: np.ndarray, b: np.ndarray,
                    attrs: Mapping[str, Any]) -> np.ndarray:
    """``reference(a, b, a_scale, a_zp, b_scale, b_zp, y_scale, y_zp, y_min, y_max)`` of
    a fused binary node's stored operands, on the model's values (uint8 for a node
    shifted from uint8), back in the stored domain (int64)."""
    offset, p = model_domain(attrs)
    dtype = np.uint8 if offset else a.dtype
    a, b = ((v.astype(np.int64) + offset).astype(dtype) for v in (a, b))
    y = reference(a, b, p["a_scale"], p["a_zero_point"], p["b_scale"], p["b_zero_point"],
                  p["y_scale"], p["y_zero_point"], p["y_min"], p["y_max"])
    return y - offset


# ------------------------------------------------------------------------- grouping
def _uint8_groups(graph: Graph) -> list[list[str]]:
    """The connected sets of uint8 tensors, linked by movers and fused nodes; sets of
    constants alone are left out."""
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    uint8 = {n for n, v in graph.values.items() if v.dtype == "uint8"}
    for name in uint8:
        parent[name] = name
    for node in graph.nodes:
        if _is_fused(node) or (not node.domain and node.op in MOVERS):
            linked = [t for t in (*node.inputs, *node.outputs) if t in uint8]
            for t in linked[1:]:
                parent[find(t)] = find(linked[0])
    groups: dict[str, list[str]] = {}
    for name in sorted(uint8):
        groups.setdefault(find(name), []).append(name)
    return [g for g in groups.values() if any(not graph.values[t].is_const for t in g)]


def _is_fused(node: Node) -> bool:
    return node.domain == DOMAIN


def _activations(graph: Graph, node: Node) -> list[str]:
    """A fused node's non-constant inputs and its outputs."""
    return [t for t in (*node.inputs, *node.outputs) if t and not graph.values[t].is_const]


def _shiftable(graph: Graph, group: list[str]) -> bool:
    """True if every node writing or reading a tensor of ``group`` keeps its meaning
    when the tensor is shifted (module doc)."""
    for name in group:
        if graph.values[name].is_const and name in graph.outputs:
            return False
        if name in graph.inputs and name in graph.outputs:
            return False
        producer = graph.producer(name)
        nodes = [(producer, True)] if producer is not None else []
        nodes += [(reader, False) for reader in graph.consumers(name)]
        if not all(_carries(graph, node, name, writes) for node, writes in nodes):
            return False
    return True


def _carries(graph: Graph, node: Node, name: str, writes: bool) -> bool:
    """Whether ``node`` (writing or reading uint8 tensor ``name``) can take the shift."""
    if _is_fused(node):
        return all(graph.values[t].dtype == "uint8" for t in _activations(graph, node))
    if node.domain:
        return False
    constant_zero_point = not node.input(2) or graph.const(node.input(2)) is not None
    if node.op == "QuantizeLinear":
        return writes and constant_zero_point
    if node.op == "DequantizeLinear":
        return not writes and node.inputs[0] == name and constant_zero_point
    return node.op in MOVERS


# ------------------------------------------------------------------------- rewriting
def _shift(graph: Graph, group: list[str]) -> None:
    members = set(group)
    for name in group:
        value = graph.values[name]
        data = None if value.data is None else _shifted(value.data)
        graph.add_value(name, value.shape, "int8", data)
    zero_points: dict[str, str] = {}
    for node in graph.nodes:
        if _is_fused(node) and members.intersection(_activations(graph, node)):
            for key in _STORED_ATTRS:
                if key in node.attrs:
                    node.attrs[key] = int(node.attrs[key]) - SHIFT
            node.attrs["from_uint8"] = 1
            if node.op == "QLookup":
                _reindex_table(graph, node)
        elif ((node.op == "QuantizeLinear" and node.outputs[0] in members)
              or (node.op == "DequantizeLinear" and node.inputs[0] in members)):
            _shift_zero_point(graph, node, zero_points)
    for name in [n for n in graph.inputs if n in members]:
        _convert_input(graph, name)
    for name in [n for n in graph.outputs if n in members]:
        _convert_output(graph, name)


def _reindex_table(graph: Graph, node: Node) -> None:
    """Move a shifted lookup's table entry ``b`` to ``b ^ 0x80`` (module doc)."""
    table = graph.values[node.inputs[1]]
    order = np.arange(256) ^ 0x80
    graph.add_value(table.name, table.shape, table.dtype, table.data.reshape(256)[order]
                    .reshape(table.shape))


def _shifted(data: np.ndarray) -> np.ndarray:
    return (data.astype(np.int16) - SHIFT).astype(np.int8)


def _shift_zero_point(graph: Graph, node: Node, done: dict[str, str]) -> None:
    """Give Q/DQ ``node`` the int8 zero point ``zp - 128`` (a new constant, shared by
    the nodes that shared the old one)."""
    old = node.input(2)
    name = done.get(old) if old else None
    if name is None:
        data = graph.const(old) if old else np.zeros(graph.value(node.input(1)).shape,
                                                      np.uint8)
        name = graph.unique_name(f"{old or node.name + '.zero_point'}.int8")
        graph.add_const(name, _shifted(data))
        if old:
            done[old] = name
    _set_zero_point(node, name)


def _set_zero_point(node: Node, name: str) -> None:
    node.inputs = [node.input(0), node.input(1), name, *node.inputs[3:]]


def _convert_input(graph: Graph, name: str) -> None:
    """The graph reads uint8 input ``name``; its nodes read ``name - 128`` as int8."""
    shape = graph.values[name].shape
    inner = _fresh_value(graph, f"{name}.int8", shape, "int8")
    graph.rename_uses(name, inner)
    graph.add_value(name, shape, "uint8")
    _add_conversion(graph, name, inner, 0, "to_int8", from_zero_point=np.uint8(SHIFT),
                    to_zero_point=np.int8(0))


def _convert_output(graph: Graph, name: str) -> None:
    """The graph writes uint8 output ``name`` from the int8 tensor its nodes compute."""
    shape = graph.values[name].shape
    inner = _fresh_value(graph, f"{name}.int8", shape, "int8")
    producer = graph.producer(name)
    producer.outputs = [inner if o == name else o for o in producer.outputs]
    for node in graph.nodes:
        node.inputs = [inner if i == name else i for i in node.inputs]
    graph.add_value(name, shape, "uint8")
    _add_conversion(graph, inner, name, len(graph.nodes), "to_uint8",
                    from_zero_point=np.int8(0), to_zero_point=np.uint8(SHIFT))


def _fresh_value(graph: Graph, base: str, shape: tuple[int, ...], dtype: str) -> str:
    name = graph.unique_name(base)
    graph.add_value(name, shape, dtype)
    return name


def _add_conversion(graph: Graph, source: str, target: str, index: int, what: str, *,
                    from_zero_point: np.generic, to_zero_point: np.generic) -> None:
    """``target = Q(DQ(source, 1, from_zp), 1, to_zp)`` at ``index``: exactly ``source -
    from_zp + to_zp`` in the target's type (scale 1: no rounding anywhere)."""
    base = f"{source}.{what}"
    consts = []
    for key, data in (("one", np.float32(1.0)), ("from_zp", from_zero_point),
                      ("to_zp", to_zero_point)):
        consts.append(graph.unique_name(f"{base}.{key}"))
        graph.add_const(consts[-1], np.asarray(data))
    one, from_zp, to_zp = consts
    middle = _fresh_value(graph, f"{base}.float", graph.values[source].shape, "float32")
    graph.add_node("DequantizeLinear", [source, one, from_zp], [middle], index=index,
                   name=graph.unique_name(f"{base}/DequantizeLinear"))
    graph.add_node("QuantizeLinear", [middle, one, to_zp], [target], index=index + 1,
                   name=graph.unique_name(f"{base}/QuantizeLinear"))
