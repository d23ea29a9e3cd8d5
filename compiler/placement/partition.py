"""Placement of every graph node on the accelerator or the host CPU, with the reason.

:func:`place_nodes` places by one of three strategies:

* ``"dp"`` (the default): the placement with the least projected sequential latency of
  the whole graph (:func:`.dp.solve`, under the cost model of :mod:`.problem`: node
  times, a launch per segment, host-device transfers). Each reason gives the node's time
  here and on the other device, and what moving it alone would change (launches,
  transfers, the graph's latency);
* ``"greedy"``: per node, in topological order, "cheaper here" (below);
* ``"cpu"``: every node the CPU can run on the CPU (the CPU-only baseline).

Whatever the strategy:

* a view (Flatten, Reshape, Squeeze, Unsqueeze, Identity) is a host-side reshape of the
  stored values: no data moves (``"view"``); it ends an accelerator segment;
* a fused integer node runs on the accelerator only if it supports it
  (:func:`~..accel.lower.accel_unsupported_reason`) and it is not in ``force_cpu``;
* a Concat of int8 images along channels runs on the accelerator only in place: inside
  the segment that writes its inputs, each read only by it, so that the producers store
  side by side into its buffer, no copy (:func:`~..accel.dram.concat_parts`);
* everything else runs as a CPU kernel if one exists (:mod:`..cpu.lower`); a node with
  neither is a :class:`~tessera.errors.CompileError` naming it and saying why.

The greedy rule: a node goes to the accelerator when its estimated time there is below
the CPU estimate. A host round trip counts against the side that causes it: opening a
new accelerator segment (launch and transfer) against the accelerator, reading an
accelerator result on the CPU (the segment ends, the next needs a launch) against the
CPU. A node that would open a segment but whose reader is a conv or dense layer the
accelerator takes is not charged that launch: left on the CPU, its reader would pay it.

The estimates are models, not measurements: the accelerator's is the roofline bound
(:mod:`..accel.roofline`) of the lowered operator, the host's comes from
:class:`~tessera.hostmodel.HostModel` (the board's CPU); both are in :mod:`.cost`.
:func:`projected_latency` prices any placement with the DP's cost model. ``tessera
profile`` measures the real figures.

:func:`segments` groups consecutive accelerator nodes into segments: each compiles into
one program (one launch, no host round trip between its layers).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Sequence

import numpy as np

from tessera.config import HwConfig
from tessera.errors import CLI, PYTHON, CompileError
from tessera.hostmodel import HostModel, Work, get_host_model

from ..accel.lower import accel_unsupported_reason, lowering_note
from ..cpu.lower import cpu_unsupported_reason
from ..frontend.graph import Graph, Node

from .cost import accel_seconds, node_work, weight_density
from .dp import solve
from .problem import ACCEL, CPU, VIEW, Latency, NodeCost, Problem, evaluate

__all__ = ["STRATEGIES", "VIEW_OPS", "Placement", "check_strategy", "place_nodes",
           "placement_problem", "projected_latency", "segments"]

#: Ops that only reinterpret a tensor's shape: a host-side view of the stored values.
VIEW_OPS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")
#: The placement strategies of :func:`place_nodes`.
STRATEGIES = ("dp", "greedy", "cpu")


@dataclass
class Placement:
    """Where one node runs, why, and the estimates the decision compared: its time on
    each device (``None`` where it cannot run there) and its work as a CPU kernel."""

    node: str
    op: str
    target: str                       # "accelerator", "cpu" or "view"
    reason: str
    accel_seconds: float | None = None
    cpu_seconds: float | None = None
    work: Work | None = None
    density: float | None = None      # of the weight's GEMM blocks (None: no weight)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Placement":
        """Read :meth:`to_dict`'s form (files written before ``work`` existed too)."""
        d = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        if d.get("work") is not None:
            d["work"] = Work.from_dict(d["work"])
        return cls(**d)


@dataclass(frozen=True)
class _Facts:
    """What each device can do with one node: its estimate there, or why it cannot."""

    view: bool
    work: Work | None = None
    cpu_seconds: float | None = None
    cpu_reason: str | None = None
    accel_seconds: float | None = None
    accel_reason: str | None = None
    density: float | None = None


