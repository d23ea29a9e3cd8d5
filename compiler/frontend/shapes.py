"""Shape subgraphs folded and constant control flow resolved, on the ONNX model itself.

Exporters compute shapes at run time: ``Shape -> Gather -> Concat -> Reshape`` for a
flatten, ``Shape -> Range -> Expand`` for a detector's grid, ``If`` on a shape for a
special case. Once the inputs' shapes are fixed (``input_shapes``) all of that is constant.
:func:`fold_shape_subgraphs` evaluates it (onnx's reference implementation, one node at a
time, at the model's own opset) until nothing more folds, so that shape inference then
gives every tensor a static shape, and splices in the branch of each ``If`` whose
condition became a constant. :func:`refuse_control_flow` turns what is left (``Loop``,
``Scan``, an ``If`` on data) into a :class:`~tessera.errors.CompileError`.

The folding policy (:data:`FOLD_LIMIT_BYTES`, what never folds) and the one-node
evaluator :func:`evaluate_proto` are shared with the graph-level ``fold_constants``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tessera.errors import CompileError

from .upgrade import DEFAULT_DOMAINS, IR_OPSET, inferred_types

__all__ = ["FOLD_LIMIT_BYTES", "SHAPE_ONLY", "WEIGHT_INPUTS", "constant_data", "evaluate_proto",
           "fold_shape_subgraphs", "foldable_op", "refuse_control_flow", "type_contrib_outputs",
           "weight_sources"]

#: A node whose outputs would be larger than this stays a node (not a constant), unless
#: they are weights (:func:`weight_sources`).
FOLD_LIMIT_BYTES = 16 << 20
#: The weight input of each layer op: a constant there makes the layer one the
#: accelerator runs (a quantizer finds its weights only among initializers).
WEIGHT_INPUTS = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}
#: Ops never folded: the quantizer wants int8 weights behind their DequantizeLinear, and
#: random ops must not be frozen to one draw.
_NO_FOLD = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                      "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
                      "RandomNormal", "RandomUniform"})
#: Ops whose result depends only on their input's (static) shape: folded whatever the input.
SHAPE_ONLY = frozenset({"Shape", "Size"})
#: Ops that read an input for its shape or element type only (see _placeholder).
_TYPE_READERS = SHAPE_ONLY | {"CastLike"}
_SUBGRAPH_TYPES = (AttributeProto.GRAPH, AttributeProto.GRAPHS)


def foldable_op(op: str, domain: str) -> bool:
    """Whether a node of this op may be replaced by its value when its inputs are known."""
    return op not in _NO_FOLD and domain in DEFAULT_DOMAINS


#: onnx.reference implements QuantizeLinear/DequantizeLinear from opset 19 only; 19 adds
#: float8 types and nothing that changes int8/uint8.
_REFERENCE_OPSET = {"QuantizeLinear": 19, "DequantizeLinear": 19}


def evaluate_proto(node: onnx.NodeProto, feeds: Mapping[str, np.ndarray], name: str, *,
                   failure: str = "has constant inputs but cannot be evaluated to fold it",
                   opset: int = IR_OPSET) -> list[np.ndarray]:
    """Run one node of ONNX ``opset`` with onnx's reference evaluator (a one-node model).
    A failure is a :class:`CompileError` saying the node ``failure`` (why it was run)."""
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                            v.shape) for k, v in feeds.items()]
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    version = _REFERENCE_OPSET.get(node.op_type, opset)
    model = helper.make_model(helper.make_graph([node], name, inputs, outputs),
                              opset_imports=[helper.make_opsetid(node.domain, version)])
    try:
        return list(ReferenceEvaluator(model).run(None, dict(feeds)))
    except Exception as exc:  # the reference ops raise whatever numpy raises
        raise CompileError(f"{node.op_type} node {name!r} {failure} ({type(exc).__name__}: "
                           f"{exc}); check its attributes and inputs", op=name) from exc


def constant_data(node: onnx.NodeProto, opset: int = IR_OPSET) -> np.ndarray:
    """The value of a ``Constant`` node."""
    if len(node.attribute) != 1:
        raise CompileError(f"Constant node {node.name!r} has {len(node.attribute)} attributes; "
                           f"it needs exactly one, its value", op=node.name)
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    if attr.name in ("value_float", "value_floats"):
        return np.array(helper.get_attribute_value(attr), dtype=np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.array(helper.get_attribute_value(attr), dtype=np.int64)
    # Sparse and string constants are rare: let the reference implementation decode them.
    return evaluate_proto(node, {}, node.name, opset=opset)[0]


# ------------------------------------------------------------------------- folding
class _Known:
    """The tensors of a graph known before run time (its initializers, to which folding
    adds), decoded to numpy only when a node reads them."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._tensors: dict[str, onnx.TensorProto] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self.index(graph)

    def index(self, graph: onnx.GraphProto) -> None:
        """Point at ``graph``'s initializers (again: shape inference moves the large ones
        out and back, which copies them, and the old copies must not stay alive)."""
        self._tensors = {t.name: t for t in graph.initializer}

    def __contains__(self, name: str) -> bool:
        return name in self._arrays or name in self._tensors

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self._tensors[name])
        return self._arrays[name]

    def add(self, graph: onnx.GraphProto, tensor: onnx.TensorProto) -> None:
        """Make ``tensor`` an initializer of ``graph`` and known."""
        graph.initializer.append(tensor)
        self._tensors[tensor.name] = graph.initializer[-1]  # append copied it


