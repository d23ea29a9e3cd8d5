"""What :func:`tessera.compress.prune` is given, checked: the model, its calibration
feeds and the numeric arguments. Every problem is a :class:`CompileError` with the
Python argument and the CLI flag that fix it."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from tessera.compiler.frontend.zoo import calibration_data
from tessera.errors import CLI, PYTHON, CompileError

__all__ = ["RANDOM_SAMPLES", "check_fraction", "load_model", "model_inputs", "prune_feeds"]

#: Random calibration samples when none are given: the per-layer errors are relative
#: output changes, which a few samples already rank; every sample is one more run per
#: (layer, sparsity) pair.
RANDOM_SAMPLES = 4

_CALIBRATION_FIX = {PYTHON: "pass calibration=[{input name: array}, ...] with one array "
                            "per model input",
                    CLI: "give --calibration FILE.npz with an array per model input"}


def load_model(model: Any) -> onnx.ModelProto:
    """``model`` as a ModelProto (from a path, or as given)."""
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, Path)):
        raise CompileError(f"model must be an onnx.ModelProto or a path, not "
                           f"{type(model).__name__}")
    path = Path(model)
    if not path.is_file():
        raise CompileError(f"model file {str(path)!r} does not exist")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001  (protobuf raises several unrelated types)
        raise CompileError(f"{str(path)!r} is not an ONNX model: {exc}") from None
    if not proto.HasField("graph"):
        raise CompileError(f"{str(path)!r} is empty or not an ONNX model (it has no graph)")
    return proto


def check_fraction(value: float | None, argument: str, flag: str, *,
                   upper: float | None) -> float | None:
    """``value`` as a float in ``[0, upper)`` (no upper bound when ``upper`` is None)."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise CompileError(f"{argument}={value!r} is not a number") from None
    if math.isnan(value) or value < 0 or (upper is not None and value >= upper):
        allowed = f"in [0, {upper:g})" if upper is not None else ">= 0"
        raise CompileError(f"{argument}={value:g} is not {allowed}",
                           fix={PYTHON: f"pass {argument}= a number {allowed}",
                                CLI: f"give {flag} a number {allowed}"})
    return value


def model_inputs(model: onnx.ModelProto) -> dict[str, tuple[list[int | None], np.dtype]]:
    """``{input name: (dims, None where dynamic; dtype)}`` of the model's real inputs (not
    the initializers old models list as inputs too)."""
    weights = {t.name for t in model.graph.initializer}
    inputs = {}
    for v in model.graph.input:
        if v.name in weights:
            continue
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        inputs[v.name] = (dims, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)))
    return inputs


def _check_feed(i: int, feed: Any, inputs: dict) -> dict[str, np.ndarray]:
    """Calibration sample ``i`` as ``{input: array of the input's dtype}``."""
    if not isinstance(feed, Mapping):
        raise CompileError(f"calibration sample {i} is a {type(feed).__name__}, not a "
                           "{input name: array} dict", fix=_CALIBRATION_FIX)
    if set(feed) != set(inputs):
        missing, extra = sorted(set(inputs) - set(feed)), sorted(set(feed) - set(inputs))
        raise CompileError(f"calibration sample {i} has inputs {sorted(feed)}, the model "
                           f"{sorted(inputs)}" + (f" (missing {missing})" if missing else "")
                           + (f" (not inputs: {extra})" if extra else ""), fix=_CALIBRATION_FIX)
    checked = {}
    for name, (dims, dtype) in inputs.items():
        array = np.asarray(feed[name])
        if array.dtype.kind != dtype.kind:
            raise CompileError(f"calibration sample {i}: input {name!r} is {array.dtype}, "
                               f"the model takes {dtype}", fix=_CALIBRATION_FIX)
        if array.ndim != len(dims) or any(d and d != s for d, s in zip(dims, array.shape)):
            shape = ["?" if d is None else d for d in dims]
            raise CompileError(f"calibration sample {i}: input {name!r} has shape "
                               f"{list(array.shape)}, the model takes {shape}",
                               fix=_CALIBRATION_FIX)
        checked[name] = array.astype(dtype, copy=False)
    return checked


def prune_feeds(model: onnx.ModelProto, calibration: Sequence[Mapping[str, Any]] | None
                ) -> tuple[list[dict[str, np.ndarray]], bool]:
    """The calibration feeds, checked against the model's inputs, and whether they are
    random (``calibration`` None: :data:`RANDOM_SAMPLES` seeded standard normal feeds)."""
    inputs = model_inputs(model)
    if calibration is None:
        try:
            feeds = calibration_data(model, RANDOM_SAMPLES, seed=0)
        except CompileError as exc:
            raise CompileError(f"no calibration given and random samples cannot be made: "
                               f"{exc.args[0]}", fix=_CALIBRATION_FIX) from None
        return feeds, True
    if isinstance(calibration, Mapping) or not isinstance(calibration, Sequence):
        raise CompileError("calibration must be a list of {input name: array} feeds, not a "
                           f"{type(calibration).__name__}", fix=_CALIBRATION_FIX)
    if not calibration:
        raise CompileError("calibration is an empty list", fix=_CALIBRATION_FIX)
    return [_check_feed(i, feed, inputs) for i, feed in enumerate(calibration)], False
