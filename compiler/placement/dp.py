"""The placement that minimises a graph's projected sequential latency: a dynamic program
over the execution order (:func:`solve`), exact under the cost model of :mod:`.problem`.

On a chain this is the DP of Hong, Wu et al. (IPDPS'21): the state after a node is the
device it ran on. Branches and joins need more, because what the rest of the graph costs
depends on where each live tensor (produced, and read later or a graph output) is: a
tensor the open accelerator segment wrote is free to its later accelerator readers but
costs a read-back when the segment ends; a host tensor costs a write into the segment
the first time the segment reads it, and nothing the next time. So the state is

* whether an accelerator segment is open (the previous node ran on the accelerator);
* the live tensors the open segment wrote;
* the live host tensors already written into the open segment;

and everything else is on the host. Two partial placements with the same state have the
same cheapest completion, so keeping the cheaper one per state is exact. Dead tensors
leave the state, which keeps it small (a handful of states on CNNs: a residual block has
two live tensors). Should a frontier ever exceed ``max_states``, the program keeps the
``max_states`` cheapest states (a beam) and says so: :attr:`Solution.exact` is False and
the result is not proven optimal.
"""
from __future__ import annotations

from dataclasses import dataclass

from tessera.errors import CompileError

from .problem import ACCEL, CPU, VIEW, NodeCost, Problem

__all__ = ["MAX_STATES", "Solution", "solve"]

#: The widest frontier kept exactly; beyond it, the cheapest this many (a beam).
MAX_STATES = 4096


@dataclass(frozen=True)
class Solution:
    """The cheapest placement found, its projected latency, and whether it is proven
    optimal (False when a frontier had to be cut to a beam)."""

    targets: tuple[str, ...]
    seconds: float
    exact: bool
    widest_frontier: int


#: (segment open, live tensors the open segment wrote, live host tensors written into it)
_State = tuple[bool, frozenset, frozenset]
_CLOSED: _State = (False, frozenset(), frozenset())


def solve(problem: Problem, max_states: int = MAX_STATES) -> Solution:
    """The placement of ``problem``'s nodes with the least projected sequential latency
    (:func:`~.problem.evaluate` of it equals :attr:`Solution.seconds`)."""
    last = problem.last_reads()
    frontier: dict[_State, float] = {_CLOSED: 0.0}
    history: list[dict[_State, tuple[_State, str]]] = []
    exact, widest = True, 1
    for i, node in enumerate(problem.nodes):
        nxt: dict[_State, float] = {}
        back: dict[_State, tuple[_State, str]] = {}
        for state, cost in frontier.items():
            for target, step, new in _moves(problem, node, state):
                new = _forget_dead(new, last, i)
                if cost + step < nxt.get(new, float("inf")):
                    nxt[new] = cost + step
                    back[new] = (state, target)
        if not nxt:
            raise CompileError(f"node {node.name!r} can be placed nowhere: it has no CPU "
                               "kernel and, on the accelerator, its inputs must be written "
                               "by its own segment, which no placement of its producers "
                               "achieves", op=node.name)
        widest = max(widest, len(nxt))
        if len(nxt) > max_states:
            exact = False
            nxt = dict(sorted(nxt.items(), key=lambda kv: kv[1])[:max_states])
        frontier = nxt
        history.append(back)
    best, seconds = min(((s, c + _close(problem, s)) for s, c in frontier.items()),
                        key=lambda sc: sc[1])
    return Solution(_walk_back(history, best), seconds, exact, widest)


def _moves(problem: Problem, node: NodeCost, state: _State):
    """``(target, cost of this step, state after it)`` for each place ``node`` may run."""
    is_open, in_segment, written = state
    if node.view or node.cpu is not None:
        # a host node ends the open segment: what it wrote and is live is read back
        here = 0.0 if node.view else node.cpu
        yield (VIEW if node.view else CPU), here + _close(problem, state), _CLOSED
    if node.view or node.accel is None:
        return
    if node.in_place and not (is_open and in_segment.issuperset(node.inputs)):
        return
    fresh = [t for t in node.inputs if t not in in_segment and t not in written]
    step = (node.accel + (0.0 if is_open else problem.launch)
            + sum(problem.transfer[t] for t in fresh))
    yield ACCEL, step, (True, in_segment | frozenset(node.outputs), written | frozenset(fresh))


def _close(problem: Problem, state: _State) -> float:
    """Reading back the live tensors the open segment wrote, when it ends."""
    return sum(problem.transfer[t] for t in state[1])


def _forget_dead(state: _State, last: dict[str, int], i: int) -> _State:
    """``state`` without the tensors nothing after node ``i`` reads."""
    is_open, in_segment, written = state
    if not is_open:
        return _CLOSED
    return (True, frozenset(t for t in in_segment if last.get(t, -1) > i),
            frozenset(t for t in written if last.get(t, -1) > i))


def _walk_back(history: list[dict[_State, tuple[_State, str]]], state: _State) -> tuple[str, ...]:
    targets = []
    for back in reversed(history):
        state, target = back[state]
        targets.append(target)
    return tuple(reversed(targets))
