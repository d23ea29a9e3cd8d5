"""The RTL out of Python: :mod:`.export` (Verilog with Vivado-friendly port names,
``tessera hw verilog``) and :mod:`.resources` (yosys ``synth_xilinx`` estimates,
``tessera hw resources``)."""
