"""The design space: points as the product of the axes, legality by the config's and the
board's own checks, the CLI's --vary parsing, names shared by equal designs."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.config import PRESETS
from tessera.dse.space import Axis, Space, design_name, parse_axis
from tessera.errors import CLI, DseError


def test_points_are_the_product_of_the_axes_with_illegal_ones_explained():
    space = Space.of("pynq", {"block_in,block_out": [8, 16], "wgt_depth": [3, 512]}, "xc7z020")
    points = space.points()
    assert space.part == "xc7z020clg400-1"          # the PYNQ boards' part, in full
    assert [p.label for p in points] == [
        "block_in,block_out=8 wgt_depth=3", "block_in,block_out=8 wgt_depth=512",
        "block_in,block_out=16 wgt_depth=3", "block_in,block_out=16 wgt_depth=512"]
    legal = [p for p in points if p.legal]
    assert [(p.config.block_in, p.config.block_out, p.config.wgt_depth) for p in legal] == [
        (8, 8, 512), (16, 16, 512)]
    for p in points:
        if not p.legal:
            assert p.error == "wgt_depth must be a power of two >= 1, not 3"
    assert all(p.config.part == "xc7z020clg400-1" for p in legal)


def test_the_output_buffer_follows_the_accumulator_unless_varied_itself():
    (point,) = Space.of("tiny", {"acc_depth": [64]}).points()
    assert point.config.acc_depth == point.config.out_depth == 64
    points = Space.of("tiny", {"acc_depth": [64], "out_depth": [64, 128]}).points()
    assert [p.legal for p in points] == [True, False]
    assert "out_depth must equal acc_depth" in points[1].error


def test_the_board_of_the_part_refuses_a_config_its_ps_cannot_carry():
    # PYNQ's PS7 has 4 HP slave ports; a fifth DRAM port has nowhere to go
    ports = PRESETS["pynq"].dram_ports
    (point,) = Space.of("pynq", {"dram_ports": [ports + 1]}).points()
    assert point.legal          # the extra port unused: the board takes it
    base = PRESETS["pynq"].replace(dram_ports=ports + 1, module_ports=(0, 1, 2, ports))
    moved = Space.of(base, {"clock_mhz": [100.0]}).points()[0]
    assert not moved.legal and f"board pynq-z1 has {ports} slave ports" in moved.error


def test_equal_designs_share_a_name_whatever_the_sweep():
    a = Space.of("pynq", {"wgt_depth": [512]}).points()[0].config
    b = Space.of("pynq", {"wgt_depth": [256, 512]}).points()[1].config
    c = Space.of("pynq", {"wgt_depth": [512], "clock_mhz": [120.0]}).points()[0].config
    assert a.name == b.name == design_name(a) and a.name.startswith("dse-")
    assert c.name != a.name


@pytest.mark.parametrize("axes, words", [
    ({"bogus": [1]}, "'bogus' is not a field"),
    ({"name": ["x"]}, "'name' is fixed by the sweep"),
    ({"block_in": [8], "block_in,block_out": [8]}, "'block_in' is on two axes"),
    ({"wgt_depth": []}, "has no values"),
])
def test_bad_axes_are_refused_with_the_cli_advice(axes, words):
    with pytest.raises(DseError) as info:
        Space.of("tiny", axes)
    assert words in str(info.value) and "--vary" in info.value.describe(CLI)


def test_vary_parses_each_value_as_its_field_type():
    base = PRESETS["pynq"]
    assert parse_axis("block_in,block_out=8,16", base) == Axis(("block_in", "block_out"), (8, 16))
    assert parse_axis("clock_mhz=100,142.5", base) == Axis(("clock_mhz",), (100.0, 142.5))
    for text, words in [("wgt_depth", "is not FIELD=V1,V2"), ("wgt_depth=8.5", "not a int"),
                        ("part=xc7z010", "not one of the numeric"), ("=1", "is not FIELD")]:
        with pytest.raises(DseError, match=words):
            parse_axis(text, base)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.sampled_from([1, 3, 8, 16, 64, 512]), min_size=1, max_size=3,
                         unique=True), min_size=1, max_size=3))
def test_every_combination_is_a_point_and_a_legal_one_carries_its_values(value_lists):
    fields = ["inp_depth", "wgt_depth", "uop_depth"][:len(value_lists)]
    space = Space.of("tiny", dict(zip(fields, value_lists)))
    points = space.points()
    assert len(points) == math.prod(len(v) for v in value_lists)
    for p in points:
        values = dict(p.values)
        assert p.legal == all(v & (v - 1) == 0 for v in values.values())
        if p.legal:
            assert all(getattr(p.config, f) == v for f, v in values.items())


def test_a_core_with_more_multipliers_than_the_part_has_dsps_is_refused_unsynthesized():
    pytest.importorskip("amaranth")
    from tessera.dse.space import refuse_without_dsps
    from tessera.hw.tensor import gemm_multipliers
    assert gemm_multipliers(PRESETS["pynq"]) == 128          # 256 int8 MACs, two per DSP
    assert gemm_multipliers(PRESETS["pynq"].replace(inp_width=16, wgt_width=16)) == 256
    space = Space.of("pynq", {"block_in": [16, 32]}, "xc7z020")
    kept, refused = [refuse_without_dsps(p, space.part) for p in space.points()]
    assert kept.legal and not refused.legal
    assert refused.error == ("its GEMM core needs 256 DSP48s (a multiplier each), more than "
                             "the 220 of xc7z020clg400-1")
