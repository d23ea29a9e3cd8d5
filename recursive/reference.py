"""Numpy references of a cell over a linearized batch: float, and the exact int8 meaning.

Both walk the batches in order (a node's children are in earlier batches) and evaluate
the cell's expressions for every node of a batch at once. The int8 meaning of each
operation (:func:`int_op`) is the accelerator's contract: the program of
:mod:`.lower` reproduces it bit for bit. With ``s`` the scales of :mod:`.quantize` and
``R(v, m) = rint(f32(v) * f32(m))`` (REQUANT, round half to even) and ``clip8`` the
saturation to [-128, 127]:

* linear: ``clip8(R(sum_i W_i x_i + b, s_acc / s_y))`` (int32 sums, weights int8 at
  ``s_acc / s_x_i``, bias int32 at ``s_acc``);
* ``a + b`` / ``a - b``: ``clip8(R(a, s_a/s_y) +/- R(b, s_b/s_y))``;
* ``a * b``: ``clip8(R(a b, s_a s_b / s_y))``; rescale: ``clip8(R(a, s_a/s_y))``;
* sigmoid, tanh: a 256-entry table indexed by the int8 input; relu: ``max(a, 0)``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from tessera.compiler.accel.epilogue import reference_stages
from tessera.compiler.accel.ops import Requant

from .cell import Cell, Expr

ACTIVATIONS = {"sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)), "tanh": np.tanh,
               "relu": lambda v: np.maximum(v, 0.0)}


def requant(v: np.ndarray, scale: float) -> np.ndarray:
    """``rint(f32(v) * f32(scale))``: the REQUANT ALU op's exact meaning (int64)."""
    return reference_stages(np.asarray(v, dtype=np.int64), (Requant(float(scale)),), 1)


def clip8(v: np.ndarray) -> np.ndarray:
    return np.clip(v, -128, 127)


def _gather(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` of ``table``, zeros where ``index`` is -1."""
    out = table[np.maximum(index, 0)]
    out[index < 0] = 0
    return out


def value_shape(e: Expr, nodes: int) -> tuple[int, ...]:
    """The array of ``e``'s values over ``nodes`` nodes: ``(n, width)``, or
    ``(n, rows, width)`` for a matrix."""
    return (nodes, e.width) if e.rows == 1 else (nodes, e.rows, e.width)


def float_op(e: Expr, args: list[np.ndarray]) -> np.ndarray:
    """The float meaning of expression ``e`` on its arguments' values."""
    if e.op == "linear":
        return sum(a @ w.T for w, a in zip(e.weights, args)) + e.bias
    if e.op == "matvec":
        return np.einsum("noi,ni->no", args[0], args[1])
    if e.op == "mlinear":
        return sum(np.einsum("oi,nic->noc", w, m) for w, m in zip(e.weights, args)) + e.bias
    if e.op in ACTIVATIONS:
        return ACTIVATIONS[e.op](args[0])
    if e.op == "add":
        return args[0] + args[1]
    if e.op == "sub":
        return args[0] - args[1]
    if e.op == "mul":
        return args[0] * args[1]
    if e.op == "rescale":
        return args[0]
    raise ValueError(f"no float meaning for {e.label}")


def evaluate(cell: Cell, lin, inputs: np.ndarray | None, op=float_op,
             dtype=np.float64, record: dict[int, list[np.ndarray]] | None = None
             ) -> dict[str, np.ndarray]:
    """Every node's states (``{state: (N, width)}``) over the linearized batch ``lin``.

    ``inputs``: the input matrix the nodes' input indices select rows of; ``op`` gives an
    expression's value from its arguments' (float by default, :func:`int_op` bound to a
    quantized cell for the int8 meaning); ``record``, when given, collects every
    expression's values per batch (calibration).
    """
    n = lin.num_nodes
    states = {s: np.zeros(value_shape(e, n), dtype=dtype) for s, e in cell.states.items()}
    order = cell.exprs
    for start, end in lin.batches:
        rows = np.arange(start, end)
        env: dict[int, np.ndarray] = {}
        for e in order:
            if e.op == "input":
                env[e.uid] = _gather(np.asarray(inputs, dtype=dtype), lin.inputs[rows])
            elif e.op == "child":
                env[e.uid] = _gather(states[e.state], lin.children[rows, e.slot])
            else:
                env[e.uid] = op(e, [env[a.uid] for a in e.args])
            if record is not None:
                record.setdefault(e.uid, []).append(env[e.uid])
        for s, e in cell.states.items():
            states[s][rows] = env[e.uid]
    return states


def reference_float(cell: Cell, lin, inputs: np.ndarray | None) -> dict[str, np.ndarray]:
    """The float model's states of every node."""
    return evaluate(cell, lin, inputs)


def reference_int8(qcell, lin, inputs_q: np.ndarray | None) -> dict[str, np.ndarray]:
    """The int8 model's states of every node (``inputs_q``: the int8 input matrix)."""
    return evaluate(qcell.cell, lin, inputs_q, op=qcell.int_op, dtype=np.int64)


def outputs_of(states: Mapping[str, np.ndarray], cell: Cell, lin) -> np.ndarray:
    """Each structure's result: the output state of its root, ``(S, width)``."""
    return states[cell.output][lin.roots]
