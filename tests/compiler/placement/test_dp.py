"""The DP placement: exact against brute force on abstract problems, never worse than the
greedy rule on the zoo models, and within the placement's constraints (in-place Concat,
force_cpu, views)."""
from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tessera
from tessera.compiler import zoo
from tessera.compiler.model import fuse_integer_nodes, import_quantized
from tessera.compiler.placement.dp import solve
from tessera.compiler.placement.partition import (Placement, place_nodes,
                                                  placement_problem, projected_latency)
from tessera.compiler.placement.problem import (ACCEL, CPU, VIEW, NodeCost, Problem,
                                                evaluate)
from tessera.config import get_config
from tessera.errors import CompileError
from tessera.hostmodel import KINDS, HostModel, KernelCost, Work

# ----------------------------------------------------------------- abstract problems


@st.composite
def problems(draw, max_nodes: int = 10) -> Problem:
    """A random DAG in topological order: each node reads 1-3 earlier tensors (or the
    input), may be a view, may lack a CPU kernel or an accelerator lowering, may be an
    in-place concatenation; random times, transfer costs and launch."""
    cost = st.floats(0.0, 1.0, allow_nan=False)
    tensors, transfer, nodes = ["x"], {"x": draw(cost)}, []
    for i in range(draw(st.integers(1, max_nodes))):
        inputs = tuple(draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=3,
                                     unique=True)))
        view = draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans())
        cpu = draw(st.none() | cost)
        accel = draw(st.none() | cost)
        if cpu is None and accel is None:
            cpu = draw(cost)
        nodes.append(NodeCost(f"n{i}", inputs, (f"t{i}",), cpu, accel, view,
                              in_place=draw(st.integers(0, 5)) == 0))
        tensors.append(f"t{i}")
        transfer[f"t{i}"] = draw(cost)
    outputs = frozenset(draw(st.lists(st.sampled_from(tensors[1:]), min_size=1, max_size=3)))
    return Problem(tuple(nodes), transfer, draw(cost), outputs)


def brute_force(problem: Problem) -> float:
    """The least evaluated latency over every placement (inf if none is feasible)."""
    options = [[VIEW] if n.view else [t for t in (CPU, ACCEL) if n.allows(t)]
               for n in problem.nodes]
    best = float("inf")
    for targets in itertools.product(*options):
        try:
            best = min(best, evaluate(problem, targets).total)
        except CompileError:
            continue            # an infeasible placement (a node where it cannot run)
    return best


@settings(max_examples=300, deadline=None)
@given(problems())
def test_dp_optimum_equals_the_brute_force_minimum(problem: Problem) -> None:
    best = brute_force(problem)
    if best == float("inf"):
        with pytest.raises(CompileError, match="can be placed nowhere"):
            solve(problem)
        return
    solution = solve(problem)
    assert solution.exact
    assert solution.seconds == pytest.approx(best, abs=1e-9)
    # the DP's own figure is the evaluation of the placement it returns
    assert evaluate(problem, solution.targets).total == pytest.approx(solution.seconds,
                                                                     abs=1e-12)


def test_a_chain_stays_in_one_segment_when_a_launch_costs_more_than_a_slow_node() -> None:
    # n1 is 1 s faster on the CPU, but there it splits the segment: a second launch (5 s)
    # and a round trip of two tensors.
    chain = Problem((NodeCost("n0", ("x",), ("a",), 10.0, 1.0),
                     NodeCost("n1", ("a",), ("b",), 1.0, 2.0),
                     NodeCost("n2", ("b",), ("y",), 10.0, 1.0)),
                    {"x": 0.1, "a": 0.1, "b": 0.1, "y": 0.1}, 5.0, frozenset({"y"}))
    solution = solve(chain)
    assert solution.targets == (ACCEL, ACCEL, ACCEL)
    assert solution.seconds == pytest.approx(1 + 2 + 1 + 5 + 0.1 + 0.1)
    split = evaluate(chain, (ACCEL, CPU, ACCEL))
    assert (split.segments, split.total) == (2, pytest.approx(3 + 10 + 4 * 0.1))
    # a view between accelerator nodes ends the segment, like a CPU node
    viewed = Problem((chain.nodes[0], NodeCost("v", ("a",), ("b",), None, None, view=True),
                      chain.nodes[2]), chain.transfer, 5.0, chain.outputs)
    assert solve(viewed).targets == (ACCEL, VIEW, ACCEL)
    assert evaluate(viewed, (ACCEL, VIEW, ACCEL)).segments == 2


