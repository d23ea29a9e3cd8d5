"""Simulations of the accelerator's RTL: :mod:`.rtlsim` (Verilator, driven from Python
through the C++ DRAM model in ``verilator/``) and :mod:`.amaranth_sim` (Amaranth's own
simulator with the Python AXI model of :mod:`.axi_dram`)."""
