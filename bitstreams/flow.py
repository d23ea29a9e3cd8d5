"""The Vivado board flow: a batch-mode Tcl script that builds a bitstream and its ``.hwh``.

:func:`flow_tcl` writes the whole flow for a board (:mod:`tessera.boards`) and a
:class:`~tessera.config.HwConfig`; :func:`write_project` puts it in a folder with the
exported Verilog, ready for ``vivado -mode batch -source build.tcl``. The flow

1. creates a project for the board's part and board part;
2. packages ``tessera_top.v`` as the IP :data:`tessera.hwh.IP_VLNV`, with the register
   map of :mod:`tessera.regmap` (:mod:`~tessera.bitstreams.ip_package`);
3. builds the block design :mod:`tessera.hwh` describes: the PS with the board preset,
   PL clock 0 (and a Clocking Wizard where needed), the interconnects, interrupt, reset
   and address map (:mod:`~tessera.bitstreams.block_design`);
4. synthesises, implements and writes the bitstream, keeps utilisation and timing
   reports, stops with exit code 1 if timing fails, and copies the bitstream and the
   ``.hwh`` to ``out/``.

Each step reads a :class:`~tessera.bitstreams.plan.FlowPlan` and appends to a
:class:`~tessera.bitstreams.tcl.TclScript`. Without Vivado, :func:`dry_run`
(:mod:`~tessera.bitstreams.standin`) executes the flow under ``tclsh`` against
``vivado_standin.tcl`` and returns a :class:`FlowRecord` of what the flow asked Vivado
to build.

The flow of every board's default preset is checked in as ``bitstreams/<board>/build.tcl``
beside the board's README; ``python -m tessera.bitstreams.flow --regenerate``
(:func:`regenerate`) writes them again after a change here.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path

from tessera.boards import BOARDS, Board, get_board
from tessera.config import HwConfig, get_config
from tessera.errors import ConfigError
from tessera.hwh import IP_MODULE, IP_VLNV, hwh_xml

from .block_design import block_design
from .ip_package import package_ip
from .plan import (BIT_NAME, EXPECTED_HWH_NAME, HWH_NAME, IP_REPO_DIR, OUT_DIR, README_NAME,
                   REPORTS_DIR, TCL_NAME, VIVADO_DIR, FlowPlan, VivadoProject)
from .standin import DEFAULT_ANSWERS, STANDIN, Address, Cell, Core, FlowRecord, dry_run
from .tcl import TclScript, mhz

__all__ = ["DEFAULT_ANSWERS", "FLOWS_DIR", "STANDIN", "Address", "Cell", "Core",
           "FlowRecord", "VivadoProject", "checked_in_tcl", "dry_run", "flow_tcl",
           "regenerate", "write_project"]

#: The folder with a folder per board (its README.md and the build.tcl of its preset);
#: in a source checkout, builds also install there (tessera.bitstreams.default_install_root).
FLOWS_DIR = Path(__file__).parent


# ------------------------------------------------------------------------------ API
def flow_tcl(board: str | Board, config: HwConfig | str) -> str:
    """The Vivado batch-mode Tcl of the board flow for ``config`` on ``board``.

    Raises :class:`~tessera.errors.ConfigError` if the config does not fit the board
    (another part, too many DRAM ports, a bus width the HP ports lack).
    """
    board = get_board(board)
    config = get_config(config)
    board.check(config)
    plan = FlowPlan.of(board, config)
    script = TclScript()
    for step in _STEPS:
        step(plan, script)
        script.emit("")
    return script.text()


def write_project(board: str | Board, config: HwConfig | str, directory: str | Path, *,
                  verilog: str | Path | None = None) -> VivadoProject:
    """Write a ready-to-run project folder for ``config`` on ``board`` into ``directory``:
    ``build.tcl``, the exported Verilog (:func:`tessera.hw.synth.export.write`, which takes
    minutes for large configs), the ``.hwh`` the flow must produce (``expected.hwh``) and a
    ``README.txt`` saying how to run it.

    ``verilog``: an already exported ``tessera_top.v`` of this config to copy instead of
    exporting again (its ``tessera_top.json`` is copied too when it sits beside it).
    """
    board = get_board(board)
    config = get_config(config)
    tcl = flow_tcl(board, config)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    target = _place_verilog(config, out, verilog)
    (out / TCL_NAME).write_text(tcl)
    (out / EXPECTED_HWH_NAME).write_text(hwh_xml(config, board))
    (out / README_NAME).write_text(_readme(board, config))
    return VivadoProject(directory=out, tcl=out / TCL_NAME, verilog=target,
                         bitstream=out / OUT_DIR / BIT_NAME, hwh=out / OUT_DIR / HWH_NAME,
                         expected_hwh=out / EXPECTED_HWH_NAME, reports=out / REPORTS_DIR,
                         board=board.name, config=config)


def _place_verilog(config: HwConfig, out: Path, verilog: str | Path | None) -> Path:
    """Export ``config``'s Verilog into ``out``, or copy ``verilog`` (and the JSON
    description beside it) there; the path of ``tessera_top.v`` in ``out``."""
    target = out / f"{IP_MODULE}.v"
    if verilog is None:
        from tessera.hw.synth import export
        if export.TOP_NAME != IP_MODULE:      # the flow packages the module tessera.hwh names
            raise ConfigError(f"hw.export writes {export.TOP_NAME}, tessera.hwh expects "
                              f"{IP_MODULE}")
        export.write(config, out)
        return target
    source = Path(verilog)
    if not source.is_file():
        raise ConfigError(f"no Verilog at {source}: export it with `tessera hw verilog` or "
                          "leave verilog=None")
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)
        description = source.with_suffix(".json")
        if description.is_file():
            shutil.copyfile(description, target.with_suffix(".json"))
    return target


def checked_in_tcl(board: str | Board) -> Path:
    """Where the flow of ``board``'s default preset is checked in: ``<board>/build.tcl``
    under :data:`FLOWS_DIR`."""
    return FLOWS_DIR / get_board(board).name / TCL_NAME


def regenerate(root: str | Path = FLOWS_DIR) -> list[Path]:
    """Write every board's flow for its default preset as ``root/<board>/build.tcl`` (the
    checked-in copies by default); the files written."""
    written = []
    for board in BOARDS.values():
        path = Path(root) / board.name / TCL_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(flow_tcl(board, board.preset).encode())
        written.append(path)
    return written


# ------------------------------------------------------------------------- steps
def _header(plan: FlowPlan, script: TclScript) -> None:
    """What the script is, the folders it uses, what Vivado must report, and the stop."""
    board, config = plan.board, plan.config
    script.emit(
        f"# Tessera board flow: config {config.name!r} on the {board.title} ({board.name}).",
        "# Written by tessera.bitstreams.flow; regenerate it rather than editing it.",
        "#",
        "# Run from this folder:  vivado -mode batch -source build.tcl",
        f"# It writes {OUT_DIR}/{BIT_NAME} and {OUT_DIR}/{HWH_NAME} (what pynq.Overlay loads), "
        f"the reports in {REPORTS_DIR}/,",
        "# and exits with code 1 when timing fails. TESSERA_VIVADO_JOBS sets the parallel "
        "jobs (default 4).",
        "",
        "set here [file dirname [file normalize [info script]]]",
        f"set name {plan.name}",
        f"set project_dir [file join $here {VIVADO_DIR}]",
        f"set ip_repo [file join $here {IP_REPO_DIR}]",
        f"set out_dir [file join $here {OUT_DIR}]",
        f"set reports_dir [file join $here {REPORTS_DIR}]",
        "set jobs [expr {[info exists ::env(TESSERA_VIVADO_JOBS)] ? "
        "$::env(TESSERA_VIVADO_JOBS) : 4}]",
        "file mkdir $out_dir $reports_dir",
        "",
        "# What Vivado must report for the design to match tessera.hwh and the driver "
        "(checked below).",
        "set tessera_expect [dict create \\",
        f"    CONFIG.{plan.vivado.pl0_actual} {plan.clock.mhz:.6f} \\",
        "]",
        "",
        "proc tessera_fail {message} {",
        '    puts stderr "ERROR: \\[tessera\\] $message"',
        "    exit 1",
        "}",
    )


def _project(plan: FlowPlan, script: TclScript) -> None:
    """The project for the board's part, with the board part (stops without its files)."""
    board = plan.board
    script.section("Project for the board's part; the board part gives the PS its DDR and MIO "
                   "preset.")
    script.emit(
        f"create_project -force $name $project_dir -part {board.part}",
        f"if {{[get_board_parts -quiet {board.board_part}] eq \"\"}} {{",
        f'    tessera_fail "the board files of {board.board_part} ({board.title}) are not '
        "installed: add them to Vivado's board repository (XHub stores, or the board "
        'vendor\'s files) and run again"',
        "}",
        f"set_property board_part {board.board_part} [current_project]",
        "set_property target_language Verilog [current_project]",
    )


