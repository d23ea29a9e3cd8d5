"""``tessera.sim``: the event-driven, cycle-level simulator (golden and performance model).

>>> from tessera.sim import simulate
>>> result = simulate(program)            # doctest: +SKIP
>>> print(result.stats.table())           # doctest: +SKIP
"""
from .simulator import SimResult, Simulator, simulate, validate_program
from .stats import ModuleStats, SimStats, TraceEvent, chrome_trace

__all__ = ["ModuleStats", "SimResult", "SimStats", "Simulator", "TraceEvent", "chrome_trace",
           "simulate", "validate_program"]
