"""The host-side linearizer: a batch of trees, DAGs or sequences numbered for one program.

CORTEX's linearizer is the recursive program with the tensor math stripped: it walks the
input structures (no arithmetic) and emits the index arrays the device program loops
over. :func:`linearize` numbers every node of a batch of structures so that

* nodes are grouped by *height* (a leaf has height 0, any other node 1 + the largest
  height of its children) and each height is one contiguous *batch* of node ids, leaves
  first: every node's children are in earlier batches, so a batch's nodes are independent
  and one GEMM row block can compute them all;
* inside a batch, nodes follow their parents (the rule below), so that the children in
  slot ``k`` of consecutive parents sit at a constant stride where the structure allows
  it (in a perfect binary tree: stride 2), which lets the program's DMA gathers merge
  them into few runs.

**Order inside a batch.** Batches are numbered from the highest down. A node's *key* is
``(p, k)`` for the parent ``p`` (its final id, already known: parents are higher) and the
slot ``k`` it fills there, the smallest such pair if the node has several parents (a
DAG); nodes of a batch are sorted by key. Nodes with no parent (the outputs: a tree's
root, a sequence's last element, a DAG's sink) come after the others of their batch, in
the order of their structures in the batch.

Accepted structures, by ``kind`` (``max_children`` is the cell's declared maximum; a node
with more children is an error):

``"tree"``
    * nested tuples or lists: a leaf is a non-negative int (its input index, e.g. a word
      id) or ``None`` (no input); an internal node is a tuple/list of its 1 to
      ``max_children`` children and has no input. ``((3, 4), 5)`` is a root whose slot 0
      holds the node over words 3 and 4 and whose slot 1 is the leaf of word 5. A tuple
      object that appears under several parents (Python merges equal constant tuples, so
      ``((1, 2), (1, 2))`` holds one object twice) is a value: it is copied for each
      parent, as a tree has no shared nodes (up to :data:`MAX_TREE_NODES` in all);
    * :class:`Tree` nodes, for trees whose internal nodes carry an input too (a TreeRNN
      with a word at every node): ``Tree(7, (Tree(3), Tree(4)))`` (``Tree(3)`` is the
      leaf of input 3); a :class:`Tree`'s children may be ints, ``None`` or tuples too;
    * :class:`ParentArray`: ``ParentArray([-1, 0, 0], inputs=[-1, 3, 4])`` is a root (node
      0) with children 1 and 2, children ordered by their index in the array.

``"dag"``
    * a mapping ``{node: [predecessor, ...]}`` whose keys are every node (node ids are
      any hashables); a node's predecessors are its children (the states it reads), in
      slot order: ``{"a": [], "b": [], "c": ["a", "b"]}``. No node has an input;
    * :class:`Dag`: the same mapping and a mapping of inputs,
      ``Dag({"a": [], "b": ["a"]}, inputs={"a": 0, "b": 1})`` (a node left out has none);
    * a networkx-like graph: any object with ``.nodes`` and ``.predecessors(n)``, its
      inputs from the node attribute ``"input"`` (``graph.nodes[n].get("input")``).

    A DAG has a single sink (its output); several sinks are an error.

``"sequence"``
    a list, tuple or 1-D array of input indices (``None`` for no input), e.g.
    ``[5, 9, 2]``: element ``t`` reads element ``t - 1`` in slot 0; the last element is
    the output.

The structures of a batch share the batches (a batch interleaves them), so one
structure's ids are not contiguous; ``structure`` and ``source_index`` map back.
Malformed input raises :class:`~tessera.errors.StructureError` before anything is
returned, naming the structure (its position in the batch) and the node. Walks are
iterative: deep structures (a chain of 5,000 nested 1-tuples) do not meet Python's
recursion limit, and cycles are detected, never followed. Cost: one Python step per node
of a tree, DAG or parent array (sequences are numpy only), then numpy: a sort and one
pass of a few vector operations per batch.
"""
from __future__ import annotations

