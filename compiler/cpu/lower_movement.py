"""CPU lowerings of the standard ONNX data-movement ops: views (Flatten, Reshape,
Squeeze, Unsqueeze, Identity), Transpose, Pad, Concat, Split, Slice, Gather,
GatherElements, Expand, Tile, DepthToSpace, SpaceToDepth, Resize and Upsample;
:data:`MOVEMENT_LOWERINGS` maps each op type to its lowering (see :mod:`.lower`).

The operands that fix what moves where (pads, starts and ends, repeats, shapes,
scales) must be constants: the kernels are generated for them. Indices may be either:
constant ones are checked and compiled in (or passed as an array), run-time ones must
be int32. Every op takes every kernel dtype, but Resize's linear mode (float32).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tessera.errors import CpuKernelError

from ..cpu import (DTYPES as KERNEL_DTYPES, TensorSpec, build_concat, build_depth_to_space,
                   build_expand, build_gather, build_gather_elements, build_pad, build_resize,
                   build_slice, build_space_to_depth, build_split, build_tile,
                   build_transpose)
from .gather import INDEX_DTYPES, check_gather_elements, index_runs, normalized_indices
from .lower_plan import LowerFn, NodeLowering, Plan, Unsupported, first_input, lower_view, \
    single_step
from .strided import depth_to_space_view, expand_view, slice_view, space_to_depth_view, \
    tile_view

__all__ = ["MOVEMENT_LOWERINGS"]

#: A Gather with constant indices in at most this many runs of consecutive indices has
#: them compiled into its kernel (one copy per run, unrolled); more are passed as an
#: int32 array, read at run time.
GATHER_UNROLL_RUNS = 16


def _checked(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with a builder's CpuKernelError as the planning's Unsupported (so
    :func:`~.lower.cpu_unsupported_reason` sees it without generating IR)."""
    try:
        return fn(*args)
    except CpuKernelError as exc:
        raise Unsupported(str(exc)) from None


def _ints(low: NodeLowering, i: int, what: str, optional: bool = False) -> list[int] | None:
    """The values of constant input ``i`` (the op's ``what``) as ints; None if it is
    ``optional`` and omitted."""
    name = low.node.input(i)
    low.require(bool(name) or optional, f"its {what} input is missing")
    return None if not name else [int(v) for v in low.const(name, what).reshape(-1)]


# ---------------------------------------------------------------- pad, transpose, concat
def _pad(low: NodeLowering) -> list[Plan]:
    x = low.spec(first_input(low))
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
    return single_step(low, build_pad, x, pads, mode, fill, inputs=[first_input(low)])


def _transpose(low: NodeLowering) -> list[Plan]:
    x = low.spec(first_input(low))
    perm = low.attr("perm")
    perm = list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]
    low.require(sorted(perm) == list(range(x.ndim)), f"perm {perm} is not a permutation")
    return single_step(low, build_transpose, x, perm)


def _concat(low: NodeLowering) -> list[Plan]:
    names = [n for n in low.node.inputs if n]
    specs = [low.spec(n) for n in names]
    low.require(len({s.dtype for s in specs}) == 1, "its inputs have different dtypes")
    axis = low.attr("axis")
    low.require(axis is not None and -specs[0].ndim <= axis < specs[0].ndim,
                f"axis {axis} is missing or out of range")
    return single_step(low, build_concat, specs, axis, inputs=names)


