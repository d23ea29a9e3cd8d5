"""Lowering of one graph node to CPU kernel steps, for the nodes the accelerator does not run.

:func:`lower_node_to_cpu` turns a :class:`~..frontend.graph.Node` into a list of :class:`CpuStep`:
each step is one :class:`~.kernel.CpuKernel` (built by the generators of
:mod:`tessera.compiler.cpu`) with the names of the tensors it reads and writes, or a view
(``kernel`` None: a reshape, no computation). Most nodes are one step; the integer
``tessera`` nodes are a few (e.g. QConv: int8 convolution to int32, then an elementwise
requantization), linked by intermediate tensors named ``f"{node.name}:<what>"``.
:func:`tessera.runtime.cpu.run_cpu_steps` executes steps on numpy arrays.

Semantics are onnxruntime's (CPU provider) for standard ops and :mod:`..golden.quantized`'s (the golden
model, itself onnxruntime's x86 integer kernels) for the ``tessera`` nodes. Integer
results are bit-exact (QuantizeLinear and the requantizations included); so are float
results of single IEEE operations (DequantizeLinear, Add, Mul, Div, pools' maxima...).
Sigmoid is MLAS's logistic, onnxruntime's bits (dynamically quantized models measure
ranges on its results). Otherwise float results follow the kernels' documented accuracy:
exp and tanh are polynomials within a few ulp, and float sums (softmax, layer norm, reductions,
average pools, linear Resize) are added in another order, so they differ from
onnxruntime in the last bits. A
float-to-integer Cast of a value outside the target range is undefined, as in numpy and
onnxruntime.

Each op's lowering first *plans* its steps (pure Python: checks, constants, expressions)
and builds the LLVM IR only when asked, so :func:`cpu_unsupported_reason` answers from
the same code without generating IR. A few limits only a builder knows (e.g. a pooling
window too large to unroll) surface from :func:`lower_node_to_cpu` alone. The planning
vocabulary is :mod:`.lower_plan`; the lowerings are tables of (op type -> function), one
module per family, dispatched by ``(domain, op type)`` here: :mod:`.lower_math`
(elementwise math, comparisons, normalizations), :mod:`.lower_movement` (data movement and
views), :mod:`.lower_onnx` (casts, Q/DQ, softmax, layer norm, reductions, pooling),
:mod:`.lower_quantized` (the ``tessera`` integer nodes), :mod:`.lower_dynamic`
(dynamic quantization: DynamicQuantizeLinear, ConvInteger, MatMulInteger) and
:mod:`.lower_linear` (float MatMul, Gemm, Einsum, Conv, ConvTranspose; ArgMax/ArgMin).
:func:`cpu_supported_ops` lists what they cover (the conformance suite's claim).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tessera.errors import CompileError, CpuKernelError

from ..cpu import CpuKernel
from ..frontend.graph import Graph, Node
from ..frontend.qdq import DOMAIN
from .lower_dynamic import DYNAMIC_LOWERINGS
from .lower_linear import LINEAR_LOWERINGS
from .lower_math import MATH_LOWERINGS
from .lower_movement import MOVEMENT_LOWERINGS
from .lower_onnx import ONNX_LOWERINGS
from .lower_plan import LowerFn, NodeLowering, Plan, Unsupported
from .lower_qbinary import QBINARY_LOWERINGS
from .lower_quantized import QUANTIZED_LOWERINGS
from .lower_rnn import RNN_LOWERINGS
from .vector_width import building_for_vector_bits, host_vector_bits, noting_width_reads

__all__ = ["CpuStep", "cpu_supported_ops", "cpu_unsupported_reason",
           "lower_node_to_cpu"]

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


# ------------------------------------------------------------------------ public API
def lower_node_to_cpu(graph: Graph, node: Node,
                      vector_bits: Collection[int] = ()) -> list[CpuStep]:
    """CPU steps computing ``node`` exactly as onnxruntime does; raises CompileError (naming
    the node, saying which op/attribute is not supported and what to do) when there is no
    CPU kernel. Kernels tiled by vector width get, for each other width in
    ``vector_bits`` (the compile passes every width kernels are tiled for), a variant of
    their IR built for it (:attr:`CpuKernel.variants`: what a CPU of that width compiles)."""
    with noting_width_reads() as reads:
        steps = _lower(graph, node)
    if not reads:
        return steps       # built without asking the width: the same at every width
    for bits in sorted(set(vector_bits) - {host_vector_bits()}):
        with building_for_vector_bits(bits):
            other = _lower(graph, node)
        if len(other) == len(steps) and all(map(_same_but_ir, steps, other)):
            steps = [_with_variant(s, o, bits) for s, o in zip(steps, other)]
    return steps


def _lower(graph: Graph, node: Node) -> list[CpuStep]:
    try:
        plans = _plan(graph, node)
    except Unsupported as exc:
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


def _same_but_ir(a: CpuStep, b: CpuStep) -> bool:
    """Whether two lowerings of a node differ at most in their kernels' IR: a variant
    must take the same arguments and constants (a layout packed for another width does
    not) and have the same parallel form."""
    if (a.name, a.inputs, a.outputs, a.shape) != (b.name, b.inputs, b.outputs, b.shape):
        return False
    if (a.kernel is None) != (b.kernel is None) or a.constants.keys() != b.constants.keys():
        return False
    if a.kernel is not None and \
            replace(a.kernel, ir="", variants=()) != replace(b.kernel, ir="", variants=()):
        return False
    return all(np.array_equal(a.constants[n], b.constants[n]) for n in a.constants)


def _with_variant(step: CpuStep, other: CpuStep, bits: int) -> CpuStep:
    """``step`` whose kernel also has ``other``'s IR as its ``bits`` variant (when it
    differs)."""
    if step.kernel is None or other.kernel.ir == step.kernel.ir:
        return step
    kernel = replace(step.kernel, variants=(*step.kernel.variants, (bits, other.kernel.ir)))
    return replace(step, kernel=kernel)


def cpu_unsupported_reason(graph: Graph, node: Node) -> str | None:
    """Why ``node`` has no CPU kernel (None if it has one), without building IR."""
    try:
        _plan(graph, node)
    except Unsupported as exc:
        return str(exc)
    return None


def cpu_supported_ops(domain: str = "") -> frozenset[str]:
    """The op types of ``domain`` (``""``: standard ONNX; ``"tessera"``: the integer nodes)
    that have a CPU lowering. A node of such an op may still be refused for an attribute,
    dtype or rank: :func:`cpu_unsupported_reason` says."""
    return frozenset(op for d, op in _LOWERINGS if d == domain)


# ------------------------------------------------------------------------ planning
def _plan(graph: Graph, node: Node) -> list[Plan]:
    """The planned steps of ``node``, by its ``(domain, op type)`` lowering."""
    lowering = _LOWERINGS.get((node.domain, node.op))
    if lowering is None:
        raise Unsupported(_no_lowering_reason(node))
    return lowering(NodeLowering(graph, node))


def _no_lowering_reason(node: Node) -> str:
    """Why no lowering matches ``node``, naming the ops that do have one."""
    if node.domain == DOMAIN:
        return (f"{node.op!r} is not an op of domain {DOMAIN!r} the CPU runs "
                f"({', '.join(sorted(op for d, op in _LOWERINGS if d == DOMAIN))})")
    if node.domain:
        return (f"ops of domain {node.domain!r} have no CPU kernels; replace it by standard "
                "ONNX ops in the model")
    return (f"there is no CPU kernel for {node.op}; replace it in the model by supported "
            f"ops ({', '.join(sorted(op for d, op in _LOWERINGS if not d))})")



def _check_outputs(graph: Graph, node: Node, step: CpuStep) -> None:
    """A kernel whose outputs disagree with the graph's shapes would corrupt whatever
    reads them: catch it at compile time."""
    if step.kernel is None:
        # A view of an intermediate tensor of the node (not in the graph) is unchecked.
        written = [(step.shape, getattr(graph.values.get(step.outputs[0]), "dtype", None))]
    else:
        written = [(s.shape, s.dtype) for s in step.kernel.outputs]
    for name, (shape, dtype) in zip(step.outputs, written):
        value = graph.values.get(name)
        if name in node.outputs and (shape != value.shape or dtype != value.dtype):
            raise CompileError(f"{node.op} node {node.name!r}: its CPU kernel writes {name!r} "
                               f"as {dtype}{list(shape)}, the graph says "
                               f"{value.dtype}{list(value.shape)}", op=node.name)


# ---------------------------------------------------------------------- dispatch table
#: (domain, op type) -> lowering.
_LOWERINGS: dict[tuple[str, str], LowerFn] = {
    **{("", op): fn for op, fn in ONNX_LOWERINGS.items()},
    **{("", op): fn for op, fn in MOVEMENT_LOWERINGS.items()},
    **{("", op): fn for op, fn in MATH_LOWERINGS.items()},
    **{("", op): fn for op, fn in DYNAMIC_LOWERINGS.items()},
    **{("", op): fn for op, fn in LINEAR_LOWERINGS.items()},
    **{(DOMAIN, op): fn for op, fn in QUANTIZED_LOWERINGS.items()},
    **{(DOMAIN, op): fn for op, fn in QBINARY_LOWERINGS.items()},
    **RNN_LOWERINGS,
}