import reprlib
from dataclasses import dataclass
from itertools import chain
from typing import Any, Mapping, Sequence

import numpy as np

from tessera.errors import StructureError

KINDS = ("sequence", "tree", "dag")

#: Most nodes a tree given as nested tuples with shared sub-tuples may expand to. Shared
#: sub-tuples are copied once per parent, so a few dozen levels of sharing describe more
#: nodes than memory holds; beyond this the input is almost certainly a DAG written as
#: tuples.
MAX_TREE_NODES = 1 << 22

_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother = 3, 40, 40


@dataclass(frozen=True)
class Tree:
    """A tree node that carries an input: ``input`` (an input index, or ``None``) and its
    ``children`` (:class:`Tree` nodes, ints, ``None`` or nested tuples), in slot order.
    ``Tree(i)`` is the leaf of input ``i``."""
    input: int | None = None
    children: Sequence[object] = ()


@dataclass(frozen=True)
class ParentArray:
    """A tree as ``parents[i]``, the index of node ``i``'s parent (``-1`` for the one
    root), and optionally ``inputs[i]`` (an input index or ``-1``/``None``; default: no
    inputs). A node's children are ordered by their indices."""
    parents: Sequence[int]
    inputs: Sequence[int | None] | None = None


@dataclass(frozen=True)
class Dag:
    """A DAG as ``preds[node]``, the list of the node's predecessors (its children, in
    slot order; every node is a key), and optionally ``inputs[node]``, its input index
    (a node left out, or ``None``, has no input)."""
    preds: Mapping[Any, Sequence[Any]]
    inputs: Mapping[Any, int | None] | None = None


@dataclass(frozen=True)
class Linearized:
    """A batch of structures numbered for one accelerator program (see the module doc).

    ``children[i, k]`` is the id of the child in slot ``k`` of node ``i`` or -1 (absent
    slots are at the end of the row); every child id is less than ``i``. ``inputs[i]`` is
    node ``i``'s input index (a row of the caller's input matrix) or -1. ``batches`` are
    the ``[start, end)`` id ranges in execution order, batch ``b`` holding exactly the
    nodes of height ``b``. ``roots[s]`` is the output node of structure ``s`` (a tree's
    root, a sequence's last element, a DAG's sink); ``structure[i]`` is the structure
    node ``i`` belongs to; ``source_index[i]`` is the node's index within its structure
    in the caller's terms: the array index of a :class:`ParentArray`, the position of a
    sequence element, the position in a DAG's node order (its mapping's keys, or
    ``graph.nodes``), the post-order position (children before parents, slot order) in
    nested tuples or :class:`Tree` nodes. The arrays are read-only.
    """
    kind: str
    max_children: int
    children: np.ndarray
    inputs: np.ndarray
    batches: tuple[tuple[int, int], ...]
    roots: np.ndarray
    structure: np.ndarray
    source_index: np.ndarray

    @property
    def num_nodes(self) -> int:
        """Nodes in the whole batch of structures."""
        return int(self.children.shape[0])

    @property
    def num_structures(self) -> int:
        """Structures in the batch."""
        return int(self.roots.shape[0])

    @property
    def is_leaf(self) -> np.ndarray:
        """``(N,)`` bool: the node has no children (exactly the nodes of batch 0)."""
        return self.children[:, 0] < 0

    @property
    def heights(self) -> np.ndarray:
        """``(N,)`` int64: each node's height, which is its batch's index."""
        sizes = [end - start for start, end in self.batches]
        return np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)


@dataclass
class _Parsed:
    """One structure in local ids: ``children`` ``(n, K)`` (-1 padded at the end),
    ``inputs`` and ``heights`` ``(n,)``, and the local id of its output node."""
    children: np.ndarray
    inputs: np.ndarray
    heights: np.ndarray
    root: int


