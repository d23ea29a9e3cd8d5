"""The RTL out of Python: :mod:`.export` (Verilog with Vivado-friendly port names,
``tessera hw verilog``), :mod:`.resources` (yosys ``synth_xilinx`` estimates,
``tessera hw resources``) and :mod:`.resource_cache` (their results kept on disk)."""
