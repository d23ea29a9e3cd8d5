"""Placement: which device runs each node of the graph.

* :mod:`.cost`: the cost models compared (the host CPU's, the accelerator's roofline).
* :mod:`.partition`: the per-node decision with its reason, and the accelerator segments
  (one program each).
"""
