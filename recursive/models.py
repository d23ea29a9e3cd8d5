"""The built-in recursive models, as cells of the vocabulary in :mod:`.cell`.

Each builder takes the sizes and either ``weights`` (a mapping of the names listed in
its docstring to numpy arrays, e.g. trained parameters) or a ``seed`` for a uniform
``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` initialisation (PyTorch's default for linear
layers). Shapes are ``(out, in)`` for matrices and ``(out,)`` for biases.

The models are the ones CORTEX evaluates (TreeFC, TreeGRU, TreeLSTM, MV-RNN, DAG-RNN)
plus the plain TreeRNN; a leaf is specialised (its absent children are zeros, so the
terms that read them vanish at compile time).
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from tessera.errors import CompileError

from .cell import (Cell, Expr, child, child_matrix, child_sum, left_linear, linear, matvec,
                   node_input, sigmoid, tanh)


class _Params:
    """Named parameters: the caller's, else seeded uniform ones (and a record of both)."""

    def __init__(self, model: str, weights: Mapping[str, np.ndarray] | None, seed: int):
        self.model = model
        self.given = dict(weights or {})
        self.rng = np.random.default_rng(seed)
        self.used: dict[str, np.ndarray] = {}

    def __call__(self, name: str, *shape: int) -> np.ndarray:
        if name in self.given:
            w = np.asarray(self.given[name], dtype=np.float64)
            if w.shape != shape:
                raise CompileError(f"{self.model}: weight {name!r} has shape {w.shape}, "
                                   f"expected {shape}")
        else:
            bound = 1.0 / np.sqrt(shape[-1] if len(shape) > 1 else shape[0])
            w = self.rng.uniform(-bound, bound, size=shape)
        self.used[name] = w
        return w

    def check_all_used(self) -> None:
        unknown = sorted(set(self.given) - set(self.used))
        if unknown:
            raise CompileError(f"{self.model}: unknown weights {unknown}; this model takes "
                               f"{sorted(self.used)}")


def _build(model: str, weights, seed: int, body: Callable[[_Params], Cell]) -> Cell:
    p = _Params(model, weights, seed)
    cell = body(p)
    p.check_all_used()
    return cell


def _slot_fc(name: str, kind: str, hidden: int, embed: int, max_children: int,
             weights: Mapping[str, np.ndarray] | None, seed: int) -> Cell:
    """``h = tanh(W x + sum_k U_k h_k + b)``, each child slot its own ``U_k``."""
    def body(p: _Params) -> Cell:
        x = node_input(embed)
        terms = [(p("W", hidden, embed), x)] + [
            (p(f"U{k}", hidden, hidden), child("h", k, hidden)) for k in range(max_children)]
        return Cell(name, kind, max_children, {"h": tanh(linear(*terms, bias=p("b", hidden)))})
    return _build(name, weights, seed, body)


