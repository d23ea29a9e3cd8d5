# vivado_standin.tcl: a recording stand-in for the Vivado Tcl commands of the Tessera board
# flow (tessera.bitstreams.flow), so the flow runs under plain tclsh where there is no Vivado.
#
#     tclsh vivado_standin.tcl RECORD FLOW [PROPERTY VALUE]...
#
# Sources FLOW from its folder with every Vivado command it uses defined here. Each command
# checks its options and argument count against its syntax in UG835 (an unknown option or a
# missing argument is a Tcl error, as in Vivado), does what little the flow depends on, and
# appends one JSON object per call to RECORD: {"cmd", "opts", "args", "result", "notes"}.
#
# The model, just enough to answer the flow's queries and catch its mistakes:
#   * ipx::infer_core reads the HDL in the IP folder and infers, from the top module's ports,
#     the AXI interfaces (<prefix>_awvalid...), clocks (*clk*) and resets (*rst*, *reset*);
#     nothing else (an interrupt must be inferred explicitly). The other ipx:: commands keep
#     the memory maps, address blocks, address spaces and parameters the flow adds.
#   * update_ip_catalog puts the saved cores under the project's ip_repo_paths in the catalog;
#     create_bd_cell takes xilinx.com IP and catalog IP only.
#   * Block-design objects: get_bd_cells/pins/intf_pins/addr_spaces/addr_segs refuse what does
#     not exist (cells; the pins, interfaces, address spaces and segments of packaged IP; the
#     pins of Xilinx IP are taken on trust). An interface pin connects once; assign_bd_address
#     wants a power-of-two range of at least 4K and an offset aligned to it.
#   * Runs: launch_runs, wait_on_run and open_run in order; launching impl_1 to write_bitstream
#     writes a placeholder .bit in the run folder, generate_target a placeholder .hwh (one
#     MODULE line per cell with its VLNV), reports placeholder files.
#   * get_property answers what set_property set, then the PROPERTY VALUE pairs on the command
#     line, then the flow's own dict tessera_expect (what it will check Vivado against: the
#     stand-in is a Vivado that agrees), else fails. "@board_parts" answers get_board_parts.
#   * exit ends the run with its code; `file copy` is recorded and done.
# Placeholders say they are placeholders; nothing here is a Vivado output.

namespace eval ::standin {
    variable out ""                     ;# the record channel
    variable notes {}                   ;# notes of the command being recorded (encoded JSON)
    variable syntax [dict create]       ;# command -> {valued-options flag-options min max}
    variable answers [dict create]      ;# property -> value, from the command line
    variable props [dict create]        ;# object -> property -> value
    variable project {}                 ;# dict: name dir part
    variable bd ""                      ;# the block design's name
    variable cells [dict create]        ;# cell name -> dict: vlnv type reference
    variable cores [dict create]        ;# core handle -> dict: vlnv root ports axi pins saved
    variable ipx [dict create]          ;# ipx object handle -> 1
    variable current_core ""
    variable catalog [dict create]      ;# vlnv -> core handle
    variable intf_connected [dict create]
    variable runs [dict create synth_1 {} impl_1 {}]   ;# run -> dict: launched to_step
    variable design_open 0
    variable added {}                   ;# files add_files added
    namespace eval impl {}
}
namespace eval ::ipx {}

if {[info commands ::exit] ne ""} {
    rename ::exit ::standin::real_exit
} else {
    # Python's tkinter.Tcl has no exit: its runner (tessera.bitstreams.flow) gives one.
    proc ::standin::real_exit {{code 0}} {
        flush stdout
        flush stderr
        ::standin_host_exit $code
    }
}
rename ::file ::standin::tcl_file

# ------------------------------------------------------------------------------ JSON record
proc ::standin::jstr {s} {
    set s [string map [list "\\" "\\\\" "\"" "\\\"" "\n" "\\n" "\r" "\\r" "\t" "\\t"] $s]
    return "\"$s\""
}
proc ::standin::jlist {items} {
    set parts {}
    foreach item $items { lappend parts [jstr $item] }
    return "\[[join $parts ,]\]"
}
proc ::standin::jdict {d} {
    set parts {}
    dict for {k v} $d { lappend parts "[jstr $k]:[jstr $v]" }
    return "\{[join $parts ,]\}"
}
proc ::standin::jobj {d} {   ;# values already encoded
    set parts {}
    dict for {k v} $d { lappend parts "[jstr $k]:$v" }
    return "\{[join $parts ,]\}"
}
proc ::standin::note {key json} {
    variable notes
    dict set notes $key $json
}
proc ::standin::log {name opts pos result error} {
    variable out
    variable notes
    set entry [dict create cmd [jstr $name] opts [jdict $opts] args [jlist $pos] \
                   result [jstr $result] notes [jobj $notes]]
    if {$error ne ""} { dict set entry error [jstr $error] }
    puts $out [jobj $entry]
    flush $out
}

