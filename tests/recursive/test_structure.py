"""The linearizer (tessera.recursive.structure) and the structure generators
(tessera.recursive.generators): invariants of the numbering on random structures of every
form, the inverse mapping back to the caller's structure, and the errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.errors import StructureError
from tessera.recursive.generators import (SST_MAX_LEAVES, SST_MIN_LEAVES, grid_dag,
                                          perfect_tree, random_sequence, sst_like_trees)
from tessera.recursive.structure import Dag, ParentArray, Tree, linearize

# --- strategies -------------------------------------------------------------------------

inputs = st.one_of(st.integers(0, 60), st.none())


def nested_trees(k: int, leaves=inputs, max_leaves: int = 25):
    """Nested tuples, leaves ints or None (drawn from ``leaves``), 1..k children per
    internal node."""
    return st.recursive(leaves, lambda kids: st.lists(kids, min_size=1, max_size=k)
                        .map(tuple), max_leaves=max_leaves)


def input_trees(k: int, leaves=inputs, max_leaves: int = 25):
    """Trees of Tree nodes carrying inputs, mixed with plain leaves and tuples."""
    leaf = st.one_of(leaves, st.builds(Tree, leaves))
    return st.recursive(leaf, lambda kids: st.one_of(
        st.builds(Tree, leaves, st.lists(kids, min_size=1, max_size=k).map(tuple)),
        st.lists(kids, min_size=1, max_size=k).map(tuple)), max_leaves=max_leaves)


@st.composite
def parent_arrays(draw, k: int):
    """A random tree with at most k children per node, its nodes relabelled at random."""
    n = draw(st.integers(1, 30))
    parents, fanout = [-1], [0]
    for i in range(1, n):
        p = draw(st.sampled_from([j for j in range(i) if fanout[j] < k]))
        parents.append(p)
        fanout[p] += 1
        fanout.append(0)
    label = draw(st.permutations(range(n)))
    relabelled = [-1] * n
    for i, p in enumerate(parents):
        relabelled[label[i]] = -1 if p < 0 else label[p]
    given_inputs = draw(st.none() | st.lists(inputs | st.just(-1), min_size=n, max_size=n))
    return ParentArray(relabelled, given_inputs)


class DuckGraph:
    """The part of networkx.DiGraph the linearizer uses: ``nodes`` (node -> attributes)
    and ``predecessors``."""

    def __init__(self, preds, node_inputs):
        self._preds = preds
        self.nodes = {n: ({"input": node_inputs[n]} if n in node_inputs else {})
                      for n in preds}

    def predecessors(self, node):
        return iter(self._preds[node])


@st.composite
def dags(draw, k: int):
    """A random DAG with one sink (a tree towards the sink plus extra edges), arbitrary
    node names and key order, as a Dag, a plain mapping or a networkx-like graph."""
    n = draw(st.integers(1, 20))
    preds: list[list[int]] = [[] for _ in range(n)]
    for i in range(n - 2, -1, -1):          # every node but n-1 feeds a later node
        preds[draw(st.sampled_from([j for j in range(i + 1, n) if len(preds[j]) < k]))
              ].append(i)
    for i, j in draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                              max_size=10)):
        if i < j and len(preds[j]) < k and i not in preds[j]:
            preds[j].append(i)
    names = [("v", i) if i % 2 else f"n{i}" for i in draw(st.permutations(range(n)))]
    order = draw(st.permutations(range(n)))
    mapping = {names[j]: [names[i] for i in draw(st.permutations(preds[j]))]
               for j in order}
    node_inputs = {names[j]: draw(inputs) for j in draw(st.sets(st.integers(0, n - 1)))}
    form = draw(st.sampled_from(["dag", "mapping", "graph"]))
    if form == "mapping":
        return mapping
    return Dag(mapping, node_inputs) if form == "dag" else DuckGraph(mapping, node_inputs)


sequences = st.one_of(st.lists(inputs, min_size=1, max_size=30),
                      st.lists(st.integers(0, 60), min_size=1, max_size=30).map(np.array))

# --- invariants -------------------------------------------------------------------------


def _rows(lin, node):
    return [int(c) for c in lin.children[node] if c >= 0]


def check_invariants(lin, sizes):
    """Everything the module doc promises of a numbering of structures of ``sizes``."""
    n, k = lin.num_nodes, lin.max_children
    ch = lin.children
    assert n == sum(sizes) and lin.num_structures == len(sizes)
    assert ch.shape == (n, k) and ch.dtype == np.int64
    present = ch >= 0
    assert np.all(ch < np.arange(n)[:, None]), "a child id not below its parent's"
    assert np.all(present[:, 1:] <= present[:, :-1]), "an absent slot before a present one"
    assert lin.batches[0][0] == 0 and lin.batches[-1][1] == n
    assert all(s < e for s, e in lin.batches)
    assert all(a[1] == b[0] for a, b in zip(lin.batches, lin.batches[1:]))
    heights = np.zeros(n, dtype=np.int64)
    for i in range(n):
        heights[i] = 1 + max(heights[c] for c in _rows(lin, i)) if present[i, 0] else 0
    for b, (s, e) in enumerate(lin.batches):
        assert np.all(heights[s:e] == b)
    assert np.array_equal(lin.heights, heights)
    assert np.array_equal(lin.is_leaf, heights == 0)
    parent_of_edge = np.nonzero(present)[0]
    assert np.all(lin.structure[ch[present]] == lin.structure[parent_of_edge])
    assert np.array_equal(lin.structure[lin.roots], np.arange(len(sizes)))
    has_parent = np.zeros(n, dtype=bool)
    has_parent[ch[present]] = True
    assert set(np.flatnonzero(~has_parent).tolist()) == set(lin.roots.tolist())
    for s, size in enumerate(sizes):
        assert sorted(lin.source_index[lin.structure == s].tolist()) == list(range(size))
    check_order(lin, has_parent)


def check_order(lin, has_parent):
    """Inside a batch: nodes by (smallest (parent id, slot)), parentless ones last, by
    structure."""
    k = lin.max_children
    key = np.full(lin.num_nodes, np.iinfo(np.int64).max)
    for i in range(lin.num_nodes):
        for slot, c in enumerate(_rows(lin, i)):
            key[c] = min(key[c], i * k + slot)
    for s, e in lin.batches:
        inner = key[s:e][has_parent[s:e]]
        assert np.all(np.diff(inner) > 0)
        assert np.all(has_parent[s:s + len(inner)])
        assert np.all(np.diff(lin.structure[s + len(inner):e]) > 0)


def rebuild(lin, node):
    """The canonical (input or None, children) form of the sub-tree at ``node``."""
    value = int(lin.inputs[node])
    return (None if value < 0 else value, tuple(rebuild(lin, c) for c in _rows(lin, node)))


def canonical(tree):
    """A nested-tuple or Tree structure in rebuild's canonical form."""
    if isinstance(tree, Tree):
        return (tree.input, tuple(canonical(c) for c in tree.children))
    if isinstance(tree, tuple):
        return (None, tuple(canonical(c) for c in tree))
    return (tree, ())


