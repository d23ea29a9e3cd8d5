"""Differential fuzzing: random valid programs on the simulator and on the RTL (tiny).

A larger run is ``python benchmarks/rtl_agreement.py --fuzz N``.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from tessera.config import PRESETS

from tests.fuzz_programs import FAMILIES, random_program
from tests.programs import TINY_2LOAD, assert_device_agrees

TINY = PRESETS["tiny"]

@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), family=st.sampled_from(FAMILIES))
def test_random_programs_agree(seed, family):
    program, sim = random_program(TINY, seed, family)
    assert_device_agrees(program, sim, "rtl")


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), family=st.sampled_from(FAMILIES))
def test_random_programs_agree_with_two_load_ports(seed, family):
    """A LOAD split over two ports: the RTL's DRAM bit-identical and its cycles equal to the
    simulator's (uncontended, the tolerance does not apply)."""
    program, sim = random_program(TINY_2LOAD, seed, family)
    assert not sim.stats.dram_contended
    assert_device_agrees(program, sim, "rtl")
