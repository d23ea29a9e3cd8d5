# Tessera board flow: config 'zcu104' on the AMD Zynq UltraScale+ ZCU104 (zcu104).
# Written by tessera.bitstreams.flow; regenerate it rather than editing it.
#
# Run from this folder:  vivado -mode batch -source build.tcl
# It writes out/tessera.bit and out/tessera.hwh (what pynq.Overlay loads), the reports in reports/,
# and exits with code 1 when timing fails. TESSERA_VIVADO_JOBS sets the parallel jobs (default 4).

set here [file dirname [file normalize [info script]]]
set name tessera_zcu104
set project_dir [file join $here vivado]
set ip_repo [file join $here ip]
set out_dir [file join $here out]
set reports_dir [file join $here reports]
set jobs [expr {[info exists ::env(TESSERA_VIVADO_JOBS)] ? $::env(TESSERA_VIVADO_JOBS) : 4}]
file mkdir $out_dir $reports_dir

# What Vivado must report for the design to match tessera.hwh and the driver (checked below).
set tessera_expect [dict create \
    CONFIG.PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ 187.498125 \
]

proc tessera_fail {message} {
    puts stderr "ERROR: \[tessera\] $message"
    exit 1
}

# ------------------------------------------------------------------------------
# Project for the board's part; the board part gives the PS its DDR and MIO preset.
create_project -force $name $project_dir -part xczu7ev-ffvc1156-2-e
if {[get_board_parts -quiet xilinx.com:zcu104:part0:1.1] eq ""} {
    tessera_fail "the board files of xilinx.com:zcu104:part0:1.1 (AMD Zynq UltraScale+ ZCU104) are not installed: add them to Vivado's board repository (XHub stores, or the board vendor's files) and run again"
}
set_property board_part xilinx.com:zcu104:part0:1.1 [current_project]
set_property target_language Verilog [current_project]

# ------------------------------------------------------------------------------
# Package tessera_top.v as the IP tessera.dev:tessera:tessera_top:1.0.
# A packaged IP rather than a module reference: the .hwh then carries this VLNV, which is
# how the driver (tessera.runtime.pynq_device) finds the accelerator in the overlay.
set ip_dir [file join $ip_repo tessera_top]
file delete -force $ip_dir
file mkdir $ip_dir
file copy -force [file join $here tessera_top.v] $ip_dir
ipx::infer_core -vendor tessera.dev -library tessera -name tessera_top -version 1.0 -taxonomy /UserIP -set_current true $ip_dir
set core [ipx::current_core]
set_property display_name {Tessera accelerator (zcu104)} $core
set_property description {Tessera accelerator, config zcu104 (1x32x32 GEMM core, 200 MHz)} $core
set_property supported_families {zynquplus Production} $core

# The packager infers the AXI interfaces from the port names (<interface>_awvalid...), the
# clock and the reset; stop here if it missed one.
foreach busif {s_axi_control m_axi_p0 m_axi_p1 m_axi_p2 m_axi_p3 m_axi_p4 aclk aresetn} {
    if {[ipx::get_bus_interfaces $busif -of_objects $core] eq ""} {
        tessera_fail "the IP packager did not infer the interface $busif from the ports of tessera_top.v"
    }
}
if {[ipx::get_bus_interfaces interrupt -of_objects $core] eq ""} {
    ipx::infer_bus_interface interrupt xilinx.com:signal:interrupt_rtl:1.0 $core
}
set irq [ipx::get_bus_interfaces interrupt -of_objects $core]
set sensitivity [ipx::get_bus_parameters SENSITIVITY -of_objects $irq]
if {$sensitivity eq ""} {set sensitivity [ipx::add_bus_parameter SENSITIVITY $irq]}
set_property value LEVEL_HIGH $sensitivity
foreach busif {s_axi_control m_axi_p0 m_axi_p1 m_axi_p2 m_axi_p3 m_axi_p4} {
    ipx::associate_bus_interfaces -busif $busif -clock aclk $core
}
ipx::associate_bus_interfaces -clock aclk -reset aresetn $core