def _size(tree):
    return 1 + sum(map(_size, tree.children if isinstance(tree, Tree) else tree)) \
        if isinstance(tree, (tuple, Tree)) else 1


def _by_source(lin, s):
    """Global ids of structure ``s``'s nodes, indexed by their source index."""
    ids = np.flatnonzero(lin.structure == s)
    out = np.empty(len(ids), dtype=np.int64)
    out[lin.source_index[ids]] = ids
    return out


# --- properties -------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3).flatmap(lambda k: st.tuples(
    st.just(k), st.lists(st.one_of(nested_trees(k), input_trees(k)), min_size=1,
                         max_size=4))))
def test_nested_trees(case):
    k, trees = case
    lin = linearize(trees, kind="tree", max_children=k)
    check_invariants(lin, [_size(t) for t in trees])
    for s, tree in enumerate(trees):
        assert rebuild(lin, lin.roots[s]) == canonical(tree)
        post_order = _by_source(lin, s)      # nested forms number in post-order
        assert post_order[-1] == lin.roots[s]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3).flatmap(lambda k: st.tuples(
    st.just(k), st.lists(parent_arrays(k), min_size=1, max_size=4))))
def test_parent_arrays(case):
    k, trees = case
    lin = linearize(trees, max_children=k)
    check_invariants(lin, [len(t.parents) for t in trees])
    for s, tree in enumerate(trees):
        ids = _by_source(lin, s)
        parents = [-1] * len(ids)
        for local, node in enumerate(ids):
            kids = [int(lin.source_index[c]) for c in _rows(lin, node)]
            assert kids == sorted(kids)
            for c in kids:
                parents[c] = local
        assert parents == list(tree.parents)
        expected = tree.inputs or [None] * len(ids)
        assert lin.inputs[ids].tolist() == [-1 if v is None else v for v in expected]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3).flatmap(lambda k: st.tuples(
    st.just(k), st.lists(dags(k), min_size=1, max_size=3))))
