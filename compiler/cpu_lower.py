"""Lowering of one graph node to CPU kernel steps, for the nodes the accelerator does not run.

:func:`lower_node_to_cpu` turns a :class:`~.graph.Node` into a list of :class:`CpuStep`:
each step is one :class:`~.cpu.kernel.CpuKernel` (built by the generators of
:mod:`tessera.compiler.cpu`) with the names of the tensors it reads and writes, or a view
(``kernel`` None: a reshape, no computation). Most nodes are one step; the integer
``tessera`` nodes are a few (e.g. QConv: int8 convolution to int32, then an elementwise
requantization), linked by intermediate tensors named ``f"{node.name}:<what>"``.
:func:`run_cpu_steps` executes steps on numpy arrays (the tests' executor, and a
reference for runtimes).

Semantics are onnxruntime's (CPU provider) for standard ops and :mod:`.qref`'s (the golden
model, itself onnxruntime's x86 integer kernels) for the ``tessera`` nodes. Integer
results are bit-exact (QuantizeLinear and the requantizations included); so are float
results of single IEEE operations (DequantizeLinear, Add, Mul, Div, pools' maxima...).
Otherwise float results follow the kernels' documented accuracy: exp, sigmoid and tanh
are polynomials within a few ulp, and float sums (softmax, layer norm, reductions,
average pools, linear Resize) are added in another order, so they differ from
onnxruntime in the last bits. A
float-to-integer Cast of a value outside the target range is undefined, as in numpy and
onnxruntime.

Each op's lowering first *plans* its steps (pure Python: checks, constants, expressions)
and builds the LLVM IR only when asked, so :func:`cpu_unsupported_reason` answers from
the same code without generating IR. A few limits only a builder knows (e.g. a pooling
window too large to unroll) surface from :func:`lower_node_to_cpu` alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tessera.errors import CompileError, CpuKernelError
from tessera.isa.requant import requant_scale

from .cpu import (DTYPES as KERNEL_DTYPES, CpuKernel, E, TensorSpec, build_average_pool,
                  build_concat, build_conv_int8, build_global_average_pool,
                  build_global_max_pool, build_matmul_int8, build_max_pool, build_pad,
                  build_resize, build_transpose, fused_elementwise, layer_norm, log_softmax,
                  maximum, minimum, reduction, softmax)
from .cpu.pool import Window
from .graph import Graph, Node, Value
from .qdq import DOMAIN

__all__ = ["CpuStep", "cpu_unsupported_reason", "lower_node_to_cpu", "run_cpu_steps"]

_QUANT_DTYPES = ("int8", "uint8")
_QUANTIZE_HINT = "quantize the model (tessera.compile(..., calibration=...))"
#: Above this many corrected (a, b) pairs a QAdd kernel would get slow. Not seen in
#: practice: over 300 random scale sets the float32 formula without FMA needed 0.09
#: corrections on average, at most 2.
_QADD_MAX_PATCHES = 64


# ------------------------------------------------------------------------------ steps
@dataclass
class CpuStep:
    """One CPU step of a compiled model."""

    name: str                      # unique step name (node name, plus ":suffix" for extra steps)
    op: str                        # the graph node's op type, e.g. "QuantizeLinear", "QConv"
    kernel: CpuKernel | None       # None: a pure reshape (a view of the input, no computation)
    inputs: tuple[str, ...]        # tensor names read, in the kernel's input order
    outputs: tuple[str, ...]       # tensor names written, in the kernel's output order
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # inputs that are constants
    shape: tuple[int, ...] | None = None   # for kernel None: the output shape of the view

    def __post_init__(self) -> None:
        self.inputs = tuple(self.inputs)
        self.outputs = tuple(self.outputs)
        if self.shape is not None:
            self.shape = tuple(int(d) for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict. Constants are listed by name only: the caller stores their
        arrays (and passes them back to :meth:`from_dict`)."""
        return {"name": self.name, "op": self.op,
                "kernel": None if self.kernel is None else self.kernel.to_dict(),
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "constants": list(self.constants),
                "shape": None if self.shape is None else list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], constants: dict[str, np.ndarray]) -> "CpuStep":
        """The step :meth:`to_dict` wrote; ``constants`` holds (at least) the arrays of the
        constants it lists. Raises CpuKernelError for a malformed record or a missing
        constant."""
        try:
            names = list(d["constants"])
            missing = [n for n in names if n not in constants]
            if missing:
                raise CpuKernelError(f"CPU step {d['name']!r} needs constant {missing[0]!r}, "
                                     "which is not among the constants given")
            kernel = None if d["kernel"] is None else CpuKernel.from_dict(d["kernel"])
            return cls(d["name"], d["op"], kernel, tuple(d["inputs"]), tuple(d["outputs"]),
                       {n: np.asarray(constants[n]) for n in names},
                       None if d["shape"] is None else tuple(d["shape"]))
        except (KeyError, TypeError) as exc:
            raise CpuKernelError(f"malformed CPU step record: {exc!r}") from exc


def run_cpu_steps(steps: Sequence[CpuStep], env: dict[str, np.ndarray]) -> None:
    """Run ``steps`` in order on ``env`` (tensor name -> array), adding their outputs.

    Each step reads its inputs from ``step.constants`` or ``env``, runs its kernel with
    :func:`tessera.runtime.cpu.load_kernel` (a view reshapes its input) and stores its
    outputs in ``env``. Raises CpuKernelError for an input that is nowhere or arrays that
    do not fit the kernel.
    """
    from tessera.runtime.cpu import load_kernel   # the runtime needs llvmlite's JIT

    for step in steps:
        args = []
        for name in step.inputs:
            data = step.constants.get(name)
            if data is None:
                data = env.get(name)
            if data is None:
                raise CpuKernelError(f"CPU step {step.name!r} reads tensor {name!r}, which is "
                                     "neither a constant of the step nor computed yet")
            args.append(data)
        if step.kernel is None:
            env[step.outputs[0]] = np.reshape(args[0], step.shape)
            continue
        results = load_kernel(step.kernel)(*args)
        env.update(zip(step.outputs, results))