# ------------------------------------------------------------------------ command syntax
proc ::standin::define {name valued flags min max body} {
    variable syntax
    dict set syntax $name [list $valued [concat $flags -quiet -verbose] $min $max]
    proc ::standin::impl::[string map {:: __} $name] {opts pos} $body
    interp alias {} ::$name {} ::standin::invoke $name
}

proc ::standin::parse {name arglist} {
    variable syntax
    lassign [dict get $syntax $name] valued flags min max
    set opts [dict create]
    set pos {}
    for {set i 0} {$i < [llength $arglist]} {incr i} {
        set arg [lindex $arglist $i]
        if {[string match -* $arg] && ![string is double -strict $arg] && ![regexp {\s} $arg]} {
            if {$arg in $valued} {
                if {$i + 1 >= [llength $arglist]} { error "option $arg needs a value" }
                dict set opts $arg [lindex $arglist [incr i]]
            } elseif {$arg in $flags} {
                dict set opts $arg 1
            } else {
                error "unknown option $arg (it takes [join [lsort [concat $valued $flags]] {, }])"
            }
        } else {
            lappend pos $arg
        }
    }
    if {[llength $pos] < $min || ($max >= 0 && [llength $pos] > $max)} {
        set want [expr {$min == $max ? $min : "$min to [expr {$max < 0 ? {any number} : $max}]"}]
        error "takes $want positional arguments, got [llength $pos]: $pos"
    }
    return [list $opts $pos]
}

proc ::standin::invoke {name args} {
    variable notes [dict create]
    set pos $args
    set opts [dict create]
    if {[catch {lassign [parse $name $args] opts pos} message]} {
        log $name {} $args "" $message
        return -code error "$name: $message"
    }
    if {[catch {impl::[string map {:: __} $name] $opts $pos} result]} {
        log $name $opts $pos "" $result
        if {[dict exists $opts -quiet]} { return "" }
        return -code error "$name: $result"
    }
    log $name $opts $pos $result ""
    return $result
}

proc ::standin::opt {opts name {default ""}} {
    if {[dict exists $opts $name]} { return [dict get $opts $name] }
    return $default
}

# -------------------------------------------------------------------------- model helpers
proc ::standin::need_project {} {
    variable project
    if {$project eq ""} { error "no open project (create_project first)" }
}
proc ::standin::need_bd {} {
    variable bd
    need_project
    if {$bd eq ""} { error "no open block design (create_bd_design first)" }
}
proc ::standin::proj {key} {
    variable project
    need_project
    return [dict get $project $key]
}
proc ::standin::gen_dir {} {
    variable bd
    return [file join [proj dir] [proj name].gen sources_1 bd $bd]
}
proc ::standin::write_placeholder {path text} {
    tcl_file mkdir [tcl_file dirname $path]
    set handle [open $path w]
    puts $handle "Vivado stand-in placeholder (tessera.bitstreams.flow dry run), not a Vivado output."
    puts -nonewline $handle $text
    close $handle
}
proc ::standin::set_props {objects values} {
    variable props
    if {[llength $objects] == 0} { error "no objects to set [dict keys $values] on" }
    foreach obj $objects {
        dict for {k v} $values { dict set props $obj $k $v }
    }
    note objects [jlist $objects]
    note properties [jdict $values]
    note project [jstr [expr {[dict size $::standin::project] ? [proj name] : ""}]]
}

