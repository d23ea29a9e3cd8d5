"""Design-space exploration: which accelerator to build for these models on this part.

:func:`explore` sweeps a base config over some of its fields, synthesizes each legal point
with yosys (cached by design), compiles and simulates each model on it, as Ray tasks on
this machine or a cluster, and finds the Pareto set of latency against LUTs, DSPs and
BRAMs. ``tessera dse`` is its command line; docs/dse.md the guide.
"""
from __future__ import annotations

from .space import Axis, Point, Space
from .sweep import PointResult, Sweep, explore

__all__ = ["Axis", "Point", "PointResult", "Space", "Sweep", "explore"]
