"""The board projection of recursive runs (tessera.recursive.project): the parts add up,
launches and transfers are priced by the host model, and the node-by-node CPU pricing
of the float model. Tiny config, hidden 8; no wall-clock time is checked."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.errors import ConfigError
from tessera.hostmodel import Work, get_host_model
from tessera.isa import INSN_BYTES
from tessera.recursive import (compile_recursive, linearize, run, sst_like_trees, tanh,
                               mv_rnn, tree_fc, tree_lstm)
from tessera.recursive.project import (Projection, expression_work, node_calls,
                                       project_cpu, project_launches)
from tessera.recursive.run import prepare

HOST = get_host_model("cortex-a9")
VOCAB, H = 40, 8


@pytest.fixture(scope="module")
def model():
    emb = np.random.default_rng(0).standard_normal((VOCAB, H))
    cal = sst_like_trees(3, seed=5, vocab=VOCAB)
    return compile_recursive(tree_fc(hidden=H, embed=H), "tiny", calibration=[(cal, None)],
                             embeddings=emb)


TREES = sst_like_trees(2, seed=1, vocab=VOCAB)


def projected(model, launches: str, inputs=None) -> Projection:
    _, programs, _, _ = prepare(model, TREES, inputs, launches)
    result = run(model, TREES, inputs, launches=launches)
    return project_launches(model, result, programs, HOST, inputs=inputs)


@pytest.fixture(scope="module")
def by_launches(model):
    return {launches: projected(model, launches) for launches in ("tree", "batch", "node")}


def test_parts_add_up_and_are_the_host_models(model, by_launches):
    _, programs, _, _ = prepare(model, TREES, None, "batch")
    p = by_launches["batch"]
    assert p.total_seconds == pytest.approx(p.accelerator_seconds + p.launch_seconds
                                            + p.transfer_seconds)
    assert p.launches == len(programs)
    assert p.launch_seconds == pytest.approx(p.launches * HOST.launch_seconds)
    assert p.accelerator_seconds == pytest.approx(p.cycles / (model.config.clock_mhz * 1e6))
    # instruction streams written + one padded output row per tree read back (tiny: 4 lanes)
    insns = sum(len(q.instructions) for q in programs)
    assert p.transfer_bytes == insns * INSN_BYTES + len(TREES) * 2 * model.config.block_out
    assert p.transfer_seconds == pytest.approx(HOST.transfer_seconds(p.transfer_bytes))


def test_more_launches_cost_more_launch_time(by_launches):
    tree, batch, node = (by_launches[k] for k in ("tree", "batch", "node"))
    assert tree.launches == 1 < batch.launches < node.launches
    assert tree.launch_seconds < batch.launch_seconds < node.launch_seconds
    # every launch reloads its weights: more launches, more cycles
    assert tree.cycles < node.cycles
    assert tree.total_seconds < batch.total_seconds < node.total_seconds


def test_per_run_inputs_are_sent_resident_embeddings_are_not(model, by_launches):
    lin = model.linearize(TREES)
    rows = int(lin.inputs.max()) + 1
    matrix = np.random.default_rng(3).standard_normal((rows, H))
    given = projected(model, "tree", inputs=matrix)
    resident = by_launches["tree"]
    assert given.transfer_bytes - resident.transfer_bytes == rows * 2 * model.config.block_out
    assert given.transfer_seconds > resident.transfer_seconds


def test_programs_must_be_the_runs(model):
    _, programs, _, _ = prepare(model, TREES, None, "batch")
    result = run(model, TREES, launches="tree")
    with pytest.raises(ValueError, match="launches"):
        project_launches(model, result, programs, HOST)


def test_unknown_host_names_are_the_host_models_errors(model):
    _, programs, _, _ = prepare(model, TREES, None, "tree")
    result = run(model, TREES)
    with pytest.raises(ConfigError, match="unknown host model 'vax'"):
        project_launches(model, result, programs, "vax")
    with pytest.raises(ConfigError, match="unknown host model 'vax'"):
        project_cpu(model.cell, result.lin, "vax")


def test_cpu_pricing_is_per_node():
    cell = tree_fc(hidden=H, embed=H)
    small = linearize(sst_like_trees(1, seed=2, vocab=VOCAB), kind="tree", max_children=2)
    twice = linearize(sst_like_trees(1, seed=2, vocab=VOCAB) * 2, kind="tree", max_children=2)
    assert project_cpu(cell, twice, HOST) == pytest.approx(2 * project_cpu(cell, small, HOST))
    # a leaf's call (W x) and an inner node's (U0 h0 + U1 h1), summed over the nodes
    leaves = int(np.sum(np.all(small.children < 0, axis=1)))
    inner = small.num_nodes - leaves
    leaf_s = sum(HOST.kernel_seconds(w) for w in node_calls(cell, frozenset(), True))
    inner_s = sum(HOST.kernel_seconds(w) for w in node_calls(cell, frozenset({0, 1}), False))
    assert project_cpu(cell, small, HOST) == pytest.approx(leaves * leaf_s + inner * inner_s)
    assert inner_s > leaf_s


def test_leaves_fold_the_terms_that_read_children():
    cell = tree_lstm(hidden=H, embed=H)
    leaf = node_calls(cell, frozenset(), True)
    inner = node_calls(cell, frozenset({0, 1}), True)
    gemm = [w for w in leaf if w.kind == "gemm_float"]
    # a leaf: gates i, o, u from W x only (no forget gates: f_k * c_k is 0)
    assert len(gemm) == 3 and all(w.ops == H * H for w in gemm)
    assert sorted(w.kind for w in leaf).count("transcendental") == 4   # i, o, u, tanh(c)
    # an inner node with an input: i, o, u (W x + U hsum), two forget gates
    assert sum(w.ops for w in inner if w.kind == "gemm_float") == 10 * H * H


def test_expression_work_counts_bytes_like_node_work():
    cell = tree_fc(hidden=H, embed=H)
    lin = next(e for e in cell.exprs if e.op == "linear")
    w = expression_work(lin, [0, 1, 2])
    assert (w.kind, w.ops, w.elements) == ("gemm_float", 3 * H * H, H)
    assert w.bytes == 4 * (3 * (H + H * H) + H + H)       # x_k, W_k, bias, output
    assert expression_work(tanh(lin)) == Work("transcendental", 0, H, 4 * 2 * H)
    with pytest.raises(ValueError, match="no kernel call"):
        expression_work(lin.args[0])                        # the node input: no call


def test_mv_rnn_matrix_products_are_priced_as_gemms():
    cell = mv_rnn(hidden=H, embed=H)
    leaf = node_calls(cell, frozenset(), True)          # v = tanh(Wx x + b), M = M0: constant
    assert sorted(w.kind for w in leaf) == ["gemm_float", "transcendental"]
    inner = node_calls(cell, frozenset({0, 1}), False)
    macs = sorted(w.ops for w in inner if w.kind == "gemm_float")
    # B a and A b (H*H each), W1 (B a) + W2 (A b) (2 H*H), WM1 A + WM2 B (2 H**3)
    assert macs == [H * H, H * H, 2 * H * H, 2 * H ** 3]
