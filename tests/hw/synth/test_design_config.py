"""Configs that differ only in the fields the RTL does not read have the same Verilog but
for the CONFIG_ID constant, so one synthesis serves them all (a sweep over the clock)."""
from __future__ import annotations

import pytest

pytest.importorskip("amaranth")

from tessera.config import PRESETS  # noqa: E402
from tessera.hw.synth import export  # noqa: E402
from tessera.regmap import config_id  # noqa: E402


def test_non_design_fields_change_only_the_config_id():
    a = PRESETS["tiny"]
    b = a.replace(name="other", part="xc7z010clg400-1", clock_mhz=250.0, dram_latency=7,
                  ddr_bytes_per_cycle=3.0)
    assert set(export.NON_DESIGN_FIELDS) == {f for f in a.to_dict()
                                             if getattr(a, f) != getattr(b, f)}
    va, vb = export.verilog(a), export.verilog(b)
    assert va != vb
    assert va.replace(f"32'd{config_id(a)};", f"32'd{config_id(b)};") == vb
    assert export.design_config(a) == export.design_config(b)
