"""A pruned model end to end: tessera.compress.prune, tessera.compile, the placement
report's density column, and the same int8 results with and without skipping zero
blocks (and as onnxruntime's)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import tessera
from tessera.cli import main as cli_main
from tessera.compiler import zoo
from tessera.compiler.golden.check import int8_agreement, output_scales, reference_outputs
from tessera.compress import prune


@pytest.fixture(scope="module")
def pruned_small_resnet():
    model = zoo.small_resnet()
    calibration = zoo.calibration_data(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = prune(model, sparsity=0.75, strategy="uniform", calibration=calibration)
    return result.model, calibration


def _run(model, calibration, **options):
    m = tessera.compile(model, "pynq", calibration=calibration, **options)
    feed = zoo.calibration_data(model, 1, seed=7)[0]
    outputs, profile = m.run(feed)
    return m, feed, outputs, profile


def test_a_pruned_model_skips_its_zero_blocks_with_the_same_results(pruned_small_resnet):
    model, calibration = pruned_small_resnet
    sparse, feed, y_sparse, p_sparse = _run(model, calibration)
    dense, _, y_dense, p_dense = _run(model, calibration, skip_zero_blocks=False)
    for name in y_sparse:
        np.testing.assert_array_equal(y_sparse[name], y_dense[name])
    reference = reference_outputs(sparse.compiled.reference, feed)
    scales = output_scales(sparse.compiled.reference)
    for name, ours in y_sparse.items():
        agree = int8_agreement(ours, reference[name], scales[name])
        assert agree.fraction >= 0.999 and agree.max_steps <= 1, (name, str(agree))
    # A narrow model: its epilogues, which do not shrink, weigh much in its cycles.
    assert p_sparse.accel_cycles < 0.85 * p_dense.accel_cycles
    gemm = [sum(layer.gemm_ops for layer in p.layers) for p in (p_sparse, p_dense)]
    assert gemm[0] < 0.35 * gemm[1]
    densities = [p.density for p in sparse.compiled.placements if p.density is not None]
    assert densities and all(d <= 0.3 for d in densities)
    # The placement report shows each weighted node's density.
    conv = next(p for p in sparse.compiled.placements if p.op == "QConv")
    line = next(row for row in sparse.summary().splitlines() if row.startswith(conv.node))
    assert f"{conv.density:.0%}" in line and "density" in sparse.summary().splitlines()[0]


def test_cli_compiles_densely_on_request(pruned_small_resnet, tmp_path, capsys):
    import onnx
    model, calibration = pruned_small_resnet
    path = tmp_path / "pruned.onnx"
    onnx.save(model, path)
    sizes = {}
    for flags in ([], ["--dense-weights"]):
        out = tmp_path / f"m{len(flags)}.tsr"
        assert cli_main(["compile", str(path), "--random-calibration", "2", "-o", str(out),
                         *flags]) == 0
        sizes[bool(flags)] = out.stat().st_size
    assert "density" in capsys.readouterr().out
    assert sizes[False] < sizes[True]          # the zero blocks are not stored