def _error(at: int, what: str) -> StructureError:
    """The error about structure ``at`` (its position in the batch)."""
    return StructureError(f"structure {at} of the batch: {what}")


def _input_index(value: object, at: int, node: str) -> int:
    """``value`` as an input index: a non-negative int, or -1 for ``None``."""
    if value is None:
        return -1
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if value >= 0:
            return int(value)
        raise _error(at, f"{node} has input {int(value)}; an input index is a "
                     "non-negative int (a row of the input matrix), or None for no input")
    raise _error(at, f"{node} has input {_short.repr(value)} of type "
                 f"{type(value).__name__}; an input index is a non-negative int (a row "
                 "of the input matrix), or None for no input")


# --- trees as nested tuples / Tree nodes ------------------------------------------------

def _is_container(node: object) -> bool:
    """Whether a nested-tree node has children: a tuple, a list, or a Tree whose children
    are not an empty tuple/list (a Tree with malformed children is opened, and refused)."""
    if isinstance(node, Tree):
        kids = node.children
        return not (isinstance(kids, (tuple, list)) and len(kids) == 0)
    return isinstance(node, (tuple, list))


def _path_name(stack: list[list[Any]]) -> str:
    """The node being looked at, as its path of child slots from the root."""
    path = [frame[1] - 1 for frame in stack]
    return "the node at path " + "".join(f"[{i}]" for i in path) if path else "the root"


def _open_frame(node: object, start: int, at: int, stack: list[list[Any]],
                k: int) -> list[Any]:
    """A walk frame for a container (``stack`` holds its ancestors' frames): [children,
    next slot, child ids, input, first local id of its subtree, id(node)]; checks its
    number of children."""
    if isinstance(node, Tree):
        kids, inp = node.children, node.input
        if not (inp is None or type(inp) is int and inp >= 0):
            inp = _input_index(inp, at, _path_name(stack))
        if not isinstance(kids, (tuple, list)):
            name = _path_name(stack)
            raise _error(at, f"{name} is a Tree whose children are a "
                         f"{type(kids).__name__}; give them as a tuple or list")
    else:
        kids, inp = node, -1
    if len(kids) == 0:
        name = _path_name(stack)
        raise _error(at, f"{name} is an empty {type(node).__name__}; a leaf is an int "
                     "(its input index) or None, an internal node has 1 or more children")
    if len(kids) > k:
        name = _path_name(stack)
        raise _error(at, f"{name} has {len(kids)} children, but the cell declares at most "
                     f"{k}; binarize the tree or declare max_children={len(kids)}")
    return [kids, 0, [], -1 if inp is None else inp, start, id(node)]


def _kids(node: object) -> Sequence[object]:
    """A nested-tree container's children (none for a malformed :class:`Tree`)."""
    kids = node.children if isinstance(node, Tree) else node
    return kids if isinstance(kids, (tuple, list)) else ()


def _check_expansion(root: object, at: int) -> None:
    """Refuse a tree whose shared sub-trees, copied once per parent, expand it past
    :data:`MAX_TREE_NODES`: counted over the distinct objects (memoized, iterative), so
    that a few dozen levels of sharing fail at once instead of copying millions of nodes.
    A cycle stops the count (the walk reports it where it meets it)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        if closing:
            sizes[id(node)] = 1 + sum(sizes[id(c)] if _is_container(c) else 1
                                      for c in _kids(node))
            on_path.discard(id(node))
        elif id(node) in on_path:
            return
        elif id(node) not in sizes:
            on_path.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in _kids(node) if _is_container(c))
    if sizes[id(root)] > MAX_TREE_NODES:
        raise _error(at, f"the tree shares sub-trees so often that it expands to "
                     f"{sizes[id(root)]} nodes, past {MAX_TREE_NODES} (a tree copies a "
                     "sub-tuple for each parent); give it as a DAG (kind='dag', a "
                     "mapping of predecessors)")


def _copy_span(rows: list, inputs: list, heights: list, span: tuple[int, int]) -> int:
    """Append a copy of an already walked subtree (local ids ``span``, its root last);
    returns the copy's root id."""
    start, end = span
    delta = len(rows) - start
    rows.extend([c + delta for c in row] for row in rows[start:end])
    inputs.extend(inputs[start:end])
    heights.extend(heights[start:end])
    return end - 1 + delta


