"""Compile a published model, run it on the simulator, compare with onnxruntime.

:func:`run_wheel_model` is the one path of the test module and of ``benchmarks/models.py``:
``tessera.compile`` of the whole file as shipped (calibrated on the case's real inputs),
a run on ``sim``, then two comparisons:

* **exactness** against onnxruntime running the same QDQ model
  (``model.compiled.reference``, int8 kernels): an output written by a
  DequantizeLinear is compared in int8 steps of its scale (identical = 0 steps); an
  output written by a float op after the last DequantizeLinear (a softmax, a sigmoid, a
  float LSTM) is compared within :data:`FLOAT_RTOL`;
* the **task**: the case's decoded result against the float model run by onnxruntime.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

import tessera
from tessera.compiler.golden.check import int8_agreement, output_scales, reference_outputs

from .cases import WheelModel

__all__ = ["FLOAT_RTOL", "OutputAgreement", "WheelRun", "run_wheel_model"]

#: Tolerance of an output computed in float32 after the last DequantizeLinear, relative to
#: the output's largest magnitude. Both sides read the same dequantized values; our LLVM
#: kernels (exp, tanh, sums in another order, FMAs) differ from onnxruntime's MLAS ones
#: by a few float32 ulps of the largest term (2^-24 ~ 6e-8 each); 1e-5 of the output's
#: range is ~100 ulps, far below one int8 step of any input (1/256 of its range), so an
#: element outside it means an upstream int8 value differed, which is what is counted.
FLOAT_RTOL = 1e-5


@dataclass(frozen=True)
class OutputAgreement:
    """One output against onnxruntime's on the same QDQ model."""

    name: str
    elements: int
    identical: int
    #: Largest difference: in int8 steps (``int8``) or relative to the range (float).
    largest: float
    int8: bool

    @property
    def fraction(self) -> float:
        return self.identical / self.elements if self.elements else 1.0

    def __str__(self) -> str:
        unit = "step(s)" if self.int8 else "of the range"
        kind = "int8 steps" if self.int8 else f"float, within {FLOAT_RTOL:g} of the range"
        return (f"{self.name}: {self.identical}/{self.elements} identical ({kind}, "
                f"{self.fraction:.4%}), largest difference {self.largest:.3g} {unit}")


@dataclass
class WheelRun:
    """What one compile and run of a published model gave."""

    model: tessera.Model
    compile_seconds: float
    sim_seconds: float
    profile: object
    agreements: list[OutputAgreement]
    task_ok: bool
    task: str

    @property
    def exact_fraction(self) -> float:
        """The fraction of all output elements identical to onnxruntime's."""
        total = sum(a.elements for a in self.agreements)
        return sum(a.identical for a in self.agreements) / total if total else 1.0


def run_wheel_model(case: WheelModel, config: str = "pynq") -> WheelRun:
    """Compile ``case`` for ``config``, run it on ``sim`` and compare (module doc)."""
    feeds = case.feeds()
    started = time.perf_counter()
    model = tessera.compile(str(case.path), config, calibration=feeds.calibration,
                            input_shapes=dict(case.input_shapes))
    compile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    ours, profile = model.run(feeds.check, backend="sim")
    sim_seconds = time.perf_counter() - started
    reference = model.compiled.reference
    expected = reference_outputs(reference, feeds.check)
    scales = output_scales(reference)
    agreements = [_agreement(name, ours[name], expected[name], scales.get(name))
                  for name in expected]
    session = ort.InferenceSession(str(case.path), providers=["CPUExecutionProvider"])
    published = session.run(None, feeds.check)
    names = [o.name for o in session.get_outputs()]
    task_ok, task = case.task(published, [ours[n] for n in names])
    return WheelRun(model, compile_seconds, sim_seconds, profile, agreements, task_ok, task)


def _agreement(name: str, ours: np.ndarray, expected: np.ndarray,
               scale: float | None) -> OutputAgreement:
    if scale is not None:
        a = int8_agreement(ours, expected, scale)
        return OutputAgreement(name, a.elements, a.identical, a.max_steps, True)
    ours, expected = (np.asarray(x, np.float64) for x in (ours, expected))
    assert ours.shape == expected.shape, (name, ours.shape, expected.shape)
    span = float(np.abs(expected).max()) or 1.0
    relative = np.abs(ours - expected) / span
    return OutputAgreement(name, int(relative.size), int((relative <= FLOAT_RTOL).sum()),
                           float(relative.max()) if relative.size else 0.0, False)