def test_dags(case):
    k, graphs = case
    lin = linearize(graphs, kind="dag", max_children=k)
    forms = [(g.preds, g.inputs) if isinstance(g, Dag) else (g, {}) if isinstance(g, dict)
             else (g._preds, {n: a["input"] for n, a in g.nodes.items() if a})
             for g in graphs]
    check_invariants(lin, [len(preds) for preds, _ in forms])
    for s, (preds, node_inputs) in enumerate(forms):
        names = list(preds)
        for local, node in enumerate(_by_source(lin, s)):
            name = names[local]
            assert [names[lin.source_index[c]] for c in _rows(lin, node)] == preds[name]
            value = node_inputs.get(name)
            assert lin.inputs[node] == (-1 if value is None else value)


@settings(max_examples=60, deadline=None)
@given(st.lists(sequences, min_size=1, max_size=5), st.integers(1, 3))
def test_sequences(seqs, k):
    lin = linearize(seqs, kind="sequence", max_children=k)
    check_invariants(lin, [len(q) for q in seqs])
    for s, seq in enumerate(seqs):
        ids = _by_source(lin, s)
        assert lin.inputs[ids].tolist() == [-1 if v is None else v for v in seq]
        assert [_rows(lin, node) for node in ids] == [[]] + [[c] for c in ids[:-1]]
        assert lin.roots[s] == ids[-1]
        assert lin.structure[ids].tolist() == [s] * len(seq)


def test_small_tree_numbering():
    """A hand-checked numbering: leaves first, by parent; the lone leaf tree last."""
    lin = linearize([((1, 2), (3, 4)), 5, (6, (7, 8))])
    assert lin.batches == ((0, 8), (8, 11), (11, 13))
    assert lin.inputs.tolist() == [1, 2, 3, 4, 7, 8, 6, 5] + [-1] * 5
    assert lin.children[8:].tolist() == [[0, 1], [2, 3], [4, 5], [8, 9], [6, 10]]
    assert lin.roots.tolist() == [11, 7, 12]
    with pytest.raises(ValueError):
        lin.children[0, 0] = 3               # read-only


def test_perfect_trees_have_constant_strides():
    """Children of consecutive parents sit at stride 2, so gathers merge into runs."""
    lin = linearize([perfect_tree(5, first_input=100 * i) for i in range(3)])
    for s, e in lin.batches[1:]:
        assert np.all(np.diff(lin.children[s:e, 0]) == 2)
        assert np.array_equal(lin.children[s:e, 1], lin.children[s:e, 0] + 1)
    assert lin.inputs[:96].tolist() == [100 * i + j for i in range(3) for j in range(32)]


def test_shared_subtuples_are_copied():
    """Python merges equal constant tuples; a tree copies a shared one per parent."""
    pair = (1, 2)
    lin = linearize([(pair, pair)])
    assert lin.num_nodes == 7 and rebuild(lin, lin.roots[0]) == canonical(((1, 2), (1, 2)))


