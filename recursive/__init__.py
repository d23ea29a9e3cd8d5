"""Recursive models: cells over trees, DAGs and sequences, each batch of input structures
run as one accelerator program (CORTEX's approach; docs/recursive.md).

::

    from tessera import recursive as rec
    cell = rec.tree_lstm(hidden=256, embed=256)
    model = rec.compile_recursive(cell, "pynq", calibration=[(trees, None)], embeddings=E)
    result = rec.run(model, [((1, 2), 3), (4, (5, 6))], backend="sim")
    result.outputs          # each tree's root state, (2, 256)

The layers: the cell vocabulary (:mod:`.cell`) and built-in models (:mod:`.models`);
the linearizer (:mod:`.structure`) and structure generators (:mod:`.generators`);
int8 quantization (:mod:`.quantize`) and the numpy references (:mod:`.reference`);
per-variant templates lowered onto the accelerator (:mod:`.specialize`,
:mod:`.template`), instantiated and joined per batch of structures (:mod:`.program`,
:mod:`.compiled`); runs through the Device API (:mod:`.run`); the board projection of a run and of the
float model on the board's CPU (:mod:`.project`).
"""
from .cell import (Cell, Expr, child, child_matrix, child_sum, left_linear, linear, matvec,
                   node_input, relu, sigmoid, tanh)
from .compiled import LAUNCHES, RecursiveModel, compile_recursive
from .generators import grid_dag, perfect_tree, random_sequence, sst_like_trees
from .project import Projection, project_cpu, project_launches
from .models import MODELS, dag_rnn, mv_rnn, tree_fc, tree_gru, tree_lstm, tree_rnn
from .quantize import QuantizedCell, quantize_cell
from .reference import reference_float, reference_int8
from .run import RecursiveResult, run
from .structure import Dag, Linearized, ParentArray, Tree, linearize

__all__ = [
    "Cell", "Dag", "Expr", "LAUNCHES", "Linearized", "MODELS", "ParentArray", "Projection", "QuantizedCell",
    "RecursiveModel", "RecursiveResult", "Tree", "child", "child_matrix", "child_sum", "compile_recursive",
    "dag_rnn", "grid_dag", "left_linear", "linear", "matvec", "mv_rnn", "linearize", "node_input", "perfect_tree", "project_cpu", "project_launches",
    "quantize_cell", "random_sequence", "reference_float", "reference_int8", "relu", "run",
    "sigmoid", "sst_like_trees", "tanh", "tree_fc", "tree_gru", "tree_lstm", "tree_rnn",
]