def fold_shape_subgraphs(proto: onnx.ModelProto, opset: int) -> int:
    """Replace (in place) every node of ``proto``'s graph whose inputs are known by its
    value, with ``Shape`` and ``Size`` known once their input's shape is, and inline every
    ``If`` whose condition is known, until nothing changes; shapes are inferred again after
    each round, so a ``Shape`` of a tensor whose shape just became static folds in the
    next. Keeps the nodes :func:`foldable_op` refuses and outputs over
    :data:`FOLD_LIMIT_BYTES` that are not weights (:func:`weight_sources`: a VGG's
    400 MB ``ConstantOfShape`` FC weight is folded); declares the outputs of the
    ``com.microsoft`` nodes import keeps (:func:`type_contrib_outputs`). Returns the number
    of nodes folded or inlined."""
    graph = proto.graph
    known = _Known(graph)
    unfoldable: set[str] = set()
    weights = weight_sources(graph)
    total = 0
    while True:
        types = {}
        if _reads_types(graph, known):
            types = inferred_types(proto)
            known.index(graph)
        count = _fold_pass(graph, known, types, opset, unfoldable, weights)
        total += count
        if not count and not type_contrib_outputs(proto):
            return total


def _reads_types(graph: onnx.GraphProto, known: _Known) -> bool:
    """Whether some node asks for a run-time tensor's shape or type (so inference is
    needed): Shape, Size, CastLike."""
    return any(n.op_type in _TYPE_READERS and any(i and i not in known for i in n.input)
               for n in graph.node)


def weight_sources(graph: onnx.GraphProto) -> frozenset[str]:
    """The tensors that are a layer's weight (:data:`WEIGHT_INPUTS`) or that only such
    tensors are computed from (the ``ConstantOfShape -> Reshape`` before a weight):
    folded whatever their size, so that the layer has its weight as a constant."""
    sources = {n.input[WEIGHT_INPUTS[n.op_type]] for n in graph.node
               if n.domain in DEFAULT_DOMAINS and n.op_type in WEIGHT_INPUTS
               and len(n.input) > WEIGHT_INPUTS[n.op_type]} - {""}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def feeds_weights_only(name: str) -> bool:
        return name not in sources and all(
            o in sources for r in readers[name] for o in r.output if o)
    while True:
        more = {i for n in graph.node if any(o in sources for o in n.output)
                for i in n.input if i and feeds_weights_only(i)}
        if not more:
            return frozenset(sources)
        sources |= more


