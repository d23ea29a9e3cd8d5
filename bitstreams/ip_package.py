"""Step 2 of the board flow: the Tcl that packages ``tessera_top.v`` as the IP
:data:`tessera.hwh.IP_VLNV`, with the register map of :mod:`tessera.regmap`.

A packaged IP rather than a module reference (whose VLNV would be
``xilinx.com:module_ref:...``): the driver finds our IP in the ``.hwh`` by that VLNV.
"""
from __future__ import annotations

from tessera.hwh import CONTROL_INTERFACE, IP_MODULE, IP_VLNV, REGISTER_ACCESS
from tessera.regmap import AXI_ADDR_BITS, CTRL_DATA_BITS, REGISTERS

from .plan import FlowPlan
from .tcl import TclScript, tcl_word

__all__ = ["package_ip"]

_INTERRUPT_VLNV = "xilinx.com:signal:interrupt_rtl:1.0"


def package_ip(plan: FlowPlan, script: TclScript) -> None:
    """Package the Verilog as our IP, check its interfaces, describe its registers and
    address spaces, and put it in the project's IP catalog."""
    for step in (_infer_core, _check_interfaces, _register_map, _master_address_spaces,
                 _save_core):
        step(plan, script)


def _masters(plan: FlowPlan) -> list[str]:
    """The interface names of our AXI4 masters."""
    return [port.name for port in plan.ports]


def _infer_core(plan: FlowPlan, script: TclScript) -> None:
    """Copy the Verilog into the IP repository and infer a core from it."""
    vendor, library, name, version = IP_VLNV.split(":")
    script.section(
        f"Package {IP_MODULE}.v as the IP {IP_VLNV}.",
        "A packaged IP rather than a module reference: the .hwh then carries this VLNV, "
        "which is",
        "how the driver (tessera.runtime.pynq_device) finds the accelerator in the overlay.",
    )
    script.emit(
        f"set ip_dir [file join $ip_repo {IP_MODULE}]",
        "file delete -force $ip_dir",
        "file mkdir $ip_dir",
        f"file copy -force [file join $here {IP_MODULE}.v] $ip_dir",
        f"ipx::infer_core -vendor {vendor} -library {library} -name {name} "
        f"-version {version} -taxonomy /UserIP -set_current true $ip_dir",
        "set core [ipx::current_core]",
        f"set_property display_name {tcl_word(f'Tessera accelerator ({plan.config.name})')}"
        " $core",
        f"set_property description {tcl_word(_ip_description(plan))} $core",
        f"set_property supported_families {{{plan.board.family} Production}} $core",
        "",
    )


def _ip_description(plan: FlowPlan) -> str:
    """The IP's description in the catalog: the config and its GEMM core."""
    config = plan.config
    return (f"Tessera accelerator, config {config.name} "
            f"({config.batch}x{config.block_in}x{config.block_out} GEMM core, "
            f"{config.clock_mhz:g} MHz)")


def _check_interfaces(plan: FlowPlan, script: TclScript) -> None:
    """Stop unless the packager inferred every interface; make the interrupt a level
    interrupt and clock every AXI interface by our clock."""
    control, masters = CONTROL_INTERFACE, _masters(plan)
    script.emit(
        "# The packager infers the AXI interfaces from the port names "
        "(<interface>_awvalid...), the",
        "# clock and the reset; stop here if it missed one.",
        f"foreach busif {{{' '.join([control, *masters, plan.aclk, plan.aresetn])}}} {{",
        "    if {[ipx::get_bus_interfaces $busif -of_objects $core] eq \"\"} {",
        f'        tessera_fail "the IP packager did not infer the interface $busif from the '
        f'ports of {IP_MODULE}.v"',
        "    }",
        "}",
        f"if {{[ipx::get_bus_interfaces {plan.interrupt} -of_objects $core] eq \"\"}} {{",
        f"    ipx::infer_bus_interface {plan.interrupt} {_INTERRUPT_VLNV} $core",
        "}",
        f"set irq [ipx::get_bus_interfaces {plan.interrupt} -of_objects $core]",
        "set sensitivity [ipx::get_bus_parameters SENSITIVITY -of_objects $irq]",
        'if {$sensitivity eq ""} {set sensitivity [ipx::add_bus_parameter SENSITIVITY $irq]}',
        "set_property value LEVEL_HIGH $sensitivity",
        f"foreach busif {{{' '.join([control, *masters])}}} {{",
        f"    ipx::associate_bus_interfaces -busif $busif -clock {plan.aclk} $core",
        "}",
        f"ipx::associate_bus_interfaces -clock {plan.aclk} -reset {plan.aresetn} $core",
        "",
    )


def _register_map(plan: FlowPlan, script: TclScript) -> None:
    """The control interface's memory map: one register block with our registers."""
    control = CONTROL_INTERFACE
    script.emit(
        f"# {control}: one register block, the size of the board's register window (what",
        "# the .hwh gives the driver to map), with the registers of tessera.regmap.",
        f"set memory_map [ipx::get_memory_maps {control} -of_objects $core]",
        f'if {{$memory_map eq ""}} {{set memory_map [ipx::add_memory_map {control} $core]}}',
        f"set_property slave_memory_map_ref {control} "
        f"[ipx::get_bus_interfaces {control} -of_objects $core]",
        "set block [ipx::get_address_blocks reg0 -of_objects $memory_map]",
        'if {$block eq ""} {set block [ipx::add_address_block reg0 $memory_map]}',
        f"set_property range {plan.board.registers.size} $block",
        f"set_property width {CTRL_DATA_BITS} $block",
        "set_property usage register $block",
        "foreach {register offset description} {",
        *(f"    {reg.name} {reg.offset:#04x} "
          f"{tcl_word(f'{reg.doc} ({REGISTER_ACCESS[reg.access]})')}" for reg in REGISTERS),
        "} {",
        "    set reg [ipx::add_register $register $block]",
        "    set_property address_offset $offset $reg",
        f"    set_property size {CTRL_DATA_BITS} $reg",
        "    set_property description $description $reg",
        "}",
        "",
    )


def _master_address_spaces(plan: FlowPlan, script: TclScript) -> None:
    """An address space per master, as wide as our AXI addresses."""
    script.emit(
        f"# Each master addresses the {AXI_ADDR_BITS}-bit space its DDR segment is mapped "
        "into.",
        f"foreach master {{{' '.join(_masters(plan))}}} {{",
        "    set space [ipx::get_address_spaces $master -of_objects $core]",
        '    if {$space eq ""} {set space [ipx::add_address_space $master $core]}',
        f"    set_property range {1 << AXI_ADDR_BITS} $space",
        "    set_property master_address_space_ref $master "
        "[ipx::get_bus_interfaces $master -of_objects $core]",
        "}",
    )


def _save_core(plan: FlowPlan, script: TclScript) -> None:
    """Check and save the core, and rebuild the project's IP catalog with it."""
    script.emit(
        "ipx::create_xgui_files $core",
        "ipx::update_checksums $core",
        "ipx::check_integrity $core",
        "ipx::save_core $core",
        "ipx::unload_core $core",
        "set_property ip_repo_paths [list $ip_repo] [current_project]",
        "update_ip_catalog -rebuild",
    )
