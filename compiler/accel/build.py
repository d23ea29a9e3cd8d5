"""``compile_ops``: several operators into one program (one launch, one FINISH).

Passes, in order:

1. shape inference over the operator list;
2. ``plan_dram`` (:mod:`.dram`): program inputs and outputs get named
   segments the runtime fills and reads; intermediate tensors share one arena
   segment, at offsets reused once a tensor is dead;
3. per operator, ``plan_*_tiles`` and ``tensorize_*`` append its instructions
   (no tokens) to one :class:`~.emit.Emitter`;
4. FINISH, then :func:`~.sync.insert_dependency_tokens` over the whole
   stream: DRAM hazards between operators (a layer's loads waiting for the
   stores of the tile they read) are ordered by the same analysis as the
   on-chip ones.

The result is a :class:`CompiledProgram`: the program plus where each tensor
lives, with helpers to bind inputs and read outputs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Mapping, Sequence

import numpy as np

from tessera.config import HwConfig, get_config
from tessera.isa import Program

from .conv import TensorInfo, tensorize_conv2d
from .simtune import SimTuner
from .dram import DramPlan, plan_dram
from .emit import Emitter, Place
from tessera.errors import CompileError
from .layout import ActLayout, int_dtype, pack_activation, unpack_activation
from .ops import Concat, Conv2d, ConvTranspose2d, Dense, Eltwise, Op, Pool2d
from .poolfuse import fuse_conv_pools
from .packing import PackedInput, pack_small_channel_convs
from .sync import insert_dependency_tokens


@dataclass
class CompiledProgram:
    """A compiled operator sequence: the program and the placement of its tensors."""

    config: HwConfig
    program: Program
    tensors: dict[str, TensorInfo]
    inputs: list[str]
    outputs: list[str]
    plans: dict[str, object] = field(default_factory=dict)
    dram: DramPlan | None = None
    compile_seconds: float = 0.0
    #: Host-side transforms producing a device input from a program input (kernel-position
    #: packing): ``{device input: transform}``, ``transform.source`` names the program input
    #: it reads.
    input_transforms: dict[str, PackedInput] = field(default_factory=dict)
    #: The tensors the host writes into DRAM (the inputs, or their transformed versions).
    device_inputs: list[str] = field(default_factory=list)
    #: ``(operator, first, end)``: the instructions of each operator (end exclusive).
    op_bounds: list[tuple[str, int, int]] = field(default_factory=list)

    def manifest(self) -> dict:
        """Everything but the program as JSON-able data (see :meth:`from_manifest`)."""
        return {
            "tensors": {n: {"shape": list(t.layout.shape), "batch": t.layout.batch,
                            "block": t.layout.block, "segment": t.place.segment,
                            "offset": t.place.offset} for n, t in self.tensors.items()},
            "inputs": self.inputs, "outputs": self.outputs,
            "device_inputs": self.device_inputs,
            "input_transforms": {n: t.to_dict() for n, t in self.input_transforms.items()},
            "op_bounds": [list(b) for b in self.op_bounds],
        }

    @classmethod
    def from_manifest(cls, program: Program, manifest: dict) -> "CompiledProgram":
        """A compiled program from its :class:`~tessera.isa.Program` and :meth:`manifest`
        (tiling plans and the DRAM plan are not kept)."""
        m = manifest
        tensors = {n: TensorInfo(n, ActLayout(tuple(t["shape"]), t["batch"], t["block"]),
                                 Place(t["segment"], t["offset"]))
                   for n, t in m["tensors"].items()}
        return cls(program.config, program, tensors, list(m["inputs"]), list(m["outputs"]),
                   input_transforms={n: PackedInput.from_dict(d)
                                     for n, d in m["input_transforms"].items()},
                   device_inputs=list(m["device_inputs"]),
                   op_bounds=[(str(n), int(a), int(b)) for n, a, b in m["op_bounds"]])

    def input_segments(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The new contents of every segment that holds a device input, with ``inputs``
        (logical NCHW / NC arrays) packed in."""
        missing = [n for n in self.inputs if n not in inputs]
        if missing:
            raise CompileError(f"inputs {missing} were not given (the program reads "
                               f"{self.inputs})")
        segments: dict[str, np.ndarray] = {}
        for name in self.device_inputs or self.inputs:
            if name in self.input_transforms:
                fn = self.input_transforms[name]
                x = fn(np.asarray(inputs[fn.source]))
            else:
                x = np.asarray(inputs[name])
            info = self.tensors[name]
            packed = pack_activation(x, info.layout, int_dtype(self.config.inp_width))
            raw = packed.view(np.uint8).reshape(-1)
            seg = info.place.segment
            if seg not in segments:
                segments[seg] = self.program.segment(seg).data.copy()
            segments[seg][info.place.offset:info.place.offset + raw.size] = raw
        return segments

    @property
    def output_segments(self) -> list[str]:
        """The segments :meth:`read` takes the outputs from."""
        return sorted({self.tensors[n].place.segment for n in self.outputs})

    def bind(self, inputs: Mapping[str, np.ndarray]) -> Program:
        """A copy of the program with ``inputs`` (logical NCHW / NC arrays) packed into DRAM."""
        segments = self.input_segments(inputs)
        return Program(self.config, self.program.instructions,
                       [type(s)(s.name, s.addr, segments.get(s.name, s.data))
                        for s in self.program.segments])

    def read(self, result, name: str) -> np.ndarray:
        """Tensor ``name`` (logical shape) out of a simulation result's DRAM."""
        info = self.tensors[name]
        dram = getattr(result, "dram", result)
        seg = self.program.segment(info.place.segment)
        dtype = int_dtype(self.config.out_width)
        n = info.layout.values * np.dtype(dtype).itemsize
        raw = dram[seg.addr + info.place.offset: seg.addr + info.place.offset + n]
        return unpack_activation(raw.view(dtype), info.layout)

    def run(self, inputs: Mapping[str, np.ndarray], **sim_options):
        """Simulate with ``inputs``; returns ``(outputs dict, SimResult)``."""
        from tessera.sim import simulate
        result = simulate(self.bind(inputs), **sim_options)
        return {name: self.read(result, name) for name in self.outputs}, result