def _build(plan: FlowPlan, script: TclScript) -> None:
    """Synthesis and implementation to the bitstream, the reports, and the timing verdict."""
    script.section("Synthesis and implementation up to the bitstream; reports; the timing "
                   "verdict.")
    script.emit(
        "set wrapper [make_wrapper -files [get_files $name.bd] -top]",
        "add_files -norecurse $wrapper",
        "set_property top ${name}_wrapper [current_fileset]",
        "update_compile_order -fileset sources_1",
        "generate_target all [get_files $name.bd]",
        "",
        "launch_runs synth_1 -jobs $jobs",
        "wait_on_run synth_1",
        'if {[get_property PROGRESS [get_runs synth_1]] ne "100%"} {',
        '    tessera_fail "synthesis failed: see [get_property DIRECTORY [get_runs synth_1]]'
        '/runme.log"',
        "}",
        "launch_runs impl_1 -to_step write_bitstream -jobs $jobs",
        "wait_on_run impl_1",
        'if {[get_property PROGRESS [get_runs impl_1]] ne "100%"} {',
        '    tessera_fail "implementation failed: see [get_property DIRECTORY '
        '[get_runs impl_1]]/runme.log"',
        "}",
        "open_run impl_1",
        "report_utilization -file [file join $reports_dir utilization.rpt]",
        "report_utilization -hierarchical -file [file join $reports_dir "
        "utilization_hierarchical.rpt]",
        "report_timing_summary -max_paths 10 -report_unconstrained "
        "-file [file join $reports_dir timing_summary.rpt]",
        "set wns [get_property STATS.WNS [get_runs impl_1]]",
        "set whs [get_property STATS.WHS [get_runs impl_1]]",
        "if {$wns < 0 || $whs < 0} {",
        f'    tessera_fail "timing failed at {plan.config.clock_mhz:g} MHz: WNS $wns ns '
        "(setup), WHS $whs ns (hold); see $reports_dir/timing_summary.rpt. Lower the "
        "config's clock_mhz or shrink the design; no bitstream was copied to $out_dir\"",
        "}",
    )


