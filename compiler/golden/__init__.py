"""Golden models: what compiled code must compute, in plain numpy.

* :mod:`.quantized`: graphs of the frontend's integer nodes, as onnxruntime computes them.
* :mod:`.operators`: the accelerator operators of :mod:`..accel.ops` (the benchmarks'
  reference for single operators).
* :mod:`.check`: a compiled model against onnxruntime (the demo's and benchmarks' check).

Nothing in the compiler imports this folder: it is the yardstick, not a stage.
"""
