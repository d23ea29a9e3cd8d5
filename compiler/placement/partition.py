"""Placement of every graph node on the accelerator or the host CPU, with the reason.

:func:`place_nodes` decides per node, in topological order:

* a view (Flatten, Reshape, Squeeze, Unsqueeze, Identity) is a host-side reshape of the
  stored values: no data moves (``"view"``);
* a fused integer node the accelerator supports (:func:`~..accel.lower.accel_unsupported_reason`)
  goes to the accelerator when its estimated time there is below the CPU estimate. A
  host round trip counts against the side that causes it: opening a new accelerator
  segment (launch and transfer) against the accelerator, reading an accelerator result
  on the CPU (the segment ends, the next needs a launch) against the CPU. A node that
  would open a segment but whose reader is a conv or dense layer the accelerator takes
  is not charged that launch: left on the CPU, its reader would pay it instead;
* a Concat of int8 images along channels whose inputs the open accelerator segment
  writes, each read only by it, joins the segment: the producers store side by side into
  its buffer, no copy (:func:`~..accel.dram.concat_parts`);
* everything else runs as a CPU kernel if one exists (:mod:`..cpu.lower`); a node with
  neither is a :class:`~tessera.errors.CompileError` naming it and saying why.

The estimates are models, not measurements: the accelerator's is the roofline bound
(:mod:`..accel.roofline`) of the lowered operator, the host's comes from
:class:`~tessera.hostmodel.HostModel` (the board's CPU); both are in :mod:`.cost`. ``tessera profile`` measures the real figures.

:func:`segments` groups consecutive accelerator nodes into segments: each compiles into
one program (one launch, no host round trip between its layers).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from tessera.config import HwConfig
from tessera.errors import CLI, PYTHON, CompileError

from ..cpu.lower import cpu_unsupported_reason
from ..frontend.graph import Graph, Node
from ..accel.lower import accel_unsupported_reason, lowering_note
from tessera.hostmodel import HostModel, get_host_model

from .cost import accel_seconds, node_work

__all__ = ["VIEW_OPS", "Placement", "place_nodes", "segments"]

#: Ops that only reinterpret a tensor's shape: a host-side view of the stored values.
VIEW_OPS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")


@dataclass
class Placement:
    """Where one node runs, why, and the estimates the decision compared."""

    node: str
    op: str
    target: str                       # "accelerator", "cpu" or "view"
    reason: str
    accel_seconds: float | None = None
    cpu_seconds: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Placement":
        return cls(**d)


def place_nodes(graph: Graph, config: HwConfig, *, host: HostModel | None = None,
                force_cpu: Sequence[str] = ()) -> list[Placement]:
    """A :class:`Placement` for every node of ``graph`` (see the module doc).

    ``force_cpu`` names nodes to keep off the accelerator (e.g. to compare backends).
    """
    unknown = set(force_cpu) - {n.name for n in graph.nodes}
    if unknown:
        raise CompileError(f"nodes {sorted(unknown)} to keep on the CPU are not in the graph",
                           fix={PYTHON: "force_cpu takes node names of "
                                        "CompiledModel.placements",
                                CLI: "--force-cpu takes node names that tessera compile "
                                     "prints"})
    host = get_host_model(host, config.name)
    placements: list[Placement] = []
    produced_on_accel: set[str] = set()
    segment: set[str] = set()       # the outputs of the accelerator run open so far
    for node in graph.nodes:
        if placements and placements[-1].target != "accelerator":
            segment = set()
        if node.op in VIEW_OPS and not node.domain:
            placements.append(Placement(node.name, node.op, "view",
                                        "a reshape of the stored values (no data moves)"))
            continue
        cpu_reason = cpu_unsupported_reason(graph, node)
        cpu_s = None
        if cpu_reason is None:
            cpu_s = host.kernel_seconds(node_work(graph, node))
            # Reading accelerator results ends its program: the host waits for it, and
            # the accelerator ops after this one need a launch of their own.
            if any(t in produced_on_accel for t in node.inputs):
                cpu_s += host.launch_seconds
        accel_reason = ("kept on the CPU by force_cpu" if node.name in force_cpu
                        else accel_unsupported_reason(graph, node, config))
        if accel_reason is None and node.op == "Concat" and not node.domain:
            accel_reason = _in_place_concat_reason(graph, node, segment)
        if accel_reason is None:
            acc_s = accel_seconds(graph, node, config)
            # Reading host tensors means a launch of its own (unless a segment is open).
            opens_segment = not any(t in produced_on_accel for t in node.inputs)
            moved = sum(graph.value(t).size for t in node.inputs
                        if t and not graph.value(t).is_const)
            cost = acc_s + (host.launch_seconds + host.transfer_seconds(moved)
                            if opens_segment else 0.0)
            cpu_cost, cpu_note = cpu_s, ""
            if (cpu_s is not None and opens_segment
                    and _read_on_accelerator(graph, node, config, force_cpu)):
                # Left on the CPU, its accelerator reader would open the segment instead:
                # that launch is paid either way.
                cpu_cost, cpu_note = cpu_s + host.launch_seconds, " (its reader's launch)"
            if cpu_cost is None or cost <= cpu_cost:
                why = (f"estimated {_ms(cost)} on the accelerator"
                       + (f" vs {_ms(cpu_cost)} on the CPU{cpu_note}" if cpu_s is not None
                          else f"; no CPU kernel ({cpu_reason})")
                       + lowering_note(graph, node, config))
                placements.append(Placement(node.name, node.op, "accelerator", why, acc_s,
                                            cpu_s))
                produced_on_accel.update(node.outputs)
                segment.update(node.outputs)
                continue
            placements.append(Placement(node.name, node.op, "cpu",
                                        f"estimated {_ms(cpu_cost)} on the CPU{cpu_note} vs "
                                        f"{_ms(cost)} on the accelerator", acc_s, cpu_s))
            continue
        if cpu_reason is not None:
            raise CompileError(f"{node.op} node {node.name!r} can run neither on the accelerator "
                               f"({accel_reason}) nor on the CPU ({cpu_reason})",
                               op=node.name)
        placements.append(Placement(node.name, node.op, "cpu", accel_reason, None, cpu_s))
    return placements


def _read_on_accelerator(graph: Graph, node: Node, config: HwConfig,
                         force_cpu: Sequence[str]) -> bool:
    """Whether a conv or dense layer the accelerator can take reads one of ``node``'s
    outputs (a one-step lookahead: such a reader goes there on its own)."""
    return any(reader.op in _HEAVY_OPS and reader.name not in force_cpu
               and accel_unsupported_reason(graph, reader, config) is None
               for t in node.outputs for reader in graph.consumers(t))


#: Integer nodes whose work keeps them on the accelerator once it can take them.
_HEAVY_OPS = frozenset({"QConv", "QGemm", "QConvTranspose"})


def _in_place_concat_reason(graph: Graph, node: Node, segment: set[str]) -> str | None:
    """Why the accelerator cannot concatenate ``node``'s inputs in place: each must be
    written by an accelerator node of the segment the concat joins and read by nothing
    else, so that its producer can store it straight into the concat's buffer."""
    for name in node.inputs:
        if name not in segment:
            return (f"its input {name!r} is not written by the accelerator program it would "
                    "join (a copy would be needed)")
        if name in graph.outputs or len(graph.consumers(name)) != 1:
            return (f"its input {name!r} is read elsewhere too; it is stored in place only "
                    "when the concat is its one reader")
    return None


def segments(graph: Graph, placements: Sequence[Placement]) -> list[list[Node]]:
    """Runs of consecutive accelerator nodes (in graph order): one program each."""
    runs: list[list[Node]] = []
    previous = None
    for node, place in zip(graph.nodes, placements):
        if place.target == "accelerator":
            if previous != "accelerator":
                runs.append([])
            runs[-1].append(node)
        previous = place.target
    return runs


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"
