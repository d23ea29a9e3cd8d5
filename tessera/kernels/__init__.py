"""Hand-written reference kernels (programs built directly from the ISA).

They drive the demo, the simulator tests and the benchmarks until the
compiler generates programs itself.
"""