def infer_shapes(ops: Sequence[Op], input_shapes: Mapping[str, tuple[int, ...]]
                 ) -> dict[str, tuple[int, int, int, int]]:
    """Logical ``(N, C, H, W)`` shape of every tensor."""
    shapes: dict[str, tuple[int, int, int, int]] = {}
    for name, s in input_shapes.items():
        s = tuple(int(v) for v in s)
        shapes[name] = s + (1,) * (4 - len(s)) if len(s) < 4 else s  # type: ignore[assignment]
    for op in ops:
        for t in op.inputs:
            if t not in shapes:
                raise CompileError(f"operator {op.name!r} reads tensor {t!r}, which no earlier "
                                   "operator produces and which is not a program input",
                                   op=op.name)
        out = op.output_shape(shapes[op.inputs[0]])
        if op.output in shapes:
            raise CompileError(f"operator {op.name!r} writes tensor {op.output!r}, which already "
                               "exists: tensors are written once", op=op.name)
        shapes[op.output] = out
    return shapes


def plan_layouts(ops: Sequence[Op], shapes: Mapping[str, tuple[int, int, int, int]],
                 config: HwConfig, input_blocks: Mapping[str, int] | None = None
                 ) -> dict[str, ActLayout]:
    """The packed layout of every tensor: blocks of the widest channel block that moves
    it -- ``block_out`` for an operator's stores and the accumulator (acc8) loads,
    ``block_in`` for the GEMM's input. On a core with ``block_in != block_out`` a tensor
    the GEMM reads is stored in blocks of the larger and the smaller moves as sub-blocks
    (:attr:`ActLayout.pixel_stride`), so a layer chains into the next on any core of one
    image per entry whose block sizes divide one another. ``input_blocks`` fixes a program
    input's block (a layer compiled alone, stored as in its model)."""
    units: dict[str, dict[int, str]] = {}
    for op in ops:
        units.setdefault(op.output, {})[config.block_out] = op.name
        gemm_input = op.input if isinstance(op, (Conv2d, Dense)) else None
        for t in op.inputs:
            block = config.block_in if t == gemm_input else config.block_out
            units.setdefault(t, {})[block] = op.name
    produced = {op.output for op in ops}
    small, large = sorted((config.block_in, config.block_out))
    for op in ops:
        if isinstance(op, (Conv2d, Dense)) and op.input in produced and (
                large % small or config.inp_width != config.out_width
                or (large != small and config.batch > 1)):
            raise CompileError(f"{op.name!r} reads {op.input!r}, which an operator stores in "
                               f"{config.out_width}-bit blocks of {config.block_out} channels, "
                               f"but config {config.name!r}'s GEMM reads {config.inp_width}-bit "
                               f"blocks of {config.block_in}: it cannot be chained on this "
                               "config", op=op.name)
    layouts = {}
    for name, shape in shapes.items():
        blocks = units.get(name, {config.block_in: ""})
        if (large % small or config.batch > 1) and len(blocks) > 1:
            raise CompileError(f"input {name!r} is read by {blocks[config.block_in]!r} in blocks "
                               f"of {config.block_in} channels and by "
                               f"{blocks[config.block_out]!r} in blocks of {config.block_out} "
                               f"(config {config.name!r}): give each its own input")
        block = (input_blocks or {}).get(name) if name not in produced else None
        layouts[name] = ActLayout.of(shape, config, block or max(blocks))
    return layouts


