"""ONNX in and out of the graph IR: :func:`import_onnx`, :func:`fold_constants`, :func:`to_onnx`.

Import checks the model the way the rest of the compiler needs it (a supported opset,
the ONNX checker, static shapes for every tensor) and turns each failure into a
:class:`~tessera.errors.CompileError` that names the node and says what to do. It takes
models of any opset from :data:`MIN_OPSET` (7) to the newest ONNX knows and of any IR
version: old-IR models are repaired, ops newer than opset :data:`IR_OPSET` expanded to
the ONNX functions that define them, and every model is converted to opset
:data:`IR_OPSET` (:mod:`.upgrade`), so every later pass and :func:`to_onnx` see one
version of each operator. Shapes computed at run time and ``If`` on them are folded
once ``input_shapes`` fixes the inputs (:mod:`.shapes`).

``to_onnx`` writes a graph back as a model onnxruntime runs, which is how the tests
check that import and every later pass keep the model's meaning.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnx.inliner
import onnx.version_converter
from google.protobuf.message import DecodeError
from onnx import AttributeProto, helper, numpy_helper

from tessera.errors import CLI, PYTHON, CompileError, input_shape_fix

from .graph import DTYPES, Graph, Node, Value
from .qoperator import KEPT_CONTRIB_OPS, expand_qoperators
from .shapes import (FOLD_LIMIT_BYTES, SHAPE_ONLY, constant_data, evaluate_proto,
                     fold_shape_subgraphs, foldable_op, refuse_control_flow)
from .upgrade import (DEFAULT_DOMAINS, IR_OPSET, MIN_OPSET, attach_weights, check_opset,
                      convert_opset, detach_weights, expand_newer_ops, repair_ir)

log = logging.getLogger("tessera.compiler")

__all__ = ["FOLD_LIMIT_BYTES", "IR_OPSET", "MIN_OPSET", "evaluate_proto", "fold_constants",
           "import_onnx", "node_proto", "to_onnx"]

ModelSource = onnx.ModelProto | str | Path | bytes


# ------------------------------------------------------------------------------ import
def import_onnx(model: ModelSource,
                input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Load, check and shape an ONNX model and return it as a :class:`Graph`.

    ``model`` is a ModelProto (not modified), a file path or serialized bytes, of ONNX
    opset 7 to the newest and any IR version; it is converted to opset :data:`IR_OPSET`
    (logged at INFO on the ``tessera.compiler`` logger). ``input_shapes`` gives the shape
    of inputs with dynamic dims (``{"x": (1, 3, 224, 224)}``); it must agree with the
    model's static dims. Initializers (also those listed as graph inputs) and ``Constant``
    nodes become constants; shapes computed in the graph, constant subgraphs and ``If``
    on a constant condition are folded (:func:`~.shapes.fold_shape_subgraphs`,
    :func:`fold_constants`) and unused nodes removed. Raises :class:`CompileError` for
    anything the compiler cannot take, naming the node, tensor or attribute to blame.
    """
    proto, source = load_model(model)
    repair_ir(proto, source)
    opset = check_opset(proto, source)
    if proto.functions:
        # Local functions (PyTorch's dynamo exporter) are plain subgraphs once inlined.
        proto = onnx.inliner.inline_local_functions(proto)
    _name_nodes(proto.graph)
    expand_qoperators(proto)  # QOperator nodes as DQ -> float op -> Q
    _check_nodes(proto.graph)
    # Before the checker, which refuses an input without a shape that input_shapes gives.
    _set_input_shapes(proto.graph, dict(input_shapes or {}))
    _run_checker(proto, source)
    if opset > IR_OPSET:
        proto = expand_newer_ops(proto, opset)
    fold_shape_subgraphs(proto, opset)
    refuse_control_flow(proto.graph)
    if opset != IR_OPSET:
        proto = convert_opset(proto, opset, source)
    _name_nodes(proto.graph)  # the converter's and inlined branches' nodes too
    proto = _infer_shapes(proto)
    graph = _build_graph(proto)
    graph.metadata = {p.key: p.value for p in proto.metadata_props}
    for node in graph.nodes:
        if node.op == "Conv":
            _check_conv(graph, node)
    fold_constants(graph)
    graph.remove_unused()
    graph.verify()
    return graph


