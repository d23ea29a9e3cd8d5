"""Static int8 quantization of float ONNX models: :func:`quantize_static`, :func:`is_quantized`.

The compiler's int8 arithmetic is that of onnxruntime's QDQ format, so quantization is
onnxruntime's own. The compiler takes every form onnxruntime writes (:mod:`.qdq`: uint8 or
int8, per tensor or per channel, symmetric or not); the options here are pinned to the
form the accelerator runs best (uint8 activations cost a conversion at a uint8 model
input or output; asymmetric per-tensor weights exceed int8 once their zero point is
subtracted, and those layers run on the CPU):

* activations int8, per-tensor, asymmetric (onnxruntime's default), which lets
  onnxruntime absorb a ReLU into its producer's output range (zero point -128).
  ``symmetric_activations=True`` pins every zero point to 0, but then onnxruntime keeps
  each ReLU as a float op between requantizations;
* weights int8, symmetric (zero point 0), per output channel unless ``per_channel=False``;
* biases int32 (scale = input scale x weight scale, zero point 0);
* BatchNormalization folded into its convolution first (``quant_pre_process``), so the
  weights quantized are the folded ones;
* MinMax calibration over the given input feeds.

ReLU/ReLU6 disappear into their producer's output range, as onnxruntime does by default.
Run the result in onnxruntime with the session config entry ``session.qdqisint8allowed =
1`` so its int8 kernels (not float fallbacks) run.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper
from onnxruntime import quantization as ortq
from onnxruntime.quantization.shape_inference import quant_pre_process

from tessera.errors import CompileError

from . import ort_quantize
from .ort_quantize import Feed, FeedReader
from .graph import Graph

__all__ = ["DYNAMIC_OPS", "QDQ_OPS", "is_quantized", "quantize_static", "reference_session"]

#: The ops a QDQ model marks its quantized tensors with.
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
#: The ops of a dynamically quantized model (quantized at run time, no calibration).
DYNAMIC_OPS = frozenset({"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
                         "DynamicQuantizeLSTM"})


def reference_session(model: onnx.ModelProto):
    """An onnxruntime session of a QDQ ``model`` as the reference runs it: the CPU
    provider, every graph optimisation (its QDQ fusions: QLinearConv, QLinearSigmoid, ...)
    and int8 QDQ kernels allowed. The whole model's reference, the activation tables and
    the calibration histograms all come from sessions made here, so that onnxruntime
    fuses the same way in each."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def quantize_static(model: onnx.ModelProto, calibration: Sequence[Feed], *,
                    per_channel: bool = True,
                    symmetric_activations: bool = False) -> onnx.ModelProto:
    """``model`` quantized to int8 QDQ by onnxruntime, calibrated on ``calibration``.

    ``calibration`` is a non-empty sequence of input feeds (input name -> array with the
    model's shape and dtype, finite); see the module doc for the quantization scheme.
    ``model`` is not modified. Raises :class:`CompileError` naming the sample and input
    when the calibration data is wrong.
    """
    samples = _checked_samples(model, calibration)
    # Pinned: the form the accelerator runs (module doc).
    options = {"ActivationSymmetric": symmetric_activations, "WeightSymmetric": True}
    if _onnx_opset(model) <= 10:
        return quantize_through_files(model, samples, options, per_channel=per_channel)
    folded = ort_quantize.optimize(model)
    _flatten_gemm_biases(folded)
    return ort_quantize.quantize_qdq(folded, samples, options, per_channel=per_channel)


def quantize_through_files(model: onnx.ModelProto, samples: Sequence[Feed], options: dict,
                           *, per_channel: bool) -> onnx.ModelProto:
    """onnxruntime's own file-based ``quant_pre_process`` + ``quantize_static``: for models
    before opset 11 (which pre-processing upgrades through files), and the reference the
    tests hold the in-memory pipeline (:mod:`.ort_quantize`) to, byte for byte."""
    with tempfile.TemporaryDirectory(prefix="tessera-qdq-") as tmp:
        source, folded, quantized = (Path(tmp) / f for f in ("float.onnx", "folded.onnx",
                                                             "qdq.onnx"))
        # Through files: given a ModelProto, quant_pre_process moves its weights out to
        # external data in place, breaking the caller's model. Symbolic shape inference
        # (which needs sympy) is for dynamic shapes; the compiler's are static.
        onnx.save(model, str(source))
        quant_pre_process(str(source), str(folded), skip_symbolic_shape=True)
        pre_processed = onnx.load(str(folded))
        if _flatten_gemm_biases(pre_processed):
            onnx.save(pre_processed, str(folded))
        ortq.quantize_static(str(folded), str(quantized), FeedReader(samples),
                             quant_format=ortq.QuantFormat.QDQ, per_channel=per_channel,
                             activation_type=ortq.QuantType.QInt8,
                             weight_type=ortq.QuantType.QInt8,
                             calibrate_method=ortq.CalibrationMethod.MinMax,
                             extra_options=options)
        return onnx.load(str(quantized))


