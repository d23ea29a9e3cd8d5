"""The simulator as the tiling search's cost model where the analytic one is unsure.

:mod:`.convcost` ranks a layer's tilings by its pipeline model, within about 1% of the
simulator on the presets. On configs far from them (a design-space sweep's small buffers,
narrow buses, odd core shapes) it can be further off, and then its first choice may not
be the fastest. :class:`SimTuner` checks: it compiles the layer alone with the model's
first choice and simulates it; when the estimate is off by more than :data:`MARGIN` of
the simulated cycles it simulates the next :data:`CANDIDATES` - 1 tilings too and takes
the fastest. Each layer's check is kept in :attr:`SimTuner.records` (how often the two
disagree, and what it gained).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, islice
from typing import TYPE_CHECKING, Iterator

import numpy as np

from tessera.errors import CompileError

from .convplan import ConvPlan

if TYPE_CHECKING:
    from .conv import ConvTensorizer

__all__ = ["CANDIDATES", "MARGIN", "SimTuner", "TuneRecord"]

#: How far (a share of the simulated cycles) the model's estimate of its first choice may
#: be off before the simulator ranks the candidates: twice the model's error on the
#: presets' ResNet-18 layers (tests/compiler/accel/test_residual_tiling.py holds it to 2%).
MARGIN = 0.02
#: Tilings simulated when the model is off: its first choice and the next best.
CANDIDATES = 4


@dataclass(frozen=True)
class TuneRecord:
    """One layer's check: the model's first choice with its estimate and simulated
    cycles, the tiling taken with its simulated cycles, and how many were simulated."""

    op: str
    first: ConvPlan
    estimate: int
    simulated: int
    taken: ConvPlan
    chosen: int
    tried: int

    @property
    def error(self) -> float:
        """The model's error on its first choice, a share of the simulated cycles."""
        return abs(self.estimate - self.simulated) / self.simulated

    @property
    def changed(self) -> bool:
        """Whether the simulator picked another tiling than the model."""
        return self.taken != self.first


@dataclass
class SimTuner:
    """The tuner one compilation shares across its layers (see the module doc)."""

    margin: float = MARGIN
    candidates: int = CANDIDATES
    records: list[TuneRecord] = field(default_factory=list)

    def order(self, tz: "ConvTensorizer", ranked: Iterator[ConvPlan],
              threads: int) -> Iterator[ConvPlan]:
        """``ranked`` (the model's order of ``tz``'s tilings) with the simulator's choice
        first when the model is off by more than the margin."""
        head = list(islice(ranked, self.candidates))
        first = self._simulate(tz, head[0], threads) if head else None
        if first is None or not head[0].est_cycles:
            return chain(head, ranked)
        cycles = [first]
        if abs(head[0].est_cycles - first) > self.margin * first:
            cycles += [self._simulate(tz, p, threads) for p in head[1:]]
        best = min(range(len(cycles)), key=lambda i: (cycles[i] is None, cycles[i] or 0))
        self.records.append(TuneRecord(tz.op.name, head[0], head[0].est_cycles, first,
                                       head[best], cycles[best] or first, len(cycles)))
        return chain([head[best]], head[:best], head[best + 1:], ranked)

    def _simulate(self, tz: "ConvTensorizer", plan: ConvPlan, threads: int) -> int | None:
        """The cycles of ``tz``'s layer alone with ``plan`` (zero inputs: the cycles do not
        depend on the data), or ``None`` when the tiling does not emit."""
        from .build import compile_ops
        tensors = [tz.inp, *tz.residuals.values()]
        shapes = {t.name: tuple(t.layout.shape) for t in tensors}
        try:
            program = compile_ops([tz.op], shapes, tz.config, threads=threads,
                                  plans={tz.op.name: plan}, fuse_pools=False,
                                  skip_zero_blocks=not tz.g.blocks.is_dense,
                                  input_blocks={t.name: t.layout.block for t in tensors})
        except CompileError:
            return None
        _, result = program.run({name: np.zeros(s, np.int8) for name, s in shapes.items()})
        return result.stats.cycles

    def summary(self) -> dict[str, float | int]:
        """How often the model and the simulator disagreed, and what the simulator's picks
        saved: layers checked, disagreements, tilings changed, cycles before and after."""
        return {"margin": self.margin, "layers": len(self.records),
                "disagreed": sum(r.error > self.margin for r in self.records),
                "changed": sum(r.changed for r in self.records),
                "model_cycles": sum(r.simulated for r in self.records),
                "tuned_cycles": sum(r.chosen for r in self.records)}
