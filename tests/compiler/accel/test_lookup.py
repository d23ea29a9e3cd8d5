"""Table lookups on the accelerator: the LUT plug-in's ``Apply`` stage in epilogues,
tables loaded once per program and kept resident, bit-exact against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler import Apply, Clip, CompileError, Conv2d, Eltwise, requantize

from tests.compiler.helpers import PYNQ, TINY, compile_and_run
from tests.compiler.reference import conv, ort_requant

CONFIGS = pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])


def lut(table: np.ndarray) -> tuple:
    """The LUT plug-in's stages: clamp to the int8 index, then the table."""
    return (Clip(-128, 127), Apply("LUT", table=table,
                                   out_range=(int(table.min()), int(table.max()))))


def looked_up(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[byte of x]``, written out independently of the ALU semantics."""
    return np.asarray(table, dtype=np.int8)[np.asarray(x, dtype=np.int8).view(np.uint8)]


def tables(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-128, 128, 256).astype(np.int8) for _ in range(count)]


@CONFIGS
def test_lookup_of_every_int8_value(config):
    (table,) = tables(1, 1)
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 4, 8, 8)
    out, _, compiled = compile_and_run([Eltwise("act", "lut", "x", "y", epilogue=lut(table))],
                                       {"x": x}, config)
    np.testing.assert_array_equal(out["y"], looked_up(x, table))


@CONFIGS
def test_conv_epilogue_then_table_equals_the_two_steps(config):
    """``requantize -> clamp -> LUT`` in the conv's epilogue gives the table of the conv's
    int8 output."""
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (1, 5, 7, 6), dtype=np.int8)
    w = rng.integers(-128, 128, (9, 5, 3, 3), dtype=np.int8)
    (table,) = tables(3, 1)
    stages = requantize(0.004, zero_point=-5)
    op = Conv2d("conv", "x", "y", w, padding=1, epilogue=(*stages, *lut(table)))
    out, _, _ = compile_and_run([op], {"x": x}, config)
    expected = ort_requant(conv(x, w, pads=(1, 1, 1, 1)), 0.004, zp=-5)
    np.testing.assert_array_equal(out["y"], looked_up(expected, table))


def test_more_tables_than_slots_evict_round_robin():
    """Six activations in one program on a four-table memory: each operator's table is
    resident when it runs, the shared one loaded once while it stays."""
    ts = tables(4, 5)
    order = [0, 1, 0, 2, 3, 4, 1, 0]
    ops, env, names = [], {"x0": np.arange(-128, 128, dtype=np.int8).reshape(1, 16, 4, 4)}, "x0"
    for k, t in enumerate(order):
        ops.append(Eltwise(f"act{k}", "lut", names, f"x{k + 1}", epilogue=lut(ts[t])))
        names = f"x{k + 1}"
    out, _, compiled = compile_and_run(ops, env, PYNQ)
    expected = env["x0"]
    for t in order:
        expected = looked_up(expected, ts[t])
    np.testing.assert_array_equal(out[names], expected)
    loads = [i for i in compiled.program.instructions
             if getattr(i, "mem", None) is not None and i.mem.label == "tbl"]
    # Loads: 0, 1 (0 still resident), 2, 3, 4 into slot 0 (evicting 0), (1 resident), 0
    # again into slot 1.
    assert [load.sram_base for load in loads] == [0, 16, 32, 48, 0, 16]


def test_config_without_table_memory_refuses_a_lookup():
    (table,) = tables(5, 1)
    bare = TINY.replace(name="tiny-notable", table_entries=0)
    with pytest.raises(CompileError, match="table memory of 0 entries"):
        compile_and_run([Eltwise("act", "lut", "x", "y", epilogue=lut(table))],
                        {"x": np.zeros((1, 4, 2, 2), np.int8)}, bare)


@CONFIGS
def test_sum_of_shifted_relus_in_a_conv_epilogue(config):
    """The ReLU-sum approximation's row passes (scratch groups S and T beside the tile)
    give exactly what :meth:`ReluSum.evaluate` says, fused after a conv or on its own."""
    from tessera.compiler.accel.relu_sum import fit_relu_sum

    byte_values = np.arange(256, dtype=np.uint8).view(np.int8)
    table = np.round(127 * np.tanh(byte_values / 40.0)).astype(np.int8)
    rs = fit_relu_sum(table, pieces=6)
    rng = np.random.default_rng(6)
    x = rng.integers(-128, 128, (1, 5, 7, 6), dtype=np.int8)
    w = rng.integers(-128, 128, (9, 5, 3, 3), dtype=np.int8)
    stages = requantize(0.004, zero_point=-5)
    approx = (Clip(-128, 127), rs, Clip(-128, 127))
    ops = [Conv2d("conv", "x", "y", w, padding=1, epilogue=(*stages, *approx)),
           Eltwise("act", "max", "x", "z", epilogue=approx)]
    out, _, _ = compile_and_run(ops, {"x": x}, config)
    conv_out = ort_requant(conv(x, w, pads=(1, 1, 1, 1)), 0.004, zp=-5)
    np.testing.assert_array_equal(out["y"], rs.evaluate(conv_out))
    np.testing.assert_array_equal(out["z"], rs.evaluate(x))
