"""Recursive models end to end on the simulator: every built-in (and cells written with the
vocabulary) compiled for the ``tiny`` config, each batch of structures run as one launch,
bit-identical to the int8 numpy reference for every node and state; the baselines'
launch granularities equal the same reference; the programs pass the token verifier; the
int8 results stay close to the float reference; templates are compiled once per model.

Expected values come from :func:`tessera.recursive.reference_int8` (numpy), never from
the device under test.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from tessera.compiler.accel.verify import verify_program
from tessera.errors import CompileError
from tessera.recursive import (LAUNCHES, MODELS, Cell, Dag, Tree, child, compile_recursive, dag_rnn,
                               grid_dag, linear, mv_rnn, node_input, perfect_tree,
                               reference_float, reference_int8, relu, run, sigmoid,
                               sst_like_trees, tanh, tree_fc, tree_gru, tree_lstm, tree_rnn)
from tessera.recursive import template as template_module
from tessera.recursive.specialize import Variant

from tests.recursive.test_quantize import nested_activations, random_cells
from tests.recursive.test_structure import dags, input_trees, nested_trees

CONFIG = "tiny"
VOCAB = 32

# --- the models under test --------------------------------------------------------------


def sequence_cell(hidden: int, embed: int, seed: int = 0) -> Cell:
    """A gated sequence cell written with the vocabulary: relu, ``-``, ``*``, ``+`` and a
    shared sub-expression (``r``, read twice), none of which the tree built-ins use all
    together: ``r = relu(W x + U h_prev + b)``, ``g = sigmoid(V x + c)``,
    ``h = r + g * (h_prev - r)``."""
    rng = np.random.default_rng(seed)
    x, prev = node_input(embed), child("h", 0, hidden)

    def mat(out, inp):
        return rng.uniform(-1, 1, (out, inp)) / np.sqrt(inp)
    r = relu(linear((mat(hidden, embed), x), (mat(hidden, hidden), prev),
                    bias=rng.uniform(-0.5, 0.5, hidden)))
    g = sigmoid(linear((mat(hidden, embed), x), bias=rng.uniform(-0.5, 0.5, hidden)))
    return Cell("GatedSeq", "sequence", 1, {"h": r + g * (prev - r)})


TREES = [((1, 2), 3), (4, (5, (6, 7))), 8, ((9, 10), (11, 12)), (None, (13, None)),
         (((14, 15), (16, 17)), ((18, None), 19))]
UNARY_TREES = [((1,), (2, 3)), (((4,),),), (5, (None,)), Tree(6, (Tree(7, (8,)),))]
INPUT_TREES = [Tree(1, (Tree(2), Tree(3, (4, None)))), Tree(5, (6,)),
               Tree(None, (Tree(7, (8, 9)), (10, 11))), Tree(12)]
GRIDS = [grid_dag(3, 4), grid_dag(2, 2), grid_dag(1, 3),
         # A node reading one predecessor in both slots; a source without input.
         Dag({"s": [], "t": ["s", "s"], "u": ["t", "s"]}, inputs={"t": 5, "u": 6})]
SEQUENCES = [[3, 1, 4, 1, 5, 9, 2, 6], [None, 2, 7], np.array([8]), [0, None, None, 5]]

#: name -> (cell builder(hidden, seed), structures)
CASES = {
    "TreeFC": (lambda h, s: tree_fc(hidden=h, embed=h, seed=s), TREES),
    "TreeRNN": (lambda h, s: tree_rnn(hidden=h, embed=h, seed=s), TREES),
    "TreeGRU": (lambda h, s: tree_gru(hidden=h, embed=h, seed=s), TREES),
    "TreeLSTM": (lambda h, s: tree_lstm(hidden=h, embed=h, seed=s), TREES),
    "TreeLSTM-nary": (lambda h, s: tree_lstm(hidden=h, embed=h, nary=True, seed=s), TREES),
    "MV-RNN": (lambda h, s: mv_rnn(hidden=h, embed=h, seed=s), TREES),
    "DAG-RNN": (lambda h, s: dag_rnn(hidden=h, embed=h, seed=s), GRIDS),
    "GatedSeq": (lambda h, s: sequence_cell(h, h, s), SEQUENCES),
    # A cell over trees whose internal nodes read an input too.
    "TreeRNN-inputs": (lambda h, s: tree_rnn(hidden=h, embed=h, seed=s), INPUT_TREES),
    # Unary nodes: the absent slot reads the zero rows past the state array.
    "TreeLSTM-nary-unary": (lambda h, s: tree_lstm(hidden=h, embed=h, nary=True, seed=s),
                            UNARY_TREES),
    "TreeFC-unary": (lambda h, s: tree_fc(hidden=h, embed=h, seed=s), UNARY_TREES),
}
#: Hidden 8 (two 4-wide blocks) for every case; 12 (three blocks) where it differs: on
#: ``tiny`` TreeLSTM at 12 no longer fits all variants' matrices in the weight buffer at
#: once, so each variant loads its own (the per-variant weight reloads).
WIDTHS = [(name, 8) for name in CASES] + [("TreeFC", 12), ("TreeGRU", 12), ("TreeLSTM", 12),
                                          ("DAG-RNN", 12), ("GatedSeq", 12), ("MV-RNN", 4)]


def embeddings(width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(100 + seed).standard_normal((VOCAB, width))


@lru_cache(maxsize=None)
def compiled(name: str, hidden: int, seed: int = 0):
    """The case's model compiled for ``tiny``, calibrated on its own structures, with
    embeddings (kept: hypothesis examples and tests share its templates)."""
    build, structures = CASES[name]
    emb = embeddings(hidden, seed)
    return compile_recursive(build(hidden, seed), CONFIG, calibration=[(structures, None)],
                             embeddings=emb)


def int8_inputs(model):
    if model.embeddings is None:
        return None
    return model.quantized.quantize_inputs(model.embeddings)


def assert_matches_reference(model, result) -> dict[str, np.ndarray]:
    """Every node's every state equals the int8 reference on the run's own linearization,
    and the outputs are the roots' output states dequantized; returns the reference."""
    ref = reference_int8(model.quantized, result.lin, int8_inputs(model))
    assert set(result.states) == set(model.cell.states)
    for s, expected in ref.items():
        got = result.states[s]
        assert got.shape == expected.shape
        bad = np.argwhere(got != expected)
        assert bad.size == 0, (f"state {s!r}: {len(bad)} values differ, first at node "
                               f"{bad[0][0]} lane {bad[0][1]}: {got[tuple(bad[0])]} != "
                               f"{expected[tuple(bad[0])]}")
    out = model.quantized.dequantize(model.cell.output, ref[model.cell.output][result.lin.roots])
    np.testing.assert_array_equal(result.outputs, out)
    return ref