def test_deep_structures_walk_iteratively():
    chain = 0
    for _ in range(5000):
        chain = (chain,)
    lin = linearize([chain], max_children=1)
    assert lin.num_nodes == 5001 and len(lin.batches) == 5001
    assert lin.children[1:, 0].tolist() == list(range(5000))
    parents = ParentArray([-1] + list(range(4999)))
    assert len(linearize([parents], max_children=1).batches) == 5000
    dag = {i: [i - 1] if i else [] for i in range(5000)}
    assert len(linearize([dag], kind="dag", max_children=1).batches) == 5000


# --- errors -----------------------------------------------------------------------------

def _self_containing():
    node = [1]
    node.append(node)
    return node


def _deep_cycle():
    top = [None]
    outer = top
    for _ in range(3000):
        outer = [outer]
    top[0] = outer
    return top


def _tree_containing_itself():
    kids = [3]
    tree = Tree(7, kids)
    kids.append(tree)
    return tree


def _exponential_sharing():
    tree = (1, 2)
    for _ in range(60):
        tree = (tree, tree)
    return tree


ERRORS = [
    ([], {}, "batch is empty"),
    ([((1, 2), 3)], {"kind": "forest"}, "unknown structure kind 'forest'"),
    ([(1, 2)], {"max_children": 0}, "max_children is 0"),
    ({"a": []}, {"kind": "dag"}, r"batch \(a list\).*wrap it in a list"),
    ([(1, 2), ()], {}, r"structure 1 of the batch: the root is an empty tuple"),
    ([(1, (2, ()))], {}, r"the node at path \[1\]\[1\] is an empty tuple"),
    ([[1, 2], []], {"kind": "sequence"}, "structure 1 .*sequence is empty"),
    ([{}], {"kind": "dag"}, "DAG has no nodes"),
    ([ParentArray([])], {}, "parent array is empty"),
    ([_self_containing()], {}, r"path \[1\] is the same object as one of its ancestors"),
    ([_deep_cycle()], {"max_children": 1}, "cycle"),
    ([_tree_containing_itself()], {}, r"path \[1\] is the same object"),
    ([ParentArray([-1, 2, 1])], {}, "node 1 is on a cycle"),
    ([ParentArray([-1, 0, 3, 3])], {}, "node 3 is on a cycle"),
    ([{"a": ["b"], "b": ["a"], "c": ["a"]}], {"kind": "dag"}, "on a cycle"),
    ([{"a": ["a"]}], {"kind": "dag"}, "node 'a' is on a cycle"),
    ([(1, (2, 3, 4))], {}, r"path \[1\] has 3 children, but the cell declares at most 2"),
    ([Tree(0, (1, 2, 3))], {}, "the root has 3 children"),
    ([ParentArray([-1, 0, 0, 0])], {}, "node 0 has 3 children"),
    ([{"x": [], "y": [], "z": ["x", "y"]}], {"kind": "dag", "max_children": 1},
     "node 'z' has 2 children.*max_children=2"),
    ([ParentArray([-1, 0, -1])], {}, r"2 roots \(nodes with parent -1: \[0, 2\]\)"),
    ([ParentArray([-1, 5])], {}, "node 1 has parent 5, outside"),
    ([ParentArray([-1, 0], inputs=[1])], {}, "inputs has 1 entries for 2 nodes"),
    ([(1.5, 2)], {}, r"path \[0\] has input 1.5 of type float"),
    ([("word", 2)], {}, "has input 'word' of type str"),
    ([(1, -3)], {}, r"path \[1\] has input -3"),
    ([(True, 1)], {}, "of type bool"),
    ([Tree("x", (1, 2))], {}, "the root has input 'x'"),
    ([[1, 2.5]], {"kind": "sequence"}, "element 1 has input 2.5"),
    ([np.zeros((2, 2), dtype=int)], {"kind": "sequence"}, "2-D array"),
    ([5], {"kind": "sequence"}, "input indices, not an object of type int"),
    ([{"a": [], "b": [], "c": ["a"]}], {"kind": "dag"}, r"2 sinks \('b', 'c'\)"),
    ([{"a": [], "c": ["a", "zz"]}], {"kind": "dag"}, "'zz', a predecessor of node 'c', "
                                                     "is not a node"),
    ([Dag({"a": []}, {"a": -1})], {"kind": "dag"}, "node 'a' has input -1"),
    ([(1, 2)], {"kind": "dag"}, "a DAG is a mapping"),
    ([{"a": []}], {}, "a tree is nested tuples.*kind='dag'"),
    ([_exponential_sharing()], {}, "expands to .* nodes.*kind='dag'"),
]


