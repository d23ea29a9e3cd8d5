"""Board latency of a recursive model, projected: the accelerator launches of a run
(:func:`project_launches`) and the board CPU running the float model node by node
(:func:`project_cpu`), both priced with the board CPU's host model
(:mod:`tessera.hostmodel`), the same figures the compiler's placement and the runtime's
board projection use (docs/models.md, "Scheduling the CPU and the accelerator together":
a segment costs a launch, its transfers and its cycles at the config's clock).

What is projected is the board's part of a run. The host's *preparation* (linearizing
the structures, instantiating the templates) is not: it is Python code whose time on
the board's CPU no host-model kind describes (no kernel, only interpreter work), so the
benchmark reports it as measured on this machine, beside the projection.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tessera.hostmodel import HostModel, Work, get_host_model
from tessera.isa import INSN_BYTES, Program

from .cell import Cell, Expr
from .compiled import RecursiveModel
from .run import RecursiveResult
from .structure import Linearized
from .template import blocks

#: Bytes of a float the CPU baseline computes in (a C implementation's ``float``).
FLOAT_BYTES = 4


@dataclass(frozen=True)
class Projection:
    """A run's projected board latency, by part (seconds)."""

    launches: int
    #: Accelerator cycles over every launch.
    cycles: int
    #: ``cycles`` at the config's clock.
    accelerator_seconds: float
    #: One host-model launch per program (register writes, start, completion).
    launch_seconds: float
    #: Host copies and cache maintenance: the instruction streams and a per-run input
    #: matrix written, the structures' output states read back.
    transfer_seconds: float
    #: The bytes those transfers move.
    transfer_bytes: int

    @property
    def total_seconds(self) -> float:
        return self.accelerator_seconds + self.launch_seconds + self.transfer_seconds


def _host(host: HostModel | str | None, model: RecursiveModel) -> HostModel:
    return get_host_model(host, model.config.name)


def _row_bytes(model: RecursiveModel, width: int) -> int:
    """Bytes of one node's int8 vector in the run's DRAM arrays (padded to blocks)."""
    return blocks(model.config, width) * model.config.block_out


def project_launches(model: RecursiveModel, result: RecursiveResult,
                     programs: Sequence[Program], host: HostModel | str | None = None, *,
                     inputs: np.ndarray | None = None) -> Projection:
    """The board latency of ``result``, the run of ``programs`` (one per launch, as
    :meth:`~.compiled.RecursiveModel.programs` made them, ``result.cycles`` theirs).

    Included, priced by ``host`` (a :class:`~tessera.hostmodel.HostModel`, a built-in's
    name, ``None`` for the config's board):

    * every launch's cycles at the config's clock (a launch reloads its weights from
      DRAM: nothing stays on chip between launches; that is in its cycles);
    * one ``launch_seconds`` per launch;
    * the transfers (``transfer_seconds``: copy and cache flush): each launch's
      instruction stream (``INSN_BYTES`` per instruction), the int8 input matrix when the
      run gives one (``inputs``, as :func:`~.run.run` took it; ``None``: the model's
      embeddings, resident in device memory like the weights, are not sent again), and
      reading back each structure's output state (one padded row per structure).

    Not included: the one-time load of the model (weights, templates' micro-ops,
    embeddings), the children's states between launches (they stay in device DRAM),
    and the host's linearize/instantiate time (measured, not projected; see the module).
    """
    if len(programs) != len(result.cycles):
        raise ValueError(f"{len(programs)} programs for a run of {len(result.cycles)} "
                         "launches; pass the programs of that run (same structures and "
                         "launches=)")
    board = _host(host, model)
    written = sum(len(p.instructions) for p in programs) * INSN_BYTES
    if inputs is not None:
        written += int(np.shape(inputs)[0]) * _row_bytes(model, model.cell.embed)
    read = len(result.lin.roots) * _row_bytes(model, model.cell.width(model.cell.output))
    cycles = int(sum(result.cycles))
    return Projection(
        launches=len(programs), cycles=cycles,
        accelerator_seconds=model.config.cycles_to_seconds(cycles),
        launch_seconds=len(programs) * board.launch_seconds,
        transfer_seconds=board.transfer_seconds(written + read),
        transfer_bytes=written + read)


# --------------------------------------------------------------- the board CPU, float