def compile_ops(ops: Sequence[Op], input_shapes: Mapping[str, tuple[int, ...]],
                config: HwConfig | str | None = None, *, outputs: Sequence[str] | None = None,
                threads: int = 2, plans: Mapping[str, object] | None = None,
                pack_small_channels: bool = True, skip_zero_blocks: bool = True,
                verify: bool = False, fuse_pools: bool = True,
                on_op: Callable[[Op], None] | None = None,
                tuner: SimTuner | None = None,
                input_blocks: Mapping[str, int] | None = None) -> CompiledProgram:
    """Compile ``ops`` (in execution order) into one program for ``config``.

    ``input_shapes`` gives the program inputs' logical shapes; ``outputs`` the
    tensors the host reads back (default: those no operator consumes).
    ``threads`` is the number of virtual threads (1 disables latency hiding).
    ``plans`` forces a tiling per operator name. ``pack_small_channels`` lets
    a convolution reading a program input with few channels pack kernel
    positions into the channel block (the host applies the matching input
    transform in :meth:`CompiledProgram.bind`). ``skip_zero_blocks``: convolution and dense
    weight blocks of zeros are neither stored, loaded nor multiplied (False runs every
    layer densely, e.g. to compare). ``verify`` runs
    :func:`~.verify.verify_program` on the result. ``fuse_pools``: a max pool runs in the
    tiles of the convolution it reads where it can (:mod:`.poolfuse`). ``on_op`` sees each
    operator before it is tensorized. ``tuner``: see :mod:`.simtune`. ``input_blocks``
    stores the named inputs in blocks of that many channels (:func:`plan_layouts`).
    """
    t0 = time.perf_counter()
    cfg = get_config(config)
    if threads not in (1, 2):
        raise CompileError(f"threads must be 1 or 2, not {threads}")
    unfused = partial(compile_ops, ops, input_shapes, cfg, outputs=outputs, threads=threads,
                      plans=plans, pack_small_channels=pack_small_channels,
                      skip_zero_blocks=skip_zero_blocks, verify=verify, fuse_pools=False,
                      on_op=on_op, tuner=tuner, input_blocks=input_blocks)
    ops = list(ops)
    user_inputs = list(input_shapes)
    input_transforms: dict[str, PackedInput] = {}
    if pack_small_channels:
        ops, input_shapes, input_transforms = pack_small_channel_convs(ops, dict(input_shapes),
                                                                        cfg)
    input_shapes, shapes, outs = _program_tensors(ops, input_shapes, outputs)
    if fuse_pools:
        ops = fuse_conv_pools(ops, shapes, outs, cfg, threads, plans or {})
    em = Emitter(cfg)
    layouts = plan_layouts(ops, shapes, cfg, input_blocks)
    dram = plan_dram(ops, shapes, list(input_shapes), outs, cfg, em, layouts)
    tensors = {name: TensorInfo(name, layouts[name], dram.places[name]) for name in shapes}
    used_plans: dict[str, object] = {}
    for op in ops:
        if on_op is not None:
            on_op(op)
        try:
            plan = _tensorize_op(em, op, tensors, threads=threads,
                                 plan=(plans or {}).get(op.name),
                                 skip_zero_blocks=skip_zero_blocks, tuner=tuner)
        except CompileError:
            if getattr(op, "pool", None) is None:
                raise
            return unfused()    # no fused tiling emits (its uop kernels overflow)
        if plan is not None:
            used_plans[op.name] = plan
        if getattr(op, "pool", None) is not None:
            em.begin_op(op.pool.name)   # fused: no instructions of its own (profile rows)
            em.end_op()
    program = insert_dependency_tokens(em.finish())
    op_bounds = _per_operator(program.sync_stats.map_bounds(em.op_bounds()),  # type: ignore
                              [op.name for op in ops])
    if verify:
        from .verify import verify_program
        verify_program(program)
    return CompiledProgram(cfg, program, tensors, user_inputs, outs, used_plans, dram,
                           time.perf_counter() - t0, input_transforms, list(input_shapes),
                           op_bounds)


