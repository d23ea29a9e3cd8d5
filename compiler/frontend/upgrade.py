"""Old and new ONNX models brought to the IR's version: IR repair and opset conversion.

:func:`repair_ir` makes an old-IR model valid for the checker and the converter (IR 3
requires every initializer to be a graph input, and onnxruntime's quantizer writes IR-3
models whose new scales are not); :func:`check_opset` accepts opsets :data:`MIN_OPSET`
to the newest ONNX knows; :func:`expand_newer_ops` replaces ops that opset
:data:`IR_OPSET` lacks by the ONNX functions that define them; :func:`convert_opset`
converts a model to :data:`IR_OPSET` with ``onnx.version_converter`` (logged at INFO on
the ``tessera.compiler`` logger) and, where the converter fails, names the node it fails
on.
"""
from __future__ import annotations

import logging
import re
from typing import Callable

import numpy as np
import onnx
import onnx.inliner
import onnx.version_converter
from onnx import helper, numpy_helper

from tessera.errors import CompileError

__all__ = ["DEFAULT_DOMAINS", "IR_OPSET", "MIN_OPSET", "attach_weights", "check_opset",
           "convert_opset", "detach_weights", "expand_newer_ops", "inferred_types", "repair_ir"]

#: The opset of the IR: imported models are converted to it.
IR_OPSET = 17
#: The oldest default-domain opset import accepts: opset 7 brought numpy broadcasting,
#: which every later version of the arithmetic ops keeps.
MIN_OPSET = 7
#: The first IR version whose initializers need not be graph inputs.
_IR_FREE_INITIALIZERS = 4
DEFAULT_DOMAINS = ("", "ai.onnx")

log = logging.getLogger("tessera.compiler")


def repair_ir(proto: onnx.ModelProto, source: str) -> None:
    """Make ``proto`` (modified in place) a model of IR 4 or later whose initializers are
    constants: graph inputs that an initializer also gives are removed from the inputs
    (the compiler treats weights as constants, never as inputs to override), and an IR
    below 4 is raised to 4, where initializers need not be inputs."""
    constants = {t.name for t in proto.graph.initializer}
    listed = [i.name for i in proto.graph.input if i.name in constants]
    if listed:
        inputs = [i for i in proto.graph.input if i.name not in constants]
        del proto.graph.input[:]
        proto.graph.input.extend(inputs)
    if proto.ir_version < _IR_FREE_INITIALIZERS:
        log.info("%s: IR version %d raised to %d (initializers as constants)", source,
                 proto.ir_version, _IR_FREE_INITIALIZERS)
        proto.ir_version = _IR_FREE_INITIALIZERS
    if listed:
        log.info("%s: %d graph inputs given by initializers are constants (%s%s)", source,
                 len(listed), ", ".join(listed[:3]), ", ..." if len(listed) > 3 else "")


def check_opset(proto: onnx.ModelProto, source: str) -> int:
    """The model's default-domain opset; CompileError unless the compiler takes it."""
    versions = [o.version for o in proto.opset_import if o.domain in DEFAULT_DOMAINS]
    newest = onnx.defs.onnx_opset_version()
    if not versions:
        raise CompileError(f"{source} imports no opset of the default ONNX domain; export "
                           f"it with opset {IR_OPSET}")
    if not MIN_OPSET <= versions[0] <= newest:
        raise CompileError(
            f"{source} uses ONNX opset {versions[0]}, but the compiler takes opsets "
            f"{MIN_OPSET} to {newest}; export it with an opset in that range (e.g. "
            f"opset_version={IR_OPSET})")
    return versions[0]


