"""Checking a compiled model against onnxruntime, the golden reference.

onnxruntime runs the int8 QDQ model with its integer kernels
(``session.qdqisint8allowed=1``); :func:`int8_agreement` compares outputs in quantized
steps of the output's scale (a DequantizeLinear output ``(q - zp) * scale`` differs from
another by ``k * scale`` when the int8 values differ by ``k``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from tessera.errors import CompileError

__all__ = ["Agreement", "int8_agreement", "output_scales", "reference_outputs"]


@dataclass(frozen=True)
class Agreement:
    """How far an output is from the reference, in int8 steps."""

    elements: int
    identical: int
    max_steps: int

    @property
    def fraction(self) -> float:
        return self.identical / self.elements if self.elements else 1.0

    def __str__(self) -> str:
        return (f"{self.identical}/{self.elements} int8 values identical "
                f"({self.fraction:.4%}), largest difference {self.max_steps} step(s)")


def reference_outputs(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]
                      ) -> dict[str, np.ndarray]:
    """onnxruntime's outputs of ``model`` with its int8 QDQ kernels."""
    from ..frontend.quantize import reference_session
    session = reference_session(model)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(inputs))))


def output_scales(model: onnx.ModelProto) -> dict[str, float]:
    """The DequantizeLinear scale of every graph output produced by one."""
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    scales = {}
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in outputs:
            scales[node.output[0]] = float(np.asarray(consts[node.input[1]]).reshape(-1)[0])
    return scales


def int8_agreement(ours: np.ndarray, reference: np.ndarray, scale: float) -> Agreement:
    """Compare two dequantized outputs of one int8 tensor in steps of ``scale``."""
    ours, reference = np.asarray(ours), np.asarray(reference)
    if ours.shape != reference.shape:
        raise CompileError(f"output shapes differ: {ours.shape} vs {reference.shape}")
    steps = np.rint(np.abs(ours.astype(np.float64) - reference.astype(np.float64)) / scale)
    return Agreement(int(steps.size), int((steps == 0).sum()),
                     int(steps.max()) if steps.size else 0)
