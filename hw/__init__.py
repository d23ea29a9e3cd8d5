"""``tessera.hw``: the accelerator RTL in Amaranth 0.5, its simulations and its export.

* :mod:`.accelerator`: the whole accelerator (:class:`~.accelerator.Accelerator`),
  built from one :class:`tessera.config.HwConfig`; :mod:`.fetch`, :mod:`.modules` (load,
  compute, store), :mod:`.tensor` (the pipelines of the compute module's two units, GEMM
  core and tensor ALU), :mod:`.dma`, :mod:`.sequencer` (command and token queues),
  :mod:`.control` (AXI4-Lite registers), :mod:`.alu_ops` (ALU hardware hooks),
  :mod:`.table` (the tensor ALU's table memory, one copy per lane),
  :mod:`.layouts` and :mod:`.ports` (instruction views and bus signatures).
* :mod:`.harness`: simulations of that RTL (Verilator through :mod:`.harness.rtlsim`,
  Amaranth's simulator through :mod:`.harness.amaranth_sim`).
* :mod:`.synth`: Verilog export (``tessera hw verilog``) and yosys resource estimates
  (``tessera hw resources``).

The board flow that turns the Verilog into a bitstream is :mod:`tessera.bitstreams`
(the top-level ``bitstreams/`` folder). See docs/hardware.md.
"""