def _fold_pass(graph: onnx.GraphProto, known: _Known, types: Mapping[str, onnx.TypeProto],
               opset: int, unfoldable: set[str], weights: frozenset[str]) -> int:
    """One walk in topological order: fold or inline what can be; the number changed."""
    kept: list[onnx.NodeProto] = []
    pending = list(reversed(graph.node))
    count = 0
    while pending:
        node = pending.pop()
        if _is_default(node, "Constant"):
            # As an initializer: the converter reads a constant axes or shape input (opset
            # 18's ReduceMean) only from one.
            data = constant_data(node, opset)
            known.add(graph, numpy_helper.from_array(np.asarray(data), node.output[0]))
            count += 1
            continue
        if _is_default(node, "If") and node.input[0] in known:
            inlined = inline_branch(node, _condition(node, known.array(node.input[0])),
                                    graph, known)
            pending.extend(reversed(inlined))
            count += 1
            continue
        results = _evaluate_if_known(node, known, types, opset, unfoldable, weights)
        if results is None:
            kept.append(node)
            continue
        for name, data in results:
            known.add(graph, numpy_helper.from_array(np.asarray(data), name))
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(kept)
    return count


def _is_default(node: onnx.NodeProto, op: str) -> bool:
    return node.op_type == op and node.domain in DEFAULT_DOMAINS


def _evaluate_if_known(node: onnx.NodeProto, known: _Known,
                       types: Mapping[str, onnx.TypeProto], opset: int,
                       unfoldable: set[str], weights: frozenset[str]
                       ) -> list[tuple[str, np.ndarray]] | None:
    """The node's outputs by name if it folds, else None."""
    inputs = [i for i in node.input if i]
    if (not inputs or not foldable_op(node.op_type, node.domain) or node.name in unfoldable
            or any(a.type in _SUBGRAPH_TYPES for a in node.attribute)):
        return None
    feeds = {}
    for name in inputs:
        feed = known.array(name) if name in known else _placeholder(node, name, types)
        if feed is None:
            return None
        feeds[name] = feed
    limit = np.inf if all(o in weights for o in node.output if o) else FOLD_LIMIT_BYTES
    predicted = _predicted_bytes(node, feeds, types)
    if predicted is not None and predicted > limit:
        unfoldable.add(node.name)
        return None
    try:
        results = [np.asarray(r) for r in evaluate_proto(node, feeds, node.name, opset=opset)]
    except CompileError:
        # onnx.reference lacks some old versions (Upsample-7, Resize-10, ...): the node
        # folds after conversion to the IR opset, or fold_constants says what is wrong.
        unfoldable.add(node.name)
        return None
    if sum(r.nbytes for r in results) > limit:
        unfoldable.add(node.name)
        return None
    return list(zip([o for o in node.output if o], results))


def _placeholder(node: onnx.NodeProto, name: str,
                 types: Mapping[str, onnx.TypeProto]) -> np.ndarray | None:
    """For an input the node reads only for its shape (Shape, Size) or element type
    (CastLike's target), an empty array of that shape or type; None if it is not known
    or the node reads the values."""
    ttype = types.get(name)
    if node.op_type in SHAPE_ONLY:
        static = _static(ttype)
        # np.empty maps no memory: only the shape is read.
        return None if static is None else np.empty(*static)
    if (node.op_type == "CastLike" and list(node.input).index(name) == 1 and ttype is not None
            and ttype.HasField("tensor_type") and ttype.tensor_type.elem_type):
        return np.empty(0, helper.tensor_dtype_to_np_dtype(ttype.tensor_type.elem_type))
    return None


