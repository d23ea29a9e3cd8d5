"""Placement: which device runs each node of the graph.

* :mod:`.cost`: the cost models compared (the host CPU's, the accelerator's roofline).
* :mod:`.problem`: the placement problem in the abstract and the projected sequential
  latency of a placement (node times, launches, transfers).
* :mod:`.dp`: the dynamic program that finds the placement of least projected latency.
* :mod:`.partition`: the placement of a graph (DP, greedy or CPU-only) with a reason per
  node, and the accelerator segments (one program each).
"""