def load_model(model: ModelSource) -> tuple[onnx.ModelProto, str]:
    """A private copy of the model (a ``ModelProto``, a path or bytes) and how to call it in
    messages; :class:`CompileError` for anything that is not an ONNX model."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        return proto, f"model {model.graph.name!r}"
    if isinstance(model, (bytes, bytearray, memoryview)):
        source = f"the model data given ({len(model)} bytes)"
        proto = _parse(lambda: onnx.load_model_from_string(bytes(model)), source)
    elif isinstance(model, (str, Path)):
        path = Path(model)
        source = f"file '{path}'"
        if not path.is_file():
            raise CompileError(f"cannot import {source}: there is no such file")
        proto = _parse(lambda: onnx.load(str(path)), source)
    else:
        raise CompileError(f"import_onnx takes an onnx.ModelProto, a path or bytes, not "
                           f"{type(model).__name__}")
    if not proto.HasField("graph") or proto.ir_version <= 0 or not proto.opset_import:
        raise CompileError(f"{source} is not an ONNX model or is truncated (it has no graph, "
                           f"IR version or opset import); export the model again")
    return proto, source


def _parse(load: Any, source: str) -> onnx.ModelProto:
    try:
        return load()
    except (DecodeError, ValueError, OSError, RuntimeError) as exc:
        raise CompileError(f"{source} is not an ONNX model or is damaged ({exc}); export "
                           f"the model again") from exc


def _name_nodes(graph: onnx.GraphProto) -> None:
    """Give unnamed nodes (and repeated names) unique names, so every message and pass can
    point at a node."""
    seen: set[str] = set()
    for index, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            base = node.name or f"{node.op_type}_{index}"
            name, k = base, 1
            while name in seen:
                name, k = f"{base}_{k}", k + 1
            node.name = name
        seen.add(node.name)


def _check_nodes(graph: onnx.GraphProto) -> None:
    """Refuse what the IR cannot hold and give the checker's commonest failure (a tensor
    read before it exists) a clearer message than the checker's."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    producer = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        where = f"{node.op_type} node {node.name!r}"
        if (node.domain not in DEFAULT_DOMAINS
                and (node.domain, node.op_type) not in KEPT_CONTRIB_OPS):
            raise CompileError(
                f"{where} is in operator domain {node.domain!r}; the compiler takes only "
                f"standard ONNX ops (for onnxruntime's quantizer: use QuantFormat.QDQ without "
                f"the UseQDQContribOps option)", op=node.name)
        for tensor in node.input:
            if tensor not in defined:
                raise CompileError(_undefined_message(where, tensor, producer.get(tensor)),
                                   op=node.name)
        defined.update(node.output)


def _undefined_message(where: str, tensor: str, later: onnx.NodeProto | None) -> str:
    if later is None:
        return (f"{where} reads tensor {tensor!r}, which no graph input, initializer or node "
                f"output defines; the model is incomplete, export it again")
    return (f"{where} reads tensor {tensor!r}, which {later.op_type} node {later.name!r} "
            f"produces later: the nodes are not in topological order or form a cycle; "
            f"sort them (the ONNX format requires it) or export the model again")


def _run_checker(proto: onnx.ModelProto, source: str) -> None:
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        message = str(exc).strip()
        match = re.search(r"name: (\S*) OpType: (\S+)", message, re.IGNORECASE)
        first = message.splitlines()[0]
        if match is None:
            raise CompileError(f"{source} fails the ONNX checker: {first}") from exc
        name, op = match.groups()
        hint = (f"{op!r} is not an operator of the model's ONNX opset; replace it by "
                f"standard ops" if first.startswith("No Op registered")
                else "fix the node in the exporter")
        raise CompileError(f"{op} node {name!r} of {source} fails the ONNX checker: {first}; "
                           f"{hint}", op=name) from exc