def check_strategy(strategy: str) -> None:
    """CompileError unless ``strategy`` is one of :data:`STRATEGIES`."""
    if strategy not in STRATEGIES:
        raise CompileError(f"unknown placement strategy {strategy!r}; the strategies are "
                           f"{list(STRATEGIES)}",
                           fix={PYTHON: "tessera.compile(..., placement='dp') (least "
                                        "projected latency), 'greedy' or 'cpu'",
                                CLI: "--placement dp|greedy|cpu"})


def place_nodes(graph: Graph, config: HwConfig, *, host: HostModel | None = None,
                force_cpu: Sequence[str] = (), strategy: str = "dp") -> list[Placement]:
    """A :class:`Placement` for every node of ``graph`` by ``strategy`` (one of
    :data:`STRATEGIES`, see the module doc).

    ``force_cpu`` names nodes to keep off the accelerator (e.g. to compare backends).
    """
    check_strategy(strategy)
    unknown = set(force_cpu) - {n.name for n in graph.nodes}
    if unknown:
        raise CompileError(f"nodes {sorted(unknown)} to keep on the CPU are not in the graph",
                           fix={PYTHON: "force_cpu takes node names of "
                                        "CompiledModel.placements",
                                CLI: "--force-cpu takes node names that tessera compile "
                                     "prints"})
    host = get_host_model(host, config.name)
    facts = [_node_facts(graph, node, config, host, force_cpu) for node in graph.nodes]
    if strategy == "greedy":
        return _place_greedy(graph, config, host, force_cpu, facts)
    if strategy == "cpu":
        return _place_cpu_only(graph, config, facts)
    return _place_dp(graph, config, host, facts)


def projected_latency(graph: Graph, placements: Sequence[Placement], config: HwConfig,
                      host: HostModel | None = None) -> Latency:
    """The projected sequential latency of ``graph`` placed by ``placements`` (any
    strategy's), under the cost model the DP placement minimises (:mod:`.problem`)."""
    if [p.node for p in placements] != [n.name for n in graph.nodes]:
        raise CompileError("the placements do not name the graph's nodes in order",
                           fix={PYTHON: "pass the placements place_nodes made for this "
                                        "graph"})
    host = get_host_model(host, config.name)
    off = [p.node for p in placements if p.target != ACCEL]   # their lowering is not needed
    facts = [_node_facts(graph, node, config, host, off) for node in graph.nodes]
    return evaluate(_problem(graph, facts, host), [p.target for p in placements])


def placement_problem(graph: Graph, config: HwConfig, host: HostModel | None = None,
                      force_cpu: Sequence[str] = ()) -> Problem:
    """The abstract problem the DP placement solves for ``graph`` (:mod:`.problem`)."""
    host = get_host_model(host, config.name)
    return _problem(graph, [_node_facts(graph, node, config, host, force_cpu)
                            for node in graph.nodes], host)


def _node_facts(graph: Graph, node: Node, config: HwConfig, host: HostModel,
                force_cpu: Sequence[str]) -> _Facts:
    """Each device's estimate for ``node``, or why it cannot run it
    (:class:`CompileError` if neither can)."""
    if node.op in VIEW_OPS and not node.domain:
        return _Facts(view=True)
    work = node_work(graph, node)
    cpu_reason = cpu_unsupported_reason(graph, node)
    cpu_s = host.kernel_seconds(work) if cpu_reason is None else None
    accel_reason = ("kept on the CPU by force_cpu" if node.name in force_cpu
                    else accel_unsupported_reason(graph, node, config))
    if accel_reason is None and node.op == "Concat" and not node.domain:
        accel_reason = _concat_readers_reason(graph, node)
    if accel_reason is not None and cpu_reason is not None:
        raise CompileError(f"{node.op} node {node.name!r} can run neither on the accelerator "
                           f"({accel_reason}) nor on the CPU ({cpu_reason})", op=node.name)
    acc_s = accel_seconds(graph, node, config) if accel_reason is None else None
    return _Facts(False, work, cpu_s, cpu_reason, acc_s, accel_reason,
                  weight_density(graph, node, config))


def _problem(graph: Graph, facts: Sequence[_Facts], host: HostModel) -> Problem:
    """The abstract placement problem of ``graph`` (:mod:`.problem`)."""
    def moved(names) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for t in names if t and not graph.value(t).is_const))

    nodes = tuple(NodeCost(node.name, moved(node.inputs), moved(node.outputs),
                           f.cpu_seconds, f.accel_seconds, f.view,
                           node.op == "Concat" and not node.domain)
                  for node, f in zip(graph.nodes, facts))
    tensors = {t for n in nodes for t in (*n.inputs, *n.outputs)}
    transfer = {t: host.transfer_seconds(graph.value(t).size
                                         * np.dtype(graph.value(t).dtype).itemsize)
                for t in tensors}
    return Problem(nodes, transfer, host.launch_seconds, frozenset(graph.outputs))


