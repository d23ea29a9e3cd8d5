"""The pruner's yardstick: how far a model's outputs move on calibration data when
weights change, run by onnxruntime on the CPU.

The error of outputs ``Y`` against the unpruned model's ``Y0`` is the relative RMS
``||Y - Y0|| / ||Y0||`` of each output over all calibration samples, averaged over the
model's outputs (so that one output's scale does not drown another's).

Measuring every (layer, sparsity) pair must not build a session per pair: the model is
loaded once with the weights being pruned turned into graph inputs, so each pair is one
set of runs with one weight fed differently.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["WeightSession", "relative_rms", "run_model"]


def _session(model: onnx.ModelProto):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3          # no warnings about initializers listed as inputs
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def relative_rms(outputs: Sequence[list[np.ndarray]],
                 reference: Sequence[list[np.ndarray]]) -> float:
    """The error of ``outputs`` against ``reference``, both ``[sample][output]`` arrays
    (see the module doc)."""
    errors = []
    for k in range(len(reference[0])):
        diff = sum(float(np.sum(np.square(o[k].astype(np.float64) - r[k])))
                   for o, r in zip(outputs, reference))
        norm = sum(float(np.sum(np.square(r[k].astype(np.float64)))) for r in reference)
        errors.append(np.sqrt(diff / norm) if norm > 0 else np.sqrt(diff))
    return float(np.mean(errors))


def run_model(model: onnx.ModelProto,
              feeds: Sequence[Mapping[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """The model's outputs for each feed, by onnxruntime."""
    session = _session(model)
    return [session.run(None, dict(feed)) for feed in feeds]


def _weights_as_inputs(model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers ``names`` are graph inputs instead."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    tensors = [t for t in graph.initializer if t.name in names]
    kept = [t for t in graph.initializer if t.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    listed = {v.name for v in graph.input}       # IR 3 models list initializers as inputs
    for t in tensors:
        if t.name not in listed:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return copy


class WeightSession:
    """One onnxruntime session of ``model`` in which the ``weights`` (``{name: array}``)
    are fed, not stored; :meth:`error` runs the calibration feeds with some replaced."""

    def __init__(self, model: onnx.ModelProto, weights: Mapping[str, np.ndarray],
                 feeds: Sequence[Mapping[str, np.ndarray]]) -> None:
        self.weights = dict(weights)
        self.feeds = [dict(f) for f in feeds]
        self.session = _session(_weights_as_inputs(model, set(self.weights)))
        self.reference = self.outputs({})

    def outputs(self, replaced: Mapping[str, np.ndarray]) -> list[list[np.ndarray]]:
        """The outputs of every feed with the weights ``replaced`` (the others as given)."""
        weights = {**self.weights, **replaced}
        return [self.session.run(None, {**feed, **weights}) for feed in self.feeds]

    def error(self, replaced: Mapping[str, np.ndarray]) -> float:
        """The output error (module doc) with the weights ``replaced``."""
        return relative_rms(self.outputs(replaced), self.reference)


def with_weights(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` with the initializers ``weights`` replaced (same dtype)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for t in copy.graph.initializer:
        if t.name in weights:
            array = np.asarray(weights[t.name], helper.tensor_dtype_to_np_dtype(t.data_type))
            t.CopyFrom(numpy_helper.from_array(array, t.name))
    return copy