# ------------------------------------------------------------------------ public API
def lower_node_to_cpu(graph: Graph, node: Node) -> list[CpuStep]:
    """CPU steps computing ``node`` exactly as onnxruntime does; raises CompileError (naming
    the node, saying which op/attribute is not supported and what to do) when there is no
    CPU kernel."""
    try:
        plans = _plan(graph, node)
    except _Unsupported as exc:
        raise CompileError(f"{node.op} node {node.name!r} cannot run on the CPU: {exc}",
                           op=node.name) from None
    steps = []
    for plan in plans:
        try:
            kernel = None if plan.build is None else plan.build()
        except CpuKernelError as exc:
            raise CompileError(f"{node.op} node {node.name!r} cannot run on the CPU: {exc}",
                               op=node.name) from exc
        name = node.name if plan.suffix is None else f"{node.name}:{plan.suffix}"
        step = CpuStep(name, node.op, kernel, plan.inputs, plan.outputs, plan.constants,
                       plan.shape)
        _check_outputs(graph, node, step)
        steps.append(step)
    return steps


def cpu_unsupported_reason(graph: Graph, node: Node) -> str | None:
    """Why ``node`` has no CPU kernel (None if it has one), without building IR."""
    try:
        _plan(graph, node)
    except _Unsupported as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------ planning
class _Unsupported(Exception):
    """Raised while planning: the message says what is not supported and what to do."""


@dataclass
class _Plan:
    """A step before its kernel exists: ``build`` makes it (None for a view)."""

    suffix: str | None                       # None: the node's own step (named as the node)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    build: Callable[[], CpuKernel] | None
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    shape: tuple[int, ...] | None = None


def _plan(graph: Graph, node: Node) -> list[_Plan]:
    lowering = _LOWERINGS.get((node.domain, node.op))
    if lowering is None:
        raise _Unsupported(_no_lowering_reason(node))
    return lowering(_Lowering(graph, node))


def _no_lowering_reason(node: Node) -> str:
    if node.domain == DOMAIN:
        return (f"{node.op!r} is not an op of domain {DOMAIN!r} the CPU runs "
                f"({', '.join(sorted(op for d, op in _LOWERINGS if d == DOMAIN))})")
    if node.domain:
        return (f"ops of domain {node.domain!r} have no CPU kernels; replace it by standard "
                "ONNX ops in the model")
    specific = _FLOAT_LINEAR.get(node.op)
    if specific:
        return specific
    return (f"there is no CPU kernel for {node.op}; replace it in the model by supported "
            f"ops ({', '.join(sorted(op for d, op in _LOWERINGS if not d))})")


_FLOAT_LINEAR = {
    "Conv": f"float convolution has no CPU kernel; {_QUANTIZE_HINT}",
    "ConvTranspose": f"float convolution has no CPU kernel; {_QUANTIZE_HINT}",
    "Gemm": f"float matrix multiplication has no CPU kernel; {_QUANTIZE_HINT}",
    "MatMul": f"float matrix multiplication has no CPU kernel; {_QUANTIZE_HINT}",
}


def _check_outputs(graph: Graph, node: Node, step: CpuStep) -> None:
    """A kernel whose outputs disagree with the graph's shapes would corrupt whatever
    reads them: catch it at compile time."""
    if step.kernel is None:
        written = [(step.shape, graph.values[step.outputs[0]].dtype)]
    else:
        written = [(s.shape, s.dtype) for s in step.kernel.outputs]
    for name, (shape, dtype) in zip(step.outputs, written):
        value = graph.values.get(name)
        if name in node.outputs and (shape != value.shape or dtype != value.dtype):
            raise CompileError(f"{node.op} node {node.name!r}: its CPU kernel writes {name!r} "
                               f"as {dtype}{list(shape)}, the graph says "
                               f"{value.dtype}{list(value.shape)}", op=node.name)


class _Lowering:
    """What an op's lowering needs of its node: values, constants, specs, and checks that
    raise :class:`_Unsupported`."""

    def __init__(self, graph: Graph, node: Node) -> None:
        self.graph = graph
        self.node = node

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attr(key, default)

    def value(self, name: str) -> Value:
        if name not in self.graph.values:
            raise _Unsupported(f"tensor {name!r} is not in the graph")
        return self.graph.values[name]

    def input(self, i: int) -> Value:
        name = self.node.input(i)
        if not name:
            raise _Unsupported(f"input {i} is missing")
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
        self.require(data is not None, f"its {what} ({name!r}) must be a constant (the CPU "
                     "kernels are generated for fixed values); fold it in the model")
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
            raise _Unsupported(reason)

    def require_attrs(self, *keys: str) -> dict[str, Any]:
        """The node's attributes, which must include ``keys`` (the fused nodes' schema)."""
        missing = [k for k in keys if k not in self.node.attrs]
        self.require(not missing, f"attribute {missing[0] if missing else ''!r} is missing; "
                     "make the node with tessera.compiler.qdq.fuse_qdq")
        return self.node.attrs

    def rank4(self, name: str) -> None:
        shape = self.value(name).shape
        self.require(len(shape) == 4, f"input {name!r} has rank {len(shape)}; the CPU "
                     "kernel takes 2-D (NCHW, rank 4) tensors only")