def _outputs(plan: FlowPlan, script: TclScript) -> None:
    """Copy the bitstream and its .hwh (checked to name our IP) into the output folder."""
    script.section("The bitstream and its .hwh side by side, as pynq.Overlay wants them.")
    script.emit(
        "set run_dir [get_property DIRECTORY [get_runs impl_1]]",
        "set bit [file join $run_dir ${name}_wrapper.bit]",
        "set hwh \"\"",
        "# Vivado 2020.2 and later generate into <project>.gen, earlier ones into "
        "<project>.srcs.",
        "foreach generated {gen srcs} {",
        "    set candidate [file join $project_dir $name.$generated sources_1 bd $name "
        "hw_handoff $name.hwh]",
        "    if {[file exists $candidate]} {set hwh $candidate; break}",
        "}",
        'if {$hwh eq ""} {tessera_fail "Vivado wrote no hardware handoff for $name.bd"}',
        "set handle [open $hwh]",
        "set handoff [read $handle]",
        "close $handle",
        f"if {{[string first {{VLNV=\"{IP_VLNV}\"}} $handoff] < 0}} {{",
        f'    tessera_fail "$hwh has no {IP_VLNV}: the driver would not find the '
        'accelerator"',
        "}",
        f"file copy -force $bit [file join $out_dir {BIT_NAME}]",
        f"file copy -force $hwh [file join $out_dir {HWH_NAME}]",
        f'puts "tessera: wrote [file join $out_dir {BIT_NAME}] and {HWH_NAME} '
        '(WNS $wns ns, WHS $whs ns)"',
    )


