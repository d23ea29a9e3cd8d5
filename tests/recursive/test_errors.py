"""Errors of the recursive-model API: bad structures, inputs, configs, weights and options
raise the ``tessera.errors`` exception that names what was wrong, where and what to do,
before anything reaches the device."""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

from tessera.config import PRESETS, HwConfig
from tessera.errors import CompileError, RunError, StructureError, TesseraError
from tessera.recursive import (Dag, ParentArray, Tree, compile_recursive, dag_rnn, grid_dag,
                               mv_rnn, run, tree_fc, tree_gru, tree_lstm, tree_rnn)
from tessera.runtime import open_device

from tests.recursive.test_models import compiled, embeddings

#: The module (``tessera.recursive.run`` the attribute is the function).
run_module = importlib.import_module("tessera.recursive.run")


@pytest.fixture
def untouchable(monkeypatch):
    """A sim device whose every way in fails the test: an error raised by ``run`` with it
    was raised before anything was allocated, loaded or launched; opening a device of
    its own fails the test too."""
    dev = open_device("sim", PRESETS["tiny"])

    def forbidden(*args, **kwargs):
        raise AssertionError("the device was used before the error was raised")
    for method in ("allocate", "load", "launch", "run"):
        monkeypatch.setattr(dev, method, forbidden)
    monkeypatch.setattr(run_module, "open_device", forbidden)
    yield dev
    dev.close()