def expand_newer_ops(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``proto`` with each node of an op that opset :data:`IR_OPSET` lacks (Gelu, Mish,
    Swish, GroupNormalization, RMSNormalization, ...) replaced by the ONNX function
    that its schema defines it as, when there is one: opset-17 ops after conversion.
    onnx's inliner splices the functions in; other ops are left to the converter."""
    expanded = 0
    types: dict[str, onnx.TypeProto] | None = None
    for node in proto.graph.node:
        if node.domain not in DEFAULT_DOMAINS or _exists_at_ir_opset(node.op_type):
            continue
        schema = onnx.defs.get_schema(node.op_type, opset)
        if schema.has_context_dependent_function and types is None:
            types = inferred_types(proto)
        body = _function_body(schema, node, opset, types or {})
        if body is None:
            continue
        body.domain, body.name = _EXPANDED_DOMAIN, f"{node.op_type}_{expanded}"
        for index, inner in enumerate(body.node):
            # Named after the user's node, so messages point at it.
            inner.name = f"{node.name}/{inner.name or f'{inner.op_type}_{index}'}"
        _add_default_attributes(node, schema)
        node.domain, node.op_type = _EXPANDED_DOMAIN, body.name
        proto.functions.append(body)
        expanded += 1
    if not expanded:
        return proto
    proto.opset_import.append(helper.make_opsetid(_EXPANDED_DOMAIN, 1))
    inlined = onnx.inliner.inline_local_functions(proto, convert_version=True)
    imports = [o for o in inlined.opset_import if o.domain != _EXPANDED_DOMAIN]
    del inlined.opset_import[:]
    inlined.opset_import.extend(imports)
    return inlined


def _exists_at_ir_opset(op: str) -> bool:
    try:
        onnx.defs.get_schema(op, IR_OPSET)
    except onnx.defs.SchemaError:
        return False
    return True


def _add_default_attributes(node: onnx.NodeProto, schema: onnx.defs.OpSchema) -> None:
    """Write the schema's defaults of attributes the node omits: a function body reads
    them by reference, and the inliner knows only the node's."""
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value.name:
            node.attribute.append(attr.default_value)


def _function_body(schema: onnx.defs.OpSchema, node: onnx.NodeProto, opset: int,
                   types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """The function ``schema`` defines ``node`` as at ``opset`` (None if it has none, or
    if it depends on input types that are not known)."""
    plain = [v for v in schema.function_opset_versions if v <= opset]
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    body = onnx.FunctionProto()
    if schema.has_function and plain:
        body.ParseFromString(schema.get_function_with_opset_version(max(plain)))
    elif schema.has_context_dependent_function and dependent:
        inputs = [types.get(i) if i else onnx.TypeProto() for i in node.input]
        if any(t is None for t in inputs):
            return None
        body.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            max(dependent), node.SerializeToString(), [t.SerializeToString() for t in inputs]))
    else:
        return None
    return body


def inferred_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The types (element type and shape, as far as known) of ``proto``'s tensors from
    ONNX's shape inference; a model it fails on gives the declared ones."""
    weights = detach_weights(proto.graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # the strict inference after folding reports what is wrong
        inferred = proto
    finally:
        attach_weights(proto.graph, weights)
    g = inferred.graph
    types = {t.name: helper.make_tensor_type_proto(t.data_type, t.dims)
             for t in proto.graph.initializer}
    types.update((v.name, v.type) for v in (*g.input, *g.value_info, *g.output))
    return types


_EXPANDED_DOMAIN = "tessera.expanded"


def convert_opset(proto: onnx.ModelProto, opset: int, source: str) -> onnx.ModelProto:
    """``proto`` converted from ``opset`` to :data:`IR_OPSET`; CompileError naming the node
    the converter fails on."""
    if opset > IR_OPSET:
        _size_splits(proto)
    held = _hold_back(proto.graph) if opset > IR_OPSET else False
    if held:
        proto.opset_import.append(helper.make_opsetid(_HELD_DOMAIN, 1))
    weights = detach_weights(proto.graph)
    try:
        converted = onnx.version_converter.convert_version(proto, IR_OPSET)
    except Exception as exc:  # the converter raises bare RuntimeErrors and others
        raise _conversion_error(proto, opset, source, exc) from exc
    attach_weights(converted.graph, weights)
    if held:
        _release(converted)
    converted.ir_version = max(converted.ir_version, helper.find_min_ir_version_for(
        [helper.make_opsetid("", IR_OPSET)]))
    log.info("converted %s from opset %d to %d", source, opset, IR_OPSET)
    return converted


#: Initializers larger than this do not go through the converter or shape inference
#: (each copies the model several times); the small ones they read (axes, pads, scales,
#: sizes) do.
_DETACH_BYTES = 4096


def detach_weights(graph: onnx.GraphProto) -> list[tuple[int, onnx.TensorProto]]:
    """Take the large initializers out of ``graph``, leaving typed graph inputs in their
    place; return them with their positions for :func:`attach_weights`."""
    detached = [(i, t) for i, t in enumerate(graph.initializer)
                if len(t.raw_data) > _DETACH_BYTES]
    if detached:
        kept = [t for t in graph.initializer if len(t.raw_data) <= _DETACH_BYTES]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                           for _, t in detached)
    return detached


