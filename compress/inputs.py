"""What :func:`tessera.compress.prune` is given, checked: the model, its calibration
feeds and the numeric arguments. Every problem is a :class:`CompileError` with the
Python argument and the CLI flag that fix it."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from tessera.compiler.frontend import onnx_import, quantize
from tessera.compiler.frontend.zoo import calibration_data
from tessera.errors import CLI, PYTHON, CompileError

__all__ = ["RANDOM_SAMPLES", "check_fraction", "load_model", "prune_feeds"]

#: Random calibration samples when none are given: the per-layer errors are relative
#: output changes, which a few samples already rank; every sample is one more run per
#: (layer, sparsity) pair.
RANDOM_SAMPLES = 4

_CALIBRATION_FIX = {PYTHON: "pass calibration=[{input name: array}, ...] with one array "
                            "per model input",
                    CLI: "give --calibration FILE.npz with an array per model input"}


def load_model(model: Any) -> onnx.ModelProto:
    """``model`` (a ModelProto, a path or bytes) as a private ModelProto copy
    (:class:`CompileError` for anything that is not an ONNX model)."""
    return onnx_import.load_model(model)[0]


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
    inputs = quantize.model_inputs(model)
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