def _walk_nested(root: object, at: int, k: int) -> _Parsed:
    """Number a tree of nested tuples/lists/:class:`Tree` nodes in post-order, iteratively.
    ``seen`` maps id(container) to None while the container is on the current path (met
    again there: a cycle) and then to its post-order span (met again: a shared sub-tree,
    copied)."""
    rows: list[Sequence[int]] = []
    inputs: list[int] = []
    heights: list[int] = []
    if not _is_container(root):
        value = root.input if isinstance(root, Tree) else root
        return _parsed([()], [_input_index(value, at, "the root")], [0], 0, k)
    stack = [_open_frame(root, 0, at, [], k)]
    seen: dict[int, tuple[int, int] | None] = {id(root): None}
    expansion_checked = False
    while stack:
        frame = stack[-1]
        kids, slot, ids = frame[0], frame[1], frame[2]
        if slot == len(kids):               # all children numbered: number the node
            stack.pop()
            seen[frame[5]] = (frame[4], len(rows) + 1)
            heights.append(1 + max(map(heights.__getitem__, ids)))
            rows.append(ids)
            inputs.append(frame[3])
            if stack:
                stack[-1][2].append(len(rows) - 1)
            continue
        frame[1] = slot + 1
        child = kids[slot]
        kind = type(child)                  # int first: most nodes are word leaves
        if kind is int or (kind is not tuple and kind is not list
                            and not _is_container(child)):
            value = child.input if isinstance(child, Tree) else child
            if type(value) is not int or value < 0:
                value = _input_index(value, at, _path_name(stack))
            ids.append(len(rows))
            rows.append(())
            inputs.append(value)
            heights.append(0)
            continue
        span = seen.get(id(child), ())
        if span is None:
            raise _error(at, f"{_path_name(stack)} is the same object as one of its "
                         "ancestors (a cycle); a tree must not contain itself")
        if span:
            if not expansion_checked:
                _check_expansion(root, at)
                expansion_checked = True
            ids.append(_copy_span(rows, inputs, heights, span))
            continue
        stack.append(_open_frame(child, len(rows), at, stack, k))
        seen[id(child)] = None
    return _parsed(rows, inputs, heights, len(rows) - 1, k)


def _parsed(rows: Sequence[Sequence[int]], inputs: Sequence[int], heights: Sequence[int],
            root: int, k: int) -> _Parsed:
    """A structure's lists as arrays: ``rows[i]`` (node i's children, at most ``k``) into
    an ``(n, k)`` matrix padded with -1 at the end of each row."""
    children = np.full((len(rows), k), -1, dtype=np.int64)
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    children[np.arange(k) < lengths[:, None]] = list(chain.from_iterable(rows))
    return _Parsed(children, np.array(inputs, dtype=np.int64),
                   np.array(heights, dtype=np.int64), root)


# --- graphs: parent arrays and DAGs -----------------------------------------------------