def attach_weights(graph: onnx.GraphProto,
                   weights: list[tuple[int, onnx.TensorProto]]) -> None:
    """Put the initializers :func:`detach_weights` took back in their places (in
    ``graph`` or the graph made from it), in place of the inputs it left."""
    if not weights:
        return
    names = {t.name for _, t in weights}
    inputs = [i for i in graph.input if i.name not in names]
    del graph.input[:]
    graph.input.extend(inputs)
    initializers = list(graph.initializer)
    for index, tensor in weights:
        initializers.insert(index, tensor)
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def _conversion_error(proto: onnx.ModelProto, opset: int, source: str,
                      exc: Exception) -> CompileError:
    """The converter's failure, pinned on the first node that fails alone (the converter's
    own message names no node)."""
    advice = f"export the model with opset_version={IR_OPSET}"
    culprit = _first_unconvertible(proto)
    if culprit is None:
        return CompileError(f"{source} uses opset {opset} and cannot be converted to opset "
                            f"{IR_OPSET}, the compiler's ({_converter_reason(exc)}); {advice}")
    node, reason = culprit
    op = node.op_type
    return CompileError(f"{op} node {node.name!r} of {source} cannot be converted from opset "
                        f"{opset} to opset {IR_OPSET}, the compiler's: the converter says "
                        f"{reason!r}; change the node or {advice}", op=node.name)


def _first_unconvertible(proto: onnx.ModelProto) -> tuple[onnx.NodeProto, str] | None:
    """The first node that the converter fails on as a one-node model, and why."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # a model inference cannot type still has nodes to try
        inferred = proto
    g = inferred.graph
    types = {v.name: v.type for v in (*g.input, *g.value_info, *g.output)}
    initializers = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        read = [i for i in dict.fromkeys(node.input) if i]
        inputs = [helper.make_value_info(i, types[i]) if i in types
                  else helper.make_tensor_value_info(i, onnx.TensorProto.FLOAT, None)
                  for i in read if i not in initializers]
        graph = helper.make_graph(
            [node], node.name, inputs, [helper.make_empty_tensor_value_info(o)
                                        for o in node.output if o],
            [initializers[i] for i in read if i in initializers])
        one = helper.make_model(graph, opset_imports=list(proto.opset_import))
        one.ir_version = proto.ir_version
        try:
            onnx.version_converter.convert_version(one, IR_OPSET)
        except Exception as exc:  # as in convert_opset
            return node, _converter_reason(exc)
    return None


def _converter_reason(exc: Exception) -> str:
    """The converter's message without its C++ file, line and assertion text."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    reason = re.sub(r"^\S+\.(h|cc|cpp):\d+: \S+: ", "", lines[-1])
    return re.sub(r"^Assertion `.*` failed: ", "", reason)