def _program_tensors(ops: Sequence[Op], input_shapes: Mapping[str, tuple[int, ...]],
                     outputs: Sequence[str] | None) -> tuple[dict, dict, list[str]]:
    """``(device input shapes, every tensor's shape, outputs)`` of ``ops``: the device
    inputs are the inputs operators read (one whose readers all take its packed form
    needs no segment of its own); outputs default to the tensors no operator reads."""
    shapes = infer_shapes(ops, input_shapes)
    read = {t for op in ops for t in op.inputs}
    inputs = {k: v for k, v in input_shapes.items() if k in read}
    produced = {op.output for op in ops}
    shapes = {k: v for k, v in shapes.items() if k in inputs or k in produced}
    outs = list(outputs) if outputs is not None else [op.output for op in ops
                                                      if op.output not in read]
    for name in outs:
        if name not in shapes:
            raise CompileError(f"output {name!r} is not a tensor of the program")
    return inputs, shapes, outs


def _tensorize_op(em: Emitter, op: Op, tensors: Mapping[str, TensorInfo], *, threads: int,
                  plan: object, skip_zero_blocks: bool, tuner: SimTuner | None) -> object:
    """Emit ``op`` by its tensorizer; returns the plan used (``None`` for a concatenation:
    its parts' producers stored them in place, see :func:`~.dram.plan_dram`)."""
    res = {t: tensors[t] for t in op.inputs[1:]}
    if isinstance(op, ConvTranspose2d):
        from .convtranspose import tensorize_conv_transpose2d
        return tensorize_conv_transpose2d(em, op, tensors[op.input], tensors[op.output], res,
                                          threads=threads, plan=plan,
                                          skip_zero_blocks=skip_zero_blocks)
    if isinstance(op, (Conv2d, Dense)):
        return tensorize_conv2d(em, op, tensors[op.inputs[0]], tensors[op.output], res,
                                threads=threads, plan=plan,  # type: ignore[arg-type]
                                skip_zero_blocks=skip_zero_blocks, tuner=tuner)
    if isinstance(op, Pool2d):
        from .pool import tensorize_pool2d
        return tensorize_pool2d(em, op, tensors[op.input], tensors[op.output], res,
                                threads=threads, plan=plan)
    if isinstance(op, Concat):
        return None
    if isinstance(op, Eltwise):
        from .eltwise import tensorize_eltwise
        return tensorize_eltwise(em, op, tensors, threads=threads, plan=plan)
    raise CompileError(f"unsupported operator {op!r}")


def _per_operator(bounds: list[tuple[str, int, int]], names: Sequence[str]
                  ) -> list[tuple[str, int, int]]:
    """``bounds`` with the consecutive parts of one operator (a transposed convolution's
    phases, named ``<op>.phase<a><b>``) merged under the operator's name."""
    known = set(names)
    merged: list[tuple[str, int, int]] = []
    for name, first, end in bounds:
        owner = name if name in known else name.rsplit(".phase", 1)[0]
        if merged and name != owner and merged[-1][0] == owner:
            merged[-1] = (owner, merged[-1][1], end)
        else:
            merged.append((owner, first, end))
    return merged


def compile_op(op: Op, input_shapes: Mapping[str, tuple[int, ...]],
               config: HwConfig | str | None = None, **options) -> CompiledProgram:
    """One operator as a program (see :func:`compile_ops`)."""
    return compile_ops([op], input_shapes, config, **options)