def _place_dp(graph: Graph, config: HwConfig, host: HostModel,
              facts: Sequence[_Facts]) -> list[Placement]:
    """The least-latency placement, each reason saying what moving the node alone would
    change."""
    problem = _problem(graph, facts, host)
    solution = solve(problem)
    best = evaluate(problem, solution.targets)
    caveat = "" if solution.exact else (
        f" (beam search over a frontier of {solution.widest_frontier} states: "
        "not proven optimal)")
    placements = []
    for i, (node, f, target) in enumerate(zip(graph.nodes, facts, solution.targets)):
        if f.view:
            why = "a reshape of the stored values (no data moves)"
        elif f.cpu_reason is not None or f.accel_reason is not None:
            why = (f.accel_reason if target == CPU else
                   f"DP: {_ms(f.accel_seconds)} on the accelerator; no CPU kernel "
                   f"({f.cpu_reason})") + caveat
        else:
            why = _flip_reason(problem, solution.targets, i, best) + caveat
        if target == ACCEL:
            why += lowering_note(graph, node, config)
        placements.append(Placement(node.name, node.op, target, why, f.accel_seconds,
                                    f.cpu_seconds, f.work, f.density))
    return placements


def _flip_reason(problem: Problem, targets: Sequence[str], i: int, best: Latency) -> str:
    """Why node ``i`` is where the DP put it: its time on each device and what moving it
    alone (the rest of the optimum kept) would do to the graph's latency."""
    node, here = problem.nodes[i], targets[i]
    other = CPU if here == ACCEL else ACCEL
    here_s, there_s = ((node.accel, node.cpu) if here == ACCEL else (node.cpu, node.accel))
    why = f"DP: {_ms(here_s)} here vs {_ms(there_s)} on the {_DEVICE[other]}; "
    try:
        moved = evaluate(problem, [*targets[:i], other, *targets[i + 1:]])
    except CompileError as exc:
        return why + (f"it cannot move alone (the in-place concat {exc.op!r} needs its "
                      "inputs written by its own accelerator segment)")
    overhead = (moved.launches + moved.transfers) - (best.launches + best.transfers)
    return why + (f"moved there, launches and transfers change by {_signed_ms(overhead)} "
                  f"and the graph by {_signed_ms(moved.total - best.total)}")


def _place_cpu_only(graph: Graph, config: HwConfig,
                    facts: Sequence[_Facts]) -> list[Placement]:
    """Every node the CPU can run on the CPU; the others on the accelerator."""
    placements = []
    for node, f in zip(graph.nodes, facts):
        if f.view:
            target, why = VIEW, "a reshape of the stored values (no data moves)"
        elif f.cpu_reason is None:
            target, why = CPU, f"CPU-only baseline: {_ms(f.cpu_seconds)} on the CPU"
        else:
            target = ACCEL
            why = (f"{_ms(f.accel_seconds)} on the accelerator; no CPU kernel "
                   f"({f.cpu_reason})" + lowering_note(graph, node, config))
        placements.append(Placement(node.name, node.op, target, why, f.accel_seconds,
                                    f.cpu_seconds, f.work, f.density))
    return placements


def _place_greedy(graph: Graph, config: HwConfig, host: HostModel,
                  force_cpu: Sequence[str], facts: Sequence[_Facts]) -> list[Placement]:
    """Per node in order, the device that looks cheaper for it alone (the module doc)."""
    placements: list[Placement] = []
    produced_on_accel: set[str] = set()
    segment: set[str] = set()       # the outputs of the accelerator run open so far
    for node, f in zip(graph.nodes, facts):
        if placements and placements[-1].target != ACCEL:
            segment = set()
        if f.view:
            placements.append(Placement(node.name, node.op, VIEW,
                                        "a reshape of the stored values (no data moves)"))
            continue
        target, why = _greedy_choice(graph, node, config, host, force_cpu, f,
                                     produced_on_accel, segment)
        placements.append(Placement(node.name, node.op, target, why, f.accel_seconds,
                                    f.cpu_seconds, f.work, f.density))
        if target == ACCEL:
            produced_on_accel.update(node.outputs)
            segment.update(node.outputs)
    return placements


