"""int8 quantization of recursive cells: calibrated scales, the activation tables, the
int8 meaning of every operation (against hand computations), and the zero folding of
the specialised variants (against the full cell evaluated with zero children/inputs)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.recursive import (Cell, child, linear, linearize, node_input, quantize_cell,
                               reference_float, relu, sigmoid, tanh, tree_fc, tree_lstm)
from tessera.recursive.cell import Expr
from tessera.recursive.quantize import UNIT_SCALE, QuantizedCell
from tessera.recursive.reference import clip8, requant
from tessera.recursive.specialize import Variant, specialize

TREES = [((1, 2), (3, (4, 5))), (6, 7), ((8, None), 9), 10]


def f32(x) -> float:
    return float(np.float32(x))


def _emb(width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((16, width))


# --- calibration scales -----------------------------------------------------------------


def test_a_tree_fc_s_scales_are_its_calibrated_peaks_over_127():
    """Computed by hand from the float states: the pre-activation's peak over every node,
    the state's, and the peak of the input rows the nodes read (an unread row, however
    large, does not count)."""
    cell = tree_fc(hidden=8, embed=6, seed=2)
    emb = _emb(6)
    emb[15] = 1000.0                               # no node reads row 15
    lin = linearize(TREES, kind="tree", max_children=2)
    q = quantize_cell(cell, [(lin, emb)])
    h = reference_float(cell, lin, emb)["h"]
    (lin_expr,) = [e for e in cell.exprs if e.op == "linear"]
    w, u0, u1 = lin_expr.weights

    def rows(matrix, index):
        return np.where(index[:, None] >= 0, matrix[np.maximum(index, 0)], 0.0)
    pre = (rows(emb, lin.inputs) @ w.T + rows(h, lin.children[:, 0]) @ u0.T
           + rows(h, lin.children[:, 1]) @ u1.T + lin_expr.bias)
    np.testing.assert_allclose(np.tanh(pre), h)    # the hand computation is the model's
    assert q.scales[lin_expr.uid] == f32(np.max(np.abs(pre)) / 127)
    assert q.state_scale("h") == f32(np.max(np.abs(h)) / 127)
    used = lin.inputs[lin.inputs >= 0]
    assert q.input_scale == f32(np.max(np.abs(emb[used])) / 127) < 1000 / 127


def test_states_share_their_scale_with_every_child_read_and_gates_use_the_unit_scale():
    cell = tree_lstm(hidden=8, embed=8, seed=3)
    q = quantize_cell(cell, [(linearize(TREES, kind="tree", max_children=2), _emb(8))])
    children = [e for e in cell.exprs if e.op == "child"]
    assert {e.state for e in children} == {"h", "c"}
    for e in children:
        assert q.scales[e.uid] == q.state_scale(e.state)
    assert q.state_scale("h") != q.state_scale("c")
    states = {e.uid for e in cell.states.values()}
    gates = [e for e in cell.exprs if e.op in ("sigmoid", "tanh") and e.uid not in states]
    assert len(gates) == 6                          # i, o, u, two forget gates, tanh(c)
    assert all(q.scales[e.uid] == UNIT_SCALE for e in gates)
    inputs = [e for e in cell.exprs if e.op == "input"]
    assert all(q.scales[e.uid] == q.input_scale for e in inputs)


def test_scales_are_the_largest_magnitude_over_every_calibration_batch():
    cell = tree_fc(hidden=8, embed=8, seed=4)
    small, large = _emb(8, 1) * 0.1, _emb(8, 1) * 3.0
    lin = linearize(TREES, kind="tree", max_children=2)
    both = quantize_cell(cell, [(lin, small), (lin, large)])
    alone = quantize_cell(cell, [(lin, large)])
    assert both.scales == alone.scales and both.input_scale == alone.input_scale


# --- activation tables ------------------------------------------------------------------

FUNCTIONS = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh}


def test_sigmoid_and_tanh_tables_are_exact_for_every_int8_code():
    cell = tree_lstm(hidden=8, embed=8, seed=5)
    q = quantize_cell(cell, [(linearize(TREES, kind="tree", max_children=2), _emb(8))])
    codes = np.arange(-128, 128)
    checked = 0
    for e in cell.exprs:
        if e.op not in FUNCTIONS:
            continue
        table = q.tables[e.uid]
        assert table.shape == (256,) and table.dtype == np.int8
        s_in, s_out = q.scales[e.args[0].uid], q.scales[e.uid]
        exact = np.clip(np.rint(FUNCTIONS[e.op](codes * s_in) / s_out), -128, 127)
        np.testing.assert_array_equal(table[codes & 0xFF], exact)   # indexed by the byte
        assert np.all(np.diff(table[codes & 0xFF].astype(int)) >= 0)   # monotonic
        if s_out == UNIT_SCALE and e.op == "tanh":
            np.testing.assert_array_equal(table[codes[1:] & 0xFF], -table[-codes[1:] & 0xFF])
        if s_out == UNIT_SCALE and e.op == "sigmoid":
            assert table.min() >= 0
        checked += 1
    assert checked == 6


# --- the int8 meaning of each operation -------------------------------------------------


def _hand_cell():
    """Expressions of every op over small widths, and a QuantizedCell with chosen
    weights, biases, multipliers and tables (not calibrated: the test picks them)."""
    x2, a, b = node_input(2), node_input(3), child("h", 0, 3)
    ops = {
        "linear": linear((np.zeros((3, 2)), x2)),
        "add": a + b, "sub": a - b, "mul": a * b, "relu": relu(a),
        "rescale": Expr("rescale", 3, (a,)), "sigmoid": sigmoid(a),
    }
    cell = Cell("Hand", "tree", 1, {"h": ops["add"]})
    lin = ops["linear"].uid
    q = QuantizedCell(
        cell, 1.0, {},
        weights={lin: (np.array([[1, 2], [3, -4], [127, 127]], np.int8),)},
        bias={lin: np.array([10, -10, 0])},
        multipliers={lin: [0.5], ops["add"].uid: [1.0, 0.25], ops["sub"].uid: [0.5, 0.25],
                     ops["mul"].uid: [1 / 64], ops["relu"].uid: [2.0],
                     ops["rescale"].uid: [f32(0.1)]},
        tables={ops["sigmoid"].uid: (np.arange(256) // 2).astype(np.int8)})
    return q, ops


def _int(*rows):
    return np.array(rows, dtype=np.int64)


@pytest.mark.parametrize("op,args,expected", [
    # acc = W x + b; *0.5; round half to even; saturate: 23 -> 11.5 -> 12, -21 -> -10.5
    # -> -10, 1016 -> 508 -> 127; second node -374 -> -187 -> -128, 118 -> 59, -32512.
    ("linear", [_int([3, 5], [-128, -128])], _int([12, -10, 127], [-128, 59, -128])),
    # a + R(b, 0.25), saturated: 127 + 32 -> 127.
    ("add", [_int([10, -7, 127], [127, 127, -128]), _int([8, 4, -100], [127, 127, -128])],
     _int([12, -6, 102], [127, 127, -128])),
    # R(a, 0.5) - R(b, 0.25): -7 -> -3.5 -> -4 (half to even), 127 -> 63.5 -> 64.
    ("sub", [_int([10, -7, 127]), _int([8, 4, -100])], _int([3, -5, 89])),
    # a b / 64: 10000 -> 127, -10000 -> -128, 96 -> 1.5 -> 2, 32 -> 0.5 -> 0.
    ("mul", [_int([100, -100, 3]), _int([100, 100, 32])], _int([127, -128, 2])),
    ("mul", [_int([1, 0, -3]), _int([32, 99, 32])], _int([0, 0, -2])),
    # max(a, 0) * 2, saturated.
    ("relu", [_int([-5, 7, 100])], _int([0, 14, 127])),
    # f32 product: 25 * f32(0.1) is 2.5 in float32 -> 2 (half to even); 127 -> 12.7 -> 13.
    ("rescale", [_int([15, 25, 127], [-25, -15, -128])], _int([2, 2, 13], [-2, -2, -13])),
    # The table is indexed by the input's byte: -1 is entry 255, -128 entry 128.
    ("sigmoid", [_int([0, -1, -128], [127, 1, 2])], _int([0, 127, 64], [63, 0, 1])),
])
def test_the_int8_meaning_of_each_op_matches_a_hand_computation(op, args, expected):
    q, ops = _hand_cell()
    got = q.int_op(ops[op], args)
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.int64


def test_requant_rounds_a_float32_product_half_to_even():
    np.testing.assert_array_equal(requant(_int(1, 3, 5, -1, -3, 2 ** 25 + 1), 0.5),
                                  _int(0, 2, 2, 0, -2, 2 ** 24))
    np.testing.assert_array_equal(clip8(_int(-300, 300, 5)), _int(-128, 127, 5))


# --- zero folding in specialize ---------------------------------------------------------

OPS = ["linear", "linear", "add", "sub", "mul", "sigmoid", "tanh", "relu"]


@st.composite
def random_cells(draw):
    """A random cell of the vocabulary: every op over the node input, the children's
    states (``h`` and, sometimes, ``c``) and earlier results; shared sub-expressions."""
    width = draw(st.sampled_from([4, 8, 12]))
    k = draw(st.integers(1, 3))
    two_states = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    pool = [node_input(width)] + [child(s, j, width) for s in ("hc" if two_states else "h")
                                  for j in range(k)]
    for _ in range(draw(st.integers(2, 9))):
        op = draw(st.sampled_from(OPS))
        if op == "linear":
            picks = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
            bias = rng.uniform(-1, 1, width) if draw(st.booleans()) else None
            pool.append(linear(*[(rng.uniform(-1, 1, (width, width)), p) for p in picks],
                               bias=bias))
        elif op in ("add", "sub", "mul"):
            a, b = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
            pool.append({"add": a + b, "sub": a - b, "mul": a * b}[op])
        else:
            arg = draw(st.sampled_from(pool))
            pool.append({"sigmoid": sigmoid, "tanh": tanh, "relu": relu}[op](arg))
    states = {"h": pool[-1], "c": pool[-2]} if two_states else {"h": pool[-1]}
    return Cell("Random", "tree", k, states)


def eval_specialized(spec, gathers: dict, nodes: int) -> dict[str, np.ndarray]:
    """The specialised graph's int8 values over ``nodes`` nodes, from its :class:`Value`
    fields alone (what the template lowers): gathers, constants, linear maps with their
    kept terms and fused table, ALU ops."""
    env: dict[int, np.ndarray] = {}
    for v in spec.values:
        args = [env[id(a)] for a in v.args]
        m = v.multipliers
        if v.kind == "gather":
            y = gathers[v.source, v.slot]
        elif v.kind == "const":
            y = np.broadcast_to(v.const, (nodes, v.width)).astype(np.int64)
        elif v.kind == "linear":
            acc = sum(x @ w.astype(np.int64).T for w, x in zip(v.terms, args))
            y = clip8(requant(acc + v.bias, m[0]))
            if v.table is not None:
                y = v.table[y & 0xFF].astype(np.int64)
        elif v.op in ("sigmoid", "tanh"):
            y = v.table[args[0] & 0xFF].astype(np.int64)
        elif v.op == "rescale":
            y = clip8(requant(args[0], m[0]))
        elif v.op in ("add", "sub"):
            b = requant(args[1], m[1])
            y = clip8(requant(args[0], m[0]) + (b if v.op == "add" else -b))
        elif v.op == "mul":
            y = clip8(requant(args[0] * args[1], m[0]))
        else:
            assert v.op == "relu", v.op
            y = clip8(requant(np.maximum(args[0], 0), m[0]))
        env[id(v)] = y
    return {s: env[id(v)] for s, v in spec.states.items()}


def eval_full(q, x: np.ndarray, kids: dict) -> dict[str, np.ndarray]:
    """The whole cell through ``QuantizedCell.int_op`` (nothing folded)."""
    env: dict[int, np.ndarray] = {}
    for e in q.cell.exprs:
        if e.op == "input":
            env[e.uid] = x
        elif e.op == "child":
            env[e.uid] = kids[e.state, e.slot]
        else:
            env[e.uid] = q.int_op(e, [env[a.uid] for a in e.args])
    return {s: env[e.uid] for s, e in q.cell.states.items()}


def assert_folding_keeps_the_meaning(cell, seed: int) -> None:
    """Each variant's folded graph on random int8 rows equals the full cell evaluated with
    zero children (leaf variants) and zero inputs (variants without inputs)."""
    rng = np.random.default_rng(seed)
    full = tuple(range(1, cell.max_children + 1))
    trees = [full, (full,), ((None,),), 6]
    calibration_inputs = rng.standard_normal((8, cell.embed)) if cell.embed else None
    q = quantize_cell(cell, [(linearize(trees, kind="tree", max_children=cell.max_children),
                              calibration_inputs)])
    nodes, width = 5, cell.states["h"].width
    x = rng.integers(-128, 128, (nodes, cell.embed))
    kids = {(s, j): rng.integers(-128, 128, (nodes, width))
            for s in cell.states for j in range(cell.max_children)}
    zero = np.zeros((nodes, width), np.int64)
    for variant in (Variant(c, i) for c in (False, True) for i in (False, True)):
        spec = specialize(q, variant)
        xs = x if variant.inputs else np.zeros_like(x)
        ks = {key: (v if variant.children else zero) for key, v in kids.items()}
        gathers = {("input", 0): xs, **ks}
        folded = eval_specialized(spec, gathers, nodes)
        full_values = eval_full(q, xs, ks)
        for s in cell.states:
            np.testing.assert_array_equal(folded[s], full_values[s],
                                          err_msg=f"{variant.key} {s}")
        if not variant.children:
            assert not any(v.kind == "gather" and v.source != "input" for v in spec.values)
        if not variant.inputs:
            assert not any(v.kind == "gather" and v.source == "input" for v in spec.values)


@settings(max_examples=120, deadline=None)
@given(random_cells(), st.integers(0, 2 ** 16))
def test_zero_folding_keeps_the_int8_meaning_of_every_variant(cell, seed):
    assert_folding_keeps_the_meaning(cell, seed)


def nested_activations() -> Cell:
    """``h = sigmoid(sigmoid(W x))`` and ``c = tanh(sigmoid(U h_child))``: activations of
    activations of linear maps."""
    rng = np.random.default_rng(11)
    x, prev = node_input(4), child("h", 0, 4)
    return Cell("Nested", "tree", 1, {
        "h": sigmoid(sigmoid(linear((rng.uniform(-1, 1, (4, 4)), x)))),
        "c": tanh(sigmoid(linear((rng.uniform(-1, 1, (4, 4)), prev))))})


def test_an_activation_of_an_activation_of_a_linear_map_keeps_both_tables():
    assert_folding_keeps_the_meaning(nested_activations(), 0)


@pytest.mark.parametrize("nary", [False, True], ids=["child-sum", "nary"])
def test_tree_lstm_leaves_keep_three_gemms(nary):
    """A leaf with an input keeps the W x terms of i, o, u (the forget gates only
    multiply the children's absent c); an inner node keeps every term."""
    cell = tree_lstm(hidden=8, embed=8, nary=nary, seed=6)
    q = quantize_cell(cell, [(linearize(TREES, kind="tree", max_children=2), _emb(8))])

    def gemms(variant):
        return sum(len(v.terms) for v in specialize(q, variant).values if v.kind == "linear")
    assert gemms(Variant(True, True)) == sum(len(e.weights) for e in cell.exprs
                                             if e.op == "linear") == (15 if nary else 10)
    assert gemms(Variant(False, True)) == 3
    assert gemms(Variant(False, False)) == 0
    assert all(v.kind == "const" for v in specialize(q, Variant(False, False)).values)