# --- one launch, bit-identical ----------------------------------------------------------


@pytest.mark.parametrize("name,hidden", WIDTHS, ids=[f"{n}-h{h}" for n, h in WIDTHS])
def test_one_launch_per_batch_is_bit_identical_to_the_int8_reference(name, hidden):
    model = compiled(name, hidden)
    structures = CASES[name][1]
    result = run(model, structures)
    assert result.launches == 1 and result.cycles[0] > 0
    assert set(result.host_seconds) == {"linearize", "instantiate"}
    assert result.lin.num_structures == len(structures)
    assert result.outputs.shape == (len(structures), hidden)
    ref = assert_matches_reference(model, result)
    # Not a vacuous match: the states vary across nodes and lanes.
    assert len(np.unique(ref[model.cell.output])) > 8


@pytest.mark.parametrize("build,hidden,embed", [(tree_lstm, 8, 6), (tree_gru, 12, 5),
                                                (mv_rnn, 8, 3), (dag_rnn, 4, 13), (tree_fc, 5, 9)],
                         ids=["TreeLSTM-8x6", "TreeGRU-12x5", "MV-RNN-8x3", "DAG-RNN-4x13",
                              "TreeFC-5x9"])
def test_input_and_state_widths_may_differ_and_be_ragged(build, hidden, embed):
    structures = [grid_dag(3, 3)] if build is dag_rnn else TREES
    emb = np.random.default_rng(embed).standard_normal((VOCAB, embed))
    model = compile_recursive(build(hidden=hidden, embed=embed), CONFIG,
                              calibration=[(structures, None)], embeddings=emb)
    for launches in ("tree", "batch"):
        assert_matches_reference(model, run(model, structures, launches=launches))


def test_every_built_in_model_is_among_the_cases():
    assert set(MODELS) <= set(CASES)