def expression_work(e: Expr, live_terms: Sequence[int] = ()) -> Work:
    """One kernel call computing expression ``e`` for one node, in float32.

    * ``linear`` (``W_k @ x_k`` summed, plus the bias) and ``mlinear`` (MV-RNN's
      ``W_k @ M_k`` on per-node matrices): a ``gemm_float`` call, ``ops`` = the MACs of
      the terms ``live_terms`` (indices into ``e.args``), ``elements`` = the output's,
      ``bytes`` = every tensor read and written (the terms' operands and matrices, the
      bias, the output), as the compiler's ``node_work`` counts a Gemm node;
    * ``matvec`` (a child's matrix state times a vector): a ``gemm_float`` call of
      ``rows x width`` MACs;
    * ``add``, ``sub``, ``mul``, ``relu``: an ``elementwise`` call over the output
      (operands read, result written);
    * ``sigmoid``, ``tanh``: a ``transcendental`` call over the output.
    """
    out = e.rows * e.width
    if e.op in ("linear", "mlinear"):
        terms = [(e.weights[k], e.args[k]) for k in live_terms]
        macs = sum(w.size * a.width for w, a in terms) if e.op == "mlinear" \
            else sum(w.size for w, _ in terms)
        reads = sum(w.size + a.rows * a.width for w, a in terms) + out      # W_k, x_k, bias
        return Work("gemm_float", macs, out, FLOAT_BYTES * (reads + out))
    if e.op == "matvec":
        m, x = e.args
        return Work("gemm_float", m.rows * m.width, out,
                    FLOAT_BYTES * (m.rows * m.width + x.width + out))
    if e.op in ("sigmoid", "tanh"):
        return Work("transcendental", 0, out, FLOAT_BYTES * 2 * out)
    if e.op in ("add", "sub", "mul", "relu"):
        return Work("elementwise", 0, out, FLOAT_BYTES * (len(e.args) + 1) * out)
    raise ValueError(f"no kernel call computes {e.label}")


#: How an expression's value is known for a node: computed, a constant folded at
#: compile time, or zero (an absent child's or input's, and what follows from it).
VALUE, CONST, ZERO = "value", "const", "zero"


def _fold(e: Expr, args: list[str], present: frozenset[int], has_input: bool) -> str:
    """What ``e`` is for a node with children in slots ``present`` (zeros folded as a
    specialised C implementation would: a term of zeros vanishes, ``a + 0`` is ``a``,
    ``a * 0`` and ``M @ 0`` are 0, an operation on constants is a constant)."""
    if e.op == "input":
        return VALUE if has_input else ZERO
    if e.op == "child":
        return VALUE if e.slot in present else ZERO
    if e.op in ("linear", "mlinear"):
        return VALUE if VALUE in args else CONST       # W @ const folds into the bias
    if e.op == "rescale":
        return args[0]
    if e.op in ("add", "sub"):
        if args == [ZERO, ZERO]:
            return ZERO
    elif e.op in ("mul", "matvec"):
        if ZERO in args:
            return ZERO
    elif e.op in ("tanh", "relu") and args[0] == ZERO:
        return ZERO
    return VALUE if VALUE in args else CONST


def _is_call(e: Expr, args: list[str]) -> bool:
    """Whether a computed ``e`` needs a kernel call (``a + 0``, ``a - 0`` pass ``a``)."""
    if e.op in ("rescale", "input", "child"):
        return False
    if e.op == "add" and ZERO in args:
        return False
    if e.op == "sub" and ZERO in args:
        return args[1] != ZERO                          # 0 - b is a negation
    return True


def node_calls(cell: Cell, present: frozenset[int], has_input: bool) -> list[Work]:
    """The kernel calls of one node whose children fill ``present`` slots: the computed
    expressions the node's states depend on, each one call (:func:`expression_work`)."""
    status: dict[int, str] = {}
    for e in cell.exprs:
        status[e.uid] = _fold(e, [status[a.uid] for a in e.args], present, has_input)
    live: set[int] = set()
    todo = [e for e in cell.states.values() if status[e.uid] == VALUE]
    calls = []
    while todo:
        e = todo.pop()
        if e.uid in live:
            continue
        live.add(e.uid)
        args = [status[a.uid] for a in e.args]
        if _is_call(e, args):
            terms = [k for k, s in enumerate(args) if s == VALUE]
            calls.append(expression_work(e, terms))
        todo += [a for a, s in zip(e.args, args) if s == VALUE]
    return calls


def project_cpu(cell: Cell, lin: Linearized, host: HostModel | str | None = None, *,
                config_name: str = "pynq") -> float:
    """Seconds the board CPU takes to run the FLOAT model over ``lin``, node by node.

    Each node is computed on its own, one kernel call per computed expression (as a
    C/C++ implementation or an eager framework would; nothing batched across nodes),
    with its absent children's and input's zeros folded away (:func:`node_calls`; leaves
    skip the terms that read children). Each call is priced by ``host``'s regression for
    its kind (:func:`expression_work`: linear maps and MV-RNN's matrix products
    ``gemm_float`` with ``ops`` = MACs,
    ``+ - *`` and ReLU ``elementwise``, sigmoid and tanh ``transcendental``); the
    per-call fixed cost of the host models includes one dispatch from the runtime into
    native code. ``host``: a model, a built-in's name, or ``None`` for the board of
    ``config_name``. One core (the nodes of a level could use both: at best half this).
    """
    board = get_host_model(host, config_name)
    present = lin.children >= 0
    costs: dict[tuple, float] = {}
    total = 0.0
    for i in range(lin.num_nodes):
        key = (tuple(np.flatnonzero(present[i]).tolist()), bool(lin.inputs[i] >= 0))
        if key not in costs:
            calls = node_calls(cell, frozenset(key[0]), key[1])
            costs[key] = sum(board.kernel_seconds(w) for w in calls)
        total += costs[key]
    return total