@pytest.mark.parametrize("structures, kwargs, message", ERRORS)
def test_errors(structures, kwargs, message):
    with pytest.raises(StructureError, match=message):
        linearize(structures, **kwargs)


# --- generators -------------------------------------------------------------------------

def _leaves(tree):
    """Leaf values of a nested tuple, left to right, and whether every node is binary."""
    out, binary, stack = [], True, [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple):
            binary &= len(node) == 2
            stack.extend(reversed(node))
        else:
            out.append(node)
    return out, binary


def test_sst_like_trees_match_the_treebank_sizes():
    trees = sst_like_trees(1000, seed=0, vocab=500)
    leaves = [_leaves(t) for t in trees]
    counts = np.array([len(words) for words, _ in leaves])
    # the documented distribution's mean is 19; 1000 samples of std 9 put the sample
    # mean within 1 of it (3.5 standard errors)
    assert abs(counts.mean() - 19) < 1
    assert 7 < counts.std() < 11
    assert SST_MIN_LEAVES <= counts.min() and counts.max() <= SST_MAX_LEAVES
    assert all(binary for _, binary in leaves)
    assert all(0 <= w < 500 for words, _ in leaves for w in words)
    assert sst_like_trees(20, seed=4) == sst_like_trees(20, seed=4)
    assert sst_like_trees(20, seed=4) != sst_like_trees(20, seed=5)
    # right-branching lean: the root's left part is the smaller on average
    left = [len(_leaves(t[0])[0]) / len(_leaves(t)[0]) for t in trees]
    assert np.mean(left) < 0.5
    lin = linearize(trees[:10])
    assert lin.num_nodes == sum(2 * c - 1 for c in counts[:10])


def test_perfect_tree():
    lin = linearize([perfect_tree(7)])
    assert lin.num_nodes == 255 and len(lin.batches) == 8
    assert lin.batches[0] == (0, 128)
    assert lin.inputs[:128].tolist() == list(range(128))
    assert perfect_tree(0, first_input=9) == 9
    assert perfect_tree(1, first_input=3) == (3, 4)


def test_grid_dag():
    grid = grid_dag(3, 4)
    lin = linearize([grid], kind="dag")
    assert lin.num_nodes == 12 and len(lin.batches) == 6
    assert lin.inputs[lin.roots[0]] == 11
    for node in range(12):
        i, j = divmod(int(lin.inputs[node]), 4)
        expected = [p * 4 + q for p, q, ok in ((i - 1, j, i > 0), (i, j - 1, j > 0)) if ok]
        assert lin.inputs[_rows(lin, node)].tolist() == expected
        assert lin.heights[node] == i + j
    assert grid.preds[0, 1] == [(0, 0)] and grid.preds[2, 3] == [(1, 3), (2, 2)]


def test_random_sequence():
    seq = random_sequence(50, seed=3, vocab=7)
    assert seq.shape == (50,) and seq.min() >= 0 and seq.max() < 7
    assert np.array_equal(seq, random_sequence(50, seed=3, vocab=7))
    assert linearize([seq], kind="sequence", max_children=1).num_nodes == 50


@pytest.mark.parametrize("call", [lambda: perfect_tree(-1), lambda: grid_dag(0, 3),
                                  lambda: sst_like_trees(2, vocab=0),
                                  lambda: random_sequence(0)])
def test_generator_arguments(call):
    with pytest.raises(StructureError, match="give an int >="):
        call()