def raises(exc, model, structures, *parts, device, **kwargs) -> str:
    """``run`` raises ``exc`` whose message contains every one of ``parts``."""
    with pytest.raises(exc) as info:
        run(model, structures, device=device, **kwargs)
    message = str(info.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


# --- bad structures: StructureError before any launch -----------------------------------

GOOD_TREE, GOOD_GRID = ((1, 2), 3), grid_dag(2, 2)


@pytest.mark.parametrize("structure,parts", [
    ({"a": ["b"], "b": ["a"], "c": ["a"]}, ["structure 1", "cycle", "'a'"]),
    (Dag({"a": ["c"], "b": ["a"], "c": ["b"], "d": ["c"]}), ["structure 1", "cycle"]),
    ({"a": [], "b": ["a", "a", "a"]}, ["structure 1", "3", "at most 2"]),
    ({"a": [], "b": ["x"]}, ["structure 1", "'x'", "not a node"]),
    ({}, ["structure 1", "no nodes"]),
], ids=["cycle", "cycle-dag", "too-many-preds", "unknown-pred", "empty-dag"])
def test_bad_dags_are_structure_errors_before_any_launch(untouchable, structure, parts):
    raises(StructureError, compiled("DAG-RNN", 8), [GOOD_GRID, structure], *parts,
           device=untouchable)


@pytest.mark.parametrize("structure,parts", [
    (ParentArray([-1, 2, 1]), ["structure 1", "cycle"]),
    (ParentArray([1, 0]), ["structure 1"]),
    (ParentArray([-1, 0, 0, 0]), ["structure 1", "3 children", "at most 2"]),
    ((1, 2, 3), ["structure 1", "3 children", "at most 2", "max_children=3"]),
    ((1, (2, 3, 4)), ["structure 1", "[1]", "3 children"]),
    (Tree(1, (2, 3, 4)), ["structure 1", "3 children"]),
    ((), ["structure 1", "empty"]),
    ((1, ()), ["structure 1", "[1]", "empty"]),
    ((1, -2), ["structure 1", "-2", "non-negative"]),
    ((1, "word"), ["structure 1", "'word'", "input index"]),
    (GOOD_GRID, ["structure 1", "Dag", "kind='dag'"]),
], ids=["parent-cycle", "parent-no-root", "parent-too-many", "too-many-children",
        "too-many-deep", "tree-too-many", "empty-tuple", "empty-subtree", "negative-input",
        "string-input", "dag-for-a-tree-model"])
def test_bad_trees_are_structure_errors_before_any_launch(untouchable, structure, parts):
    raises(StructureError, compiled("TreeLSTM", 8), [GOOD_TREE, structure], *parts,
           device=untouchable)


def test_a_cyclic_tree_of_tuples_is_a_structure_error(untouchable):
    loop: list = [1]
    loop.append(loop)
    raises(StructureError, compiled("TreeFC", 8), [GOOD_TREE, loop], "structure 1", "same object",
           device=untouchable)


@pytest.mark.parametrize("batch,parts", [([], ["empty", "at least one structure"]),
                                         (None, ["batch", "NoneType"]),
                                         (Tree(1, (2, 3)), ["batch", "[structure]"])],
                         ids=["empty-batch", "none", "one-tree-not-a-batch"])
def test_bad_batches_are_structure_errors_before_any_launch(untouchable, batch, parts):
    raises(StructureError, compiled("TreeFC", 8), batch, *parts, device=untouchable)


def test_an_empty_sequence_is_a_structure_error(untouchable):
    raises(StructureError, compiled("GatedSeq", 8), [[1, 2], []], "structure 1", "empty",
           device=untouchable)


# --- bad inputs: RunError before any launch ---------------------------------------------


def test_an_input_index_past_the_matrix_is_a_run_error(untouchable):
    model = compiled("TreeFC", 8)
    raises(RunError, model, [GOOD_TREE, (4, 40)], "row 40", f"{len(model.embeddings)} rows",
           device=untouchable)
    raises(RunError, model, [(1, 5)], "row 5", "3 rows", device=untouchable,
           inputs=embeddings(8)[:3])


def test_an_input_index_past_the_matrix_names_the_structure(untouchable):
    raises(RunError, compiled("TreeFC", 8), [GOOD_TREE, (4, 40)], "structure 1",
           device=untouchable)


@pytest.mark.parametrize("shape,parts", [((10, 5), ["(10, 5)", "width 8"]),
                                         ((8,), ["(8,)", "width 8"]),
                                         ((3, 8, 1), ["(3, 8, 1)", "width 8"])])
def test_an_input_matrix_of_the_wrong_shape_is_a_run_error(untouchable, shape, parts):
    raises(RunError, compiled("TreeFC", 8), [GOOD_TREE], *parts, device=untouchable,
           inputs=np.zeros(shape))


def test_inputs_missing_without_embeddings_is_a_run_error(untouchable):
    model = compile_recursive(tree_rnn(hidden=8, embed=8), "tiny",
                              calibration=[([GOOD_TREE], embeddings(8))])
    raises(RunError, model, [GOOD_TREE], "no input matrix", "no embeddings", "inputs=",
           device=untouchable)
    # Structures that read no input need none.
    with open_device("sim", PRESETS["tiny"]) as dev:
        assert run(model, [(None, None)], device=dev).outputs.shape == (1, 8)


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
def test_non_finite_inputs_are_a_run_error(untouchable, value):
    inputs = embeddings(8).copy()
    inputs[2, 3] = value
    raises(RunError, compiled("TreeFC", 8), [GOOD_TREE], "finite", device=untouchable,
           inputs=inputs)


def test_an_input_matrix_of_strings_is_a_run_error(untouchable):
    raises(RunError, compiled("TreeFC", 8), [GOOD_TREE], "input matrix", device=untouchable,
           inputs=[["a"] * 8] * 4)


# --- bad options ------------------------------------------------------------------------


@pytest.mark.parametrize("launches", ["level", None, "TREE"])
def test_an_unknown_launch_granularity_is_refused_before_any_launch(untouchable, launches):
    raises(CompileError, compiled("TreeFC", 8), [GOOD_TREE], "tree, batch, node",
           repr(launches), device=untouchable, launches=launches)


def test_a_device_of_another_config_is_refused_before_any_launch(monkeypatch):
    """A model compiled for ``tiny`` on a ``pynq`` device: refused with both names (as
    ``Device.load`` refuses a program of another config), nothing launched or left."""
    with open_device("sim", PRESETS["pynq"]) as dev:
        def forbidden(*args, **kwargs):
            raise AssertionError("launched on a device of another config")
        monkeypatch.setattr(dev, "launch", forbidden)
        with pytest.raises(TesseraError) as info:
            run(compiled("TreeFC", 8), [GOOD_TREE], device=dev)
        assert "'tiny'" in str(info.value) and "'pynq'" in str(info.value), str(info.value)
        assert dev.counters()["live_buffers"] == 0


# --- configs the models cannot run on ---------------------------------------------------

CALIBRATION = [([GOOD_TREE], embeddings(8))]


@pytest.mark.parametrize("changes,parts", [
    ({"name": "tiny-batch2", "batch": 2}, ["'tiny-batch2'", "batch 2", "batch 1"]),
    ({"name": "tiny-nolut", "table_entries": 0}, ["'tiny-nolut'", "table_entries = 0",
                                                  "sigmoid"]),
    ({"name": "tiny-4x8", "block_out": 8}, ["'tiny-4x8'", "4x8", "block_in == block_out"]),
], ids=["batch2", "no-table", "rectangular"])
def test_configs_the_models_cannot_run_on_are_compile_errors(changes, parts):
    config = dataclasses.replace(PRESETS["tiny"], **changes)
    assert isinstance(config, HwConfig)         # a valid config, just not for these models
    with pytest.raises(CompileError) as info:
        compile_recursive(tree_lstm(hidden=8, embed=8), config, calibration=CALIBRATION)
    for part in parts:
        assert part in str(info.value), (part, str(info.value))


@pytest.mark.parametrize("build,hidden", [(tree_lstm, 64),
                                          (tree_lstm, 128),
                                          (mv_rnn, 12)],
                         ids=["uop-buffer", "accumulator", "mv-rnn-accumulator"])
def test_a_model_too_large_for_the_config_is_a_compile_error_naming_it(untouchable, build,
                                                                        hidden):
    """(Matrices larger than the weight buffer stream; a node whose values do not fit the
    accumulator or whose kernels do not fit the uop buffer cannot run.)"""
    emb = np.ones((4, hidden))
    model = compile_recursive(build(hidden=hidden, embed=hidden), "tiny",
                              calibration=[([GOOD_TREE], emb)])
    raises(CompileError, model, [GOOD_TREE], model.cell.name, "'tiny'", device=untouchable,
           inputs=emb)


# --- weights ----------------------------------------------------------------------------

BUILDERS = {"TreeFC": (tree_fc, "W"), "TreeRNN": (tree_rnn, "U"), "TreeGRU": (tree_gru, "Uz"),
            "TreeLSTM": (tree_lstm, "Wi"), "DAG-RNN": (dag_rnn, "U1")}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_weight_of_the_wrong_shape_is_a_compile_error(name):
    build, weight = BUILDERS[name]
    with pytest.raises(CompileError) as info:
        build(hidden=8, embed=8, weights={weight: np.zeros((8, 7))})
    assert f"'{weight}'" in str(info.value) and "(8, 7)" in str(info.value)
    assert "(8, 8)" in str(info.value)
    with pytest.raises(CompileError, match=r"'b\w*' has shape \(7,\), expected \(8,\)"):
        bias = {"TreeGRU": "bz", "TreeLSTM": "bi"}.get(name, "b")
        build(hidden=8, embed=8, weights={bias: np.zeros(7)})


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_an_unknown_weight_name_is_a_compile_error_listing_the_known_ones(name):
    build, weight = BUILDERS[name]
    with pytest.raises(CompileError) as info:
        build(hidden=8, embed=8, weights={"Wq": np.zeros((8, 8))})
    assert "'Wq'" in str(info.value) and f"'{weight}'" in str(info.value)


def test_given_weights_are_the_ones_used():
    w = np.full((8, 8), 0.25)
    cell = tree_fc(hidden=8, embed=8, weights={"W": w})
    (linear,) = [e for e in cell.exprs if e.op == "linear"]
    np.testing.assert_array_equal(linear.weights[0], w)


# --- calibration ------------------------------------------------------------------------


@pytest.mark.parametrize("calibration,embed,parts", [
    ([], None, ["calibration"]),
    ([([GOOD_TREE], None)], None, ["input"]),
    ([([(1, 40)], None)], embeddings(8), ["row 40"]),
    ([([GOOD_TREE], np.zeros((4, 6)))], None, ["(4, 6)", "width 8"]),
    ([([GOOD_TREE], None)], np.zeros((40, 3)), ["(40, 3)", "width 8"]),
    ([([GOOD_TREE], np.full((4, 8), np.nan))], None, ["finite"]),
], ids=["none", "no-inputs", "index-past", "wrong-width", "embeddings-wrong-width",
        "non-finite"])
def test_bad_calibration_data_is_a_compile_error(calibration, embed, parts):
    with pytest.raises(CompileError) as info:
        compile_recursive(tree_fc(hidden=8, embed=8), "tiny", calibration=calibration,
                          embeddings=embed)
    for part in parts:
        assert part in str(info.value), (part, str(info.value))


def test_bad_calibration_structures_are_structure_errors():
    with pytest.raises(StructureError, match="structure 0 .* 3 children"):
        compile_recursive(tree_fc(hidden=8, embed=8), "tiny",
                          calibration=[([(1, 2, 3)], embeddings(8))])


def test_the_untouchable_device_fails_a_run_that_would_launch(untouchable):
    with pytest.raises(AssertionError, match="device was used"):
        run(compiled("TreeFC", 8), [GOOD_TREE], device=untouchable)