def _static(ttype: onnx.TypeProto | None) -> tuple[tuple[int, ...], np.dtype] | None:
    """Shape and numpy dtype of a tensor type when both are known."""
    if ttype is None or not ttype.HasField("tensor_type"):
        return None
    tt = ttype.tensor_type
    if not tt.elem_type or not tt.HasField("shape") or not all(
            d.HasField("dim_value") for d in tt.shape.dim):
        return None
    return (tuple(d.dim_value for d in tt.shape.dim),
            np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))


def _predicted_bytes(node: onnx.NodeProto, feeds: Mapping[str, np.ndarray],
                     types: Mapping[str, onnx.TypeProto]) -> int | None:
    """The size of the node's outputs before evaluating it, where it is cheap to know: from
    inferred types, or for the ops that make big tensors from small ones."""
    outputs = [_static(types.get(o)) for o in node.output if o]
    if outputs and all(outputs):
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in outputs)
    if node.op_type not in ("ConstantOfShape", "Expand", "Tile"):
        return None
    first = feeds[node.input[0]]
    try:
        if node.op_type == "ConstantOfShape":
            value = next((numpy_helper.to_array(a.t) for a in node.attribute), np.float32(0))
            return int(np.prod(first)) * value.dtype.itemsize
        if node.op_type == "Expand":
            shape = np.broadcast_shapes(first.shape, tuple(feeds[node.input[1]]))
            return int(np.prod(shape)) * first.dtype.itemsize
        return first.nbytes * int(np.prod(feeds[node.input[1]]))
    except (ValueError, TypeError):  # a bad shape: evaluating the node reports it
        return None


# ---------------------------------------------------------------------- control flow
def _condition(node: onnx.NodeProto, value: np.ndarray) -> bool:
    if value.size != 1:
        raise CompileError(f"If node {node.name!r} has a condition {node.input[0]!r} of "
                           f"shape {list(value.shape)}; it must hold one element",
                           op=node.name)
    return bool(value.reshape(-1)[0])


def inline_branch(node: onnx.NodeProto, condition: bool, graph: onnx.GraphProto,
                  known: _Known) -> list[onnx.NodeProto]:
    """The nodes of the branch an ``If`` takes, to splice in its place: the branch's own
    tensors and nodes prefixed with the ``If``'s name, its outputs renamed to the
    ``If``'s, its initializers moved to ``graph``."""
    key = "then_branch" if condition else "else_branch"
    branch = next(a.g for a in node.attribute if a.name == key)
    prefix = f"{node.name}/"
    defined = [t.name for t in branch.initializer] + [o for n in branch.node
                                                       for o in n.output if o]
    rename = {name: prefix + name for name in defined}
    claimed: set[str] = set()
    for inner, outer in zip(branch.output, node.output):
        if inner.name in rename and inner.name not in claimed and outer:
            rename[inner.name] = outer
            claimed.add(inner.name)
    nodes = []
    for index, inner in enumerate(branch.node):
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = prefix + (inner.name or f"{inner.op_type}_{index}")
        _rename_tensors(copy, rename)
        nodes.append(copy)
    for tensor in branch.initializer:
        moved = onnx.TensorProto()
        moved.CopyFrom(tensor)
        moved.name = rename[tensor.name]
        known.add(graph, moved)
    for inner, outer in zip(branch.output, node.output):
        source = rename.get(inner.name, inner.name)
        if outer and source != outer:  # an outer tensor, or one output given twice
            nodes.append(helper.make_node("Identity", [source], [outer],
                                          name=f"{prefix}{outer}"))
    return nodes


def _rename_tensors(node: onnx.NodeProto, rename: Mapping[str, str]) -> None:
    """Rename ``node``'s inputs and outputs, and the outer tensors its subgraphs read."""
    node.input[:] = [rename.get(i, i) for i in node.input]
    node.output[:] = [rename.get(o, o) for o in node.output]
    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == AttributeProto.GRAPH else attr.graphs):
            _rename_captured(sub, rename)