def _graph_heights(kids: list[list[int]], at: int, k: int, names: list[str]) -> list[int]:
    """Heights of a graph given as child lists (Kahn's order from the leaves up), after
    checking every node has at most ``k`` children. A node left unordered lies on or
    after a cycle; following unordered children from it reaches a node on the cycle,
    which the error names."""
    n = len(kids)
    for node, row in enumerate(kids):
        if len(row) > k:
            raise _error(at, f"{names[node]} has {len(row)} children, but the cell "
                         f"declares at most {k}; declare max_children={len(row)} or "
                         "split it")
    parents: list[list[int]] = [[] for _ in range(n)]
    for node, row in enumerate(kids):
        for c in row:
            parents[c].append(node)
    waiting = [len(row) for row in kids]
    heights = [0] * n
    ready = [node for node in range(n) if waiting[node] == 0]
    for node in ready:                      # ``ready`` grows while it is walked
        for p in parents[node]:
            heights[p] = max(heights[p], heights[node] + 1)
            waiting[p] -= 1
            if waiting[p] == 0:
                ready.append(p)
    if len(ready) < n:
        node, seen = next(i for i in range(n) if waiting[i]), set()
        while node not in seen:
            seen.add(node)
            node = next(c for c in kids[node] if waiting[c])
        raise _error(at, f"{names[node]} is on a cycle (it depends on itself through its "
                     "children); a tree or DAG must be acyclic")
    return heights


def _parse_parent_array(tree: ParentArray, at: int, k: int) -> _Parsed:
    """A tree given as a parent array (see :class:`ParentArray`)."""
    parents = np.asarray(tree.parents)
    if parents.ndim == 1 and parents.size == 0:
        raise _error(at, "the parent array is empty; a tree has at least one node")
    if parents.ndim != 1 or not np.issubdtype(parents.dtype, np.integer):
        raise _error(at, "parents must be a 1-D sequence of ints (the parent's index, or "
                     f"-1 for the root), not {_short.repr(tree.parents)}")
    n = len(parents)
    bad = np.flatnonzero((parents < -1) | (parents >= n))
    if bad.size:
        raise _error(at, f"node {bad[0]} has parent {parents[bad[0]]}, outside -1.."
                     f"{n - 1}; parents[i] is the index of node i's parent, or -1 for "
                     "the root")
    roots = np.flatnonzero(parents == -1)
    if roots.size != 1:
        raise _error(at, f"the parent array has {roots.size} roots (nodes with parent -1: "
                     f"{roots[:5].tolist()}); a tree has exactly one root (give "
                     "several trees as separate structures of the batch)")
    kids: list[list[int]] = [[] for _ in range(n)]
    for node, p in enumerate(parents.tolist()):
        if p >= 0:
            kids[p].append(node)
    names = [f"node {i}" for i in range(n)]
    heights = _graph_heights(kids, at, k, names)
    raw = [None] * n if tree.inputs is None else list(tree.inputs)
    if len(raw) != n:
        raise _error(at, f"inputs has {len(raw)} entries for {n} nodes; give one per node")
    inputs = [-1 if isinstance(v, (int, np.integer)) and v == -1    # -1: no input
              else _input_index(v, at, names[i]) for i, v in enumerate(raw)]
    return _parsed(kids, inputs, heights, int(roots[0]), k)


def _dag_parts(dag: object) -> tuple[list, Any, Any]:
    """(nodes, predecessors(node), input(node)) of any accepted DAG form."""
    if isinstance(dag, Dag):
        inputs = dag.inputs or {}
        return list(dag.preds), dag.preds.__getitem__, inputs.get
    if isinstance(dag, Mapping):
        return list(dag), dag.__getitem__, lambda node: None
    nodes = dag.nodes

    def attribute_input(node: object) -> object:
        try:
            attrs = nodes[node]
        except (KeyError, TypeError, IndexError):    # a node view without attributes
            return None
        return attrs.get("input") if isinstance(attrs, Mapping) else None
    return list(nodes), dag.predecessors, attribute_input