def _set_input_shapes(graph: onnx.GraphProto, shapes: dict[str, Sequence[int]]) -> None:
    """Write ``shapes`` into the graph inputs; refuse dims left dynamic or contradicted."""
    constants = {t.name for t in graph.initializer}
    inputs = list(graph.input)  # none is an initializer since repair_ir
    names = [i.name for i in inputs]
    for name in shapes:
        if name not in names:
            what = "a constant (initializer)" if name in constants else "not an input"
            raise CompileError(f"input_shapes names {name!r}, which is {what} of the model; "
                               f"its inputs are {names}")
    for value in inputs:
        _set_input_shape(value, shapes.get(value.name))
    # Intermediate shapes the exporter wrote may hold the symbolic dims just replaced.
    del graph.value_info[:]
    for value in graph.output:
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.Clear()


def _set_input_shape(value: onnx.ValueInfoProto, given: Sequence[int] | None) -> None:
    ttype = value.type.tensor_type
    dims = list(ttype.shape.dim) if ttype.HasField("shape") else None
    known = None if dims is None else [d.dim_value if d.HasField("dim_value") else None
                                       for d in dims]
    if given is None:
        _require_static(value.name, dims)
        return
    given = tuple(int(d) for d in given)
    if known is not None and (len(known) != len(given) or any(
            k is not None and k != g for k, g in zip(known, given))):
        model_dims = ["?" if k is None else k for k in known]
        raise CompileError(f"input_shapes gives input {value.name!r} shape {list(given)}, but "
                           f"the model declares {model_dims}; give a shape that matches")
    ttype.shape.Clear()
    for d in given:
        ttype.shape.dim.add().dim_value = d


def _require_static(name: str, dims: list[onnx.TensorShapeProto.Dimension] | None) -> None:
    """CompileError naming the input's first dynamic dim, unless all its dims are static."""
    if dims is None:
        raise CompileError(f"input {name!r} has no shape in the model",
                           fix=_input_shape_advice(name, ("D0", "D1", "...")))
    dynamic = [i for i, d in enumerate(dims) if not d.HasField("dim_value")]
    if dynamic:
        first = dims[dynamic[0]]
        label = f" ({first.dim_param!r})" if first.dim_param else ""
        shown = ["?" if i in dynamic else d.dim_value for i, d in enumerate(dims)]
        example = tuple(1 if i in dynamic else d.dim_value for i, d in enumerate(dims))
        raise CompileError(f"input {name!r} has dynamic dim {dynamic[0]}{label} (shape "
                           f"{shown}) and the compiler needs static shapes (in the example, put "
                           f"the sizes you will run for the 1s that stand for '?')",
                           fix=_input_shape_advice(name, example))


def _input_shape_advice(name: str, example: Sequence[int | str]) -> dict[str, str]:
    """How to give an input's shape: from Python, the argument and the command line's flag
    (import is where both meet); on the command line, the flag."""
    advice = input_shape_fix(name, example)
    return {PYTHON: f"{advice[PYTHON]} (on the command line of tessera compile, run and "
                    f"profile: {advice[CLI].removeprefix('give its shape, e.g. ')})",
            CLI: advice[CLI]}


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    weights = detach_weights(proto.graph)
    _drop_dynamic_output_shapes(proto.graph)
    try:
        while True:
            try:
                inferred = onnx.shape_inference.infer_shapes(
                    proto, check_type=True, strict_mode=True, data_prop=True)
                break
            except onnx.shape_inference.InferenceError as exc:
                failure = _inference_failure(exc)
                if failure is None or not _drop_stale_output_shapes(proto.graph, failure[1]):
                    raise
    except onnx.shape_inference.InferenceError as exc:
        failure = _inference_failure(exc)
        if failure is None:
            raise CompileError(f"ONNX shape inference failed: {str(exc).strip()}") from exc
        op, name, reason = failure
        raise CompileError(f"{op} node {name!r}: shape inference failed: {reason}; "
                           f"check its attributes against its inputs' shapes", op=name) from exc
    attach_weights(inferred.graph, weights)
    return inferred


def _inference_failure(exc: Exception) -> tuple[str, str, str] | None:
    """(op, node name, reason) of a shape-inference error, or None if it names no node."""
    match = re.search(r"\(op_type:(\S+), node name: ([^)]*)\): (.*)", str(exc).strip())
    return None if match is None else (match[1], match[2], match[3].strip())