def _split(low: NodeLowering) -> list[Plan]:
    """Split by the ``split`` input, or into ``num_outputs`` (opset 18) or as many
    parts as outputs: equal parts, the last smaller when the axis does not divide."""
    x = low.spec(first_input(low))
    axis = int(low.attr("axis", 0))
    low.require(-x.ndim <= axis < x.ndim, f"axis {axis} is out of range for rank {x.ndim}")
    outputs = list(low.node.outputs)
    sizes = _ints(low, 1, "split", optional=True)
    if sizes is None:
        parts = int(low.attr("num_outputs", len(outputs)))
        low.require(parts > 0, f"num_outputs {parts} is not positive")
        n = x.shape[axis]
        chunk = -(-n // parts)
        sizes = [chunk] * (parts - 1) + [n - chunk * (parts - 1)]
    low.require(len(sizes) == len(outputs), f"split {sizes} gives {len(sizes)} parts for "
                f"{len(outputs)} outputs")
    low.require(min(sizes) >= 0 and sum(sizes) == x.shape[axis], f"split {sizes} must be "
                f"non-negative and sum to the size {x.shape[axis]} of axis {axis}")
    if len(outputs) == 1:
        return lower_view(low)
    return single_step(low, build_split, x, axis, sizes, inputs=[first_input(low)])


# ------------------------------------------------------------------ strided views
def _slice(low: NodeLowering) -> list[Plan]:
    x = low.spec(first_input(low))
    starts, ends = _ints(low, 1, "starts"), _ints(low, 2, "ends")
    axes, steps = _ints(low, 3, "axes", True), _ints(low, 4, "steps", True)
    _checked(slice_view, x.shape, starts, ends, axes, steps)
    return single_step(low, build_slice, x, starts, ends, axes, steps,
                       inputs=[first_input(low)])


def _expand(low: NodeLowering) -> list[Plan]:
    x = low.spec(first_input(low))
    shape = _ints(low, 1, "shape")
    if _checked(expand_view, x.shape, shape).shape == x.shape:
        return lower_view(low)
    return single_step(low, build_expand, x, shape, inputs=[first_input(low)])


def _tile(low: NodeLowering) -> list[Plan]:
    x = low.spec(first_input(low))
    repeats = _ints(low, 1, "repeats")
    _checked(tile_view, x.shape, repeats)
    if all(r == 1 for r in repeats):
        return lower_view(low)
    return single_step(low, build_tile, x, repeats, inputs=[first_input(low)])


def _depth_to_space(low: NodeLowering) -> list[Plan]:
    low.rank4(first_input(low))
    x = low.spec(first_input(low))
    blocksize, mode = int(low.attr("blocksize", 0)), low.attr("mode", "DCR")
    _checked(depth_to_space_view, x.shape, blocksize, mode)
    return single_step(low, build_depth_to_space, x, blocksize, mode)


def _space_to_depth(low: NodeLowering) -> list[Plan]:
    low.rank4(first_input(low))
    x = low.spec(first_input(low))
    blocksize = int(low.attr("blocksize", 0))
    _checked(space_to_depth_view, x.shape, blocksize)
    return single_step(low, build_space_to_depth, x, blocksize)


# -------------------------------------------------------------------------- gathers
def _gather(low: NodeLowering) -> list[Plan]:
    """Constant indices in a few runs are compiled into the kernel; other constant
    indices are passed as an int32 array, run-time ones as they are (int32)."""
    data, axis = low.spec(first_input(low)), int(low.attr("axis", 0))
    low.require(-data.ndim <= axis < data.ndim,
                f"axis {axis} is out of range for rank {data.ndim}")
    indices = _constant_indices(low, data.shape[axis])
    if indices is not None and len(index_runs(indices)) <= GATHER_UNROLL_RUNS:
        return single_step(low, build_gather, data, indices, axis, inputs=[first_input(low)])
    return _with_index_input(low, build_gather, data, indices, axis)


def _gather_elements(low: NodeLowering) -> list[Plan]:
    data, axis = low.spec(first_input(low)), int(low.attr("axis", 0))
    low.require(-data.ndim <= axis < data.ndim,
                f"axis {axis} is out of range for rank {data.ndim}")
    index_shape = low.value(low.node.input(1)).shape
    _checked(check_gather_elements, data, TensorSpec(index_shape, "int32"), axis)
    return _with_index_input(low, build_gather_elements, data,
                             _constant_indices(low, data.shape[axis]), axis)


def _constant_indices(low: NodeLowering, n: int) -> np.ndarray | None:
    """The node's indices (input 1) normalised into ``[0, n)`` if they are a constant."""
    data = low.graph.const(low.node.input(1))
    return None if data is None else _checked(normalized_indices, data, n, low.node.op)


def _with_index_input(low: NodeLowering, builder: Callable[..., Any], data: TensorSpec,
                      indices: np.ndarray | None, axis: int) -> list[Plan]:
    """One step reading the indices as an int32 input: the graph's tensor, or the
    normalised constant ``indices`` passed as an array."""
    if indices is None:
        name = low.node.input(1)
        spec = low.spec(name, INDEX_DTYPES)
        return single_step(low, builder, data, spec, axis)
    name = low.tmp("indices")
    array = indices.astype(np.int32)
    [plan] = single_step(low, builder, data, TensorSpec(array.shape, "int32"), axis,
                         inputs=[first_input(low)])
    plan.inputs += (name,)
    plan.constants[name] = array
    return [plan]


# --------------------------------------------------------------------------- resize
_RESIZE_COORDS = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
_RESIZE_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize(low: NodeLowering) -> list[Plan]:
    low.rank4(first_input(low))
    mode = low.attr("mode", "nearest")
    coords = low.attr("coordinate_transformation_mode", "half_pixel")
    nearest = low.attr("nearest_mode", "round_prefer_floor")
    low.require(coords in _RESIZE_COORDS, f"coordinate_transformation_mode {coords!r} is not "
                f"supported ({', '.join(_RESIZE_COORDS)})")
    low.require(nearest in _RESIZE_NEAREST, f"nearest_mode {nearest!r} is not supported")
    scales = low.optional_const(2, "scales")
    sizes = low.optional_const(3, "sizes")
    low.require((scales is None) != (sizes is None), "give exactly one of scales and sizes")
    return _resize_step(low, mode, None if scales is None else scales.reshape(-1).tolist(),
                        None if sizes is None else sizes.reshape(-1).tolist(), coords,
                        nearest)


def _upsample(low: NodeLowering) -> list[Plan]:
    """Upsample (opsets 7 to 9) is Resize with its scales, asymmetric coordinates and
    the nearest pixel below (onnxruntime's)."""
    low.rank4(first_input(low))
    scales = low.attr("scales")
    if low.node.input(1):
        scales = low.const(low.node.input(1), "scales").reshape(-1).tolist()
    low.require(scales is not None, "it has no scales")
    return _resize_step(low, low.attr("mode", "nearest"), [float(s) for s in scales], None,
                        "asymmetric", "floor")


def _resize_step(low: NodeLowering, mode: str, scales: list[float] | None,
                 sizes: list[int] | None, coords: str, nearest: str) -> list[Plan]:
    """The Resize kernel of H and W for ``scales`` or ``sizes`` (4 values each)."""
    low.require(mode in ("nearest", "linear"), f"mode {mode!r} is not supported (nearest, "
                "linear)")
    x = low.spec(first_input(low), ("float32",) if mode == "linear" else KERNEL_DTYPES)
    given = scales if sizes is None else sizes
    keep = [1.0, 1.0] if sizes is None else list(x.shape[:2])
    low.require(len(given) == 4 and given[:2] == keep,
                f"{'scales' if sizes is None else 'sizes'} {given} must have 4 "
                "values keeping N and C (only H and W are resized)")
    return single_step(low, build_resize, x, scales, sizes, mode, coords, nearest,
                       inputs=[first_input(low)])


# ---------------------------------------------------------------------- dispatch table
#: op type -> lowering.
MOVEMENT_LOWERINGS: dict[str, LowerFn] = {
    **{op: lower_view for op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")},
    "Transpose": _transpose,
    "Pad": _pad,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Expand": _expand,
    "Tile": _tile,
    "DepthToSpace": _depth_to_space,
    "SpaceToDepth": _space_to_depth,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "Resize": _resize,
    "Upsample": _upsample,
}