def _onnx_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _flatten_gemm_biases(model: onnx.ModelProto) -> bool:
    """Rewrite ``model`` so each Gemm's constant bias of shape ``[1, N]`` is ``[N]`` (the
    same values under Gemm's broadcast); True if any changed.

    Why: ``quant_pre_process`` fuses a MatMul and the Add of a ``[1, N]`` constant into
    a Gemm with that 2-D bias (magika's classifier head), and onnxruntime's quantizer
    then fails on it with a bare "truth value of an array ... is ambiguous" while it
    sizes the weight scales per channel for the int32 bias (it indexes the bias by
    channel, expecting 1-D).
    """
    initializers = {t.name: t for t in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    changed = False
    for node in model.graph.node:
        bias = initializers.get(node.input[2]) if (node.op_type == "Gemm"
                                                    and len(node.input) > 2) else None
        if bias is not None and len(bias.dims) == 2 and bias.dims[0] == 1 \
                and readers[bias.name] == 1:
            del bias.dims[0]
            changed = True
    return changed


def is_quantized(graph: Graph) -> bool:
    """True if the graph holds QuantizeLinear or DequantizeLinear nodes (a QDQ model) or
    the integer ops of a dynamically quantized one (onnxruntime's quantize_dynamic)."""
    return any(node.op in QDQ_OPS | DYNAMIC_OPS for node in graph.nodes)


# --------------------------------------------------------------- calibration checks
def _checked_samples(model: onnx.ModelProto, calibration: Sequence[Feed]) -> list[Feed]:
    """The calibration samples as a list; :class:`CompileError` unless every sample feeds
    every model input an array of its shape and dtype with finite values (onnxruntime's
    calibrator would fail later naming neither sample nor input, or calibrate on NaN)."""
    if isinstance(calibration, Mapping):
        raise CompileError("calibration is a single feed; pass a list of feeds "
                           "[{input name: array}, ...]")
    samples = list(calibration)
    if not samples:
        raise CompileError("quantization needs calibration data: a non-empty list of input "
                           "feeds [{input name: array}, ...], e.g. a few hundred real inputs")
    expected = model_inputs(model)
    for index, sample in enumerate(samples):
        _check_sample(index, sample, expected)
    return samples


def model_inputs(model: onnx.ModelProto) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
    """Each model input (not initializer) with its shape (None for a dynamic dim) and dtype."""
    constants = {t.name for t in model.graph.initializer}
    inputs = {}
    for value in model.graph.input:
        if value.name in constants:
            continue
        ttype = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else None
                      for d in ttype.shape.dim)
        inputs[value.name] = shape, np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type))
    return inputs


def _check_sample(index: int, sample: Feed,
                  expected: Mapping[str, tuple[tuple[int | None, ...], np.dtype]]) -> None:
    where = f"calibration sample {index}"
    if not isinstance(sample, Mapping):
        raise CompileError(f"{where} is a {type(sample).__name__}, not a feed {{input name: "
                           f"array}}")
    missing = [name for name in expected if name not in sample]
    if missing:
        raise CompileError(f"{where} lacks input {missing[0]!r}; the model's inputs are "
                           f"{list(expected)}")
    extra = [name for name in sample if name not in expected]
    if extra:
        raise CompileError(f"{where} feeds {extra[0]!r}, which is not an input of the model; "
                           f"its inputs are {list(expected)}")
    for name, (shape, dtype) in expected.items():
        _check_array(f"{where}, input {name!r},", sample[name], shape, dtype)


def _check_array(where: str, array: np.ndarray, shape: tuple[int | None, ...],
                 dtype: np.dtype) -> None:
    if not isinstance(array, np.ndarray):
        raise CompileError(f"{where} is a {type(array).__name__}, not a numpy array")
    model_dims = ["?" if d is None else d for d in shape]
    if len(array.shape) != len(shape) or any(
            d is not None and d != a for d, a in zip(shape, array.shape)):
        raise CompileError(f"{where} has shape {list(array.shape)}, but the model declares "
                           f"{model_dims}")
    if array.dtype != dtype:
        raise CompileError(f"{where} has dtype {array.dtype}, but the model takes {dtype}; "
                           f"convert it with .astype(np.{dtype})")
    if np.issubdtype(dtype, np.floating) and not np.isfinite(array).all():
        bad = int(np.size(array) - np.isfinite(array).sum())
        raise CompileError(f"{where} holds {bad} NaN or infinite values; calibration "
                           f"ranges need finite data")