def _drop_dynamic_output_shapes(graph: onnx.GraphProto) -> None:
    """Forget the declared shapes of graph outputs that have a dynamic dim: once the
    inputs' shapes are fixed, inference computes them, and a stale declaration (ddddocr's
    ``[1, seqlen]`` for a ``[seqlen, 1, classes]`` output) would otherwise stand for the
    computed shape where inference cannot merge the two, leaving the output unshaped."""
    for value in graph.output:
        ttype = value.type.tensor_type
        if ttype.HasField("shape") and any(not d.HasField("dim_value")
                                           for d in ttype.shape.dim):
            ttype.ClearField("shape")


def _drop_stale_output_shapes(graph: onnx.GraphProto, node_name: str) -> bool:
    """Forget the declared shapes of the graph outputs that node ``node_name`` writes;
    whether there were any.

    Why: exporters and hand edits leave graph outputs declared with static shapes the
    graph does not compute; onnxruntime only warns and returns what the node computes,
    so the inferred shape is the one to keep."""
    writes = {o for n in graph.node if n.name == node_name for o in n.output}
    dropped = []
    for value in graph.output:
        ttype = value.type.tensor_type
        if value.name in writes and ttype.HasField("shape"):
            declared = [d.dim_value or d.dim_param or "?" for d in ttype.shape.dim]
            ttype.ClearField("shape")
            dropped.append(f"{value.name!r} {declared}")
    if dropped:
        log.warning("graph output %s: the declared shape contradicts the one node %r "
                    "computes; the computed shape is used, as onnxruntime does",
                    ", ".join(dropped), node_name)
    return bool(dropped)


# -------------------------------------------------------------------- graph building
def _build_graph(proto: onnx.ModelProto) -> Graph:
    g = proto.graph
    graph = Graph(g.name or "graph")
    types = {v.name: v.type for v in (*g.input, *g.value_info, *g.output)}
    for tensor in g.initializer:
        _add_const(graph, tensor.name, numpy_helper.to_array(tensor), "initializer")
    for value in g.input:
        if value.name not in graph.values:
            shape, dtype = _static_type(types[value.name], value.name, "graph input")
            graph.add_input(value.name, shape, dtype)
    read = {t for n in g.node for t in n.input} | {o.name for o in g.output}
    for node in g.node:
        if node.op_type == "Constant":
            _add_const(graph, node.output[0], constant_data(node), f"Constant {node.name!r}")
        else:
            graph.nodes.append(_node(graph, node, types, read))
    graph.outputs = [o.name for o in g.output]
    return graph


def _add_const(graph: Graph, name: str, data: np.ndarray, what: str) -> None:
    _check_dtype(str(data.dtype), name, what)
    graph.add_const(name, data)


def _check_dtype(dtype: str, tensor: str, what: str) -> None:
    if dtype not in DTYPES:
        raise CompileError(f"tensor {tensor!r} ({what}) has element type {dtype}, which the "
                           f"compiler does not handle (it takes {', '.join(DTYPES)}); cast it "
                           f"in the model")


def _static_type(ttype: onnx.TypeProto, tensor: str, what: str,
                 op: str | None = None) -> tuple[tuple[int, ...], str]:
    """Shape and numpy dtype name of a tensor type; CompileError unless both are known."""
    if not ttype.HasField("tensor_type"):
        raise CompileError(f"{what} {tensor!r} is not a tensor (sequences, maps and optionals "
                           f"are not supported)")
    tt = ttype.tensor_type
    name = onnx.TensorProto.DataType.Name(tt.elem_type).lower()
    dtype = {"float": "float32", "double": "float64"}.get(name, name)
    _check_dtype(dtype, tensor, what)
    dims = tt.shape.dim
    if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in dims):
        raise CompileError(f"{what} {tensor!r} has no static shape after shape inference and "
                           f"folding: its shape depends on the values of the input data, not "
                           f"only on their shapes; the compiler needs static shapes, so compute "
                           f"it with a size fixed in the model", op=op)
    return tuple(d.dim_value for d in dims), dtype


