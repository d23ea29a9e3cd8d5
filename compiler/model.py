"""Whole models: :func:`compile_model` (ONNX in) and :class:`CompiledModel` (``.tsr`` out).

The pipeline, :func:`compile_model`, runs four stages, each a function here calling the
passes of one folder (docs/architecture.md):

1. :func:`import_quantized` (``frontend/``): :func:`~.frontend.onnx_import.import_onnx`
   (checks, opset 17, shapes, constant folding); a float model is quantized
   (:func:`~.frontend.quantize.quantize_static`, onnxruntime's PTQ, so its QDQ model is the
   reference) from ``calibration`` samples;
2. :func:`fuse_integer_nodes` (``frontend/``): :func:`~.frontend.passes.remove_identity`,
   :func:`~.frontend.passes.fold_batch_norm`, :func:`~.frontend.qdq.fuse_qdq` (integer
   nodes), :func:`~.frontend.qlookup.tabulate_quantized_activations`,
   :func:`~.accel.lower.convert_flattened_gemms`;
3. :func:`place_and_compile` (``placement/``): :func:`~.placement.partition.place_nodes`
   (accelerator, CPU or view, with the reason, from the cost models of
   :mod:`.placement.cost`) and :func:`~.placement.partition.segments`;
4. then, in the same function, the backends: each segment's nodes lowered
   (:func:`~.accel.lower.lower_node`), residual adds fused into the convolutions that feed
   them, compiled by :func:`~.accel.build.compile_ops` into one program (``accel/``); every
   CPU node into CPU kernels (:func:`~.cpu.lower.lower_node_to_cpu`, ``cpu/``).

A :class:`CompiledModel` is plain data (programs, packed weights inside them, CPU kernel
IR, the step list, the placements, the config): :meth:`CompiledModel.save` writes it as
a :class:`~tessera.modelfile.ModelFile` and :meth:`CompiledModel.load` reads it back
with numpy alone. :mod:`tessera.runtime.executor` runs it.

A CPU kernel may also carry its module compiled ahead of time for some CPUs
(:mod:`.cpu.objects`, built by :func:`tessera.runtime.aot.prebuild`); the file then holds
them too.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

from tessera.config import HwConfig, get_config
from tessera.errors import CLI, PYTHON, CompileError, ProgramFileError
from tessera.hostmodel import HostModel, get_host_model
from tessera.modelfile import ModelFile

from .accel.build import CompiledProgram, compile_ops
from .accel.simtune import SimTuner
from .cpu.lower import CpuStep
from .cpu.objects import read_cpu_objects, read_kernel_texts, write_cpu_objects, write_kernel_texts
from .accel.ops import Concat, Conv2d, ConvTranspose2d, Dense, Op, Pool2d, Residual
from .accel.roofline import op_roofline

__all__ = ["AccelStep", "CompiledModel", "LayerInfo", "TensorSig", "compile_model"]

#: What a model file holds; a file with another kind is not a compiled model.
KIND = "tessera.compiled_model"

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as compilation advances."""