# Cores: handles "ipx:core:<root>", children "<parent>/<kind>:<name>".
proc ::standin::core_of {handle} {
    variable cores
    set core [lindex $handle 0]
    if {![dict exists $cores $core]} { error "$handle is not an IP core (ipx::current_core)" }
    return $core
}
proc ::standin::ipx_get {kind opts pos} {
    variable ipx
    set parent [lindex [opt $opts -of_objects] 0]
    if {$parent eq ""} { error "-of_objects is needed" }
    set found {}
    foreach pattern [expr {[llength $pos] ? $pos : "*"}] {
        foreach handle [dict keys $ipx "$parent/$kind:*"] {
            set name [string range $handle [string length "$parent/$kind:"] end]
            if {![string match */* $name] && [string match $pattern $name]} {
                lappend found $handle
            }
        }
    }
    return $found
}
proc ::standin::ipx_add {kind name parent} {
    variable ipx
    if {![dict exists $ipx $parent] && ![dict exists $::standin::cores $parent]} {
        error "$parent is not an IP-XACT object"
    }
    set handle "$parent/$kind:$name"
    if {[dict exists $ipx $handle]} { error "$kind $name already exists in $parent" }
    dict set ipx $handle 1
    return $handle
}

set ::standin::axi_signals {
    awid awaddr awlen awsize awburst awlock awcache awprot awqos awregion awuser awvalid awready
    wid wdata wstrb wlast wuser wvalid wready bid bresp buser bvalid bready
    arid araddr arlen arsize arburst arlock arcache arprot arqos arregion aruser arvalid arready
    rid rdata rresp rlast ruser rvalid rready
}

# A port declaration: direction, [wire|reg|signed...], [range], (escaped) name.
set ::standin::port_re \
    {^\s*(input|output|inout)\s+(?:(?:wire|reg|signed)\s+)*(?:\[[^\]]*\]\s*)?\\?([A-Za-z_][\w$]*)}

# The ports of module $top in $files: name -> direction.
proc ::standin::hdl_ports {files top} {
    foreach path $files {
        set handle [open $path]
        set text [read $handle]
        close $handle
        if {[regexp -indices "(^|\\n)\\s*module\\s+$top\\s*\\(" $text match]} {
            set start [lindex $match 0]
            set body [string range $text $start [string first endmodule $text $start]]
            set ports [dict create]
            foreach {all direction name} [regexp -all -inline -line $::standin::port_re $body] {
                dict set ports $name $direction
            }
            return $ports
        }
    }
    error "no module $top in [llength $files] HDL files ($files)"
}

# ------------------------------------------------------------------------------- project
::standin::define create_project {-part} {-force -in_memory -ip -rtl_kernel} 0 2 {
    variable ::standin::project
    lassign $pos name dir
    if {$name eq ""} { set name project_1 }
    if {$dir eq ""} { set dir [pwd] }
    set dir [::standin::tcl_file normalize $dir]
    set xpr [file join $dir $name.xpr]
    if {[::standin::tcl_file exists $xpr] && ![dict exists $opts -force]} {
        error "project $xpr exists: use -force"
    }
    ::standin::write_placeholder $xpr "project $name\n"
    set project [dict create name $name dir $dir part [::standin::opt $opts -part]]
    return $name
}
::standin::define current_project {} {} 0 1 {
    return [::standin::proj name]
}
::standin::define current_fileset {} {-constrset -simset} 0 1 {
    ::standin::need_project
    return [expr {[llength $pos] ? [lindex $pos 0] : "sources_1"}]
}
::standin::define get_board_parts {-filter -of_objects} \
        {-latest_file_version -latest_hw_revision -regexp -nocase} 0 -1 {
    if {[dict exists $::standin::answers @board_parts]} {
        return [dict get $::standin::answers @board_parts]
    }
    return $pos
}
::standin::define set_property {-dict} {} 1 3 {
    if {[dict exists $opts -dict]} {
        if {[llength $pos] != 1} { error "with -dict it takes the objects only" }
        set values [dict get $opts -dict]
        if {[llength $values] % 2} { error "-dict needs name value pairs: $values" }
        ::standin::set_props [lindex $pos 0] $values
    } else {
        if {[llength $pos] != 3} { error "takes a name, a value and the objects" }
        lassign $pos name value objects
        ::standin::set_props $objects [dict create $name $value]
    }
    return ""
}
::standin::define get_property {} {-min -max} 2 2 {
    lassign $pos name object
    set object [lindex $object 0]
    if {[dict exists $::standin::props $object $name]} {
        return [dict get $::standin::props $object $name]
    }
    if {[dict exists $::standin::runs $object]} {
        switch -- $name {
            DIRECTORY {
                return [file join [::standin::proj dir] [::standin::proj name].runs $object]
            }
            PROGRESS {
                if {![dict exists $::standin::runs $object launched]} { return "0%" }
            }
        }
    }
    if {[dict exists $::standin::answers $name]} { return [dict get $::standin::answers $name] }
    if {[info exists ::tessera_expect] && [dict exists $::tessera_expect $name]} {
        return [dict get $::tessera_expect $name]
    }
    error "the stand-in knows no value of $name for $object (pass one in answers)"
}

# ------------------------------------------------------------------------- IP packaging
::standin::define ipx::infer_core {-vendor -library -name -version -taxonomy -files \
        -set_current} {-as_library} 1 1 {
    variable ::standin::cores
    set root [::standin::tcl_file normalize [lindex $pos 0]]
    set files [glob -nocomplain -directory $root *.v *.sv]
    if {![llength $files]} { error "no HDL files in $root" }
    set top [::standin::opt $opts -name]
    if {$top eq ""} { error "the stand-in finds the top module by the IP's -name" }
    set vlnv [join [list [::standin::opt $opts -vendor user.org] \
                  [::standin::opt $opts -library user] $top [::standin::opt $opts -version 1.0]] :]
    set ports [::standin::hdl_ports $files $top]
    set axi [dict create]
    dict for {port direction} $ports {
        if {[regexp {^(.+)_([A-Za-z]+)$} $port -> prefix signal]
                && [string tolower $signal] in $::standin::axi_signals} {
            dict lappend axi $prefix $port
        }
    }
    set core "ipx:core:$root"
    dict set cores $core [dict create vlnv $vlnv root $root ports $ports saved 0]
    set interfaces {}
    set in_axi {}
    dict for {prefix members} $axi {
        if {[llength $members] < 2} { continue }
        ::standin::ipx_add bus_interface $prefix $core
        set valid [lsearch -inline -nocase -regexp $members {_(ar|aw)valid$}]
        set mode [expr {$valid ne "" && [dict get $ports $valid] eq "output" ? "master" : "slave"}]
        dict set ::standin::props "$core/bus_interface:$prefix" INTERFACE_MODE $mode
        lappend interfaces $prefix
        lappend in_axi {*}$members
    }
    set pins {}
    dict for {port direction} $ports {
        if {$port in $in_axi} { continue }
        lappend pins $port
        if {[regexp -nocase {clk|clock} $port] || [regexp -nocase {rst|reset} $port]} {
            ::standin::ipx_add bus_interface $port $core
        }
    }
    dict set cores $core pins $pins
    dict set cores $core interfaces $interfaces
    if {[::standin::opt $opts -set_current true] in {true 1}} {
        set ::standin::current_core $core
    }
    ::standin::note core [::standin::jobj [dict create vlnv [::standin::jstr $vlnv] \
        pins [::standin::jlist $pins] interfaces [::standin::jlist $interfaces]]]
    return $core
}
::standin::define ipx::current_core {} {} 0 1 {
    if {$::standin::current_core eq ""} { error "no current IP core" }
    return $::standin::current_core
}
foreach {kind command} {bus_interface ipx::get_bus_interfaces bus_parameter ipx::get_bus_parameters
                        memory_map ipx::get_memory_maps address_block ipx::get_address_blocks
                        address_space ipx::get_address_spaces} {
    ::standin::define $command {-of_objects -filter} {-regexp -nocase} 0 1 \
        "::standin::ipx_get $kind \$opts \$pos"
}
foreach {kind command} {bus_parameter ipx::add_bus_parameter memory_map ipx::add_memory_map
                        address_block ipx::add_address_block register ipx::add_register
                        address_space ipx::add_address_space} {
    ::standin::define $command {} {} 2 2 \
        "::standin::ipx_add $kind \[lindex \$pos 0\] \[lindex \$pos 1\]"
}
::standin::define ipx::infer_bus_interface {} {} 3 3 {
    lassign $pos port vlnv core
    set core [::standin::core_of $core]
    if {$port ni [dict get $::standin::cores $core pins]} {
        error "$port is not a port of the core outside its AXI interfaces"
    }
    set handle [::standin::ipx_add bus_interface $port $core]
    dict set ::standin::props $handle BUS_TYPE_VLNV $vlnv
    return $handle
}
::standin::define ipx::associate_bus_interfaces {-busif -clock -reset} {-remove -clear} 1 1 {
    set core [::standin::core_of [lindex $pos 0]]
    foreach option {-busif -clock -reset} {
        set name [::standin::opt $opts $option]
        if {$name ne "" && ![dict exists $::standin::ipx "$core/bus_interface:$name"]} {
            error "$option $name: no such bus interface"
        }
    }
    return ""
}
foreach command {ipx::create_xgui_files ipx::update_checksums} {
    ::standin::define $command {} {} 1 1 {
        ::standin::core_of [lindex $pos 0]
        return ""
    }
}
::standin::define ipx::unload_core {} {} 0 1 {
    ::standin::core_of [expr {[llength $pos] ? [lindex $pos 0] : $::standin::current_core}]
    set ::standin::current_core ""
    return ""
}
::standin::define ipx::check_integrity {} {-kernel -xrt} 1 1 {
    set core [::standin::core_of [lindex $pos 0]]
    foreach busif [dict get $::standin::cores $core interfaces] {
        set handle "$core/bus_interface:$busif"
        if {[dict get $::standin::props $handle INTERFACE_MODE] eq "slave"} {
            if {![dict exists $::standin::props $handle slave_memory_map_ref]} {
                error "AXI slave $busif has no memory map (slave_memory_map_ref)"
            }
            set map [dict get $::standin::props $handle slave_memory_map_ref]
            if {![dict exists $::standin::ipx "$core/memory_map:$map"]} {
                error "AXI slave $busif refers to the missing memory map $map"
            }
        }
    }
    return ""
}
::standin::define ipx::save_core {} {} 0 1 {
    set core [expr {[llength $pos] ? [lindex $pos 0] : $::standin::current_core}]
    set core [::standin::core_of $core]
    dict set ::standin::cores $core saved 1
    ::standin::write_placeholder [file join [dict get $::standin::cores $core root] component.xml] \
        "component [dict get $::standin::cores $core vlnv]\n"
    return ""
}
::standin::define update_ip_catalog {-repo_path -add_ip -delete_ip -disable_ip -enable_ip \
        -add_interface -vendor -library -name -version} \
        {-rebuild -scan_changes -create_index -delete_mult_ip -report -update_module_ref} 0 0 {
    set project [::standin::proj name]
    set paths {}
    if {[dict exists $::standin::props $project ip_repo_paths]} {
        set paths [dict get $::standin::props $project ip_repo_paths]
    }
    dict for {core info} $::standin::cores {
        if {![dict get $info saved]} { continue }
        foreach path $paths {
            set path [::standin::tcl_file normalize $path]
            if {[string first "$path/" "[dict get $info root]/"] == 0} {
                dict set ::standin::catalog [dict get $info vlnv] $core
            }
        }
    }
    return ""
}

# ------------------------------------------------------------------------- block design
::standin::define create_bd_design {-dir -cell -mode -bdsource -boundary_from \
        -boundary_from_container} {} 1 1 {
    ::standin::need_project
    set ::standin::bd [lindex $pos 0]
    return $::standin::bd
}
::standin::define create_bd_cell {-vlnv -type -reference -prop_dict} {-noexpand} 1 1 {
    ::standin::need_bd
    set name [lindex $pos 0]
    if {[dict exists $::standin::cells $name]} { error "cell $name already exists" }
    set type [::standin::opt $opts -type ip]
    set vlnv [::standin::opt $opts -vlnv]
    switch -- $type {
        ip {
            if {[llength [split $vlnv :]] != 4} {
                error "-type ip needs -vlnv vendor:library:name:version"
            }
            if {![string match xilinx.com:* $vlnv] && ![dict exists $::standin::catalog $vlnv]} {
                error "IP $vlnv is not in the IP catalog (package it, add its repository to\
                       ip_repo_paths, update_ip_catalog)"
            }
        }
        module {
            if {![dict exists $opts -reference]} { error "-type module needs -reference" }
        }
        default { error "-type must be ip, module or hier, not $type" }
    }
    dict set ::standin::cells $name [dict create vlnv $vlnv type $type]
    return "/$name"
}
# The packaged core behind a cell, or "" for Xilinx IP.
proc ::standin::cell_core {cell} {
    if {![dict exists $::standin::cells $cell]} { error "no cell $cell in the block design" }
    set vlnv [dict get $::standin::cells $cell vlnv]
    if {[dict exists $::standin::catalog $vlnv]} { return [dict get $::standin::catalog $vlnv] }
    return ""
}
proc ::standin::bd_objects {kind pos check} {
    ::standin::need_bd
    set found {}
    foreach pattern $pos {
        set path [string trimleft $pattern /]
        set parts [split $path /]
        set cell [lindex $parts 0]
        set core [::standin::cell_core $cell]
        if {$core ne "" && $check ne ""} { $check $core [lrange $parts 1 end] $path }
        lappend found "/$path"
    }
    return $found
}
proc ::standin::check_pin {core rest path} {
    if {[llength $rest] != 1 || [lindex $rest 0] ni [dict get $::standin::cores $core pins]} {
        error "no pin $path (pins: [dict get $::standin::cores $core pins])"
    }
}
proc ::standin::check_intf {core rest path} {
    if {[llength $rest] != 1 || [lindex $rest 0] ni [dict get $::standin::cores $core interfaces]} {
        error "no interface pin $path (interfaces: [dict get $::standin::cores $core interfaces])"
    }
}
proc ::standin::check_space {core rest path} {
    foreach busif [dict get $::standin::cores $core interfaces] {
        set handle "$core/bus_interface:$busif"
        if {[dict exists $::standin::props $handle master_address_space_ref]
                && [dict get $::standin::props $handle master_address_space_ref] eq [lindex $rest 0]
                && [dict exists $::standin::ipx "$core/address_space:[lindex $rest 0]"]} {
            return
        }
    }
    error "no address space $path (no master interface refers to one of that name)"
}
proc ::standin::check_segment {core rest path} {
    lassign $rest busif block
    set handle "$core/bus_interface:$busif"
    if {[llength $rest] != 2 || ![dict exists $::standin::props $handle slave_memory_map_ref]} {
        error "no address segment $path ($busif has no memory map)"
    }
    set map [dict get $::standin::props $handle slave_memory_map_ref]
    if {![dict exists $::standin::ipx "$core/memory_map:$map/address_block:$block"]} {
        error "no address segment $path (memory map $map has no block $block)"
    }
}
::standin::define get_bd_cells {-filter -of_objects} {-hierarchical -regexp -nocase} 0 -1 {
    return [::standin::bd_objects cell $pos {}]
}
::standin::define get_bd_pins {-filter -of_objects} {-hierarchical -regexp -nocase} 0 -1 {
    return [::standin::bd_objects pin $pos ::standin::check_pin]
}
::standin::define get_bd_intf_pins {-filter -of_objects} {-hierarchical -regexp -nocase} 0 -1 {
    return [::standin::bd_objects intf_pin $pos ::standin::check_intf]
}
::standin::define get_bd_addr_spaces {-filter -of_objects} {-regexp -nocase} 0 -1 {
    return [::standin::bd_objects addr_space $pos ::standin::check_space]
}
::standin::define get_bd_addr_segs {-filter -of_objects} \
        {-addressables -addressing -excluded -unassigned -hierarchical -regexp -nocase} 0 -1 {
    return [::standin::bd_objects addr_seg $pos ::standin::check_segment]
}
::standin::define apply_bd_automation {-rule -dict -config -opts} {} 1 1 {
    ::standin::need_bd
    if {![dict exists $opts -rule]} { error "-rule is required" }
    if {[llength [lindex $pos 0]] == 0} { error "no object to automate" }
    return ""
}
::standin::define connect_bd_net {-net} {} 1 -1 {
    ::standin::need_bd
    set pins [concat {*}$pos]
    if {[llength $pins] < 2} { error "needs at least two pins, got: $pins" }
    ::standin::note pins [::standin::jlist $pins]
    return "/net_[string map {/ _} [string trimleft [lindex $pins 0] /]]"
}
::standin::define connect_bd_intf_net {-intf_net -boundary_type} {} 2 2 {
    ::standin::need_bd
    foreach end $pos {
        if {[llength $end] != 1} { error "each end must be one interface pin, got: $end" }
        if {[dict exists $::standin::intf_connected $end]} {
            error "$end is connected already"
        }
    }
    foreach end $pos { dict set ::standin::intf_connected $end 1 }
    return ""
}
proc ::standin::size {text} {
    if {[regexp {^(\d+)([KMGT])$} $text -> n unit]} {
        return [expr {wide($n) << (10 * [string first $unit " KMGT"])}]
    }
    if {![string is wide -strict $text]} { error "not an address: $text" }
    return [expr {wide($text)}]
}
::standin::define assign_bd_address {-target_address_space -offset -range -dict \
        -import_from_file -export_to_file -export_gui_to_file} \
        {-boundary -combine_segments -external -force} 0 1 {
    ::standin::need_bd
    if {[llength [lindex $pos 0]] != 1} { error "takes one address segment" }
    foreach option {-target_address_space -offset -range} {
        if {![dict exists $opts $option]} { error "the stand-in wants $option" }
    }
    set offset [::standin::size [dict get $opts -offset]]
    set range [::standin::size [dict get $opts -range]]
    if {$range < 4096 || ($range & ($range - 1))} {
        error "range [dict get $opts -range] is not a power of two of at least 4K"
    }
    if {$offset % $range} { error "offset [dict get $opts -offset] is not aligned to the range" }
    return "SEG_[string map {/ _} [string trimleft [lindex $pos 0] /]]"
}
::standin::define validate_bd_design {-design} {-force} 0 0 { ::standin::need_bd; return "" }
::standin::define save_bd_design {} {} 0 1 { ::standin::need_bd; return "" }
::standin::define make_wrapper {-fileset -files} \
        {-top -testbench -inst_template -import -force} 0 0 {
    ::standin::need_bd
    if {![dict exists $opts -files]} { error "-files is required" }
    set path [file join [::standin::gen_dir] hdl ${::standin::bd}_wrapper.v]
    ::standin::write_placeholder $path "module ${::standin::bd}_wrapper();\nendmodule\n"
    return $path
}
::standin::define get_files {-filter -of_objects -compile_order -used_in -references} \
        {-regexp -nocase -all} 0 -1 {
    set found {}
    foreach pattern $pos {
        if {$::standin::bd ne "" && $pattern eq "$::standin::bd.bd"} {
            lappend found [file join [::standin::proj dir] [::standin::proj name].srcs sources_1 \
                               bd $::standin::bd $pattern]
            continue
        }
        set matches [lsearch -all -inline -glob $::standin::added "*$pattern"]
        if {![llength $matches]} { error "no file matches $pattern" }
        lappend found {*}$matches
    }
    return $found
}
::standin::define add_files {-fileset -of_objects -copy_to} \
        {-norecurse -force -scan_for_includes} 0 -1 {
    ::standin::need_project
    set files [concat {*}$pos]
    foreach path $files {
        if {![::standin::tcl_file exists $path]} { error "file $path does not exist" }
    }
    lappend ::standin::added {*}$files
    ::standin::note files [::standin::jlist $files]
    return $files
}
::standin::define update_compile_order {-fileset} {} 0 0 { ::standin::need_project; return "" }
::standin::define generate_target {} {-force} 2 2 {
    ::standin::need_bd
    set text ""
    dict for {cell info} $::standin::cells {
        append text "<MODULE INSTANCE=\"$cell\" VLNV=\"[dict get $info vlnv]\"/>\n"
    }
    set hwh [file join [::standin::gen_dir] hw_handoff $::standin::bd.hwh]
    ::standin::write_placeholder $hwh $text
    return ""
}

# ---------------------------------------------------------------------------------- runs
set ::standin::steps {synth_design opt_design power_opt_design place_design
    post_place_power_opt_design phys_opt_design route_design post_route_phys_opt_design
    write_bitstream write_device_image}
::standin::define get_runs {-filter -of_objects} {-regexp -nocase} 0 -1 {
    ::standin::need_project
    foreach run $pos {
        if {![dict exists $::standin::runs $run]} { error "no run $run" }
    }
    return [expr {[llength $pos] ? $pos : [dict keys $::standin::runs]}]
}
::standin::define launch_runs {-jobs -to_step -dir -host -remote_cmd -email_to \
        -pre_launch_script -post_launch_script -custom_script -lsf -sge \
        -cluster_configurations} {-scripts_only -next_step -email_all -force} 1 -1 {
    ::standin::need_project
    set step [::standin::opt $opts -to_step]
    if {$step ne "" && $step ni $::standin::steps} { error "-to_step $step is not a step" }
    set runs [concat {*}$pos]
    foreach run $runs {
        if {![dict exists $::standin::runs $run]} { error "no run $run" }
        dict set ::standin::runs $run launched 1
        if {$run eq "impl_1" && $step eq "write_bitstream"} {
            set fileset [expr {[dict exists $::standin::props sources_1 top] ?
                               [dict get $::standin::props sources_1 top] : ""}]
            if {$fileset eq ""} { error "no top module set for sources_1" }
            ::standin::write_placeholder [file join [::standin::proj dir] \
                [::standin::proj name].runs impl_1 $fileset.bit] "bitstream of $fileset\n"
        }
    }
    ::standin::note runs [::standin::jlist $runs]
    return ""
}
::standin::define wait_on_run {-timeout} {} 1 1 {
    if {![dict exists $::standin::runs [lindex $pos 0] launched]} {
        error "run [lindex $pos 0] was not launched"
    }
    return ""
}
::standin::define open_run {-name -pr_config} {} 1 1 {
    if {![dict exists $::standin::runs [lindex $pos 0] launched]} {
        error "run [lindex $pos 0] was not launched"
    }
    set ::standin::design_open 1
    return ""
}
proc ::standin::report {opts} {
    if {!$::standin::design_open} { error "no open design (open_run first)" }
    if {[dict exists $opts -file]} {
        ::standin::write_placeholder [dict get $opts -file] "report\n"
    }
    return ""
}
::standin::define report_utilization {-file -name -pblocks -cells -slr -hierarchical_depth \
        -spreadsheet_file -spreadsheet_table -spreadsheet_depth} {-append -hierarchical \
        -hierarchical_percentages -no_primitives -omit_locs -packthru -evaluate_pblock \
        -return_string -exclude_child_pblocks -exclude_non_assigned} 0 0 {
    return [::standin::report $opts]
}
::standin::define report_timing_summary {-file -delay_type -max_paths -nworst -name -cells \
        -rpx -slack_lesser_than -slack_greater_than -input_pins -significant_digits} \
        {-append -no_detailed_paths -report_unconstrained -warn_on_violation -return_string \
        -no_header -datasheet -unique_pins -setup -hold -no_check_timing \
        -check_timing_verbose} 0 0 {
    return [::standin::report $opts]
}
::standin::define write_bitstream {-reference_bitfile -cell -raw_bitfile} {-force -bin_file \
        -mask_file -no_binary_bitfile -logic_location_file -no_partial_bitfile \
        -readback_file} 1 1 {
    if {!$::standin::design_open} { error "no open design (open_run first)" }
    ::standin::write_placeholder [lindex $pos 0] "bitstream\n"
    return ""
}

# ------------------------------------------------------------------------ Tcl built-ins
proc ::file {args} {
    if {[lindex $args 0] eq "copy"} {
        set paths [lrange $args 1 end]
        while {[string match -* [lindex $paths 0]]} {
            set option [lindex $paths 0]
            set paths [lrange $paths 1 end]
            if {$option eq "--"} { break }
        }
        if {[llength $paths] == 2} {
            set ::standin::notes [dict create \
                source [::standin::jstr [::standin::tcl_file normalize [lindex $paths 0]]] \
                destination [::standin::jstr [::standin::tcl_file normalize [lindex $paths 1]]]]
            ::standin::log "file copy" {} $paths "" ""
        }
    }
    return [uplevel 1 [list ::standin::tcl_file {*}$args]]
}

proc ::exit {{code 0}} {
    if {$::standin::out ne ""} { close $::standin::out }
    ::standin::real_exit $code
}

# ------------------------------------------------------------------------------------ run
if {[llength $argv] < 2 || [llength $argv] % 2} {
    puts stderr "usage: tclsh vivado_standin.tcl RECORD FLOW \[PROPERTY VALUE\]..."
    ::standin::real_exit 2
}
set ::standin::answers [dict create {*}[lrange $argv 2 end]]
set ::standin::out [open [lindex $argv 0] w]
set flow [::standin::tcl_file normalize [lindex $argv 1]]
cd [::standin::tcl_file dirname $flow]
if {[catch {uplevel #0 [list source $flow]} message options]} {
    puts stderr "Tcl error: $message"
    puts stderr [dict get $options -errorinfo]
    close $::standin::out
    ::standin::real_exit 3
}
close $::standin::out
::standin::real_exit 0
