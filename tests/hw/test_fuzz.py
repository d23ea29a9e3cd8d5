"""Differential fuzzing: random valid programs on the simulator and on the RTL (tiny).

A larger run is ``python benchmarks/rtl_agreement.py --fuzz N``.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from tessera.config import PRESETS

from tests.fuzz_programs import FAMILIES, random_program
from tests.programs import assert_device_agrees

TINY = PRESETS["tiny"]


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), family=st.sampled_from(FAMILIES))
def test_random_programs_agree(seed, family):
    program, sim = random_program(TINY, seed, family)
    assert_device_agrees(program, sim, "rtl")