def _parse_dag(dag: object, at: int, k: int) -> _Parsed:
    """A DAG in any accepted form (see the module doc): predecessors are children."""
    nodes, predecessors, input_of = _dag_parts(dag)
    if not nodes:
        raise _error(at, "the DAG has no nodes")
    index = {node: i for i, node in enumerate(nodes)}
    names = [f"node {_short.repr(node)}" for node in nodes]
    kids: list[list[int]] = []
    for i, node in enumerate(nodes):
        row = []
        try:
            preds = list(predecessors(node))
        except TypeError:
            raise _error(at, f"the predecessors of {names[i]} are not a list of nodes "
                         "(give [] for a source)") from None
        for pred in preds:
            try:
                row.append(index[pred])
            except (KeyError, TypeError):
                raise _error(at, f"{_short.repr(pred)}, a predecessor of {names[i]}, is "
                             "not a node of the DAG; add it (with no predecessors if it "
                             "is a source)") from None
        kids.append(row)
    heights = _graph_heights(kids, at, k, names)
    has_successor = np.zeros(len(nodes), dtype=bool)
    for row in kids:
        has_successor[row] = True
    sinks = np.flatnonzero(~has_successor)
    if sinks.size != 1:
        shown = ", ".join(_short.repr(nodes[s]) for s in sinks[:5])
        raise _error(at, f"the DAG has {sinks.size} sinks ({shown}); a DAG's output is its "
                     "one sink: add a node reading them all, or give them as separate "
                     "structures")
    inputs = [_input_index(input_of(node), at, names[i]) for i, node in enumerate(nodes)]
    return _parsed(kids, inputs, heights, int(sinks[0]), k)


# --- sequences --------------------------------------------------------------------------

def _parse_sequence(seq: object, at: int, k: int) -> _Parsed:
    """A sequence of input indices: element t reads element t-1 in slot 0."""
    if not isinstance(seq, (list, tuple, np.ndarray)):
        raise _error(at, "a sequence is a list, tuple or 1-D array of input indices, not "
                     f"an object of type {type(seq).__name__}")
    values = np.asarray(seq) if isinstance(seq, np.ndarray) else None
    if values is not None and values.ndim != 1:
        raise _error(at, f"the sequence is a {values.ndim}-D array; give a 1-D array of "
                     "input indices")
    n = len(seq)
    if n == 0:
        raise _error(at, "the sequence is empty; a sequence has at least one element")
    if values is not None and np.issubdtype(values.dtype, np.integer) and values.min() >= 0:
        inputs = values.astype(np.int64)
    else:
        inputs = np.array([_input_index(v, at, f"element {t}") for t, v in enumerate(seq)],
                          dtype=np.int64)
    children = np.full((n, k), -1, dtype=np.int64)
    children[1:, 0] = np.arange(n - 1)
    return _Parsed(children, inputs, np.arange(n, dtype=np.int64), n - 1)


# --- the batch --------------------------------------------------------------------------

def _parse(structure: object, kind: str, at: int, k: int) -> _Parsed:
    """One structure of the batch in local ids, by kind and form."""
    if kind == "sequence":
        return _parse_sequence(structure, at, k)
    if kind == "dag":
        if isinstance(structure, (Dag, Mapping)) or (
                hasattr(structure, "nodes") and hasattr(structure, "predecessors")):
            return _parse_dag(structure, at, k)
        raise _error(at, f"a DAG is a mapping {{node: [predecessors]}}, a Dag or a graph "
                     f"with .nodes and .predecessors(), not a {type(structure).__name__}")
    if isinstance(structure, ParentArray):
        return _parse_parent_array(structure, at, k)
    if isinstance(structure, (Dag, Mapping, np.ndarray)):
        raise _error(at, f"a tree is nested tuples, a Tree or a ParentArray, not a "
                     f"{type(structure).__name__} (a DAG needs kind='dag', a sequence "
                     "kind='sequence')")
    return _walk_nested(structure, at, k)


