"""The placement problem in the abstract, and the projected sequential latency of a
placement: the one cost model that both the placements (:mod:`.dp`, the greedy rule)
and the comparisons between them use.

A :class:`Problem` is a list of :class:`NodeCost` in execution order (the graph's
topological order, which the executor follows): what each node reads and writes, its
time on the CPU and on the accelerator (``None`` where it cannot run), plus the time to
move each tensor between the host and a device buffer and the launch of a segment. The
latency of a placement (:func:`evaluate`) is, run sequentially as the executor does:

* every node's time on its device (a view: nothing);
* a launch per segment, a maximal run of accelerator nodes in the order (a CPU node or a
  view ends it);
* a transfer each time a tensor crosses: written into a segment that reads it from the
  host (once per segment; graph inputs, CPU results and results read back from an
  earlier segment are on the host), read back once at the end of the segment that
  produced it if anything after that segment reads it or it is a graph output.

Constants (weights) are resident on the device and are not part of the problem.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from tessera.errors import CompileError

__all__ = ["ACCEL", "CPU", "VIEW", "Latency", "NodeCost", "Problem", "evaluate"]

ACCEL, CPU, VIEW = "accelerator", "cpu", "view"


@dataclass(frozen=True)
class NodeCost:
    """One node as the placement sees it."""

    name: str
    inputs: tuple[str, ...]           # the non-constant tensors it reads, each once
    outputs: tuple[str, ...]
    cpu: float | None                 # seconds on the CPU; None: no CPU kernel
    accel: float | None               # seconds on the accelerator; None: cannot run there
    view: bool = False                # a host-side reshape: free, always on the host
    #: On the accelerator only if every input is written by the open segment (an
    #: in-place Concat: its producers store straight into its buffer).
    in_place: bool = False

    def allows(self, target: str) -> bool:
        """Whether this node may run on ``target``."""
        if self.view:
            return target == VIEW
        return (self.cpu if target == CPU else self.accel if target == ACCEL
                else None) is not None


@dataclass(frozen=True)
class Problem:
    """Nodes in execution order, the host-device transfer time of every non-constant
    tensor, the launch time of a segment and the graph's outputs."""

    nodes: tuple[NodeCost, ...]
    transfer: Mapping[str, float]
    launch: float
    outputs: frozenset[str] = field(default_factory=frozenset)

    def last_reads(self) -> dict[str, int]:
        """For every tensor read, the index of its last reader (graph outputs: one past
        the last node, they are read by the caller)."""
        last: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            for t in node.inputs:
                last[t] = i
        for t in self.outputs:
            last[t] = len(self.nodes)
        return last


@dataclass(frozen=True)
class Latency:
    """A placement's projected sequential latency, by where the time goes (seconds)."""

    compute: float
    launches: float
    transfers: float
    segments: int

    @property
    def total(self) -> float:
        return self.compute + self.launches + self.transfers


def evaluate(problem: Problem, targets: Sequence[str]) -> Latency:
    """The projected sequential latency of running ``problem``'s nodes on ``targets``
    (one of :data:`ACCEL`, :data:`CPU`, :data:`VIEW` per node), or :class:`CompileError`
    if a node cannot run where it is placed."""
    if len(targets) != len(problem.nodes):
        raise CompileError(f"{len(targets)} targets for {len(problem.nodes)} nodes")
    segment_of = _segment_ids(targets)
    produced_in: dict[str, int] = {}          # tensor -> segment that wrote it
    written: set[tuple[int, str]] = set()     # (segment, host tensor written into it)
    compute = transfers = 0.0
    for node, target, seg in zip(problem.nodes, targets, segment_of):
        _check_allowed(node, target, seg, produced_in)
        if target != ACCEL:
            compute += node.cpu if target == CPU else 0.0
            continue
        compute += node.accel
        for t in node.inputs:
            if produced_in.get(t) != seg and (seg, t) not in written:
                written.add((seg, t))
                transfers += problem.transfer[t]
        produced_in.update((t, seg) for t in node.outputs)
    reader_segments: dict[str, set[int]] = {}
    for node, seg in zip(problem.nodes, segment_of):
        for t in node.inputs:
            reader_segments.setdefault(t, set()).add(seg)
    for t, seg in produced_in.items():
        # read back if anything outside its segment reads it (host nodes are -1)
        if t in problem.outputs or reader_segments.get(t, {seg}) - {seg}:
            transfers += problem.transfer[t]
    segments = max(segment_of, default=-1) + 1
    return Latency(compute, segments * problem.launch, transfers, segments)


def _segment_ids(targets: Sequence[str]) -> list[int]:
    """Each node's segment number (accelerator nodes), -1 for host nodes."""
    ids, count, previous = [], 0, None
    for target in targets:
        if target == ACCEL and previous != ACCEL:
            count += 1
        ids.append(count - 1 if target == ACCEL else -1)
        previous = target
    return ids


def _check_allowed(node: NodeCost, target: str, seg: int,
                   produced_in: Mapping[str, int]) -> None:
    if not node.allows(target):
        raise CompileError(f"node {node.name!r} cannot run on the {target}"
                           + (" (it is a view)" if node.view else ""), op=node.name)
    if target == ACCEL and node.in_place and any(produced_in.get(t, -1) != seg
                                                 for t in node.inputs):
        raise CompileError(f"node {node.name!r} is an in-place concatenation: on the "
                           "accelerator, its inputs must be written by its own segment",
                           op=node.name)
