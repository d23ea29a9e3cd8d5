"""The simulator as the tiling search's cost model: where the model's estimate is off by
more than the margin, the simulated candidates decide, the program is the one simulated,
and its outputs stay exact."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler import compile_ops
from tessera.compiler.accel.simtune import SimTuner
from tessera.compiler.golden.operators import run_reference
from tessera.errors import CLI, CompileError

from tests.compiler.accel.test_residual_tiling import _resnet_tail
from tests.compiler.helpers import PYNQ


def _compile(tuner: SimTuner | None):
    op, feeds, _, _ = _resnet_tail(1, c=32, hw=14)
    compiled = compile_ops([op], {k: v.shape for k, v in feeds.items()}, PYNQ, tuner=tuner)
    out, result = compiled.run(feeds)
    np.testing.assert_array_equal(out["y"], run_reference([op], feeds, 8)["y"])
    return compiled, result.stats.cycles


def test_when_the_model_is_off_the_fastest_simulated_tiling_is_taken():
    _, model_cycles = _compile(None)
    strict = SimTuner(margin=0.0)         # any error at all: simulate every candidate
    compiled, cycles = _compile(strict)
    (record,) = strict.records
    assert record.tried == strict.candidates and record.simulated == model_cycles
    assert cycles == record.chosen <= record.simulated      # the program is what was simulated
    assert compiled.plans["c"] == record.taken
    assert record.changed == (record.taken != record.first) == (cycles < model_cycles)


def test_within_the_margin_the_model_choice_stands_after_one_simulation():
    _, model_cycles = _compile(None)
    lax = SimTuner(margin=1.0)
    _, cycles = _compile(lax)
    (record,) = lax.records
    assert record.tried == 1 and cycles == record.chosen == record.simulated == model_cycles
    assert lax.summary() == {"margin": 1.0, "layers": 1, "disagreed": 0, "changed": 0,
                             "model_cycles": model_cycles, "tuned_cycles": model_cycles}


def test_compile_model_reports_its_tuning_and_refuses_an_unknown_tuner():
    import tessera
    from tessera.compiler.frontend import zoo
    model = zoo.lenet()
    compiled = tessera.compile(model, "pynq", calibration=zoo.calibration_data(model, 2),
                               tune="sim")
    tuning = compiled.compiled.stats["tuning"]
    assert tuning["layers"] >= 3 and 0 <= tuning["changed"] <= tuning["disagreed"] <= \
        tuning["layers"] and tuning["tuned_cycles"] <= tuning["model_cycles"]
    with pytest.raises(CompileError, match="tune must be") as info:
        tessera.compile(model, "pynq", calibration=zoo.calibration_data(model, 2),
                        tune="fast")
    assert "--tune sim" in info.value.describe(CLI)


def test_the_interfaces_state_the_margin_the_tuner_uses():
    """``--tune``'s help and ``tessera.compile``'s docstring say the margin; the core
    cannot import the compiler, so they restate :data:`MARGIN` and this keeps them true."""
    import argparse

    import tessera
    from tessera.cli_output import tune_arg
    from tessera.compiler.accel.simtune import MARGIN
    p = argparse.ArgumentParser()
    tune_arg(p)
    said = f"{MARGIN:.0%}"
    assert said in p.format_help() and said in " ".join(tessera.compile.__doc__.split())
