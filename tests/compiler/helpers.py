"""Shared helpers of the compiler tests: compile, verify every pass, simulate."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, settings

from tessera.compiler import compile_ops, verify_dram_plan, verify_program
from tessera.compiler.accel.roofline import op_roofline
from tessera.config import PRESETS

TINY = PRESETS["tiny"]
PYNQ = PRESETS["pynq"]

#: Hypothesis settings of the random-shape tests (simulations are a few ms each). CI runs a
#: fixed set of 40 examples; TESSERA_EXAMPLES=N runs N fresh random ones (bug hunting).
_EXAMPLES = os.environ.get("TESSERA_EXAMPLES")
FEW = settings(max_examples=int(_EXAMPLES or 40), deadline=None, derandomize=not _EXAMPLES,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def compile_and_run(ops, inputs: dict, config, **options):
    """Compile, check the token verifier and the DRAM plan's verifier, simulate; a single
    operator must take at least its roofline bound (the bound is a lower bound).

    Returns (outputs by name, SimResult, CompiledProgram).
    """
    shapes = {k: np.asarray(v).shape for k, v in inputs.items()}
    compiled = compile_ops(ops, shapes, config, **options)
    verify_program(compiled.program)
    verify_dram_plan(compiled.dram, {k: t.layout.shape for k, t in compiled.tensors.items()},
                     compiled.config)
    outputs, result = compiled.run(inputs)
    assert result.stats.leftover_tokens == {}
    if len(ops) == 1:
        bound = op_roofline(ops[0], shapes.__getitem__, config).bound
        assert result.stats.cycles >= bound, (ops[0].name, result.stats.cycles, bound)
    return outputs, result, compiled