# s_axi_control: one register block, the size of the board's register window (what
# the .hwh gives the driver to map), with the registers of tessera.regmap.
set memory_map [ipx::get_memory_maps s_axi_control -of_objects $core]
if {$memory_map eq ""} {set memory_map [ipx::add_memory_map s_axi_control $core]}
set_property slave_memory_map_ref s_axi_control [ipx::get_bus_interfaces s_axi_control -of_objects $core]
set block [ipx::get_address_blocks reg0 -of_objects $memory_map]
if {$block eq ""} {set block [ipx::add_address_block reg0 $memory_map]}
set_property range 65536 $block
set_property width 32 $block
set_property usage register $block
foreach {register offset description} {
    CONTROL 0x00 {write 1 to bit 0 to start a run (ignored while running) (write-only)}
    STATUS 0x04 {bit 0 done, bit 1 error, bit 2 running; a start clears done and error (read-only)}
    INSN_ADDR 0x08 {DRAM byte address of the instruction stream (4 KiB aligned) (read-write)}
    INSN_COUNT 0x0c {number of instructions in the stream (read-write)}
    CYCLES_LO 0x10 {cycles of the current or last run, low word (read-only)}
    CYCLES_HI 0x14 {cycles of the current or last run, high word (read-only)}
    ERROR_CODE 0x18 {an ErrorCode; 0 when the last run had no error (read-only)}
    ERROR_INDEX 0x1c {index of the instruction that raised the error (read-only)}
    CONFIG_ID 0x20 {config_id() of the HwConfig the bitstream was built from (read-only)}
    VERSION 0x24 {interface version, 0x54530001 (read-only)}
} {
    set reg [ipx::add_register $register $block]
    set_property address_offset $offset $reg
    set_property size 32 $reg
    set_property description $description $reg
}

# Each master addresses the 32-bit space its DDR segment is mapped into.
foreach master {m_axi_p0 m_axi_p1 m_axi_p2 m_axi_p3 m_axi_p4} {
    set space [ipx::get_address_spaces $master -of_objects $core]
    if {$space eq ""} {set space [ipx::add_address_space $master $core]}
    set_property range 4294967296 $space
    set_property master_address_space_ref $master [ipx::get_bus_interfaces $master -of_objects $core]
}
ipx::create_xgui_files $core
ipx::update_checksums $core
ipx::check_integrity $core
ipx::save_core $core
ipx::unload_core $core
set_property ip_repo_paths [list $ip_repo] [current_project]
update_ip_catalog -rebuild

# ------------------------------------------------------------------------------
# Block design: the zynq_ultra_ps_e with the board preset, tessera_0, interconnects, clock, reset
# and interrupt: the design tessera.hwh describes.
create_bd_design $name
create_bd_cell -type ip -vlnv xilinx.com:ip:zynq_ultra_ps_e:3.4 zynq_ultra_ps_e_0
apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e -config {apply_board_preset "1"} [get_bd_cells zynq_ultra_ps_e_0]
# PL clock 0 = IOPLL (1499.985 MHz) / 8 / 1 = 187.498125 MHz (tessera.boards.Board.pl_clock); the HP ports
# our masters use, at their data width; the PS master that reaches s_axi_control; the interrupt.
set_property -dict [list \
    CONFIG.PSU__USE__M_AXI_GP0 {1} \
    CONFIG.PSU__USE__M_AXI_GP1 {0} \
    CONFIG.PSU__USE__M_AXI_GP2 {0} \
    CONFIG.PSU__MAXIGP0__DATA_WIDTH {32} \
    CONFIG.PSU__USE__S_AXI_GP2 {1} \
    CONFIG.PSU__SAXIGP2__DATA_WIDTH {128} \
    CONFIG.PSU__USE__S_AXI_GP3 {1} \
    CONFIG.PSU__SAXIGP3__DATA_WIDTH {128} \
    CONFIG.PSU__USE__S_AXI_GP4 {1} \
    CONFIG.PSU__SAXIGP4__DATA_WIDTH {128} \
    CONFIG.PSU__USE__S_AXI_GP5 {1} \
    CONFIG.PSU__SAXIGP5__DATA_WIDTH {128} \
    CONFIG.PSU__USE__S_AXI_GP0 {1} \
    CONFIG.PSU__SAXIGP0__DATA_WIDTH {128} \
    CONFIG.PSU__USE__S_AXI_GP1 {0} \
    CONFIG.PSU__USE__IRQ0 {1} \
    CONFIG.PSU__FPGA_PL0_ENABLE {1} \
    CONFIG.PSU__CRL_APB__PL0_REF_CTRL__SRCSEL {IOPLL} \
    CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {200} \
    CONFIG.PSU__CRL_APB__PL0_REF_CTRL__DIVISOR0 {8} \
    CONFIG.PSU__CRL_APB__PL0_REF_CTRL__DIVISOR1 {1} \
] [get_bd_cells zynq_ultra_ps_e_0]
create_bd_cell -type ip -vlnv tessera.dev:tessera:tessera_top:1.0 tessera_0
create_bd_cell -type ip -vlnv xilinx.com:ip:proc_sys_reset:5.0 reset_aclk