# Ops from opset 18 and later that the converter cannot take down to the IR opset.
def _hold_back(graph: onnx.GraphProto) -> bool:
    """Move the nodes the converter has no downgrade for (but that mean the same at the IR
    opset) to a private domain, which the converter leaves alone; True if there were any."""
    held = False
    for node in graph.node:
        check = _NEWER_FEATURES.get(node.op_type)
        if check is None or node.domain not in DEFAULT_DOMAINS:
            continue
        feature = check(node)
        if feature:
            raise CompileError(f"{node.op_type} node {node.name!r} uses {feature}, which opset "
                               f"{IR_OPSET} (the compiler's) does not have; export the model "
                               f"with opset_version={IR_OPSET}", op=node.name)
        node.domain = _HELD_DOMAIN
        held = True
    return held


def _release(proto: onnx.ModelProto) -> None:
    for node in proto.graph.node:
        if node.domain == _HELD_DOMAIN:
            node.domain = ""
            # Split's num_outputs (18): at opset 17 a Split without sizes divides evenly
            # into its outputs, the same split when the size divides.
            kept = [a for a in node.attribute if a.name != "num_outputs"]
            del node.attribute[:]
            node.attribute.extend(kept)
    imports = [o for o in proto.opset_import if o.domain != _HELD_DOMAIN]
    del proto.opset_import[:]
    proto.opset_import.extend(imports)


def _size_splits(proto: onnx.ModelProto) -> None:
    """Give each Split that has ``num_outputs`` (opset 18) and no sizes its sizes as a
    constant input: chunks of ``ceil(size / num_outputs)``, the last one smaller, which
    opset 17's Split (even parts only, without sizes) cannot otherwise say."""
    splits = [n for n in proto.graph.node if n.op_type == "Split"
              and n.domain in DEFAULT_DOMAINS and (len(n.input) < 2 or not n.input[1])
              and any(a.name == "num_outputs" for a in n.attribute)]
    if not splits:
        return
    types = inferred_types(proto)
    for node in splits:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        dims = types.get(node.input[0], onnx.TypeProto()).tensor_type.shape.dim
        axis = attrs.get("axis", 0)
        if not dims or not -len(dims) <= axis < len(dims) or \
                not dims[axis].HasField("dim_value"):
            continue  # unknown size: _release drops num_outputs (an even split)
        size, parts = dims[axis].dim_value, attrs["num_outputs"]
        chunk = -(-size // parts)
        sizes = [min(chunk, max(size - k * chunk, 0)) for k in range(parts)]
        name = f"{node.name}/split_sizes"
        proto.graph.initializer.append(numpy_helper.from_array(
            np.array(sizes, dtype=np.int64), name))
        del node.input[1:]
        node.input.append(name)
        kept = [a for a in node.attribute if a.name != "num_outputs"]
        del node.attribute[:]
        node.attribute.extend(kept)


def _pad_feature(node: onnx.NodeProto) -> str | None:
    if len(node.input) > 3 and node.input[3]:
        return "the axes input"
    mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
    return "mode 'wrap'" if mode == b"wrap" else None


def _resize_feature(node: onnx.NodeProto) -> str | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("antialias", 0) or "axes" in attrs:
        return "antialias or axes"
    if attrs.get("keep_aspect_ratio_policy", b"stretch") != b"stretch":
        return "keep_aspect_ratio_policy"
    if attrs.get("coordinate_transformation_mode") == b"half_pixel_symmetric":
        return "coordinate_transformation_mode 'half_pixel_symmetric'"
    return None


#: Ops onnx's version converter cannot take from opset 18+ down to the IR opset, with what
#: tells whether a node uses a feature opset 17 lacks (None: it means the same there).
_NEWER_FEATURES: dict[str, Callable[[onnx.NodeProto], str | None]] = {
    "Pad": _pad_feature, "Resize": _resize_feature, "Split": lambda node: None}
_HELD_DOMAIN = "tessera.held"