def _node(graph: Graph, proto: onnx.NodeProto, types: Mapping[str, onnx.TypeProto],
          read: set[str]) -> Node:
    where = f"{proto.op_type} node {proto.name!r}"
    outputs = []
    for out in proto.output:
        if out and out not in types and out not in read:
            out = ""  # an optional output nobody reads and inference did not type
        if out:
            if out not in types:
                raise CompileError(f"shape inference gave no shape for output {out!r} of "
                                   f"{where}; the compiler needs static shapes everywhere",
                                   op=proto.name)
            shape, dtype = _static_type(types[out], out, f"{where}: output", proto.name)
            graph.add_value(out, shape, dtype)
        outputs.append(out)
    while outputs and not outputs[-1]:
        outputs.pop()
    attrs = {a.name: _attr_value(a) for a in proto.attribute}
    return Node(proto.op_type, proto.name, list(proto.input), outputs, attrs,
                "" if proto.domain in DEFAULT_DOMAINS else proto.domain)


def _attr_value(attr: AttributeProto) -> Any:
    """An attribute as plain Python: numbers, lists, str, numpy arrays for tensors."""
    value = helper.get_attribute_value(attr)
    if attr.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if attr.type == AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in value]
    if attr.type == AttributeProto.STRING:
        return value.decode()
    if attr.type == AttributeProto.STRINGS:
        return [s.decode() for s in value]
    if attr.type in (AttributeProto.INTS, AttributeProto.FLOATS):
        return list(value)
    return value


def _check_conv(graph: Graph, node: Node) -> None:
    """ONNX's shape inference takes Conv's kernel_shape and group on trust; onnxruntime
    fails at run time if they disagree with the weights, so check here."""
    x, w = graph.values[node.inputs[0]].shape, graph.values[node.inputs[1]].shape
    group = node.attr("group", 1)
    kernel = node.attr("kernel_shape")
    problem = None
    if len(x) != len(w):
        problem = f"input rank {len(x)} but weight rank {len(w)}"
    elif kernel is not None and tuple(kernel) != w[2:]:
        problem = f"kernel_shape {list(kernel)} but weights of shape {list(w)}"
    elif x[1] != w[1] * group or w[0] % group:
        problem = (f"group {group}, which does not fit input channels {x[1]} and weights of shape "
                   f"{list(w)} (need C_in == W.shape[1] * group and W.shape[0] % group == 0)")
    if problem:
        raise CompileError(f"Conv node {node.name!r} has {problem}; fix its attributes or "
                           f"weights", op=node.name)


# ------------------------------------------------------------------- constant folding
def fold_constants(graph: Graph) -> int:
    """Evaluate every node whose inputs are all constants and make its outputs constants.

    ``Shape`` and ``Size`` fold whatever their input, since shapes are static: that turns
    the ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` of PyTorch's flatten into
    one Reshape with a constant shape.

    Keeps QuantizeLinear/DequantizeLinear (quantized weights stay int8 behind their
    DequantizeLinear), random ops and nodes whose outputs exceed
    :data:`FOLD_LIMIT_BYTES`. Nodes are evaluated by onnx's reference implementation,
    so every ONNX op folds. Returns the number of nodes folded (and removed).
    """
    folded = []
    for node in graph.nodes:
        if _foldable(graph, node):
            outputs = [o for o in node.outputs if o]
            feeds = {i: _feed(graph.values[i]) for i in node.inputs if i}
            results = evaluate_proto(node_proto(node), feeds, node.name)
            for name, data in zip(outputs, results):
                _set_const(graph, node, name, data)
            folded.append(node)
    graph.remove_nodes(folded)
    return len(folded)


def _foldable(graph: Graph, node: Node) -> bool:
    inputs = [i for i in node.inputs if i]
    if not foldable_op(node.op, node.domain) or not inputs:
        return False
    if node.op not in SHAPE_ONLY and not all(graph.values[i].is_const for i in inputs):
        return False
    out_bytes = sum(graph.values[o].size * np.dtype(graph.values[o].dtype).itemsize
                    for o in node.outputs if o)
    return out_bytes <= FOLD_LIMIT_BYTES


