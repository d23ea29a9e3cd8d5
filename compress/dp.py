"""The per-layer sparsity choice: a knapsack over layers with a discretised error axis.

Each layer ``i`` has options ``j`` (its candidate sparsities), each removing ``gain[i][j]``
MACs at an error ``error[i][j]`` (measured with that layer alone pruned); the errors of
several layers are taken as adding up. The error axis from 0 to ``limit`` is cut into
``levels`` steps and each option's error rounded *up* to a step, so a choice the DP finds
within ``limit`` is within it in the unrounded sum too. ``best[c]`` is the most MACs
removable at a rounded error of at most ``c`` steps; one pass per layer, as in the IIS
group's per-layer sparsity DP (ICPADS'23).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Choice", "choose", "LEVELS"]

#: Steps of the error axis: the rounding costs at most ``layers x limit / LEVELS`` error.
LEVELS = 2000


@dataclass(frozen=True)
class Choice:
    """The DP's answer: an option per layer, or (``options`` None) the best it could do."""

    options: list[int] | None     #: option index per layer; None if the target is unmet
    removed: float                #: MACs removed (the best reachable one when unmet)
    error: float                  #: summed (unrounded) error of the options


def _costs(errors: Sequence[Sequence[float]], step: float, levels: int) -> list[np.ndarray]:
    """Each option's error in steps, rounded up (past ``levels``: out of reach)."""
    # an error a hair above a whole step (float noise) must not cost a step more
    return [np.array([math.ceil(e / step - 1e-9) if e / step <= levels + 1 else levels + 1
                      for e in layer], int) for layer in errors]


def _tables(gains: Sequence[Sequence[float]], costs: list[np.ndarray], levels: int
            ) -> tuple[np.ndarray, list[np.ndarray]]:
    """``best`` over the error axis after every layer, and each layer's argmax option."""
    best = np.zeros(levels + 1)
    picks = []
    for gain, cost in zip(gains, costs):
        new = np.full(levels + 1, -np.inf)
        pick = np.full(levels + 1, -1, int)
        for j, (g, c) in enumerate(zip(gain, cost)):
            if c > levels:
                continue
            shifted = np.full(levels + 1, -np.inf)
            shifted[c:] = best[:levels + 1 - c] + g
            better = shifted > new
            new[better], pick[better] = shifted[better], j
        best = new
        picks.append(pick)
    return best, picks


def choose(gains: Sequence[Sequence[float]], errors: Sequence[Sequence[float]], *,
           limit: float | None, target: float | None = None, levels: int = LEVELS) -> Choice:
    """The options, one per layer, removing the most MACs at a summed error within
    ``limit`` -- or, when ``target`` is given, the least summed error that removes at
    least ``target`` MACs within ``limit`` (None: any error). Every layer needs an option
    of error 0 (its dense form), so some choice always fits."""
    if limit is None:
        # the steps of the largest sum; a step more per layer so that rounding up leaves
        # every combination within the table
        top = sum(max(e) for e in errors)
        step = top / levels if top > 0 else 1.0
        levels += len(errors)
    else:
        step = limit / levels if limit > 0 else 1.0
        levels = levels if limit > 0 else 0
    costs = _costs(errors, step, levels)
    best, picks = _tables(gains, costs, levels)
    if target is None:
        level = levels
    else:
        reached = np.flatnonzero(best >= target * (1 - 1e-12))
        if not reached.size:
            return Choice(None, float(best[levels]), math.nan)
        level = int(reached[0])
    options = []
    for pick, cost in zip(reversed(picks), reversed(costs)):
        j = int(pick[level])
        options.append(j)
        level -= int(cost[j])
    options.reverse()
    return Choice(options, float(sum(g[j] for g, j in zip(gains, options))),
                  float(sum(e[j] for e, j in zip(errors, options))))
