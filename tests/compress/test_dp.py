"""The per-layer sparsity DP against brute force over every combination."""
from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.compress import dp


def _instance(seed: int, layers: int, options: int):
    rng = np.random.default_rng(seed)
    gains, errors = [], []
    for _ in range(layers):
        macs = float(rng.integers(100, 10_000))
        fractions = np.sort(rng.uniform(0, 1, options - 1))
        gains.append([0.0, *(macs * fractions)])
        errors.append([0.0, *np.sort(rng.uniform(0, 0.5, options - 1))])
    return gains, errors


def _brute(gains, errors, cost):
    """Every combination: (options, removed, summed cost)."""
    for combo in itertools.product(*(range(len(g)) for g in gains)):
        yield (list(combo), sum(g[j] for g, j in zip(gains, combo)),
               sum(cost(e[j]) for e, j in zip(errors, combo)))


def _steps(limit, levels):
    step = limit / levels
    return lambda e: math.ceil(e / step - 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(2, 4), st.floats(0.01, 1.5))
def test_budget_choice_removes_the_most_within_the_budget(seed, layers, options, budget):
    gains, errors = _instance(seed, layers, options)
    levels = 200
    choice = dp.choose(gains, errors, limit=budget, levels=levels)
    # the unrounded summed error is within the budget
    assert choice.error <= budget + 1e-12
    # optimal on the DP's own (rounded-up) errors ...
    cost = _steps(budget, levels)
    best = max(r for _, r, c in _brute(gains, errors, cost) if c <= levels)
    assert math.isclose(choice.removed, best, rel_tol=1e-12)
    # ... so at least as good as any choice with a margin of one step per layer
    margin = layers * budget / levels
    exact = max(r for o, r, _ in _brute(gains, errors, lambda e: e)
                if sum(e[j] for e, j in zip(errors, o)) <= budget - margin)
    assert choice.removed >= exact - 1e-9


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(2, 4),
       st.one_of(st.just(1.0), st.floats(0, 1)))
def test_target_choice_has_the_least_error_meeting_the_target(seed, layers, options, frac):
    gains, errors = _instance(seed, layers, options)
    total_best = sum(max(g) for g in gains)
    target = frac * total_best
    limit = sum(max(e) for e in errors)
    levels = 400
    choice = dp.choose(gains, errors, limit=None, target=target, levels=levels)
    assert choice.options is not None and choice.removed >= target * (1 - 1e-12)
    cost = _steps(limit, levels)
    least = min(c for _, r, c in _brute(gains, errors, cost) if r >= target * (1 - 1e-12))
    assert sum(cost(e[j]) for e, j in zip(errors, choice.options)) == least
    exact = min(sum(e[j] for e, j in zip(errors, o)) for o, r, _ in
                _brute(gains, errors, lambda e: e) if r >= target * (1 - 1e-12))
    assert choice.error <= exact + layers * limit / levels + 1e-12


def test_the_sparsest_combination_is_reachable_without_a_budget():
    """Errors rounded up must not push the all-sparsest choice off the table."""
    gains, errors = _instance(7, 6, 4)
    total = sum(max(g) for g in gains)
    choice = dp.choose(gains, errors, limit=None, target=total, levels=10)
    assert choice.options == [len(g) - 1 for g in gains]


def test_unreachable_target_reports_the_best_reachable():
    gains = [[0.0, 50.0], [0.0, 30.0]]
    errors = [[0.0, 0.2], [0.0, 0.3]]
    choice = dp.choose(gains, errors, limit=0.25, target=60.0)
    assert choice.options is None and choice.removed == 50.0
    both = dp.choose(gains, errors, limit=0.25, target=40.0)
    assert both.options == [1, 0] and both.error == 0.2


def test_zero_budget_takes_only_free_options():
    gains = [[0.0, 50.0, 70.0], [0.0, 30.0]]
    errors = [[0.0, 0.0, 0.1], [0.0, 1e-6]]
    assert dp.choose(gains, errors, limit=0.0).options == [1, 0]
