"""``tessera.compiler``: ONNX in, accelerator programs and CPU kernels out.

Targets the ISA in :mod:`tessera.isa`; arrives with the compiler issues.
"""