@dataclass(frozen=True)
class TensorSig:
    """A model input or output: name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: dict) -> "TensorSig":
        return cls(d["name"], tuple(d["shape"]), d["dtype"])


@dataclass
class LayerInfo:
    """One accelerator operator of a segment, for the profile: what it is, its work and
    its roofline bound (cycles, and whether compute or DRAM bounds it)."""

    name: str
    kind: str
    nodes: list[str]
    macs: int
    bound_cycles: float
    bound_by: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "LayerInfo":
        return cls(**d)


@dataclass
class AccelStep:
    """One accelerator segment: a program and the graph tensors it reads and writes."""

    name: str
    program: CompiledProgram
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    layers: list[LayerInfo]
    #: Graph shape of every input and output (the program holds them as 4-D images).
    shapes: dict[str, tuple[int, ...]]

    def to_dict(self) -> dict:
        return {"kind": "accelerator", "name": self.name, "inputs": list(self.inputs),
                "outputs": list(self.outputs), "layers": [x.to_dict() for x in self.layers],
                "shapes": {k: list(v) for k, v in self.shapes.items()},
                "program": self.program.manifest()}


Step = Union[AccelStep, CpuStep]


@dataclass
class CompiledModel:
    """A model compiled for one config: steps to run in order, and how it was placed."""

    config: HwConfig
    inputs: list[TensorSig]
    outputs: list[TensorSig]
    steps: list[Step]
    placements: list  # list[partition.Placement]
    #: The model's name (its ONNX graph name).
    source: str = "model"
    compile_seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    #: The int8 QDQ ONNX model this was compiled from (the reference onnxruntime runs;
    #: not stored in model files).
    reference: Any = None
    #: Recurrent state: input name -> the output carried into it from one run (frame) to
    #: the next (the ONNX metadata ``tessera.recurrent_state``; ``Model.stream`` uses it).
    state: dict[str, str] = field(default_factory=dict)
    #: The board CPU's cost model the placement assumed (runs project onto it by default).
    host: HostModel | None = None

    # ------------------------------------------------------------------ queries
    @property
    def accel_steps(self) -> list[AccelStep]:
        return [s for s in self.steps if isinstance(s, AccelStep)]

    def summary(self) -> str:
        """The placement table: one line per node with its target, its weight density (the
        share of its GEMM weight blocks that hold a non-zero, which is the share of its
        work the accelerator runs; blank without a constant weight) and the reason."""
        rows = [f"{'node':<40}{'op':<20}{'placed on':<13}{'density':>8}  reason"]
        for p in self.placements:
            density = "" if p.density is None else f"{p.density:.0%}"
            rows.append(f"{p.node[:39]:<40}{p.op[:19]:<20}{p.target:<13}{density:>8}  "
                        f"{p.reason}")
        return "\n".join(rows)

    # ------------------------------------------------------------------ files
    def to_modelfile(self) -> ModelFile:
        """The model as a :class:`~tessera.modelfile.ModelFile` (see :meth:`save`)."""
        mf = ModelFile({}, self.config)
        steps = []
        targets = write_cpu_objects(self.steps, mf)
        for k, step in enumerate(self.steps):
            if isinstance(step, AccelStep):
                mf.add_program(f"program.{k}", step.program.program)
                steps.append(step.to_dict())
            else:
                d = step.to_dict()
                d["kind"] = "cpu"
                if step.kernel is not None:
                    d["kernel"] = write_kernel_texts(step.kernel, mf, k)
                for name, value in step.constants.items():
                    mf.blobs[f"const.{k}.{name}"] = np.ascontiguousarray(value)
                steps.append(d)
        mf.manifest = {
            "kind": KIND, "source": self.source,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "steps": steps, "placements": [p.to_dict() for p in self.placements],
            "compile_seconds": self.compile_seconds, "stats": self.stats,
            "state": self.state,
            "host": None if self.host is None else self.host.to_dict(),
        }
        if targets:
            mf.manifest["cpu_targets"] = targets
        return mf

    def save(self, path: str | Path) -> Path:
        """Write the model as a ``.tsr`` file (checksummed sections, format version)."""
        path = Path(path)
        self.to_modelfile().save(path)
        return path

    @classmethod
    def from_modelfile(cls, mf: ModelFile, source: str = "model") -> "CompiledModel":
        from .placement.partition import Placement
        m = mf.manifest
        if m.get("kind") != KIND:
            raise ProgramFileError(f"{source} is a Tessera file but not a compiled model "
                                   f"(kind {m.get('kind')!r}); compile one with tessera "
                                   "compile")
        try:
            steps: list[Step] = []
            for k, d in enumerate(m["steps"]):
                if d["kind"] == "accelerator":
                    program = CompiledProgram.from_manifest(mf.program(f"program.{k}"),
                                                            d["program"])
                    steps.append(AccelStep(d["name"], program, tuple(d["inputs"]),
                                           tuple(d["outputs"]),
                                           [LayerInfo.from_dict(x) for x in d["layers"]],
                                           {n: tuple(s) for n, s in d["shapes"].items()}))
                else:
                    prefix = f"const.{k}."
                    consts = {n[len(prefix):]: mf.array(n) for n in mf.blobs
                              if n.startswith(prefix)}
                    if d.get("kernel") is not None:
                        d = {**d, "kernel": read_kernel_texts(d["kernel"], mf, k)}
                    steps.append(CpuStep.from_dict(d, consts))
            read_cpu_objects(steps, mf, source)
            return cls(mf.config, [TensorSig.from_dict(t) for t in m["inputs"]],
                       [TensorSig.from_dict(t) for t in m["outputs"]], steps,
                       [Placement.from_dict(p) for p in m["placements"]], m.get("source", ""),
                       m.get("compile_seconds", 0.0), m.get("stats", {}),
                       state=dict(m.get("state", {})),
                       host=None if m.get("host") is None
                       else HostModel.from_dict(m["host"], f"{source}'s host model"))
        except ProgramFileError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ProgramFileError(f"{source}: the compiled model's manifest is malformed "
                                   f"({exc!r}); recompile the model") from None

    @classmethod
    def load(cls, path: str | Path) -> "CompiledModel":
        """Read a ``.tsr`` file written by :meth:`save`."""
        return cls.from_modelfile(ModelFile.load(path), str(path))


# ---------------------------------------------------------------------- compilation
def compile_model(model: Any, config: HwConfig | str | None = None, *,
                  calibration: Sequence[Mapping[str, np.ndarray]] | None = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None,
                  force_cpu: Sequence[str] = (), host=None,
                  progress: Progress | None = None, activations: str = "exact",
                  pieces: int | None = None, tolerance: float | None = None,
                  placement: str = "dp", skip_zero_blocks: bool = True,
                  tune: str = "model") -> CompiledModel:
    """Compile an ONNX model (``ModelProto``, path or bytes) for ``config``.

    A float model needs ``calibration`` (a list of input feeds) to be quantized; an int8
    QDQ model compiles as it is. ``force_cpu`` keeps the named nodes (of the fused graph,
    see :attr:`CompiledModel.placements`) on the CPU; ``host`` is the
    :class:`~tessera.hostmodel.HostModel` the placement assumes (a model, a built-in's name,
    ``"local"`` or a file; ``None``: the config's board CPU). ``placement`` is the
    strategy of :func:`~.placement.partition.place_nodes`: ``"dp"`` (the least projected
    latency of the whole graph), ``"greedy"`` (cheaper per node) or ``"cpu"`` (the CPU-only
    baseline). ``progress(stage, done, total)``
    is called as compilation advances. ``activations="approximate"`` with ``pieces`` or
    ``tolerance`` approximates the activations no exact intrinsic of ``config`` runs
    (:func:`~.accel.builtin_patterns.mark_approximate_activations`), fitted to their
    inputs' distribution on the calibration data. ``skip_zero_blocks`` (default): weight
    blocks of zeros (a pruned model's, :mod:`tessera.compress`) are neither stored,
    loaded nor multiplied on the accelerator; False runs every layer densely (the same
    results, for comparison). ``tune="sim"`` checks each convolution's tiling on the
    simulator and lets it choose where the cost model is off (:mod:`.accel.simtune`; slower
    to compile; ``stats["tuning"]`` says how often); ``"model"`` (default) trusts the model.
    """
    from .placement.partition import check_strategy

    t0 = time.perf_counter()
    cfg = get_config(config)
    report = progress or (lambda stage, done, total: None)
    if activations not in ("exact", "approximate"):
        raise CompileError(f"activations must be 'exact' or 'approximate', not {activations!r}",
                           fix={PYTHON: "activations='approximate' with pieces=K or tolerance=T",
                                CLI: "--activations approximate --pieces K (or --tolerance T)"})
    # A bad host model or strategy is an error before any long work starts.
    hostmodel = get_host_model(host, cfg.name)
    check_strategy(placement)
    accel = {"skip_zero_blocks": skip_zero_blocks, "tuner": _tuner(tune)}
    graph, reference = import_quantized(model, input_shapes, calibration, report)
    fuse_integer_nodes(graph)
    if activations == "approximate":
        approximate_activations(graph, cfg, reference, calibration, pieces, tolerance)
    placements, steps, runs = place_and_compile(graph, cfg, hostmodel, force_cpu, report,
                                                placement, accel)
    counts = {t: sum(p.target == t for p in placements) for t in ("accelerator", "cpu", "view")}
    compiled = CompiledModel(cfg, _signatures(graph, graph.inputs),
                             _signatures(graph, graph.outputs), steps, placements, graph.name,
                             time.perf_counter() - t0,
                             {"nodes": counts, "segments": len(runs),
                              **({"tuning": accel["tuner"].summary()} if accel["tuner"]
                                 else {})}, reference,
                             recurrent_state(graph), hostmodel)
    report("done", 1, 1)
    return compiled


def _tuner(tune: str) -> SimTuner | None:
    """The tiling tuner ``tune`` names: ``"sim"`` a :class:`~.accel.simtune.SimTuner`,
    ``"model"`` none (the cost model alone)."""
    if tune not in ("model", "sim"):
        raise CompileError(f"tune must be 'model' or 'sim', not {tune!r}",
                           fix={CLI: "--tune model or --tune sim"})
    return SimTuner() if tune == "sim" else None


def approximate_activations(graph, config: HwConfig, reference, calibration,
                            pieces: int | None, tolerance: float | None) -> int:
    """Mark the lookups ``config`` has no exact intrinsic for to be approximated, each
    fitted to the byte histogram of its input over the calibration feeds (onnxruntime on
    the reference QDQ model; uniform for a QDQ model compiled without calibration)."""
    from .accel.builtin_patterns import mark_approximate_activations
    names = [n.inputs[0] for n in graph.nodes if n.op == "QLookup"]
    return mark_approximate_activations(graph, config, pieces=pieces, tolerance=tolerance,
                                        histograms=_byte_histograms(reference, calibration,
                                                                    names))


def _byte_histograms(reference, calibration, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Counts of each byte of the 8-bit tensors ``names`` of the reference model over the
    calibration feeds, in the order of the stored int8 tensor's bytes (a uint8 tensor's
    byte ``u`` is the shifted int8 ``u - 128``, byte ``u ^ 0x80``)."""
    import onnx

    from .frontend.quantize import reference_session

    produced = {t for node in reference.graph.node for t in node.output}
    wanted = [n for n in dict.fromkeys(names) if n in produced]
    if not calibration or not wanted:
        return {}
    model = onnx.ModelProto()
    model.CopyFrom(reference)
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in wanted)
    session = reference_session(model)
    counts = {n: np.zeros(256, np.float64) for n in wanted}
    for feed in calibration:
        for name, value in zip(wanted, session.run(wanted, dict(feed))):
            value = np.asarray(value)
            byte = value.view(np.uint8).ravel()
            if value.dtype == np.uint8:
                byte = byte ^ 0x80
            counts[name] += np.bincount(byte, minlength=256)
    return counts


def import_quantized(model: Any, input_shapes, calibration, report: Progress):
    """Stage 1 (frontend): the model as a graph of int8 QDQ nodes, and the QDQ ONNX model
    onnxruntime runs as the reference. A float model is quantized from ``calibration``."""
    from .frontend.onnx_import import import_onnx, to_onnx
    from .frontend.passes import chain_sums
    from .frontend.quantize import is_quantized, quantize_static

    report("import", 0, 1)
    graph = import_onnx(model, input_shapes)
    if is_quantized(graph):
        return graph, to_onnx(graph)
    if calibration is None:
        raise CompileError(f"model {graph.name!r} is a float model", fix={
            PYTHON: "pass calibration=[{input name: array}, ...] (a few representative "
                    "inputs) to quantize it to int8, or give an int8 QDQ model",
            CLI: "give --calibration FILE.npz (arrays named as the inputs: one sample or a "
                 "stack of samples) or --random-calibration N to quantize it to int8, or "
                 "give an int8 QDQ model"})
    report("quantize", 0, 1)
    chain_sums(graph)  # onnxruntime quantizes Adds, not Sums
    reference = quantize_static(to_onnx(graph), calibration)
    _name_after_user_nodes(reference, graph)
    quantized = import_onnx(reference, input_shapes)
    quantized.metadata = {**graph.metadata, **quantized.metadata}
    return quantized, reference


#: The ONNX metadata key of a model's recurrent state: a JSON object mapping each state
#: input to the output carried into it from one run to the next.
RECURRENT_STATE = "tessera.recurrent_state"


def recurrent_state(graph) -> dict[str, str]:
    """The state pairs ``graph``'s metadata declares (CompileError if they do not name an
    input and an output each)."""
    text = graph.metadata.get(RECURRENT_STATE)
    if text is None:
        return {}
    try:
        state = json.loads(text)
        pairs = {str(k): str(v) for k, v in state.items()}
    except (ValueError, AttributeError) as exc:
        raise CompileError(f"metadata {RECURRENT_STATE!r} of model {graph.name!r} is not a "
                           f"JSON object of input -> output names ({exc})") from None
    for name, source in pairs.items():
        if name not in graph.inputs or source not in graph.outputs:
            raise CompileError(f"metadata {RECURRENT_STATE!r} of model {graph.name!r} carries "
                               f"{source!r} into {name!r}: the first must be an output, the "
                               "second an input of the model")
    return pairs


def _name_after_user_nodes(quantized, graph) -> None:
    """Name the unnamed nodes of ``quantized`` after the node of the user's ``graph`` they
    come from: onnxruntime's pre-processing writes some without names (it inlines function
    ops, e.g. a HardSwish as HardSigmoid and Mul), which the import would otherwise name
    by their place in the quantized model (``HardSigmoid_7``), naming nothing the user
    wrote. Such a node is named ``<user node>/<op>``, the user node being the one that
    wrote the first tensor, downstream, that the user's graph also has."""
    writer = {t: node.name for node in graph.nodes for t in node.outputs}
    readers: dict[str, list] = {}
    for node in quantized.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    taken = {node.name for node in quantized.graph.node}
    for node in quantized.graph.node:
        if node.name:
            continue
        frontier, seen, source = list(node.output), set(), None
        while frontier and source is None:
            t = frontier.pop(0)
            source = writer.get(t)
            if t not in seen:
                seen.add(t)
                frontier += [o for r in readers.get(t, ()) for o in r.output]
        base = f"{source or graph.name}/{node.op_type}"
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        node.name = name
        taken.add(name)


def fuse_integer_nodes(graph) -> None:
    """Stage 2 (frontend passes): identities out, batch norms folded, QDQ patterns fused
    into integer nodes, quantized activations into lookup tables, flattened Gemms
    converted; the graph verified."""
    from .accel.lower import convert_flattened_gemms
    from .frontend.passes import fold_batch_norm, lift_global_pools, remove_identity
    from .frontend.qdq import fuse_qdq
    from .frontend.qdq_concat import requantize_concat_inputs
    from .frontend.qlookup import compose_lookups, tabulate_quantized_activations

    remove_identity(graph)
    fold_batch_norm(graph)
    lift_global_pools(graph)
    # Before fuse_qdq: a SiLU's Mul must still be DQ -> Mul -> Q (not a QMul) for the
    # whole activation to become one table, and a requantizing Concat's inputs must
    # still be DQs to be requantized by tables (then merged with the activations').
    tabulate_quantized_activations(graph)
    requantize_concat_inputs(graph)
    compose_lookups(graph)
    fuse_qdq(graph)
    convert_flattened_gemms(graph)
    graph.remove_unused()
    graph.verify()


def place_and_compile(graph, config: HwConfig, host, force_cpu: Sequence[str],
                      report: Progress, strategy: str = "dp",
                      accel: Mapping[str, Any] | None = None):
    """Stages 3 and 4 (placement by ``strategy``, see
    :func:`~.placement.partition.place_nodes`, then each backend):
    ``(placements, steps, segments)``.

    A node the accelerator supports but whose tensors do not fit the config's buffers
    (e.g. too many channels' parameters for a small accumulator) falls back to the CPU and
    the placement says so. Only what the fallback changed is compiled again: segments and
    CPU steps are kept by their nodes across the retries. ``accel``: options for each
    segment's :func:`~.accel.build.compile_ops` (``skip_zero_blocks``, ``tuner``).
    """
    from .placement.partition import place_nodes

    report("place", 0, 1)
    misfits: dict[str, str] = {}
    compiled = _StepCache()
    while True:
        placements = place_nodes(graph, config, host=host, force_cpu=[*force_cpu, *misfits],
                                 strategy=strategy)
        for p in placements:
            if p.node in misfits:
                p.reason = misfits[p.node]
        try:
            steps, runs = _compile_steps(graph, placements, config, report, compiled,
                                         accel or {})
            return placements, steps, runs
        except CompileError as exc:
            on_accel = {p.node for p in placements if p.target == "accelerator"}
            if exc.op is None or exc.op in misfits or exc.op not in on_accel:
                raise
            misfits[exc.op] = f"does not fit config {config.name!r}: {exc}"
            report("place", 0, 1)


def _signatures(graph, names: Sequence[str]) -> list[TensorSig]:
    return [TensorSig(n, graph.value(n).shape, graph.value(n).dtype) for n in names]


@dataclass
class _StepCache:
    """What :func:`_compile_steps` compiled, by the nodes it came from: a segment's program
    depends only on its nodes (its outputs are the tensors read after its last node), a
    CPU node's steps only on the node."""

    segments: dict[tuple[str, ...], AccelStep] = field(default_factory=dict)
    cpu: dict[str, list] = field(default_factory=dict)


def _compile_steps(graph, placements, config: HwConfig, report: Progress,
                   cache: _StepCache, accel: Mapping[str, Any]):
    """The steps of a placed graph: a program per accelerator segment, CPU kernels for the
    other nodes, in graph order."""
    from .cpu.lower import lower_node_to_cpu
    from .cpu.vector_width import VECTOR_WIDTHS
    from .placement.partition import segments
    runs = segments(graph, placements)
    target = {p.node: p.target for p in placements}
    readers = _readers_after(graph)
    total_ops = sum(len(r) for r in runs)
    done = [0]

    def on_op(op: Op) -> None:
        done[0] += 1
        report("compile", done[0], total_ops)

    steps: list[Step] = []
    run_of = {node.name: k for k, run in enumerate(runs) for node in run}
    emitted: set[int] = set()
    for node in graph.nodes:
        if target[node.name] != "accelerator":
            if node.name not in cache.cpu:
                cache.cpu[node.name] = lower_node_to_cpu(graph, node, VECTOR_WIDTHS)
            steps.extend(cache.cpu[node.name])
            continue
        k = run_of[node.name]
        if k in emitted:
            continue
        emitted.add(k)
        key = tuple(n.name for n in runs[k])
        if key not in cache.segments:
            cache.segments[key] = _compile_segment(graph, runs[k], config, readers, on_op,
                                                   accel)
        else:
            done[0] += len(key)
        steps.append(replace(cache.segments[key], name=f"accel{k}"))
    return steps, runs


def _readers_after(graph) -> dict[str, list[int]]:
    """For every tensor, the indices of the nodes reading it (graph outputs: -1)."""
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        for t in node.inputs:
            readers.setdefault(t, []).append(i)
    for t in graph.outputs:
        readers.setdefault(t, []).append(-1)
    return readers


def _compile_segment(graph, nodes, config: HwConfig, readers: dict[str, list[int]],
                     on_op, accel: Mapping[str, Any]) -> AccelStep:
    """Lower a run of accelerator nodes, each into the epilogue of its producer where an
    intrinsic pattern allows (residual adds, lookups), and compile one program."""
    from .accel.lower import fuse_into_producer, lower_node
    ops: list[Op] = []
    members: dict[str, list[str]] = {}
    for node in nodes:
        fused = fuse_into_producer(graph, node, config, ops, readers)
        if fused is not None:
            k, ops[k] = fused
            members[ops[k].name].append(node.name)
            continue
        op = lower_node(graph, node, config)
        ops.append(op)
        members[op.name] = [node.name]
    produced = {op.output for op in ops}
    inputs = tuple(dict.fromkeys(t for op in ops for t in op.inputs if t not in produced))
    names = {n.name for n in nodes}
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    last = max(index[n] for n in names)
    outputs = tuple(op.output for op in ops
                    if any(r == -1 or r > last for r in readers.get(op.output, [])))
    shapes = {t: graph.value(t).shape for t in (*inputs, *outputs)}
    program = compile_ops(ops, {t: shapes[t] for t in inputs}, config, outputs=list(outputs),
                          on_op=on_op, **accel)
    layers = [_layer_info(op, members[op.name], program, graph) for op in ops]
    return AccelStep("", program, inputs, outputs, layers, shapes)


def _layer_info(op: Op, nodes: list[str], program: CompiledProgram, graph) -> LayerInfo:
    roof = op_roofline(op, lambda t: graph.value(t).shape, program.config)
    if isinstance(op, (Conv2d, Dense)):
        conv = "convT" if isinstance(op, ConvTranspose2d) else "conv"
        kind = "dense" if isinstance(op, Dense) else (
            conv if op.groups == 1 else f"{conv}/{op.groups}")
        if any(isinstance(st, Residual) for st in op.epilogue):
            kind += "+add"                        # a residual add fused into the epilogue
    elif isinstance(op, Pool2d):
        kind = f"{op.kind}pool"
    else:
        kind = "concat" if isinstance(op, Concat) else f"eltwise {op.op}"
    return LayerInfo(op.name, kind, nodes, roof.macs, roof.bound, roof.limit)
