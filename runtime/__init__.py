"""``tessera.runtime``: one Device API over the simulator, the RTL and a PYNQ board.

Arrives with the runtime issue; until then :mod:`tessera.sim` runs programs directly.
"""