# Clocking Wizard: the closest PL clock 0 the IOPLL gives is 187.498125 MHz (1499.985 / 8 / 1),
# 6.25% off the config's 200 MHz (more than 1%), so clk_wiz_0 makes exactly 200 MHz from it.
# Its input frequency propagates from the PS pin (setting it could disagree with the PS's
# rounding); the PS clock already drives a global buffer, hence No_buffer.
create_bd_cell -type ip -vlnv xilinx.com:ip:clk_wiz:6.0 clk_wiz_0
set_property -dict [list \
    CONFIG.PRIM_SOURCE {No_buffer} \
    CONFIG.CLKOUT1_REQUESTED_OUT_FREQ {200} \
    CONFIG.USE_LOCKED {true} \
    CONFIG.USE_RESET {true} \
    CONFIG.RESET_TYPE {ACTIVE_LOW} \
    CONFIG.RESET_PORT {resetn} \
] [get_bd_cells clk_wiz_0]
connect_bd_net [get_bd_pins zynq_ultra_ps_e_0/pl_clk0] [get_bd_pins clk_wiz_0/clk_in1]
connect_bd_net [get_bd_pins zynq_ultra_ps_e_0/pl_resetn0] [get_bd_pins clk_wiz_0/resetn]
connect_bd_net [get_bd_pins clk_wiz_0/locked] [get_bd_pins reset_aclk/dcm_locked]
create_bd_cell -type ip -vlnv xilinx.com:ip:axi_interconnect:2.1 control_interconnect
set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] [get_bd_cells control_interconnect]
connect_bd_intf_net [get_bd_intf_pins zynq_ultra_ps_e_0/M_AXI_HPM0_FPD] [get_bd_intf_pins control_interconnect/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins control_interconnect/M00_AXI] [get_bd_intf_pins tessera_0/s_axi_control]
# Each AXI4 master of ours through a SmartConnect (protocol and ID conversion: a PS7's HP ports
# are AXI3) to the HP port tessera.regmap.axi_ports assigns it.
create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 p0_smartconnect
set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] [get_bd_cells p0_smartconnect]
connect_bd_intf_net [get_bd_intf_pins tessera_0/m_axi_p0] [get_bd_intf_pins p0_smartconnect/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins p0_smartconnect/M00_AXI] [get_bd_intf_pins zynq_ultra_ps_e_0/S_AXI_HP0_FPD]
create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 p1_smartconnect
set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] [get_bd_cells p1_smartconnect]
connect_bd_intf_net [get_bd_intf_pins tessera_0/m_axi_p1] [get_bd_intf_pins p1_smartconnect/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins p1_smartconnect/M00_AXI] [get_bd_intf_pins zynq_ultra_ps_e_0/S_AXI_HP1_FPD]
create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 p2_smartconnect
set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] [get_bd_cells p2_smartconnect]
connect_bd_intf_net [get_bd_intf_pins tessera_0/m_axi_p2] [get_bd_intf_pins p2_smartconnect/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins p2_smartconnect/M00_AXI] [get_bd_intf_pins zynq_ultra_ps_e_0/S_AXI_HP2_FPD]
create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 p3_smartconnect
set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] [get_bd_cells p3_smartconnect]
connect_bd_intf_net [get_bd_intf_pins tessera_0/m_axi_p3] [get_bd_intf_pins p3_smartconnect/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins p3_smartconnect/M00_AXI] [get_bd_intf_pins zynq_ultra_ps_e_0/S_AXI_HP3_FPD]
create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 p4_smartconnect
set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] [get_bd_cells p4_smartconnect]
connect_bd_intf_net [get_bd_intf_pins tessera_0/m_axi_p4] [get_bd_intf_pins p4_smartconnect/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins p4_smartconnect/M00_AXI] [get_bd_intf_pins zynq_ultra_ps_e_0/S_AXI_HPC0_FPD]
# One clock for everything; the reset synchronised to it.
connect_bd_net [get_bd_pins clk_wiz_0/clk_out1] \
    [get_bd_pins tessera_0/aclk] \
    [get_bd_pins reset_aclk/slowest_sync_clk] \
    [get_bd_pins zynq_ultra_ps_e_0/maxihpm0_fpd_aclk] \
    [get_bd_pins control_interconnect/ACLK] \
    [get_bd_pins control_interconnect/S00_ACLK] \
    [get_bd_pins control_interconnect/M00_ACLK] \
    [get_bd_pins p0_smartconnect/aclk] \
    [get_bd_pins zynq_ultra_ps_e_0/saxihp0_fpd_aclk] \
    [get_bd_pins p1_smartconnect/aclk] \
    [get_bd_pins zynq_ultra_ps_e_0/saxihp1_fpd_aclk] \
    [get_bd_pins p2_smartconnect/aclk] \
    [get_bd_pins zynq_ultra_ps_e_0/saxihp2_fpd_aclk] \
    [get_bd_pins p3_smartconnect/aclk] \
    [get_bd_pins zynq_ultra_ps_e_0/saxihp3_fpd_aclk] \
    [get_bd_pins p4_smartconnect/aclk] \
    [get_bd_pins zynq_ultra_ps_e_0/saxihpc0_fpd_aclk]