def test_a_tensor_is_written_into_a_segment_once_and_read_back_once() -> None:
    # x feeds two accelerator nodes of one segment (one write); a is read by a CPU node
    # and a later segment (one read-back, then one write into the second segment).
    p = Problem((NodeCost("a1", ("x",), ("a",), None, 1.0),
                 NodeCost("a2", ("x", "a"), ("b",), None, 1.0),
                 NodeCost("c", ("a",), ("c",), 1.0, None),
                 NodeCost("a3", ("a", "c"), ("y",), None, 1.0)),
                {"x": 1.0, "a": 10.0, "b": 100.0, "c": 1000.0, "y": 0.5}, 0.0,
                frozenset({"y"}))
    assert evaluate(p, (ACCEL, ACCEL, CPU, ACCEL)).transfers == pytest.approx(
        1.0 + 10.0 + 10.0 + 1000.0 + 0.5)                  # b is read by nobody


def test_a_frontier_wider_than_the_bound_falls_back_to_a_beam_and_says_so() -> None:
    # four independent branches open at once: each live tensor's place multiplies the states
    nodes = [NodeCost(f"b{i}", ("x",), (f"t{i}",), 1.0 + i, 0.5) for i in range(4)]
    nodes.append(NodeCost("join", tuple(f"t{i}" for i in range(4)), ("y",), 1.0, 1.0))
    p = Problem(tuple(nodes), {"x": 0.1, "y": 0.1, **{f"t{i}": 0.2 for i in range(4)}},
                0.3, frozenset({"y"}))
    exact, beam = solve(p), solve(p, max_states=1)
    assert exact.exact and exact.widest_frontier > 1
    assert not beam.exact
    assert evaluate(p, beam.targets).total == pytest.approx(beam.seconds)
    assert beam.seconds >= exact.seconds


# ----------------------------------------------------------------- graphs

CONFIG = get_config("pynq")
#: A made-up host (the shipped host models are being re-measured): cortex-a9-like
#: coefficients, scaled by the tests to move the CPU/accelerator balance.
HOST = HostModel("test-host", "made up for the tests", 2,
                 {kind: KernelCost(2e-6, 1e-9, 1e-9, 1e-9) for kind in KINDS},
                 launch_seconds=1e-4, copy_bytes_per_second=1e9,
                 flush_bytes_per_second=2e9)
SMALL = {"mlp": {}, "lenet": {}, "small_resnet": dict(image=16),
         "mobilenet": dict(image=32, width=0.25),
         "inception": dict(image=32, width=0.5, stages=(1, 1, 1))}


@lru_cache(maxsize=None)
def fused(name: str):
    """The zoo model ``name`` (small sizes) as the fused integer graph the placement sees."""
    model = zoo.ZOO[name](**SMALL[name])
    graph, _ = import_quantized(model, None, zoo.calibration_data(model, 2), lambda *a: None)
    fuse_integer_nodes(graph)
    return graph


@pytest.mark.parametrize("name", ["mlp", "lenet", "small_resnet", "mobilenet"])
def test_dp_is_never_worse_than_greedy_on_the_zoo(name: str) -> None:
    graph = fused(name)
    for host in (HOST, HOST.scaled(0.3), HOST.scaled(0.1), "cortex-a9"):
        latency = {s: projected_latency(graph, place_nodes(graph, CONFIG, host=host,
                                                           strategy=s), CONFIG, host).total
                   for s in ("cpu", "greedy", "dp")}
        assert latency["dp"] <= latency["greedy"] + 1e-12, (host, latency)
        assert latency["dp"] <= latency["cpu"] + 1e-12, (host, latency)
        # the optimum the DP found is the evaluation of the placement it returned
        assert solve(placement_problem(graph, CONFIG, host)).seconds == pytest.approx(
            latency["dp"], rel=1e-12)


def test_dp_ends_the_segment_before_a_cheap_tail_that_greedy_keeps() -> None:
    """small_resnet's classifier: cheap on a fast CPU, but the greedy rule keeps it on the
    accelerator (a node already in a segment pays no launch there); the DP reads back the
    pooled features and runs the tail on the CPU."""
    graph, host = fused("small_resnet"), HOST.scaled(0.1)
    greedy = place_nodes(graph, CONFIG, host=host, strategy="greedy")
    dp = place_nodes(graph, CONFIG, host=host)
    moved = [d for g, d in zip(greedy, dp) if g.target != d.target]
    assert [d.node for d in moved] == ["fc_QGemm.conv"]
    assert all(d.target == CPU for d in moved)
    assert (projected_latency(graph, dp, CONFIG, host).total
            < projected_latency(graph, greedy, CONFIG, host).total)
    assert moved[0].reason.startswith("DP: ") and "on the accelerator" in moved[0].reason


