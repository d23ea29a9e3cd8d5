"""Recursive models on every Device API backend: ``sim``, ``rtl`` (Verilator, ``tiny``)
and ``pynq`` (the driver on the simulated board, RTL-backed). Each run is bit-identical
to the int8 numpy reference, and each launch takes the cycles the simulator counts for
the same program (run directly with ``tessera.sim.simulate``, not through the device):
exactly, or within the suite's contention tolerance when DRAM transfers shared the bus
(the simulator and the RTL arbitrate concurrent transfers a cycle apart).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.config import PRESETS
from tessera.recursive import reference_int8, run
from tessera.runtime import open_device
from tessera.sim import simulate

from tests.programs import CONTENTION_TOLERANCE
from tests.recursive.test_models import (CASES, assert_matches_reference, compiled,
                                         int8_inputs, random_cell_model)
from tests.recursive.test_quantize import random_cells
from tests.rtl import open_backend

TINY = PRESETS["tiny"]


@pytest.fixture(scope="module", params=["sim", "rtl", "pynq"])
def device(request):
    dev = open_backend(request.param, TINY)
    yield dev
    dev.close()


@pytest.fixture(scope="module")
def rtl_device():
    dev = open_device("rtl", TINY)
    yield dev
    dev.close()


@pytest.fixture
def dev(device):
    """The module's device, powered up afresh, with no buffers left from the last test
    (the models' resident segments included)."""
    device.reset()
    for buf in device.buffers:
        buf.free()
    return device


def simulator_cycles(model, lin, launches: str) -> list[tuple[int, bool]]:
    """Each launch's program run on the simulator directly: (cycles, DRAM contended)."""
    programs, _ = model.programs(lin, int8_inputs(model), launches)
    return [(r.stats.cycles, r.stats.dram_contended) for r in map(simulate, programs)]


def assert_same_cycles(got: list[int], expected: list[tuple[int, bool]], backend: str) -> None:
    assert len(got) == len(expected)
    for k, (cycles, (sim_cycles, contended)) in enumerate(zip(got, expected)):
        if contended and backend != "sim":
            assert abs(cycles - sim_cycles) <= CONTENTION_TOLERANCE * sim_cycles, \
                (k, cycles, sim_cycles)
        else:
            assert cycles == sim_cycles, f"launch {k}: {backend} {cycles}, simulator {sim_cycles}"


#: The issue's acceptance list, one launch per batch; the baseline of a launch per batch
#: of nodes (state kept in device memory between launches) on two of them.
RUNS = [(name, "tree") for name in ("TreeFC", "TreeGRU", "TreeLSTM", "MV-RNN", "DAG-RNN",
                                    "TreeFC-unary")] + [("TreeLSTM", "batch"), ("DAG-RNN", "batch")]


@pytest.mark.parametrize("name,launches", RUNS, ids=[f"{n}-{how}" for n, how in RUNS])
def test_runs_are_bit_identical_and_take_the_simulators_cycles(device, name, launches):
    model = compiled(name, 8)
    result = run(model, CASES[name][1], device=device, launches=launches)
    assert_matches_reference(model, result)
    if launches == "tree":
        assert result.launches == 1
    assert_same_cycles(result.cycles, simulator_cycles(model, result.lin, launches),
                       device.backend)


def test_runs_leave_the_device_ready_for_the_next(dev):
    """A run of constants only (a lone leaf without input: no load-module work after the
    first barrier) and ordinary runs on the same device, each bit-identical: nothing left
    over (a stale token) changes the next run. The model's own segments stay on the
    device (written once), the runs' buffers are freed: a repeated run leaves the live
    buffers as they were and writes only its own arrays."""
    model = compiled("TreeFC", 8)
    written = []
    for structures in ([None], CASES["TreeFC"][1], [None, (1, 2)], CASES["TreeFC"][1]):
        before = dev.counters()["host_bytes_written"]
        assert_matches_reference(model, run(model, structures, device=dev))
        written.append(dev.counters()["host_bytes_written"] - before)
    live = dev.counters()["live_buffers"]
    assert_matches_reference(model, run(model, CASES["TreeFC"][1], device=dev))
    assert dev.counters()["live_buffers"] == live
    assert written[3] < written[1]


def test_runs_survive_a_reset_and_freed_buffers(dev):
    """The device's buffers freed behind the model's back (or the device reset) between
    runs: the model writes its segments again."""
    model = compiled("TreeLSTM", 8)
    assert_matches_reference(model, run(model, CASES["TreeLSTM"][1], device=dev))
    dev.reset()
    for buf in dev.buffers:
        buf.free()
    assert_matches_reference(model, run(model, CASES["TreeLSTM"][1], device=dev))


def test_explicit_inputs_and_the_resident_embeddings_alternate(dev):
    """The embeddings stay on the device with the weights; a run given its own input
    matrix reads that one, and the next run without one reads the embeddings again."""
    model = compiled("TreeFC", 8)
    other = np.random.default_rng(9).standard_normal(model.embeddings.shape)
    structures = CASES["TreeFC"][1]
    for inputs in (None, other, None, other * 0.5):
        result = run(model, structures, inputs, device=dev)
        matrix = model.embeddings if inputs is None else inputs
        ref = reference_int8(model.quantized, result.lin, model.quantized.quantize_inputs(matrix))
        for s, expected in ref.items():
            np.testing.assert_array_equal(result.states[s], expected)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells(), st.integers(0, 1000))
def test_random_cells_agree_with_the_simulator_on_the_rtl(rtl_device, cell, seed):
    """Cells drawn from the vocabulary on the Verilator model: data and cycles."""
    model, trees = random_cell_model(cell, seed, TINY)
    for launches in ("tree", "batch"):
        result = run(model, trees, device=rtl_device, launches=launches)
        assert_matches_reference(model, result)
        assert_same_cycles(result.cycles, simulator_cycles(model, result.lin, launches), "rtl")