connect_bd_net [get_bd_pins zynq_ultra_ps_e_0/pl_resetn0] [get_bd_pins reset_aclk/ext_reset_in]
connect_bd_net [get_bd_pins reset_aclk/interconnect_aresetn] [get_bd_pins control_interconnect/ARESETN]
connect_bd_net [get_bd_pins reset_aclk/peripheral_aresetn] \
    [get_bd_pins tessera_0/aresetn] \
    [get_bd_pins control_interconnect/S00_ARESETN] \
    [get_bd_pins control_interconnect/M00_ARESETN] \
    [get_bd_pins p0_smartconnect/aresetn] \
    [get_bd_pins p1_smartconnect/aresetn] \
    [get_bd_pins p2_smartconnect/aresetn] \
    [get_bd_pins p3_smartconnect/aresetn] \
    [get_bd_pins p4_smartconnect/aresetn]
connect_bd_net [get_bd_pins tessera_0/interrupt] [get_bd_pins zynq_ultra_ps_e_0/pl_ps_irq0]

# Address map: our registers where tessera.hwh and the driver expect them, and the DDR
# for every master.
assign_bd_address -offset 0xa0000000 -range 0x00010000 -target_address_space [get_bd_addr_spaces zynq_ultra_ps_e_0/Data] [get_bd_addr_segs tessera_0/s_axi_control/reg0] -force
assign_bd_address -offset 0x00000000 -range 0x80000000 -target_address_space [get_bd_addr_spaces tessera_0/m_axi_p0] [get_bd_addr_segs zynq_ultra_ps_e_0/SAXIGP2/HP0_DDR_LOW] -force
assign_bd_address -offset 0x00000000 -range 0x80000000 -target_address_space [get_bd_addr_spaces tessera_0/m_axi_p1] [get_bd_addr_segs zynq_ultra_ps_e_0/SAXIGP3/HP1_DDR_LOW] -force
assign_bd_address -offset 0x00000000 -range 0x80000000 -target_address_space [get_bd_addr_spaces tessera_0/m_axi_p2] [get_bd_addr_segs zynq_ultra_ps_e_0/SAXIGP4/HP2_DDR_LOW] -force
assign_bd_address -offset 0x00000000 -range 0x80000000 -target_address_space [get_bd_addr_spaces tessera_0/m_axi_p3] [get_bd_addr_segs zynq_ultra_ps_e_0/SAXIGP5/HP3_DDR_LOW] -force
assign_bd_address -offset 0x00000000 -range 0x80000000 -target_address_space [get_bd_addr_spaces tessera_0/m_axi_p4] [get_bd_addr_segs zynq_ultra_ps_e_0/SAXIGP0/HPC0_DDR_LOW] -force
validate_bd_design
save_bd_design

