"""Synthetic input structures for tests and benchmarks, in the forms
:func:`tessera.recursive.structure.linearize` accepts.

* :func:`sst_like_trees`: binary parse trees with the Stanford Sentiment Treebank's size
  distribution (CORTEX's TreeFC/TreeGRU/TreeLSTM/MV-RNN inputs);
* :func:`perfect_tree`: a perfect binary tree (CORTEX's TreeFC, height 7);
* :func:`grid_dag`: the DAG-RNN's image grid;
* :func:`random_sequence`: a sequence of word ids.
"""
from __future__ import annotations

import numpy as np

from tessera.errors import StructureError

from .structure import Dag

#: Sentence length (leaves per tree) of :func:`sst_like_trees`:
#: ``SST_MIN_LEAVES + round(Gamma(shape, scale))`` clipped to ``SST_MAX_LEAVES``, the
#: gamma's mean ``19 - 2 = 17`` and standard deviation 9.
SST_MIN_LEAVES, SST_MAX_LEAVES = 2, 56
SST_GAMMA_SHAPE = (17 / 9) ** 2          # mean**2 / var = 3.57
SST_GAMMA_SCALE = 9 ** 2 / 17            # var / mean = 4.76
#: Chance that a leaf of a span goes to the left part in :func:`sst_like_trees`'s split;
#: below 1/2, so the trees lean right-branching as English parses do.
SST_LEFT_BIAS = 0.35


def _check_count(name: str, value: int, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise StructureError(f"{name} is {value!r}; give an int >= {least}")


def sst_like_trees(count: int, *, seed: int = 0, vocab: int = 20000) -> list:
    """``count`` synthetic binary parse trees shaped like the Stanford Sentiment Treebank's,
    as nested tuples (leaves are word ids below ``vocab``); the same ``seed`` gives the
    same trees.

    SST (Socher et al., 2013) has 11,855 sentences (8,544 in the training split), each
    with a binary constituency parse tree; sentences are about 19 tokens long on average
    (from 1 to about 56). Here a tree's number of leaves is
    ``2 + round(Gamma(shape=3.57, scale=4.76))`` clipped to 56: the gamma has mean 17 and
    standard deviation 9, so the leaves have mean about 19, standard deviation about 9,
    minimum 2 (every tree has a root over two words) and maximum 56. The bracketing splits
    a span of ``n`` leaves recursively into a left part of ``1 + Binomial(n - 2, 0.35)``
    leaves and a right part of the rest: left parts are the smaller on average, so the
    trees lean right-branching, as English parses do.
    """
    _check_count("count", count, 0)
    _check_count("vocab", vocab, 1)
    rng = np.random.default_rng(seed)
    sizes = SST_MIN_LEAVES + np.rint(rng.gamma(SST_GAMMA_SHAPE, SST_GAMMA_SCALE, count))
    sizes = np.minimum(sizes, SST_MAX_LEAVES).astype(int)
    return [_bracket(rng.integers(0, vocab, n).tolist(), rng) for n in sizes]


def _bracket(words: list[int], rng: np.random.Generator) -> object:
    """``words`` as a binary tree by the biased recursive split of
    :func:`sst_like_trees`, built bottom-up without recursion."""
    # Each work item: (first word, number of words); splits are drawn top-down, in
    # pre-order, and the tuples are assembled in the reverse order.
    spans, todo = [], [(0, len(words))]
    while todo:
        first, n = todo.pop()
        left = 0 if n == 1 else 1 + int(rng.binomial(n - 2, SST_LEFT_BIAS))
        spans.append((first, n, left))
        if n > 1:
            todo.append((first + left, n - left))
            todo.append((first, left))
    built: dict[tuple[int, int], object] = {}
    for first, n, left in reversed(spans):
        built[first, n] = words[first] if n == 1 else (
            built.pop((first, left)), built.pop((first + left, n - left)))
    return built[0, len(words)]


def perfect_tree(height: int, *, first_input: int = 0) -> object:
    """A perfect binary tree of ``height`` as nested tuples, its leaves the inputs
    ``first_input, first_input + 1, ...`` from left to right. Height counts edges from
    the root to a leaf, as CORTEX does: height 7 has 2**7 = 128 leaves and 255 nodes
    (8 levels); height 0 is a single leaf."""
    _check_count("height", height, 0)
    level: list[object] = list(range(first_input, first_input + 2 ** height))
    while len(level) > 1:
        level = [(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def grid_dag(rows: int, cols: int) -> Dag:
    """The DAG-RNN's grid of ``rows`` x ``cols`` pixels: node ``(i, j)`` reads ``(i - 1,
    j)`` in slot 0 and ``(i, j - 1)`` in slot 1, the ones that exist (the first row and
    column read one neighbour, in slot 0; ``(0, 0)`` none), with input index
    ``i * cols + j``; the single sink is ``(rows - 1, cols - 1)``. Use ``max_children=2``.
    """
    _check_count("rows", rows, 1)
    _check_count("cols", cols, 1)
    preds = {}
    for i in range(rows):
        for j in range(cols):
            preds[i, j] = [p for p, ok in (((i - 1, j), i > 0), ((i, j - 1), j > 0)) if ok]
    return Dag(preds, {(i, j): i * cols + j for i in range(rows) for j in range(cols)})


def random_sequence(length: int, *, seed: int = 0, vocab: int = 20000) -> np.ndarray:
    """A sequence of ``length`` word ids below ``vocab``, uniform, the same for a seed."""
    _check_count("length", length, 1)
    _check_count("vocab", vocab, 1)
    return np.random.default_rng(seed).integers(0, vocab, length, dtype=np.int64)