def _greedy_choice(graph: Graph, node: Node, config: HwConfig, host: HostModel,
                   force_cpu: Sequence[str], f: _Facts, produced_on_accel: set[str],
                   segment: set[str]) -> tuple[str, str]:
    """``(target, reason)`` of the greedy rule for one (non-view) node."""
    accel_reason = f.accel_reason
    if accel_reason is None and node.op == "Concat" and not node.domain:
        accel_reason = _concat_segment_reason(node, segment)
    if accel_reason is not None:
        if f.cpu_reason is not None:
            raise CompileError(f"{node.op} node {node.name!r} can run neither on the "
                               f"accelerator ({accel_reason}) nor on the CPU "
                               f"({f.cpu_reason})", op=node.name)
        return CPU, accel_reason
    cpu_cost = f.cpu_seconds
    # Reading accelerator results ends its program: the host waits for it, and the
    # accelerator ops after this one need a launch of their own.
    if cpu_cost is not None and any(t in produced_on_accel for t in node.inputs):
        cpu_cost += host.launch_seconds
    # Reading host tensors means a launch of its own (unless a segment is open).
    opens_segment = not any(t in produced_on_accel for t in node.inputs)
    moved = sum(graph.value(t).size for t in node.inputs
                if t and not graph.value(t).is_const)
    cost = f.accel_seconds + (host.launch_seconds + host.transfer_seconds(moved)
                              if opens_segment else 0.0)
    cpu_note = ""
    if (cpu_cost is not None and opens_segment
            and _read_on_accelerator(graph, node, config, force_cpu)):
        # Left on the CPU, its accelerator reader would open the segment instead: that
        # launch is paid either way.
        cpu_cost, cpu_note = cpu_cost + host.launch_seconds, " (its reader's launch)"
    if cpu_cost is None or cost <= cpu_cost:
        return ACCEL, (f"estimated {_ms(cost)} on the accelerator"
                       + (f" vs {_ms(cpu_cost)} on the CPU{cpu_note}" if cpu_cost is not None
                          else f"; no CPU kernel ({f.cpu_reason})")
                       + lowering_note(graph, node, config))
    return CPU, (f"estimated {_ms(cpu_cost)} on the CPU{cpu_note} vs {_ms(cost)} on the "
                 "accelerator")


def _read_on_accelerator(graph: Graph, node: Node, config: HwConfig,
                         force_cpu: Sequence[str]) -> bool:
    """Whether a conv or dense layer the accelerator can take reads one of ``node``'s
    outputs (a one-step lookahead: such a reader goes there on its own)."""
    return any(reader.op in _HEAVY_OPS and reader.name not in force_cpu
               and accel_unsupported_reason(graph, reader, config) is None
               for t in node.outputs for reader in graph.consumers(t))


#: Integer nodes whose work keeps them on the accelerator once it can take them.
_HEAVY_OPS = frozenset({"QConv", "QGemm", "QConvTranspose"})


def _concat_readers_reason(graph: Graph, node: Node) -> str | None:
    """Why the accelerator can never concatenate ``node``'s inputs in place: each must be
    read by nothing else, so that its producer can store it straight into the concat's
    buffer."""
    for name in node.inputs:
        if name in graph.outputs or len(graph.consumers(name)) != 1:
            return (f"its input {name!r} is read elsewhere too; it is stored in place only "
                    "when the concat is its one reader")
    return None


def _concat_segment_reason(node: Node, segment: set[str]) -> str | None:
    """Why the open segment cannot concatenate ``node``'s inputs in place: it must have
    written each of them."""
    for name in node.inputs:
        if name not in segment:
            return (f"its input {name!r} is not written by the accelerator program it would "
                    "join (a copy would be needed)")
    return None


def segments(graph: Graph, placements: Sequence[Placement]) -> list[list[Node]]:
    """Runs of consecutive accelerator nodes (in graph order): one program each."""
    runs: list[list[Node]] = []
    previous = None
    for node, place in zip(graph.nodes, placements):
        if place.target == ACCEL:
            if previous != ACCEL:
                runs.append([])
            runs[-1].append(node)
        previous = place.target
    return runs


_DEVICE = {CPU: "CPU", ACCEL: "accelerator"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _signed_ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.3g} ms"