def test_batches_larger_than_a_chunk_are_cut_into_several_chunks():
    """Ten perfect trees of height 4: 160 leaves, more than one chunk of TreeLSTM's on
    ``tiny`` holds; the chunks of a batch are uneven when the batch does not divide."""
    model = compiled("TreeLSTM", 8)
    structures = [perfect_tree(4, first_input=k) for k in range(10)]
    result = run(model, structures)
    assert result.launches == 1
    (chunks,) = model.chunks(result.lin)
    start, end = result.lin.batches[0]
    leaves = [c for c in chunks if c.start < end]
    assert len(leaves) > 1 and sum(c.n for c in leaves) == end - start == 160
    assert max(c.n for c in leaves) <= model.capacity(leaves[0].variant)
    assert_matches_reference(model, result)


def test_matrices_that_do_not_fit_the_weight_buffer_stream_and_stay_bit_identical():
    """TreeLSTM at hidden 32 needs 8 matrices x 64 tiles, 8 times ``tiny``'s weight buffer."""
    model = compile_recursive(tree_lstm(hidden=32, embed=32, seed=7), CONFIG,
                              calibration=[(TREES[:3], None)], embeddings=embeddings(32, 7))
    assert not model.weights.shared
    assert_matches_reference(model, run(model, TREES[:3]))


@pytest.mark.parametrize("launches", ["batch", "node"])
@pytest.mark.parametrize("name", ["TreeLSTM", "TreeGRU", "MV-RNN", "DAG-RNN", "GatedSeq",
                                  "TreeRNN-inputs", "TreeFC-unary"])
def test_baseline_launch_granularities_equal_the_same_reference(name, launches):
    model = compiled(name, 8)
    structures = CASES[name][1]
    result = run(model, structures, launches=launches)
    expected = len(result.lin.batches) if launches == "batch" else result.lin.num_nodes
    assert result.launches == expected
    assert all(c > 0 for c in result.cycles)
    assert_matches_reference(model, result)


def test_the_fused_launch_takes_fewer_cycles_than_the_baselines():
    """The baselines reload the weights and drain the pipeline at every launch."""
    model = compiled("TreeLSTM", 8)
    cycles = {how: sum(run(model, TREES, launches=how).cycles)
              for how in ("tree", "batch", "node")}
    assert cycles["tree"] < cycles["batch"] < cycles["node"], cycles


def _verify_all(model, structures, launches):
    """Every program of the run passes ``verify_program``."""
    lin = model.linearize(structures)
    programs, _ = model.programs(lin, int8_inputs(model), launches)
    assert len(programs) == len(model.chunks(lin, launches))
    for program in programs:
        report = verify_program(program)
        assert report.instructions == len(program.instructions)


@pytest.mark.parametrize("launches", ["tree", "batch", "node"])
@pytest.mark.parametrize("name", ["TreeFC", "TreeLSTM", "TreeLSTM-nary", "MV-RNN", "DAG-RNN",
                                  "GatedSeq", "TreeRNN-inputs", "TreeLSTM-nary-unary"])
def test_instantiated_programs_pass_the_token_verifier(name, launches):
    _verify_all(compiled(name, 8), CASES[name][1], launches)


def _alu_only():
    """A cell with no linear map: its values reach only the ALU."""
    x, prev = node_input(8), child("h", 0, 8)
    cell = Cell("AluOnly", "sequence", 1, {"h": sigmoid(x) * prev + x})
    return compile_recursive(cell, CONFIG, calibration=[([[1, 2, 3]], None)],
                             embeddings=embeddings(8))


@pytest.mark.parametrize("model,structures,launches", [
    (lambda: compiled("TreeFC", 8), [None], "tree"),
    (lambda: compiled("TreeFC", 8), [None, None], "tree"),
    (lambda: compiled("TreeFC", 8), [(None, (13, None))], "node"),
    (_alu_only, [[1, 2, 3]], "tree"),
], ids=["lone-empty-leaf", "two-empty-leaves", "node-launch-empty-leaf", "alu-only-cell"])
def test_a_launch_ending_without_load_module_work_passes_the_verifier(model, structures,
                                                                       launches):
    """program.join starts each template behind a barrier whose LOAD no-op (load module)
    pops the carrier's token; when the last template of a launch has no instruction on
    the load module (a chunk of leaves without inputs is all constants; a cell without
    GEMMs loads only through the compute module), nothing orders that no-op before the
    FINISH."""
    _verify_all(model(), structures, launches)