class _Operands:
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

    def tensor(self, low: _Lowering, name: str, dtypes: Sequence[str] = KERNEL_DTYPES) -> E:
        """Graph tensor ``name``: one-element constants become E.const (no input needed),
        other constants are passed as arrays, activations by name."""
        spec = low.spec(name, dtypes)
        data = low.graph.const(name)
        if data is not None and data.size == 1:
            return E.const(data.reshape(()).item())
        return self.add(name, spec, data)

    def plan(self, expr: E, output: str, shape: Sequence[int], dtype: str,
             suffix: str | None = None) -> _Plan:
        if not self.specs:
            raise _Unsupported("all its inputs are constants; fold it in the model")
        specs, shape = tuple(self.specs), tuple(shape)

        def build() -> CpuKernel:
            return fused_elementwise(expr, specs, out_dtype=dtype, out_shape=shape)
        return _Plan(suffix, tuple(self.names), (output,), build, dict(self.constants))


def _single(low: _Lowering, builder: Callable[..., CpuKernel], *args: Any,
            inputs: Sequence[str] | None = None, **kwargs: Any) -> list[_Plan]:
    """One step running ``builder(*args, **kwargs)`` on the node's inputs (or ``inputs``),
    passing the constant ones as arrays."""
    names = tuple(inputs if inputs is not None else [n for n in low.node.inputs if n])
    constants = {n: low.graph.const(n) for n in names if low.graph.const(n) is not None}
    outputs = tuple(o for o in low.node.outputs if o)
    return [_Plan(None, names, outputs, lambda: builder(*args, **kwargs), constants)]


def _first(low: _Lowering) -> str:
    """Name of the node's input 0 (the activation of most ops)."""
    return low.node.input(0)


def _view(low: _Lowering) -> list[_Plan]:
    """Flatten, Reshape, Squeeze, Unsqueeze, Identity, same-type Cast: the output is the
    input's data in another shape."""
    x = low.node.input(0)
    low.require(bool(x), "input 0 is missing")
    out = low.output()
    data = low.graph.const(x)
    constants = {} if data is None else {x: data}
    return [_Plan(None, (x,), (out.name,), None, constants, out.shape)]


# ------------------------------------------------------------------- elementwise ops
_FLOAT_ONLY = ("float32",)


def _unary(fn: Callable[[E], E], dtypes: Sequence[str] = KERNEL_DTYPES
           ) -> Callable[[_Lowering], list[_Plan]]:
    """Relu, Sigmoid, Tanh, Exp, Neg, Abs: ``fn`` of the input."""
    def lower(low: _Lowering) -> list[_Plan]:
        ops = _Operands()
        x = ops.tensor(low, low.node.input(0), dtypes)
        out = low.output()
        return [ops.plan(fn(x), out.name, out.shape, out.dtype)]
    return lower


def _binary(fn: Callable[[E, E], E], dtypes: Sequence[str] = KERNEL_DTYPES
            ) -> Callable[[_Lowering], list[_Plan]]:
    """Add, Sub, Mul, Div and the variadic Max, Min (folded pairwise), with numpy
    broadcasting."""
    def lower(low: _Lowering) -> list[_Plan]:
        names = [n for n in low.node.inputs if n]
        low.require(bool(names), "it has no inputs")
        ops = _Operands()
        terms = [ops.tensor(low, n, dtypes) for n in names]
        expr = terms[0]
        for term in terms[1:]:
            expr = fn(expr, term)
        out = low.output()
        return [ops.plan(expr, out.name, out.shape, out.dtype)]
    return lower


def _clip(low: _Lowering) -> list[_Plan]:
    ops = _Operands()
    expr = ops.tensor(low, low.node.input(0))
    # np.clip's order (max, then min), which is onnxruntime's too.
    if low.node.input(1):
        expr = maximum(expr, ops.tensor(low, low.node.input(1)))
    if low.node.input(2):
        expr = minimum(expr, ops.tensor(low, low.node.input(2)))
    out = low.output()
    return [ops.plan(expr, out.name, out.shape, out.dtype)]


def _cast(low: _Lowering) -> list[_Plan]:
    x, out = low.input(0), low.output()
    if x.dtype == out.dtype:
        return _view(low)
    low.spec(out.name)
    ops = _Operands()
    expr = ops.tensor(low, x.name).cast(out.dtype)
    return [ops.plan(expr, out.name, out.shape, out.dtype)]


def _qparams(low: _Lowering, ops: _Operands, rank: int, zp_dtype: str) -> tuple[E, E]:
    """Scale and zero point of a QuantizeLinear/DequantizeLinear (inputs 1 and 2) as
    expressions: constants per tensor, ``(1, .., C, .., 1)`` arrays per axis."""
    scale = low.const(low.node.input(1), "scale")
    low.require(scale.dtype == np.float32, f"its scale is {scale.dtype}, the CPU kernel takes "
                "float32 scales")
    zp_name = low.node.input(2)
    zp = low.const(zp_name, "zero point") if zp_name else np.zeros(scale.shape, zp_dtype)
    low.require(str(zp.dtype) == zp_dtype, f"its zero point is {zp.dtype}, expected {zp_dtype}")
    if scale.size == 1 and zp.size == 1:
        return E.const(float(scale.reshape(()))), E.const(int(zp.reshape(())))
    axis = low.attr("axis", 1)
    low.require(scale.ndim == 1 and zp.shape == scale.shape and -rank <= axis < rank,
                f"its scale has shape {list(scale.shape)} and zero point "
                f"{list(zp.shape)}; the CPU kernel takes one of each, or one per element "
                "of an axis")
    shape = [1] * rank
    shape[axis % rank] = scale.size
    return (ops.array(low.tmp("scale"), scale.reshape(shape)),
            ops.array(low.tmp("zero_point"), zp.reshape(shape)))


