"""QDQ models as onnxruntime's own quantizer writes them, in each of its forms, and
onnxruntime sessions that run them with its int8 kernels: the references of the QDQ
fusion, uint8 and pooling tests."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization as ortq
from onnxruntime.quantization.shape_inference import quant_pre_process

Feed = dict[str, np.ndarray]

#: (name, onnxruntime quantize_static keywords): the forms of its QDQ output. "default"
#: is quantize_static with nothing set (int8, per tensor: scale [1] with zero point []);
#: per-tensor asymmetric weights span up to 255 steps either side of their zero point
#: (int16 once centred), per-channel ones are symmetric (uint8: zero point 128).
FORMS = {
    "default": {},
    "u8-activations-per-channel": dict(activation_type=ortq.QuantType.QUInt8,
                                       per_channel=True),
    "asymmetric-weights": dict(extra_options={"WeightSymmetric": False}),
    "u8-weights": dict(activation_type=ortq.QuantType.QUInt8,
                       weight_type=ortq.QuantType.QUInt8),
    "u8-weights-per-channel": dict(activation_type=ortq.QuantType.QUInt8,
                                   weight_type=ortq.QuantType.QUInt8, per_channel=True),
}


class _Reader(ortq.CalibrationDataReader):
    def __init__(self, feeds: Sequence[Feed]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self._feeds, None)


def ort_quantize(model: onnx.ModelProto, calibration: Sequence[Feed], *,
                 pre_process: bool = True, **options) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime's ``quantize_static`` (QDQ) with ``options``,
    after its ``quant_pre_process`` (BN folding) unless ``pre_process`` is False."""
    with tempfile.TemporaryDirectory() as tmp:
        source, folded, out = (str(Path(tmp) / f) for f in ("a.onnx", "b.onnx", "c.onnx"))
        onnx.save(model, source)
        if pre_process:
            quant_pre_process(source, folded, skip_symbolic_shape=True)
        else:
            folded = source
        ortq.quantize_static(folded, out, _Reader(calibration), **options)
        return onnx.load(out)


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime at its default optimization level, with its int8 QDQ kernels."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def exposed(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """``model`` with the tensors ``names`` as extra outputs."""
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {v.name: v for v in inferred.graph.value_info}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.extend(infos[name] for name in names)
    return out


def pool_net(seed: int = 0) -> onnx.ModelProto:
    """A float CNN with every op the QDQ fusion takes: padded Conv + Relu, MaxPool, a
    residual Add, AveragePool, a 1x1 Conv, GlobalAveragePool, Flatten, Gemm."""
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:]))).astype(
            np.float32)
    consts = {"w1": weight(8, 3, 3, 3), "b1": weight(8) * 0.1, "w2": weight(8, 8, 3, 3),
              "b2": weight(8) * 0.1, "w3": weight(16, 8, 1, 1), "b3": weight(16) * 0.1,
              "wf": weight(10, 16), "bf": weight(10) * 0.1}
    make = helper.make_node
    nodes = [make("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             make("Relu", ["c1"], ["r1"], name="relu1"),
             make("MaxPool", ["r1"], ["m1"], kernel_shape=[2, 2], strides=[2, 2],
                  name="maxpool"),
             make("Conv", ["m1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             make("Relu", ["c2"], ["r2"], name="relu2"),
             make("Add", ["r2", "m1"], ["s"], name="add"),
             make("AveragePool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                  name="avgpool"),
             make("Conv", ["p", "w3", "b3"], ["c3"], name="conv3"),
             make("GlobalAveragePool", ["c3"], ["g"], name="gap"),
             make("Flatten", ["g"], ["f"], name="flatten"),
             make("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(
        nodes, "pool_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def feeds(model: onnx.ModelProto, n: int, seed: int = 0) -> list[Feed]:
    """``n`` standard normal feeds for the model's float inputs."""
    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in model.graph.input}
    return [{k: rng.standard_normal(v, dtype=np.float32) for k, v in shapes.items()}
            for _ in range(n)]


def every_pair(dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of 8-bit values of ``dtype`` as two ``(1, 65536)`` operand rows."""
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1).astype(dtype)
    a, b = np.meshgrid(values, values, indexing="ij")
    return a.reshape(1, -1).copy(), b.reshape(1, -1).copy()


def random_binary_params(rng: np.random.Generator, dtype) -> tuple:
    """Random ``(a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)`` of a quantized binary op."""
    info = np.iinfo(dtype)
    scales = [float(np.float32(rng.uniform(0.001, 0.1))) for _ in range(3)]
    zps = [int(rng.integers(info.min, info.max + 1)) for _ in range(3)]
    return scales[0], zps[0], scales[1], zps[1], scales[2], zps[2]


def qlinear_binary_model(op: str, params: tuple, dtype, a_shape: Sequence[int],
                         b_shape: Sequence[int]) -> onnx.ModelProto:
    """A model of one com.microsoft ``op`` (QLinearAdd, QLinearMul) of inputs ``a`` and
    ``b`` with ``params`` = ``(a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)``."""
    sa, za, sb, zb, sy, zy = params
    values = [("sa", sa, np.float32), ("za", za, dtype), ("sb", sb, np.float32),
              ("zb", zb, dtype), ("sy", sy, np.float32), ("zy", zy, dtype)]
    inits = [numpy_helper.from_array(np.array(v, t), n) for n, v, t in values]
    node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"],
                            domain="com.microsoft")
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("a", t, a_shape),
                     helper.make_tensor_value_info("b", t, b_shape)],
        [helper.make_tensor_value_info("y", t, a_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])
