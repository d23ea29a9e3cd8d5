"""onnxruntime's static QDQ quantization, run in memory.

``quant_pre_process`` followed by ``quantize_static`` passes the model through files at
every step: ResNet-18 (46 MB of weights) wrote about 340 MB of temporary files per
quantization -- the caller's copy, the optimizer's output, two shape-inferred copies, the
pre-processed model, a shape-inferred copy of it, the calibration model with its
ReduceMin/ReduceMax outputs and the result. This module runs the same steps, with the same
onnxruntime objects, on ``ModelProto``s held in memory; the one file left is the output
of onnxruntime's graph optimizer, which its Python API can only write to a path.

The steps follow onnxruntime 1.31's ``quant_pre_process(skip_symbolic_shape=True)`` and
``quantize_static(quant_format=QDQ, calibrate_method=MinMax)`` line for line for the
options :func:`~.quantize.quantize_static` pins; ``tests/compiler/frontend`` checks the
result is byte for byte the model the file-based pipeline writes. Models older than opset
11 (whose pre-processing upgrades them through further files) take the file-based path.
"""
from __future__ import annotations

import copy
import io
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnxruntime import quantization as ortq
from onnxruntime.quantization.calibrate import MinMaxCalibrater, TensorsData
from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
from onnxruntime.quantization.quant_utils import (add_infer_metadata, add_pre_process_metadata,
                                                  update_opset_version)
from onnxruntime.quantization.quantize import check_static_quant_arguments
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

__all__ = ["Feed", "FeedReader", "optimize", "quantize_qdq"]

Feed = Mapping[str, np.ndarray]


def optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """``quant_pre_process(model, skip_symbolic_shape=True)`` without its files but one:
    onnxruntime's basic graph optimizations (BatchNormalization folded into convolutions,
    constants folded), ONNX shape inference and the pre-processing mark."""
    import onnxruntime as ort
    with tempfile.TemporaryDirectory(prefix="tessera-opt-") as tmp:
        path = str(Path(tmp) / "optimized.onnx")
        options = ort.SessionOptions()
        options.optimized_model_filepath = path
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        ort.InferenceSession(model.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        optimized = onnx.load(path)
    optimized = onnx.shape_inference.infer_shapes(optimized)
    add_pre_process_metadata(optimized)
    return optimized


def quantize_qdq(model: onnx.ModelProto, calibration: Sequence[Feed],
                 extra_options: dict, *, per_channel: bool) -> onnx.ModelProto:
    """``quantize_static`` of a pre-processed ``model`` to int8 QDQ with MinMax calibration
    on ``calibration`` (``extra_options`` as onnxruntime takes them), in memory."""
    activation = weight = ortq.QuantType.QInt8
    check_static_quant_arguments(ortq.QuantFormat.QDQ, activation, weight)
    op_types = list(set(QLinearOpsRegistry) | set(QDQRegistry))
    shaped = _with_shapes(model)
    updated = update_opset_version(shaped, weight, activation, tensor_quant_overrides=None,
                                   block_size=0)
    # The calibrator reads the model again (the updated one if the opset changed).
    ranges = _calibrate(updated if updated is not shaped else model, op_types, calibration)
    quantizer = QDQQuantizer(updated, per_channel, False, weight, activation, ranges, [], [],
                             op_types, extra_options)
    quantizer.quantize_model()
    quantizer.model.topological_sort()
    # The file-based pipeline reads its result back from disk: the same proto, normalised.
    return onnx.load_from_string(quantizer.model.model.SerializeToString())


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``load_model_with_shape_infer`` on a model in memory."""
    inferred = onnx.shape_inference.infer_shapes(model)
    add_infer_metadata(inferred)
    return inferred


def _calibrate(model: onnx.ModelProto, op_types: list[str],
               calibration: Sequence[Feed]) -> TensorsData:
    calibrator = _MemoryMinMax(_with_shapes(copy.deepcopy(model)), op_types)
    calibrator.augment_graph()
    calibrator.create_inference_session()
    calibrator.collect_data(FeedReader(calibration))
    return calibrator.compute_data()


class _MemoryMinMax(MinMaxCalibrater):
    """onnxruntime's MinMax calibrator (default settings) on a shape-inferred model in
    memory: its model with the ReduceMin/ReduceMax outputs goes to a byte buffer, and the
    session is made from those bytes."""

    def __init__(self, model: onnx.ModelProto, op_types: list[str]) -> None:
        # MinMaxCalibrater.__init__ loads (and shape-infers) the model through a file; these
        # are the attributes it and CalibraterBase set, with create_calibrator's defaults.
        self.model = model
        self.op_types_to_calibrate = op_types
        self.augmented_model_path = io.BytesIO()    # onnx.save writes to a buffer too
        self.symmetric = False
        self.use_external_data_format = False
        self.per_channel = False
        self.augment_model = None
        self.infer_session = None
        self.execution_providers = ["CPUExecutionProvider"]
        self.intermediate_outputs = []
        self.calibrate_tensors_range = None
        self.num_model_outputs = len(model.graph.output)
        self.model_original_outputs = {output.name for output in model.graph.output}
        self.moving_average = False
        self.averaging_constant = 0.01
        self.max_intermediate_outputs = None

    def create_inference_session(self) -> None:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.infer_session = ort.InferenceSession(self.augmented_model_path.getvalue(),
                                                  sess_options=options,
                                                  providers=self.execution_providers)


class FeedReader(ortq.CalibrationDataReader):
    """onnxruntime's calibration reader over a list of input feeds."""

    def __init__(self, feeds: Sequence[Feed]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        feed = next(self._feeds, None)
        return None if feed is None else dict(feed)