def _quantize_linear(low: _Lowering) -> list[_Plan]:
    out = low.output()
    low.spec(out.name, _QUANT_DTYPES)
    ops = _Operands()
    x = ops.tensor(low, low.node.input(0), _FLOAT_ONLY)
    scale, zp = _qparams(low, ops, len(out.shape), out.dtype)
    return [ops.plan(x.quantize(scale, zp, out.dtype), out.name, out.shape, out.dtype)]


def _dequantize_linear(low: _Lowering) -> list[_Plan]:
    x, out = low.input(0), low.output()
    ops = _Operands()
    q = ops.tensor(low, x.name, ("int8", "uint8", "int32"))
    scale, zp = _qparams(low, ops, len(x.shape), x.dtype)
    return [ops.plan(q.dequantize(scale, zp), out.name, out.shape, out.dtype)]


# --------------------------------------------------------------- normalisation, reduce
def _softmax(log: bool) -> Callable[[_Lowering], list[_Plan]]:
    def lower(low: _Lowering) -> list[_Plan]:
        x = low.spec(low.node.input(0), _FLOAT_ONLY)
        axis = int(low.attr("axis", -1))
        low.require(-x.ndim <= axis < x.ndim, f"axis {axis} is out of range for rank {x.ndim}")
        return _single(low, log_softmax if log else softmax, x, axis)
    return lower


def _layer_norm(low: _Lowering) -> list[_Plan]:
    node = low.node
    x = low.spec(node.input(0), _FLOAT_ONLY)
    scale = low.spec(node.input(1), _FLOAT_ONLY)
    bias = low.spec(node.input(2), _FLOAT_ONLY) if node.input(2) else None
    axis, epsilon = int(low.attr("axis", -1)), float(low.attr("epsilon", 1e-5))
    low.require(-x.ndim <= axis < x.ndim, f"axis {axis} is out of range for rank {x.ndim}")
    low.require(low.attr("stash_type", 1) == 1, "stash_type other than 1 (float32) is not "
                "supported")
    normalised = _strip_ones(x.shape[axis % x.ndim:])
    for what, p in (("Scale", scale), ("B", bias)):
        low.require(p is None or p.size == 1 or _strip_ones(p.shape) == normalised,
                    f"its {what} has shape {list(p.shape) if p else []}; the CPU kernel takes "
                    f"one value or the normalised shape {list(normalised)}")
    stats = any(node.outputs[1:])
    outputs = [node.outputs[0]]
    if stats:
        outputs += [node.outputs[k] if len(node.outputs) > k and node.outputs[k]
                    else low.tmp(what) for k, what in ((1, "mean"), (2, "inv_std_dev"))]
    [plan] = _single(low, layer_norm, x, scale, bias, axis, epsilon, stats)
    plan.outputs = tuple(outputs)
    return [plan]