def tree_fc(hidden: int = 256, embed: int = 256, *, max_children: int = 2,
            weights: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> Cell:
    """TreeFC: ``h = tanh(W x + sum_k U_k h_k + b)``, each child slot its own ``U_k``.
    Weights ``W``, ``U0``.. ``U{K-1}``, ``b``."""
    return _slot_fc("TreeFC", "tree", hidden, embed, max_children, weights, seed)


def tree_rnn(hidden: int = 256, embed: int = 256, *, max_children: int = 2,
             weights: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> Cell:
    """TreeRNN (child-sum): ``h = tanh(W x + U sum_k h_k + b)``. Weights ``W``, ``U``, ``b``."""
    def body(p: _Params) -> Cell:
        hs = child_sum("h", hidden, max_children)
        h = tanh(linear((p("W", hidden, embed), node_input(embed)),
                        (p("U", hidden, hidden), hs), bias=p("b", hidden)))
        return Cell("TreeRNN", "tree", max_children, {"h": h})
    return _build("TreeRNN", weights, seed, body)


def tree_gru(hidden: int = 256, embed: int = 256, *, max_children: int = 2,
             weights: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> Cell:
    """Child-sum TreeGRU: ``hs = sum_k h_k``, ``z = sigmoid(Wz x + Uz hs + bz)``,
    ``r_k = sigmoid(Wr x + Ur h_k + br)``, ``g = tanh(Wh x + Uh sum_k r_k h_k + bh)``,
    ``h = g + z (hs - g)`` (i.e. ``z hs + (1 - z) g``).
    Weights ``Wz Uz bz Wr Ur br Wh Uh bh``."""
    def body(p: _Params) -> Cell:
        x = node_input(embed)
        hs = child_sum("h", hidden, max_children)
        z = sigmoid(linear((p("Wz", hidden, embed), x), (p("Uz", hidden, hidden), hs),
                           bias=p("bz", hidden)))
        wr, ur, br = p("Wr", hidden, embed), p("Ur", hidden, hidden), p("br", hidden)
        gated = None
        for k in range(max_children):
            hk = child("h", k, hidden)
            rk = sigmoid(linear((wr, x), (ur, hk), bias=br))
            gated = rk * hk if gated is None else gated + rk * hk
        g = tanh(linear((p("Wh", hidden, embed), x), (p("Uh", hidden, hidden), gated),
                        bias=p("bh", hidden)))
        return Cell("TreeGRU", "tree", max_children, {"h": g + z * (hs - g)})
    return _build("TreeGRU", weights, seed, body)


def _lstm_update(i: Expr, o: Expr, u: Expr, forget: list[Expr], hidden: int
                 ) -> dict[str, Expr]:
    c = i * u
    for k, f in enumerate(forget):
        c = c + f * child("c", k, hidden)
    return {"h": o * tanh(c), "c": c}


def tree_lstm(hidden: int = 256, embed: int = 256, *, max_children: int = 2,
              nary: bool = False, weights: Mapping[str, np.ndarray] | None = None,
              seed: int = 0) -> Cell:
    """TreeLSTM (Tai et al. 2015). Child-sum (default): gates ``i, o, u`` from ``W* x +
    U* sum_k h_k``, a forget gate per child ``f_k = sigmoid(Wf x + Uf h_k + bf)``.
    N-ary (``nary=True``): every gate reads each slot through its own matrix
    (``U{g}{k}``, and ``Uf{k}{l}``: forget gate ``k`` from child ``l``). Then
    ``c = i u + sum_k f_k c_k``, ``h = o tanh(c)``. Weights ``W{g}``, ``b{g}`` for
    ``g`` in ``i o u f`` and the ``U`` s above."""
    def body(p: _Params) -> Cell:
        x = node_input(embed)
        hs = [child("h", k, hidden) for k in range(max_children)]
        w = {g: p(f"W{g}", hidden, embed) for g in "iouf"}
        b = {g: p(f"b{g}", hidden) for g in "iouf"}
        if nary:
            def gate(g: str) -> Expr:
                return linear((w[g], x), *[(p(f"U{g}{k}", hidden, hidden), hs[k])
                                           for k in range(max_children)], bias=b[g])
            forget = [sigmoid(linear((w["f"], x), *[(p(f"Uf{k}{l}", hidden, hidden), hs[l])
                                                    for l in range(max_children)], bias=b["f"]))
                      for k in range(max_children)]
        else:
            hsum = child_sum("h", hidden, max_children)
            u_f = p("Uf", hidden, hidden)

            def gate(g: str) -> Expr:
                return linear((w[g], x), (p(f"U{g}", hidden, hidden), hsum), bias=b[g])
            forget = [sigmoid(linear((w["f"], x), (u_f, hk), bias=b["f"])) for hk in hs]
        states = _lstm_update(sigmoid(gate("i")), sigmoid(gate("o")), tanh(gate("u")),
                              forget, hidden)
        return Cell("TreeLSTM" + ("-nary" if nary else ""), "tree", max_children, states)
    return _build("TreeLSTM", weights, seed, body)


def dag_rnn(hidden: int = 256, embed: int = 256, *, max_children: int = 2,
            weights: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> Cell:
    """DAG-RNN (Shuai et al. 2016) over an image grid: ``h = tanh(W x + sum_k U_k h_k + b)``
    with one ``U_k`` per predecessor direction. Weights ``W``, ``U0``.., ``b``."""
    return _slot_fc("DAG-RNN", "dag", hidden, embed, max_children, weights, seed)


def mv_rnn(hidden: int = 64, embed: int = 64, *,
           weights: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> Cell:
    """MV-RNN (Socher et al. 2012): every node has a vector ``v`` and a matrix ``M``. For
    children ``(a, A)`` and ``(b, B)``: ``v = tanh(W1 (B a) + W2 (A b) + Wx x + b)`` and
    ``M = WM1 A + WM2 B + M0``. A leaf (no children) gets ``v = tanh(Wx x + b)`` and
    ``M = M0``: the composition's bias matrix is every leaf's matrix (Socher's model gives
    each word its own matrix; one shared leaf matrix keeps the parameters to
    ``O(hidden^2)``). ``M0`` defaults to the identity plus uniform noise of 0.01, as
    Socher initialises word matrices. Weights ``W1 W2 Wx b WM1 WM2 M0``."""
    def body(p: _Params) -> Cell:
        a, b = child("v", 0, hidden), child("v", 1, hidden)
        ma, mb = child_matrix("M", 0, hidden), child_matrix("M", 1, hidden)
        v = tanh(linear((p("W1", hidden, hidden), matvec(mb, a)),
                        (p("W2", hidden, hidden), matvec(ma, b)),
                        (p("Wx", hidden, embed), node_input(embed)), bias=p("b", hidden)))
        given = "M0" in p.given
        m0 = p("M0", hidden, hidden)
        m0 = m0 if given else np.eye(hidden) + 0.01 * np.sign(m0)
        m = left_linear((p("WM1", hidden, hidden), ma), (p("WM2", hidden, hidden), mb), bias=m0)
        return Cell("MV-RNN", "tree", 2, {"v": v, "M": m}, output="v")
    return _build("MV-RNN", weights, seed, body)


#: Built-in models by name (the benchmark's and the tests' list).
MODELS: dict[str, Callable[..., Cell]] = {
    "TreeFC": tree_fc, "TreeRNN": tree_rnn, "TreeGRU": tree_gru, "TreeLSTM": tree_lstm,
    "DAG-RNN": dag_rnn, "MV-RNN": mv_rnn,
}
