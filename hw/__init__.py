"""``tessera.hw``: the accelerator RTL in Amaranth 0.5 and its simulations.

* :mod:`.accelerator`: the whole accelerator (:class:`~.accelerator.Accelerator`),
  built from one :class:`tessera.config.HwConfig`; :mod:`.fetch`,
  :mod:`.modules` (load, compute, store), :mod:`.tensor` (the pipelines of
  the compute module's two units, GEMM core and tensor ALU), :mod:`.dma`, :mod:`.sequencer` (command and token queues),
  :mod:`.control` (AXI4-Lite registers), :mod:`.alu_ops` (ALU hardware hooks).
* :mod:`.export`: Verilog with Vivado-friendly port names (``tessera hw verilog``).
* :mod:`.rtlsim`: the Verilator simulation driven from Python;
  :mod:`.amaranth_sim`: the same in Amaranth's simulator, with :mod:`.axi_dram`.
* :mod:`.resources`: resource estimates with yosys (``tessera hw resources``).
* :mod:`.vivado`: the Vivado batch flow of a board (project, block design, bitstream)
  and its dry run under tclsh; :mod:`.bitstream`: running it and installing the
  results (``tessera hw bitstream``). See docs/board.md.

See docs/hardware.md.
"""