def _check_batch(structures: object, kind: str, max_children: int) -> list:
    """The batch as a list, after the checks that do not look inside a structure."""
    if kind not in KINDS:
        raise StructureError(f"unknown structure kind {kind!r}; use one of {KINDS}")
    if isinstance(max_children, bool) or not isinstance(max_children, (int, np.integer)) \
            or max_children < 1:
        raise StructureError(f"max_children is {max_children!r}; a cell declares at least "
                             "one child slot (an int >= 1)")
    if isinstance(structures, (Mapping, Dag, ParentArray, Tree)) or hasattr(
            structures, "predecessors"):
        raise StructureError("linearize takes a batch (a list) of structures, not one "
                             f"{type(structures).__name__}; wrap it in a list: [structure]")
    try:
        batch = list(structures)
    except TypeError:
        raise StructureError("linearize takes a batch (a list) of structures, not a "
                             f"{type(structures).__name__}") from None
    if not batch:
        raise StructureError("the batch is empty; give at least one structure")
    return batch


def _number(heights: np.ndarray, starts: np.ndarray, children: np.ndarray,
            structure: np.ndarray, k: int) -> np.ndarray:
    """Each node's final id (old id -> new id): by height (``starts[h]`` is the first id
    of height ``h``), then by the key of the module doc, batch by batch from the highest
    down (a node's key needs its parents' final ids)."""
    n = len(heights)
    by_height = np.argsort(heights, kind="stable")
    parent, slot = np.nonzero(children >= 0)
    child = children[parent, slot]
    edges = np.argsort(heights[parent], kind="stable")
    parent, slot, child = parent[edges], slot[edges], child[edges]
    edge_starts = np.searchsorted(heights[parent], np.arange(len(starts)))
    key = n * k + structure                 # parentless nodes after the others
    new_id = np.empty(n, dtype=np.int64)
    for h in range(len(starts) - 2, -1, -1):
        nodes = by_height[starts[h]:starts[h + 1]]
        new_id[nodes[np.argsort(key[nodes], kind="stable")]] = np.arange(starts[h],
                                                                         starts[h + 1])
        if h:
            e = slice(edge_starts[h], edge_starts[h + 1])
            np.minimum.at(key, child[e], new_id[parent[e]] * k + slot[e])
    return new_id


def linearize(structures: Sequence[object], *, kind: str = "tree",
              max_children: int = 2) -> Linearized:
    """Number a batch of structures for one accelerator program (see the module doc for
    the accepted forms and the numbering rule).

    Raises :class:`~tessera.errors.StructureError` for an unknown kind, an empty batch or
    structure, a cycle, a node with more than ``max_children`` children, a parent array
    with several roots, a DAG with several sinks or an unknown predecessor, and an input
    that is not a non-negative int or ``None``.
    """
    batch = _check_batch(structures, kind, max_children)
    k = int(max_children)
    parsed = [_parse(s, kind, i, k) for i, s in enumerate(batch)]
    sizes = np.array([len(p.heights) for p in parsed], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    children = np.concatenate([p.children for p in parsed])
    children = np.where(children >= 0, children + np.repeat(offsets, sizes)[:, None], -1)
    heights = np.concatenate([p.heights for p in parsed])
    structure = np.repeat(np.arange(len(parsed), dtype=np.int64), sizes)
    starts = np.concatenate(([0], np.cumsum(np.bincount(heights))))
    new_id = _number(heights, starts, children, structure, k)
    order = np.empty_like(new_id)
    order[new_id] = np.arange(len(new_id))
    children = children[order]
    children = np.where(children >= 0, new_id[children], -1)
    local = np.arange(len(new_id), dtype=np.int64) - np.repeat(offsets, sizes)
    bounds = starts.tolist()
    result = Linearized(
        kind=kind, max_children=k, children=children,
        inputs=np.concatenate([p.inputs for p in parsed])[order],
        batches=tuple(zip(bounds[:-1], bounds[1:])),
        roots=new_id[offsets + np.array([p.root for p in parsed], dtype=np.int64)],
        structure=structure[order], source_index=local[order])
    for array in (result.children, result.inputs, result.roots, result.structure,
                  result.source_index):
        array.flags.writeable = False
    return result