#: The flow's sections, in the order the module docstring lists them.
_STEPS = (_header, _project, package_ip, block_design, _build, _outputs)


# ------------------------------------------------------------------------ README
def _readme(board: Board, config: HwConfig) -> str:
    """The README.txt of a project folder: how to run it and what it writes."""
    clock, handoff = _readme_clock(FlowPlan.of(board, config))
    return "\n\n".join([
        f"Tessera board flow: config {config.name!r} on the {board.title} ({board.name}),\n"
        "written by tessera.bitstreams.flow.write_project.",
        f"Run it with Vivado 2020.2 or newer and the board files of\n{board.board_part} "
        "installed:",
        f"    cd <this folder>\n    vivado -mode batch -source {TCL_NAME}",
        _fill(f"TESSERA_VIVADO_JOBS sets the parallel jobs (default 4). The flow packages "
              f"{IP_MODULE}.v as the IP {IP_VLNV}, builds the block design ({board.ps.module}, "
              f"{clock}, registers at {board.registers.base:#010x}), synthesises, implements "
              "and writes:"),
        f"    {OUT_DIR}/{BIT_NAME}   the bitstream\n"
        f"    {OUT_DIR}/{HWH_NAME}   its hardware handoff, which pynq.Overlay reads\n"
        f"    {REPORTS_DIR}/          utilization.rpt, utilization_hierarchical.rpt, "
        "timing_summary.rpt",
        _fill("It exits with code 1 and says why when timing fails (no bitstream is copied "
              "then), when the board files are missing, or when Vivado's design differs from "
              f"what the runtime expects. {EXPECTED_HWH_NAME} is the handoff tessera.hwh writes "
              "for this design (what the simulated board loads); the one Vivado writes "
              f"describes {handoff}."),
        "On the board, copy out/ next to your program and open the device with",
        f'    tessera.runtime.open_device("pynq", config, bitstream="{OUT_DIR}/{BIT_NAME}")',
        _fill(f"Without Vivado, tessera.bitstreams.flow.dry_run(folder) runs {TCL_NAME} under "
              "tclsh against a recording stand-in of the Vivado commands."),
    ]) + "\n"


def _readme_clock(plan: FlowPlan) -> tuple[str, str]:
    """The README's words for the design's clock, and for what Vivado's .hwh describes."""
    config, pl0 = plan.config, mhz(plan.clock.mhz)
    if plan.wizard:
        return ((f"PL clock 0 at {pl0} MHz, the closest the PS makes, and a Clocking Wizard "
                 f"making the config's {config.clock_mhz:g} MHz from it"),
                (f"the same IP, addresses and clocks (our IP at the wizard's "
                 f"{config.clock_mhz:g} MHz, the PS's PL clock 0 at {pl0} MHz)"))
    return (f"PL clock 0 at {pl0} MHz for the config's {config.clock_mhz:g} MHz",
            "the same IP, addresses and clock")


def _fill(text: str) -> str:
    """A README paragraph wrapped at 79 columns."""
    return textwrap.fill(text, 79)


# -------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """``python -m tessera.bitstreams.flow --regenerate``: rewrite the checked-in flows."""
    parser = argparse.ArgumentParser(
        prog="python -m tessera.bitstreams.flow",
        description="The Vivado board flow of tessera hw bitstream.")
    parser.add_argument("--regenerate", action="store_true",
                        help=f"rewrite <board>/{TCL_NAME} of every board under {FLOWS_DIR} "
                             "for its default preset")
    args = parser.parse_args(argv)
    if not args.regenerate:
        parser.print_help()
        return 2
    for path in regenerate():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