def _rename_captured(graph: onnx.GraphProto, rename: Mapping[str, str]) -> None:
    local = ({i.name for i in graph.input} | {t.name for t in graph.initializer}
             | {o for n in graph.node for o in n.output})
    visible = {k: v for k, v in rename.items() if k not in local}
    for node in graph.node:
        node.input[:] = [visible.get(i, i) for i in node.input]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == AttributeProto.GRAPH else attr.graphs):
                _rename_captured(sub, visible)
    for output in graph.output:
        output.name = visible.get(output.name, output.name)


_WHY_NOT = {
    "If": "its condition {cond!r} depends on the input data, not only on shapes, so it "
          "does not fold to a constant, and the compiler builds one fixed program without "
          "run-time branches; export the model with the branch resolved (trace it for your "
          "input shape) or compute both branches and select with Where",
    "Loop": "it runs its body a number of times decided at run time, and the compiler "
            "builds one fixed program of static-shaped steps; export the model with the "
            "loop unrolled",
    "Scan": "it runs its body once per slice of its inputs with state carried between "
            "steps, which the compiler's fixed program of static-shaped steps cannot "
            "express; export recurrent layers as LSTM, GRU or RNN nodes, or unroll them",
}


def refuse_control_flow(graph: onnx.GraphProto) -> None:
    """CompileError for the first node left with a subgraph (``If``, ``Loop``, ``Scan``,
    ...): the compiler takes no run-time control flow."""
    for node in graph.node:
        graphs = [a.name for a in node.attribute if a.type in _SUBGRAPH_TYPES]
        if not graphs and node.op_type not in _WHY_NOT:
            continue
        why = _WHY_NOT.get(node.op_type, f"it has subgraph attribute {graphs[0]!r} and the "
                           "compiler takes no control flow; export the model with it unrolled "
                           "or resolved")
        cond = node.input[0] if node.input else ""
        raise CompileError(f"{node.op_type} node {node.name!r} is not supported: "
                           f"{why.format(cond=cond)}", op=node.name)


def type_contrib_outputs(proto: onnx.ModelProto) -> int:
    """Declare (as ``value_info``) the outputs of the ``com.microsoft`` DynamicQuantizeLSTM
    nodes once their X's shape is known; the number of nodes typed. ONNX's shape
    inference does not know the op, so without this nothing after it gets a type: call
    it, infer shapes again, until it returns 0."""
    graph = proto.graph
    typed = {v.name for v in (*graph.value_info, *graph.output)
             if v.type.tensor_type.HasField("shape")}
    todo = [n for n in graph.node if (n.domain, n.op_type) == _MS_LSTM
            and any(o and o not in typed for o in n.output)]
    types = inferred_types(proto) if todo else {}
    count = 0
    for node in todo:
        shapes = _lstm_output_shapes(node, types.get(node.input[0]))
        if shapes is None:
            continue
        graph.value_info.extend(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, shape)
                                for out, shape in zip(node.output, shapes)
                                if out and out not in typed)
        count += 1
    return count


_MS_LSTM = ("com.microsoft", "DynamicQuantizeLSTM")


def _lstm_output_shapes(node: onnx.NodeProto,
                        x_type: onnx.TypeProto | None) -> list[list[int]] | None:
    """Y, Y_h and Y_c's shapes of an LSTM of layout 0 whose X has type ``x_type`` (None
    while X's shape or the node's hidden_size is unknown)."""
    dims = x_type.tensor_type.shape.dim if x_type is not None else []
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if len(dims) != 3 or not all(d.HasField("dim_value") for d in dims) \
            or "hidden_size" not in attrs:
        return None
    seq, batch, hidden = dims[0].dim_value, dims[1].dim_value, int(attrs["hidden_size"])
    directions = 2 if attrs.get("direction", b"forward") == b"bidirectional" else 1
    return [[seq, directions, batch, hidden]] + [[directions, batch, hidden]] * 2