# Vivado derives the achieved PL clock from the divisors: it must be the one the .hwh
# promises and the driver sets when it loads the overlay.
set achieved [get_property CONFIG.PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ [get_bd_cells zynq_ultra_ps_e_0]]
set promised [dict get $tessera_expect CONFIG.PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ]
if {![string is double -strict $achieved] || abs($achieved - $promised) > 0.02} {
    tessera_fail "PL clock 0 runs at $achieved MHz, tessera.boards and the .hwh expect $promised MHz (IOPLL / 8 / 1): check the board preset's PLL"
}

# ------------------------------------------------------------------------------
# Synthesis and implementation up to the bitstream; reports; the timing verdict.
set wrapper [make_wrapper -files [get_files $name.bd] -top]
add_files -norecurse $wrapper
set_property top ${name}_wrapper [current_fileset]
update_compile_order -fileset sources_1
generate_target all [get_files $name.bd]

launch_runs synth_1 -jobs $jobs
wait_on_run synth_1
if {[get_property PROGRESS [get_runs synth_1]] ne "100%"} {
    tessera_fail "synthesis failed: see [get_property DIRECTORY [get_runs synth_1]]/runme.log"
}
launch_runs impl_1 -to_step write_bitstream -jobs $jobs
wait_on_run impl_1
if {[get_property PROGRESS [get_runs impl_1]] ne "100%"} {
    tessera_fail "implementation failed: see [get_property DIRECTORY [get_runs impl_1]]/runme.log"
}
open_run impl_1
report_utilization -file [file join $reports_dir utilization.rpt]
report_utilization -hierarchical -file [file join $reports_dir utilization_hierarchical.rpt]
report_timing_summary -max_paths 10 -report_unconstrained -file [file join $reports_dir timing_summary.rpt]
set wns [get_property STATS.WNS [get_runs impl_1]]
set whs [get_property STATS.WHS [get_runs impl_1]]
if {$wns < 0 || $whs < 0} {
    tessera_fail "timing failed at 200 MHz: WNS $wns ns (setup), WHS $whs ns (hold); see $reports_dir/timing_summary.rpt. Lower the config's clock_mhz or shrink the design; no bitstream was copied to $out_dir"
}

# ------------------------------------------------------------------------------
# The bitstream and its .hwh side by side, as pynq.Overlay wants them.
set run_dir [get_property DIRECTORY [get_runs impl_1]]
set bit [file join $run_dir ${name}_wrapper.bit]
set hwh ""
# Vivado 2020.2 and later generate into <project>.gen, earlier ones into <project>.srcs.
foreach generated {gen srcs} {
    set candidate [file join $project_dir $name.$generated sources_1 bd $name hw_handoff $name.hwh]
    if {[file exists $candidate]} {set hwh $candidate; break}
}
if {$hwh eq ""} {tessera_fail "Vivado wrote no hardware handoff for $name.bd"}
set handle [open $hwh]
set handoff [read $handle]
close $handle
if {[string first {VLNV="tessera.dev:tessera:tessera_top:1.0"} $handoff] < 0} {
    tessera_fail "$hwh has no tessera.dev:tessera:tessera_top:1.0: the driver would not find the accelerator"
}
file copy -force $bit [file join $out_dir tessera.bit]
file copy -force $hwh [file join $out_dir tessera.hwh]
puts "tessera: wrote [file join $out_dir tessera.bit] and tessera.hwh (WNS $wns ns, WHS $whs ns)"