def test_a_cell_without_node_input_ignores_the_structures_input_indices():
    """A parse tree's leaves are word ids whether or not the cell reads them."""
    rng = np.random.default_rng(8)
    kids = [child("h", k, 8) for k in range(2)]
    cell = Cell("NoInput", "tree", 2, {"h": tanh(linear(
        *[(rng.uniform(-1, 1, (8, 8)), h) for h in kids], bias=rng.uniform(-1, 1, 8)))})
    model = compile_recursive(cell, CONFIG, calibration=[([((None, None), None)], None)])
    with_ids = run(model, [((1, 2), 0)])
    np.testing.assert_array_equal(with_ids.outputs, run(model, [((None, None), None)]).outputs)


def test_nested_activations_of_a_linear_map_are_bit_identical():
    model = compile_recursive(nested_activations(), CONFIG, calibration=[([(1,), 2], None)],
                              embeddings=embeddings(4))
    assert_matches_reference(model, run(model, [((1,),), 2, (None,)]))


@pytest.mark.parametrize("structures", [[None], [None, 3], [(None, None)], [((None,),)]],
                         ids=["empty-leaf", "leaves", "over-empty-leaves", "unary-chain"])
def test_leaves_without_inputs_are_the_folded_constants(structures):
    model = compiled("TreeLSTM", 8)
    assert_matches_reference(model, run(model, structures))


# --- close to the float model -----------------------------------------------------------

#: Largest error of any node's state, as a fraction of the state's float range. Measured
#: (SST-like trees / grids, hidden 8 and 12, 5 seeds; MV-RNN 20 seeds at hidden 8): at
#: most 0.052 (TreeGRU, hidden 12), typically 0.03; MV-RNN's vector up to 0.25 (mean
#: 0.06: the products of per-node matrices compound through the tree), its matrix 0.016.
FLOAT_TOLERANCE = {"MV-RNN": 0.3}
DEFAULT_FLOAT_TOLERANCE = 0.07


@pytest.mark.parametrize("name", ["TreeFC", "TreeRNN", "TreeGRU", "TreeLSTM", "TreeLSTM-nary",
                                  "MV-RNN", "DAG-RNN"])
@pytest.mark.parametrize("seed", [0, 1])
def test_int8_results_are_close_to_the_float_reference(name, seed):
    build = CASES[name][0]
    structures = ([grid_dag(3, 4), grid_dag(4, 3)] if name == "DAG-RNN"
                  else sst_like_trees(3, seed=seed, vocab=VOCAB))
    emb = embeddings(8, seed)
    cell = build(8, seed)
    model = compile_recursive(cell, CONFIG, calibration=[(structures, None)], embeddings=emb)
    result = run(model, structures)
    expected = reference_float(cell, result.lin, emb)
    bound = FLOAT_TOLERANCE.get(name, DEFAULT_FLOAT_TOLERANCE)
    for s, exact in expected.items():
        err = np.max(np.abs(model.quantized.dequantize(s, result.states[s]) - exact))
        assert err <= bound * np.max(np.abs(exact)), (s, err / np.max(np.abs(exact)))
    np.testing.assert_allclose(result.outputs, expected[cell.output][result.lin.roots],
                               atol=bound * np.max(np.abs(expected[cell.output])))


# --- random structures ------------------------------------------------------------------

leaf_inputs = st.one_of(st.integers(0, VOCAB - 1), st.none())


def random_trees(k: int):
    """Nested tuples up to 15 leaves, 1..k children per internal node, leaves with or
    without an input."""
    return nested_trees(k, leaf_inputs, max_leaves=15)


def random_input_trees(k: int):
    """Trees whose internal nodes may carry inputs (``Tree`` nodes) mixed with tuples."""
    return input_trees(k, leaf_inputs, max_leaves=15)


def _gru3():
    return compile_recursive(tree_gru(hidden=8, embed=8, max_children=3, seed=3), CONFIG,
                             calibration=[([((1, 2, 3), (4, 5), 6)], None)],
                             embeddings=embeddings(8, 3))


@lru_cache(maxsize=None)
def gru3():
    """A child-sum TreeGRU of up to 3 children: random batches reuse its templates."""
    return _gru3()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(random_trees(3), min_size=1, max_size=3))