def _strip_ones(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` without leading 1s (how layer_norm compares Scale/B to X)."""
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min"}
_REDUCE_DTYPES = {"sum": ("float32", "int32"), "mean": _FLOAT_ONLY, "max": KERNEL_DTYPES,
                  "min": KERNEL_DTYPES}


def _reduce(low: _Lowering) -> list[_Plan]:
    """ReduceSum/Mean/Max/Min, the axes an attribute (ReduceMean/Max/Min up to opset 17)
    or an input (ReduceSum from opset 13, all from 18)."""
    op = _REDUCE[low.node.op]
    # ONNX sums keep the input type, which the kernel does for float32 and int32 only.
    x = low.spec(low.node.input(0), _REDUCE_DTYPES[op])
    axes = low.attr("axes")
    if low.node.input(1):
        axes = low.const(low.node.input(1), "axes").reshape(-1).tolist()
    axes = [int(a) for a in axes or ()]
    low.require(all(-x.ndim <= a < x.ndim for a in axes),
                f"axes {axes} are out of range for rank {x.ndim}")
    if not axes and low.attr("noop_with_empty_axes", 0):
        return _view(low)
    keepdims = bool(low.attr("keepdims", 1))
    return _single(low, reduction, op, x, axes, keepdims, inputs=[_first(low)])


# ---------------------------------------------------------------------------- pooling
def _pool_window(low: _Lowering, x: TensorSpec) -> dict[str, Any]:
    """kernel_shape, strides, pads, dilations of a 2-D pool, checked as the builder will
    (explicit pads; auto_pad turned into them)."""
    low.require(low.attr("ceil_mode", 0) == 0, "ceil_mode=1 is not supported; export the "
                "model with ceil_mode=0 and explicit pads")
    kernel = [int(k) for k in low.attr("kernel_shape", [])]
    low.require(len(kernel) == 2, f"kernel_shape {kernel} is not 2-D")
    strides = [int(s) for s in low.attr("strides", [1, 1])]
    dilations = [int(d) for d in low.attr("dilations", [1, 1])]
    pads = [int(p) for p in low.attr("pads", [0, 0, 0, 0])]
    auto_pad = low.attr("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(auto_pad, x.shape[2:], kernel, strides, dilations)
    else:
        low.require(auto_pad == "NOTSET", f"auto_pad {auto_pad!r} is not supported")
    win = Window(x.shape[2], x.shape[3], tuple(kernel), tuple(strides), tuple(dilations),
                 tuple(pads))
    try:
        win.check(low.node.op)
    except CpuKernelError as exc:
        raise _Unsupported(str(exc)) from None
    low.require(all(r.k_hi > r.k_lo for axis in (0, 1) for r in win.runs(axis)),
                f"pads {pads} put a whole window in the padding")
    return {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations}


def _same_pads(mode: str, size: Sequence[int], kernel: Sequence[int],
               strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """ONNX's SAME_UPPER / SAME_LOWER pads: output ``ceil(size / stride)``, the odd pad
    at the end (UPPER) or the beginning (LOWER)."""
    begins, ends = [], []
    for n, k, s, d in zip(size, kernel, strides, dilations):
        total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
        small = total // 2
        begins.append(small if mode == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return begins + ends


def _max_pool(low: _Lowering) -> list[_Plan]:
    low.require(len([o for o in low.node.outputs if o]) == 1,
                "the Indices output is not supported; drop it from the model")
    low.rank4(_first(low))
    x = low.spec(_first(low), ("float32", "int8", "uint8"))
    return _single(low, build_max_pool, x, **_pool_window(low, x), inputs=[_first(low)])


def _average_pool(low: _Lowering) -> list[_Plan]:
    low.rank4(_first(low))
    x = low.spec(_first(low), _FLOAT_ONLY)
    return _single(low, build_average_pool, x, **_pool_window(low, x),
                   count_include_pad=int(low.attr("count_include_pad", 0)))


def _global_pool(builder: Callable[..., CpuKernel]) -> Callable[[_Lowering], list[_Plan]]:
    def lower(low: _Lowering) -> list[_Plan]:
        low.rank4(_first(low))
        x = low.spec(_first(low), _FLOAT_ONLY)
        low.require(x.shape[2] * x.shape[3] > 0, "its input has no pixels")
        return _single(low, builder, x)
    return lower


# ----------------------------------------------------------------------- data movement
def _pad(low: _Lowering) -> list[_Plan]:
    x = low.spec(_first(low))
    low.require(not low.node.input(3), "the axes input (opset 18) is not supported")
    pads = low.const(low.node.input(1), "pads").reshape(-1).astype(np.int64).tolist()
    low.require(len(pads) == 2 * x.ndim, f"pads {pads} need {2 * x.ndim} values")
    low.require(min(pads, default=0) >= 0, f"pads {pads} are negative (cropping); crop with "
                "Slice in the model instead")
    mode = low.attr("mode", "constant")
    low.require(mode in ("constant", "edge", "reflect"), f"mode {mode!r} is not supported "
                "(constant, edge, reflect)")
    if mode == "reflect":
        low.require(all(max(pads[k], pads[k + x.ndim]) < x.shape[k]
                        for k in range(x.ndim) if pads[k] or pads[k + x.ndim]),
                    "reflect pads must be smaller than the padded axis")
    value = low.optional_const(2, "constant_value")
    fill = 0 if value is None else value.reshape(-1)[0].item()
    return _single(low, build_pad, x, pads, mode, fill, inputs=[_first(low)])


def _transpose(low: _Lowering) -> list[_Plan]:
    x = low.spec(_first(low))
    perm = low.attr("perm")
    perm = list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]
    low.require(sorted(perm) == list(range(x.ndim)), f"perm {perm} is not a permutation")
    return _single(low, build_transpose, x, perm)


def _concat(low: _Lowering) -> list[_Plan]:
    names = [n for n in low.node.inputs if n]
    specs = [low.spec(n) for n in names]
    low.require(len({s.dtype for s in specs}) == 1, "its inputs have different dtypes")
    axis = low.attr("axis")
    low.require(axis is not None and -specs[0].ndim <= axis < specs[0].ndim,
                f"axis {axis} is missing or out of range")
    return _single(low, build_concat, specs, axis, inputs=names)


_RESIZE_COORDS = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
_RESIZE_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize(low: _Lowering) -> list[_Plan]:
    low.rank4(_first(low))
    mode = low.attr("mode", "nearest")
    coords = low.attr("coordinate_transformation_mode", "half_pixel")
    nearest = low.attr("nearest_mode", "round_prefer_floor")
    low.require(mode in ("nearest", "linear"), f"mode {mode!r} is not supported (nearest, "
                "linear)")
    low.require(coords in _RESIZE_COORDS, f"coordinate_transformation_mode {coords!r} is not "
                f"supported ({', '.join(_RESIZE_COORDS)})")
    low.require(nearest in _RESIZE_NEAREST, f"nearest_mode {nearest!r} is not supported")
    x = low.spec(_first(low), _FLOAT_ONLY if mode == "linear" else KERNEL_DTYPES)
    scales = low.optional_const(2, "scales")
    sizes = low.optional_const(3, "sizes")
    low.require((scales is None) != (sizes is None), "give exactly one of scales and sizes")
    given = (scales if sizes is None else sizes).reshape(-1)
    keep = [1.0, 1.0] if sizes is None else list(x.shape[:2])
    low.require(given.size == 4 and given[:2].tolist() == keep,
                f"{'scales' if sizes is None else 'sizes'} {given.tolist()} must have 4 "
                "values keeping N and C (only H and W are resized)")
    return _single(low, build_resize, x,
                   None if scales is None else scales.reshape(-1).tolist(),
                   None if sizes is None else sizes.reshape(-1).tolist(), mode, coords,
                   nearest, inputs=[_first(low)])


# --------------------------------------------------------------- tessera integer nodes
def _signed_input(low: _Lowering, zero_point: int) -> tuple[str, TensorSpec, int,
                                                             list[_Plan]]:
    """The node's input 0 as int8 for the int8 convolution / matmul kernels: uint8 is
    shifted down by 128 (an extra step), which moves its zero point by as much, so
    ``x - x_zp`` is unchanged. Returns (tensor, spec, zero point, steps)."""
    x = low.spec(_first(low), _QUANT_DTYPES)
    if x.dtype == "int8":
        return _first(low), x, zero_point, []
    shifted = low.tmp("x_int8")
    ops = _Operands()
    expr = (ops.add(_first(low), x) - 128).cast("int8")
    return shifted, TensorSpec(x.shape, "int8"), zero_point - 128, [
        ops.plan(expr, shifted, x.shape, "int8", suffix="x_int8")]


def _weight(low: _Lowering, ndim: int) -> np.ndarray:
    w = low.const(low.node.input(1), "weight")
    low.require(w.dtype == np.int8 and w.ndim == ndim, f"its weight is {w.dtype}"
                f"{list(w.shape)}, expected int8 of rank {ndim}")
    low.require(not np.any(np.asarray(low.attr("w_zero_point", 0))),
                "nonzero weight zero points are not supported")
    return w


def _bias(low: _Lowering, channels: int) -> np.ndarray:
    if not low.node.input(2):
        return np.zeros(channels, np.int64)
    bias = low.const(low.node.input(2), "bias")
    low.require(bias.dtype == np.int32 and bias.size == channels,
                f"its bias is {bias.dtype}{list(bias.shape)}, expected int32 of {channels}")
    return bias.reshape(channels).astype(np.int64)


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    # The kernels accumulate in int32 and wrap; so does onnxruntime (and qref).
    return np.asarray(values, np.int64).astype(np.int32)


def _requantize(low: _Lowering, acc: str, acc_shape: Sequence[int], offset: np.ndarray,
                scale: np.ndarray, channel_shape: Sequence[int]) -> _Plan:
    """The node's output from the int32 accumulator ``acc``: qref's ``_requantize``,
    ``clip(rint(f32(acc + offset) * scale) + y_zp, y_min, y_max)``, with one float32
    multiply and round-half-even; clipping after rounding equals onnxruntime's clamp
    before it because the bounds are integers. ``offset`` (int32, broadcast against
    ``acc``) holds the bias and the input zero-point correction, ``scale`` one float32
    per channel (reshaped to ``channel_shape``)."""
    out = low.output()
    ops = _Operands()
    expr = ops.add(acc, TensorSpec(tuple(acc_shape), "int32"))
    if np.any(offset):
        expr = expr + ops.array(low.tmp("offset"), _wrap_int32(offset))
    if np.all(scale == scale.reshape(-1)[0]):
        s = E.const(float(scale.reshape(-1)[0]))
    else:
        s = ops.array(low.tmp("scale"), scale.astype(np.float32).reshape(channel_shape))
    y = (expr.cast("float32") * s).quantize(1.0, int(low.attr("y_zero_point")), out.dtype)
    y = _clamp(y, low, out.dtype)
    return ops.plan(y, out.name, out.shape, out.dtype)


def _clamp(y: E, low: _Lowering, dtype: str) -> E:
    """Clamp to the node's [y_min, y_max] (an absorbed Relu/Clip) when it is narrower
    than the dtype."""
    info = np.iinfo(dtype)
    y_min, y_max = int(low.attr("y_min", info.min)), int(low.attr("y_max", info.max))
    low.require(info.min <= y_min <= y_max <= info.max,
                f"y_min {y_min} / y_max {y_max} do not fit its output type {dtype}")
    if (y_min, y_max) == (info.min, info.max):
        return y
    return y.clip(y_min, y_max)


_REQUANT_ATTRS = ("x_scale", "x_zero_point", "w_scale", "y_scale", "y_zero_point")


def _channel_scales(low: _Lowering, channels: int) -> np.ndarray:
    a = low.node.attrs
    w_scale = np.asarray(a["w_scale"], np.float32).reshape(-1)
    low.require(w_scale.size in (1, channels), f"w_scale has {w_scale.size} values for "
                f"{channels} output channels")
    return np.broadcast_to(requant_scale(a["x_scale"], w_scale, a["y_scale"]), (channels,))


def _qconv(low: _Lowering) -> list[_Plan]:
    """QConv: int8 convolution to int32 (``build_conv_int8``), then requantization. The
    input zero point is exact through the offset ``bias - x_zp * sum(w over the taps
    inside the image)``: padding holds the zero point in onnxruntime, i.e. contributes
    nothing to ``sum((x - x_zp) * w)``."""
    a = low.require_attrs(*_REQUANT_ATTRS)
    low.rank4(_first(low))
    w = _weight(low, 4)
    out = low.output()
    x_int8, x, x_zp, plans = _signed_input(low, int(a["x_zero_point"]))
    geometry = {"strides": [int(s) for s in a.get("strides", [1, 1])],
                "pads": [int(p) for p in a.get("pads", [0, 0, 0, 0])],
                "dilations": [int(d) for d in a.get("dilations", [1, 1])],
                "group": int(a.get("group", 1))}
    m = w.shape[0]
    low.require(x.shape[1] == w.shape[1] * geometry["group"] and m % geometry["group"] == 0,
                f"weight {list(w.shape)} and group {geometry['group']} do not fit input "
                f"channels {x.shape[1]}")
    offset = _bias(low, m)[:, None, None] - x_zp * _tap_weight_sums(
        w, x.shape[2:], out.shape[2:], geometry["strides"], geometry["pads"],
        geometry["dilations"])
    if np.all(offset == offset[:, :1, :1]):
        offset = offset[:, :1, :1]      # no tap in the padding: one offset per channel
    acc = low.tmp("acc")
    acc_shape = (x.shape[0], m, *out.shape[2:])
    w_spec = TensorSpec(w.shape, "int8")
    plans.append(_Plan("conv", (x_int8, low.node.input(1)), (acc,),
                       lambda: build_conv_int8(x, w_spec, False, **geometry),
                       {low.node.input(1): w}))
    plans.append(_requantize(low, acc, acc_shape, offset[None], _channel_scales(low, m),
                             (1, m, 1, 1)))
    return plans


def _tap_weight_sums(w: np.ndarray, in_hw: Sequence[int], out_hw: Sequence[int],
                     strides: Sequence[int], pads: Sequence[int],
                     dilations: Sequence[int]) -> np.ndarray:
    """``(M, OH, OW)``: per output channel and pixel, the sum of the weights whose taps
    fall inside the image (int64, exact). Groups need nothing special: ``w``'s axis 1
    holds exactly the input channels of each output channel's group."""
    per_tap = w.astype(np.int64).sum(axis=1)          # (M, kh, kw)

    def inside(axis: int) -> np.ndarray:
        taps = np.arange(w.shape[2 + axis]) * dilations[axis]
        pos = np.arange(out_hw[axis])[:, None] * strides[axis] - pads[axis] + taps[None, :]
        return ((pos >= 0) & (pos < in_hw[axis])).astype(np.int64)
    return np.einsum("mab,ya,xb->myx", per_tap, inside(0), inside(1))


def _qgemm(low: _Lowering) -> list[_Plan]:
    """QGemm: ``x @ w.T`` with ``build_matmul_int8`` (the weight passed transposed,
    ``(K, N)``), then requantization; the zero point folds into the per-column offset
    ``bias - x_zp * sum_k w[n, k]``."""
    a = low.require_attrs(*_REQUANT_ATTRS)
    w = _weight(low, 2)
    x_shape = low.value(_first(low)).shape
    low.require(len(x_shape) == 2 and x_shape[1] == w.shape[1],
                f"input {list(x_shape)} does not fit weight {list(w.shape)} (x @ w.T)")
    x_int8, x, x_zp, plans = _signed_input(low, int(a["x_zero_point"]))
    n = w.shape[0]
    offset = _bias(low, n) - x_zp * w.astype(np.int64).sum(axis=1)
    weight_t = low.tmp("weight_t")
    wt = np.ascontiguousarray(w.T)
    acc = low.tmp("acc")
    plans.append(_Plan("matmul", (x_int8, weight_t), (acc,),
                       lambda: build_matmul_int8(x, TensorSpec(wt.shape, "int8")),
                       {weight_t: wt}))
    plans.append(_requantize(low, acc, (x.shape[0], n), offset[None],
                             _channel_scales(low, n), (1, n)))
    return plans


def _qmax_pool(low: _Lowering) -> list[_Plan]:
    """QMaxPool: max pooling of the stored values (same scale and zero point out)."""
    low.require_attrs("kernel_shape")
    low.rank4(_first(low))
    x = low.spec(_first(low), _QUANT_DTYPES)
    return _single(low, build_max_pool, x, **_pool_window(low, x), inputs=[_first(low)])


def _qglobal_average_pool(low: _Lowering) -> list[_Plan]:
    """QGlobalAveragePool as qref (MLAS): ``acc = sum(x) - x_zp * HW`` in int32, then
    ``rint(f32(acc) * s) + y_zp`` saturated, ``s = f32(x_scale / f32(y_scale * HW))``."""
    a = low.require_attrs("x_scale", "x_zero_point", "y_scale", "y_zero_point")
    low.rank4(_first(low))
    x = low.spec(_first(low), _QUANT_DTYPES)
    out = low.output()
    low.require(out.dtype == x.dtype, f"input {x.dtype} and output {out.dtype} differ")
    pixels = x.shape[2] * x.shape[3]
    f32 = np.float32
    scale = f32(a["x_scale"]) / (f32(a["y_scale"]) * f32(pixels))
    total = low.tmp("sum")
    sum_shape = (*x.shape[:2], 1, 1)
    ops = _Operands()
    acc = ops.add(total, TensorSpec(sum_shape, "int32"))
    correction = int(_wrap_int32(int(a["x_zero_point"]) * pixels))
    if correction:
        acc = acc - E.const(correction, "int32")
    y = (acc.cast("float32") * float(scale)).quantize(1.0, int(a["y_zero_point"]), out.dtype)
    return [_Plan("sum", (_first(low),), (total,), lambda: reduction("sum", x, [2, 3], True)),
            ops.plan(y, out.name, out.shape, out.dtype)]


def _qadd(low: _Lowering) -> list[_Plan]:
    """QAdd. qref (onnxruntime's AVX2 kernel) computes ``t = fma(a, rA, fma(b, rB,
    fixed))`` in float32; the elementwise kernels have no FMA, so the kernel computes
    ``t = a*rA + (b*rB + fixed)`` with separate roundings and then corrects the (a, b)
    pairs whose result differs. Those pairs are found at compile time by evaluating both
    formulas over every pair of 8-bit values (65,536): there are 0 to 2 of them for typical
    scales, each a ``delta * [a == a0] * [b == b0]`` term. The result is bit-exact with
    qref on every input."""
    p = low.require_attrs("a_scale", "a_zero_point", "b_scale", "b_zero_point", "y_scale",
                          "y_zero_point", "y_min", "y_max")
    a_spec = low.spec(low.node.input(0), _QUANT_DTYPES)
    b_spec = low.spec(low.node.input(1), _QUANT_DTYPES)
    low.require(a_spec.shape == b_spec.shape, "its inputs have different shapes")
    out = low.output()
    low.spec(out.name, _QUANT_DTYPES)
    ra, rb, fixed = _qadd_coefficients(p)
    info = np.iinfo(a_spec.dtype)
    lo, hi = max(info.min, int(p["y_min"])), min(info.max, int(p["y_max"]))
    low.require(lo <= hi, f"y_min {p['y_min']} / y_max {p['y_max']} are empty for "
                f"{a_spec.dtype}")
    patches = _qadd_patches(low.node, a_spec.dtype, b_spec.dtype, (ra, rb, fixed), (lo, hi))
    low.require(len(patches) <= _QADD_MAX_PATCHES,
                f"its scales need {len(patches)} corrections of the float32 formula "
                f"(at most {_QADD_MAX_PATCHES}); requantize with other scales")
    ops = _Operands()
    a = ops.add(low.node.input(0), a_spec)
    b = ops.add(low.node.input(1), b_spec)
    t = a.cast("float32") * float(ra) + (b.cast("float32") * float(rb) + float(fixed))
    y = t.quantize(1.0, 0, "int32").clip(lo, hi)
    for a0, b0, delta in patches:
        y = y + delta * _equals(a, a0) * _equals(b, b0)
    return [ops.plan(y.cast(out.dtype), out.name, out.shape, out.dtype)]


def _qadd_coefficients(p: dict[str, Any]) -> tuple[np.float32, np.float32, np.float32]:
    """rA, rB and ``fixed``, in float32 exactly as qref and MLAS compute them."""
    from .qref import qlinear_add_coefficients
    return qlinear_add_coefficients(p["a_scale"], p["a_zero_point"], p["b_scale"],
                                    p["b_zero_point"], p["y_scale"], p["y_zero_point"])


def _qadd_patches(node: Node, a_dtype: str, b_dtype: str,
                  coefficients: tuple[np.float32, np.float32, np.float32],
                  bounds: tuple[int, int]) -> list[tuple[int, int, int]]:
    """``(a0, b0, delta)`` for every pair of input values where the kernel's formula
    (mirrored here in numpy float32, which rounds as the kernel does) differs from qref."""
    from . import qref   # the golden model (it brings onnx in); needed only for QAdd

    ia, ib = np.iinfo(a_dtype), np.iinfo(b_dtype)
    a, b = np.meshgrid(np.arange(ia.min, ia.max + 1).astype(a_dtype),
                       np.arange(ib.min, ib.max + 1).astype(b_dtype), indexing="ij")
    ra, rb, fixed = coefficients
    f32 = np.float32
    t = (a.astype(f32) * ra).astype(f32) + ((b.astype(f32) * rb).astype(f32) + fixed)
    kernel = np.clip(np.rint(t.astype(f32)), *bounds).astype(np.int64)
    p = node.attrs
    golden = qref.qlinear_add_reference(a, b, p["a_scale"], p["a_zero_point"], p["b_scale"],
                                        p["b_zero_point"], p["y_scale"], p["y_zero_point"],
                                        p["y_min"], p["y_max"])
    where = np.nonzero(kernel != golden)
    return [(int(a[i, j]), int(b[i, j]), int(golden[i, j] - kernel[i, j]))
            for i, j in zip(*where)]


def _equals(x: E, value: int) -> E:
    """1 where the 8-bit ``x`` equals ``value``, else 0 (int32), with integer min/abs."""
    return 1 - minimum(abs(x.cast("int32") - value), 1)


# ---------------------------------------------------------------------- dispatch table
_Lower = Callable[[_Lowering], list[_Plan]]

_STANDARD: dict[str, _Lower] = {
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear,
    "Relu": _unary(E.relu),
    "Clip": _clip,
    "Sigmoid": _unary(E.sigmoid, _FLOAT_ONLY),
    "Tanh": _unary(E.tanh, _FLOAT_ONLY),
    "Exp": _unary(E.exp, _FLOAT_ONLY),
    "Neg": _unary(lambda x: -x, ("float32", "int8", "int32")),
    "Abs": _unary(abs),
    "Add": _binary(lambda x, y: x + y),
    "Sub": _binary(lambda x, y: x - y),
    "Mul": _binary(lambda x, y: x * y),
    "Div": _binary(lambda x, y: x / y, _FLOAT_ONLY),
    "Max": _binary(maximum),
    "Min": _binary(minimum),
    "Cast": _cast,
    "Softmax": _softmax(log=False),
    "LogSoftmax": _softmax(log=True),
    "LayerNormalization": _layer_norm,
    **{op: _reduce for op in _REDUCE},
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalAveragePool": _global_pool(build_global_average_pool),
    "GlobalMaxPool": _global_pool(build_global_max_pool),
    "Pad": _pad,
    "Transpose": _transpose,
    "Concat": _concat,
    "Resize": _resize,
    **{op: _view for op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")},
}

_TESSERA: dict[str, _Lower] = {
    "QConv": _qconv,
    "QGemm": _qgemm,
    "QAdd": _qadd,
    "QMaxPool": _qmax_pool,
    "QGlobalAveragePool": _qglobal_average_pool,
}

#: (domain, op type) -> lowering.
_LOWERINGS: dict[tuple[str, str], _Lower] = {
    **{("", op): fn for op, fn in _STANDARD.items()},
    **{(DOMAIN, op): fn for op, fn in _TESSERA.items()},
}