def test_dp_reasons_give_each_device_and_the_lowering() -> None:
    placements = place_nodes(fused("small_resnet"), CONFIG, host=HOST)
    for p in placements:
        if p.op in ("QConv", "QAdd"):
            assert p.work is not None and p.cpu_seconds > 0 and p.accel_seconds > 0
        if p.target == ACCEL and p.op in ("QConv", "QAdd"):
            assert p.reason.startswith("DP: ") and " vs " in p.reason, p.reason
    add = next(p for p in placements if p.op == "QAdd" and p.target == ACCEL)
    assert "ADD pattern" in add.reason                   # the lowering note is kept
    view = next(p for p in placements if p.op == "Flatten")
    assert (view.target, view.accel_seconds, view.cpu_seconds) == (VIEW, None, None)


def test_in_place_concat_and_force_cpu_are_respected() -> None:
    graph = fused("inception")
    placed = {p.node: p for p in place_nodes(graph, CONFIG, host=HOST)}
    concats = [n for n in graph.nodes if n.op == "Concat" and not n.domain]
    in_place = [n for n in concats if placed[n.name].target == ACCEL]
    assert in_place, "the test needs a concat the accelerator runs in place"
    for node in in_place:
        producers = [graph.producer(t).name for t in node.inputs]
        assert all(placed[p].target == ACCEL for p in producers)
        assert "cannot move alone" in placed[producers[0]].reason
    # forcing one producer to the CPU takes the concat off the accelerator too
    concat = in_place[0]
    producer = graph.producer(concat.inputs[0]).name
    forced = {p.node: p for p in place_nodes(graph, CONFIG, host=HOST, force_cpu=[producer])}
    assert (forced[producer].target, forced[producer].reason) == (
        CPU, "kept on the CPU by force_cpu")
    assert forced[producer].accel_seconds is None
    assert forced[concat.name].target == CPU
    with pytest.raises(CompileError, match="strategies are"):
        place_nodes(graph, CONFIG, host=HOST, strategy="fastest")


def test_the_cpu_baseline_runs_everything_it_can_on_the_cpu() -> None:
    placements = place_nodes(fused("lenet"), CONFIG, host=HOST, strategy="cpu")
    assert {p.target for p in placements} == {CPU, VIEW}
    latency = projected_latency(fused("lenet"), placements, CONFIG, HOST)
    assert (latency.segments, latency.launches, latency.transfers) == (0, 0.0, 0.0)


def test_placements_round_trip_and_old_files_load() -> None:
    p = Placement("conv1", "QConv", ACCEL, "DP: ...", 1e-5, 2e-4, Work("gemm_int8", 10, 4, 8))
    assert Placement.from_dict(p.to_dict()) == p
    old = {"node": "conv1", "op": "QConv", "target": "cpu", "reason": "estimated ...",
           "accel_seconds": None, "cpu_seconds": 1e-3}
    assert Placement.from_dict(old) == Placement("conv1", "QConv", CPU, "estimated ...",
                                                 None, 1e-3, None)


def test_compile_passes_the_placement_strategy_through() -> None:
    model = zoo.mlp()
    calibration = zoo.calibration_data(model, 2)
    feed = zoo.calibration_data(model, 1, seed=7)[0]
    outputs = {}
    for strategy in ("cpu", "dp"):
        compiled = tessera.compile(model, "pynq", calibration=calibration, host=HOST,
                                   placement=strategy)
        outputs[strategy], _ = compiled.run(feed, backend="sim")
        on_accel = [p.node for p in compiled.placements if p.target == ACCEL]
        assert bool(on_accel) == (strategy == "dp")
        assert bool(compiled.compiled.accel_steps) == (strategy == "dp")
        compiled.close()
    for name, value in outputs["dp"].items():
        assert np.array_equal(value, outputs["cpu"][name]), name
    with pytest.raises(CompileError, match="unknown placement strategy"):
        tessera.compile(model, "pynq", calibration=calibration, placement="fastest")