def _feed(value: Value) -> np.ndarray:
    # np.empty maps no memory for the shape-only ops' placeholder inputs.
    return value.data if value.is_const else np.empty(value.shape, value.dtype)


def _set_const(graph: Graph, node: Node, name: str, data: Any) -> None:
    value = graph.values[name]
    data = np.asarray(data)
    if data.shape != value.shape:
        raise CompileError(f"folding {node}: output {name!r} evaluates to shape "
                           f"{list(data.shape)}, but shape inference said {list(value.shape)}",
                           op=node.name)
    graph.add_value(name, value.shape, value.dtype, data.astype(value.dtype, copy=False))


# ------------------------------------------------------------------------ export
def to_onnx(graph: Graph, opset: int = IR_OPSET) -> onnx.ModelProto:
    """The graph as an ONNX model (constants as initializers) that onnxruntime can run.

    The graph is written at opset :data:`IR_OPSET` and converted to ``opset`` when that
    differs (onnx's converter lacks some downgrades, e.g. Relu to 13). Raises :class:`CompileError` if the graph fails :meth:`Graph.verify`.
    """
    graph.verify()
    used = set(graph.outputs) | {t for n in graph.nodes for t in n.inputs}
    boundary = set(graph.inputs) | set(graph.outputs)
    initializers = [numpy_helper.from_array(v.data, v.name) for v in graph.values.values()
                    if v.is_const and v.name in used]
    value_info = [_value_info(v) for v in graph.values.values()
                  if not v.is_const and v.name not in boundary]
    proto = helper.make_graph(
        [node_proto(n) for n in graph.nodes], graph.name,
        [_value_info(graph.values[i]) for i in graph.inputs],
        [_value_info(graph.values[o]) for o in graph.outputs],
        initializers, value_info=value_info)
    domains = sorted({n.domain for n in graph.nodes if n.domain})
    opsets = [helper.make_opsetid("", IR_OPSET)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(proto, opset_imports=opsets, producer_name="tessera")
    helper.set_model_props(model, graph.metadata)
    # ignore_unknown: onnx has no IR table for onnxruntime's com.microsoft domain (a
    # DynamicQuantizeLSTM kept as it is).
    model.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    if opset != IR_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, opset)
        except Exception as exc:  # the converter raises bare RuntimeErrors and others
            raise CompileError(f"graph {graph.name!r} cannot be written at opset {opset} "
                               f"({exc}); write it at opset {IR_OPSET}") from exc
    return model


def _value_info(value: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(
        value.name, helper.np_dtype_to_tensor_dtype(np.dtype(value.dtype)), value.shape)


def node_proto(node: Node) -> onnx.NodeProto:
    """``node`` as an ONNX NodeProto (attributes typed from the op's schema)."""
    proto = helper.make_node(node.op, node.inputs, node.outputs, name=node.name,
                             domain=node.domain or None)
    types = _attr_types(node)
    proto.attribute.extend(_make_attribute(k, v, types.get(k)) for k, v in node.attrs.items())
    return proto


def _attr_types(node: Node) -> dict[str, int]:
    """Attribute types from the op schema: a Python value alone cannot tell an empty INTS
    from an empty FLOATS, nor a FLOAT that holds 1 from an INT."""
    try:
        schema = onnx.defs.get_schema(node.op, IR_OPSET, node.domain)
    except onnx.defs.SchemaError:
        return {}
    return {k: int(a.type.value) for k, a in schema.attributes.items()}


def _make_attribute(key: str, value: Any, attr_type: int | None) -> AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if attr_type == AttributeProto.TENSORS:
        return helper.make_attribute(key, [numpy_helper.from_array(np.asarray(v))
                                           for v in value], attr_type=attr_type)
    if attr_type == AttributeProto.FLOAT:
        return helper.make_attribute(key, float(value))
    if attr_type == AttributeProto.INT:
        return helper.make_attribute(key, int(value))
    if attr_type == AttributeProto.FLOATS:
        return helper.make_attribute(key, [float(v) for v in value], attr_type=attr_type)
    if attr_type == AttributeProto.INTS:
        return helper.make_attribute(key, [int(v) for v in value], attr_type=attr_type)
    return helper.make_attribute(key, value, attr_type=attr_type)