def test_random_tree_batches_are_bit_identical(batch):
    model = gru3()
    result = run(model, batch)
    assert result.launches == 1
    assert_matches_reference(model, result)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(random_trees(3), min_size=1, max_size=4), st.sampled_from(LAUNCHES))
def test_random_tree_batches_make_programs_the_token_verifier_accepts(batch, launches):
    _verify_all(gru3(), batch, launches)


def random_cell_model(cell: Cell, seed: int, config):
    """A random cell compiled for ``config`` and trees with every variant of node (leaves
    and internal nodes, with and without inputs) for it."""
    k = cell.max_children
    if cell.embed:
        trees = [tuple(range(1, k + 1)), (tuple(range(1, k + 1)),), ((None,),), 6]
        emb = np.random.default_rng(seed).standard_normal((8, cell.embed))
    else:
        trees, emb = [(None,) * k, ((None,) * k,), ((None,),), None], None
    model = compile_recursive(cell, config, calibration=[(trees, None)], embeddings=emb)
    try:
        model.chunks(model.linearize(trees))      # compiles the templates the trees need
    except CompileError as exc:
        # A recurrence that grows without bound (h = f(h_child)**3, say) needs int8 scales
        # no REQUANT multiplier bridges: the compile refuses it, naming the scale. Such
        # draws say nothing about running cells, so hypothesis draws another.
        if "requantization scale" not in str(exc):
            raise
        reject()
    return model, trees


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells(), st.integers(0, 1000))
def test_random_cells_run_bit_identical_in_one_launch(cell, seed):
    """Cells drawn from the vocabulary (every op, shared sub-expressions, constants after
    folding, GEMMs reading computed values) on trees with every variant of node."""
    model, trees = random_cell_model(cell, seed, CONFIG)
    for launches in ("tree", "batch"):
        result = run(model, trees, launches=launches)
        assert result.launches == (1 if launches == "tree" else len(result.lin.batches))
        assert_matches_reference(model, result)
        _verify_all(model, trees, launches)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(dags(2), min_size=1, max_size=3))
def test_random_dag_batches_are_bit_identical(batch):
    """DAGs of every accepted form (mapping, Dag, graph), shared predecessors, sources
    with and without inputs; indices up to 60, so the run gives its own input matrix."""
    model = compiled("DAG-RNN", 8)
    inputs = np.random.default_rng(len(batch)).standard_normal((64, 8))
    result = run(model, batch, inputs)
    assert result.launches == 1
    ref = reference_int8(model.quantized, result.lin, model.quantized.quantize_inputs(inputs))
    for s, expected in ref.items():
        np.testing.assert_array_equal(result.states[s], expected)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(random_input_trees(2), min_size=1, max_size=3))
def test_random_trees_with_inputs_at_internal_nodes_are_bit_identical(batch):
    model = compiled("TreeRNN-inputs", 8)
    result = run(model, batch)
    assert result.launches == 1
    assert_matches_reference(model, result)


# --- templates compiled once per model --------------------------------------------------


def test_a_new_batch_compiles_no_template(monkeypatch):
    """What is checked: the first batch that meets a variant compiles that variant's
    templates, one per chunk size it offers (its capacity and the powers of two below);
    after that, other batches of *different* trees and sizes are run by instantiating the
    kept templates alone -- ``TemplateBuilder.build`` (the only compilation step) is not
    called and the model's template table is unchanged -- and are still bit-identical."""
    model = compile_recursive(tree_fc(hidden=8, embed=8, seed=5), CONFIG,
                              calibration=[(TREES, None)], embeddings=embeddings(8, 5))
    run(model, [((1, 2), (3, 4))])
    kept = dict(model._templates)
    for variant in (Variant(False, True), Variant(True, False)):
        sizes = model.sizes(variant)
        assert {(variant.key, n) for n in sizes} <= set(kept)
        assert sizes[-1] == model.capacity(variant) and sizes[0] == 1

    def no_compilation(self):
        raise AssertionError(f"template {self.name} compiled after the variant was met")
    with monkeypatch.context() as patch:
        patch.setattr(template_module.TemplateBuilder, "build", no_compilation)
        for trees in ([(((5, 6), 7), 8)], [((9, None), (11, 12))],
                      [((1, 2), (3, 4)), ((5, 6), (7, 8)), (((1, 2), 3), ((4, 5), 6))],
                      sst_like_trees(6, seed=3, vocab=30)):
            assert_matches_reference(model, run(model, trees))
    assert model._templates == kept