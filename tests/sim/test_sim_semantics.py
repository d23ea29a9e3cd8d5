"""Data semantics of the simulator, checked against numpy computations written here.

Every expected value below is computed in this file with plain numpy (or
Python ints), never with the simulator's or the intrinsic registry's own
helpers: loads and stores as explicit index arithmetic, GEMM and ALU
instructions as the documented sequential loop nest.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from numpy.testing import assert_array_equal

from tessera import timing
from tessera.config import PRESETS
from tessera.errors import EncodingError, HazardError
from tessera.isa import Alu, Finish, Gemm, Load, MemType, Program, Store, Uop, clip_imm, get_isa
from tessera.isa import requant

from tests import programs
from tests.programs import (I32_MAX, I32_MIN, acc_entries, load, out_bytes, read_out, run,
                            run_on_acc, sat8, single_shot, store, wrap32)

TINY = PRESETS["tiny"]
PYNQ = PRESETS["pynq"]
TINY_B2 = PRESETS["tiny"].replace(batch=2, name="tiny-b2")
CONFIGS = [TINY, PYNQ, TINY_B2]


@pytest.fixture(scope="module", params=programs.BACKENDS, autouse=True)
def backend(request):
    """Every test runs once per Device API backend (sim, rtl, pynq on the simulated board),
    each checked against the simulator."""
    programs.use_backend(request.param)
    yield request.param
    programs.use_backend("sim")
CFG_IDS = [c.name for c in CONFIGS]

#: The built-in ALU opcodes (the ISA's documented numbering).
OP = {"MIN": 0, "MAX": 1, "ADD": 2, "SUB": 3, "SHR": 4, "MUL": 5, "CLIP": 6, "REQUANT": 7,
      "MOV": 8}

FEW = settings(max_examples=30, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by ``key`` (stable across runs, unlike ``hash``)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def inp_entries(cfg, rng, n):
    return rng.integers(-128, 128, (n, cfg.batch, cfg.block_in)).astype(np.int8)


def wgt_entries(cfg, rng, n):
    return rng.integers(-128, 128, (n, cfg.block_out, cfg.block_in)).astype(np.int8)


def acc_values(cfg, rng, n, lo=I32_MIN, hi=I32_MAX):
    return rng.integers(lo, hi, (n, cfg.batch, cfg.block_out), endpoint=True).astype(np.int64)


def mixed_acc(cfg, rng, n):
    """int32 values of every magnitude, with the extremes and int8 edges sprinkled in."""
    vals = acc_values(cfg, rng, n)
    small = acc_values(cfg, rng, n, -300, 300)
    mid = acc_values(cfg, rng, n, -(1 << 20), 1 << 20)
    pick = rng.integers(0, 3, vals.shape)
    vals = np.where(pick == 0, vals, np.where(pick == 1, small, mid))
    flat = vals.reshape(-1)
    specials = [I32_MIN, I32_MAX, 0, -1, 1, 127, 128, -128, -129, 1 << 24, (1 << 24) + 1]
    flat[:min(len(specials), flat.size)] = specials[:flat.size]
    return vals


# =============================================================== 1. padded loads
#: Pad values: a zero point after a ReLU (-128), the int8 edges and 0.
PAD_VALUES = [0, -128, -1, 127]


def check_padded_inp_load(cfg, y_size, x_size, pads, sram_base=3, seed=0, pad_value=0):
    """LOAD inp with padding over a background of nonzero entries; check the whole buffer."""
    yp0, yp1, xp0, xp1 = pads
    rng = rng_for(cfg.name, y_size, x_size, pads, sram_base, seed, pad_value)
    src = inp_entries(cfg, rng, y_size * x_size).reshape(y_size, x_size, cfg.batch, cfg.block_in)
    rows, cols = yp0 + y_size + yp1, xp0 + x_size + xp1
    n_bg = sram_base + rows * cols + 3
    assert n_bg <= cfg.inp_depth
    bg = rng.integers(1, 128, (n_bg, cfg.batch, cfg.block_in)).astype(np.int8)  # nonzero
    prog = single_shot(cfg, segments={"bg": bg, "src": src}, loads=[
        load("bg", MemType.INP, x_size=n_bg),
        load("src", MemType.INP, sram_base=sram_base, y_size=y_size, x_size=x_size,
             y_pad_0=yp0, y_pad_1=yp1, x_pad_0=xp0, x_pad_1=xp1, pad_value=pad_value)])
    inp = run(prog).datapath.inp
    padded = np.full((rows, cols, cfg.batch, cfg.block_in), pad_value, dtype=np.int8)
    padded[yp0:yp0 + y_size, xp0:xp0 + x_size] = src
    expected = bg.copy()
    expected[sram_base:sram_base + rows * cols] = padded.reshape(rows * cols, cfg.batch, cfg.block_in)
    assert_array_equal(inp[:n_bg], expected)
    assert not inp[n_bg:].any()


@pytest.mark.parametrize("pads", [(2, 0, 0, 0), (0, 3, 0, 0), (0, 0, 1, 0), (0, 0, 0, 2),
                                  (1, 2, 3, 1)],
                         ids=["y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1", "all"])
@pytest.mark.parametrize("pad_value", PAD_VALUES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_padded_load_each_pad(cfg, pads, pad_value):
    check_padded_inp_load(cfg, 3, 2, pads, pad_value=pad_value)


@pytest.mark.parametrize("pad_value", PAD_VALUES)
def test_padded_load_max_pad(pad_value):
    check_padded_inp_load(TINY, 1, 1, (15, 0, 0, 0), sram_base=0, pad_value=pad_value)
    check_padded_inp_load(TINY, 2, 1, (0, 0, 0, 15), sram_base=1, pad_value=pad_value)


@FEW
@given(y_size=st.integers(1, 4), x_size=st.integers(1, 4),
       pads=st.tuples(*[st.integers(0, 3)] * 4), sram_base=st.integers(0, 10),
       pad_value=st.one_of(st.sampled_from(PAD_VALUES), st.integers(-128, 127)))
def test_padded_load_hypothesis(y_size, x_size, pads, sram_base, pad_value):
    check_padded_inp_load(TINY, y_size, x_size, pads, sram_base, pad_value=pad_value)


@pytest.mark.parametrize("pad_value", [0, -1, -128, 127])
def test_padded_acc_load_fills_acc_and_out(pad_value):
    """Pads of an acc load write pad_value, sign-extended to int32, into acc and the
    mirrored (saturated) out entries."""
    cfg = TINY
    rng = rng_for("pad-acc")
    bg = acc_values(cfg, rng, 12, 1, 1000)
    src = acc_values(cfg, rng, 2, -5000, 5000)
    prog = single_shot(cfg, segments={"bg": bg.astype(np.int32), "src": src.astype(np.int32),
                                      "out": out_bytes(cfg, 12)},
                       loads=[load("bg", MemType.ACC, x_size=12),
                              load("src", MemType.ACC, sram_base=2, y_size=2, x_size=1,
                                   y_pad_0=1, x_pad_1=1, pad_value=pad_value)],
                       stores=[store("out", x_size=12)])
    res = run(prog)
    expected = bg.copy()
    # block rows: [pad pad] [src0 pad] [src1 pad] -> entries 2..7
    expected[2:8] = pad_value
    expected[4] = src[0]
    expected[6] = src[1]
    assert_array_equal(res.datapath.acc[:12], expected)
    assert_array_equal(read_out(res, "out", cfg, 12), sat8(expected))


# ===================================================== 2. strided loads and stores
def check_strided_load(cfg, mem, y_size, x_size, extra, offset, sram_base):
    stride = x_size + extra
    rng = rng_for("strided", cfg.name, int(mem), y_size, x_size, extra, offset)
    n_src = offset + (y_size - 1) * stride + x_size + 2
    if mem == MemType.INP:
        src = inp_entries(cfg, rng, n_src)
        buf = "inp"
    elif mem == MemType.WGT:
        src = wgt_entries(cfg, rng, n_src)
        buf = "wgt"
    else:
        src = acc_values(cfg, rng, n_src).astype(np.int32)
        buf = "acc"
    prog = single_shot(cfg, segments={"src": src}, loads=[
        load("src", mem, offset=offset, sram_base=sram_base, y_size=y_size, x_size=x_size,
             x_stride=stride)])
    got = getattr(run(prog).datapath, buf)
    expected = np.zeros_like(got)
    for y in range(y_size):
        for x in range(x_size):
            expected[sram_base + y * x_size + x] = src[offset + y * stride + x]
    assert_array_equal(got, expected)


@pytest.mark.parametrize("mem", [MemType.INP, MemType.WGT, MemType.ACC], ids=lambda m: m.label)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_strided_load(cfg, mem):
    check_strided_load(cfg, mem, y_size=3, x_size=2, extra=3, offset=1, sram_base=5)


@FEW
@given(y_size=st.integers(1, 5), x_size=st.integers(1, 4), extra=st.integers(0, 4),
       offset=st.integers(0, 5), sram_base=st.integers(0, 20))
def test_strided_load_hypothesis(y_size, x_size, extra, offset, sram_base):
    check_strided_load(TINY, MemType.INP, y_size, x_size, extra, offset, sram_base)


def check_strided_store(cfg, y_size, x_size, extra, offset, sram_base):
    stride = x_size + extra
    rng = rng_for("store", cfg.name, y_size, x_size, extra, offset, sram_base)
    n_acc = sram_base + y_size * x_size
    acc = mixed_acc(cfg, rng, n_acc)
    eb = get_isa(cfg).elem_bytes(MemType.OUT)
    n_dst = offset + (y_size - 1) * stride + x_size + 2
    sentinel = rng.integers(0, 256, n_dst * eb).astype(np.uint8)
    prog = single_shot(cfg, segments={"acc": acc.astype(np.int32), "dst": sentinel},
                       loads=[load("acc", MemType.ACC, x_size=n_acc)],
                       stores=[store("dst", offset=offset, sram_base=sram_base, y_size=y_size,
                                     x_size=x_size, x_stride=stride)])
    got = run(prog).read("dst", np.uint8)
    expected = sentinel.copy()
    for y in range(y_size):
        for x in range(x_size):
            entry = sat8(acc[sram_base + y * x_size + x]).astype(np.int8)
            e = offset + y * stride + x
            expected[e * eb:(e + 1) * eb] = entry.reshape(-1).view(np.uint8)
    assert_array_equal(got, expected)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_strided_store(cfg):
    check_strided_store(cfg, y_size=3, x_size=2, extra=2, offset=1, sram_base=4)


@FEW
@given(y_size=st.integers(1, 5), x_size=st.integers(1, 4), extra=st.integers(0, 4),
       offset=st.integers(0, 5), sram_base=st.integers(0, 20))
def test_strided_store_hypothesis(y_size, x_size, extra, offset, sram_base):
    check_strided_store(TINY, y_size, x_size, extra, offset, sram_base)


# ================================================== 3. accumulator round trips
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_acc_load_store_saturates(cfg):
    rng = rng_for("acc-rt", cfg.name)
    n = 10
    acc = mixed_acc(cfg, rng, n)
    res, final, out = run_on_acc(cfg, acc, [])
    assert_array_equal(final, acc)                       # exact int32 in acc
    expected = np.clip(acc, -128, 127)
    assert_array_equal(out, expected)
    assert_array_equal(res.datapath.out[:n], expected)   # out mirrors acc, saturated
    # both saturation sides really occur
    assert (acc > 127).any() and (acc < -128).any()
    assert (out == 127).any() and (out == -128).any()
    assert not res.datapath.out[n:].any()


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_acc8_load_sign_extends(cfg):
    rng = rng_for("acc8", cfg.name)
    n = 6
    data = rng.integers(-128, 128, (n, cfg.batch, cfg.block_out)).astype(np.int8)
    data.reshape(-1)[:4] = [-128, -1, 127, 0]
    prog = single_shot(cfg, segments={"d": data, "out": out_bytes(cfg, n + 2)},
                       loads=[load("d", MemType.ACC8, sram_base=2, x_size=n)],
                       stores=[store("out", x_size=n + 2)])
    res = run(prog)
    acc = res.datapath.acc
    assert acc.dtype == np.int32
    expected = np.zeros((n + 2, cfg.batch, cfg.block_out), dtype=np.int64)
    expected[2:] = [[[int(v) for v in lane] for lane in entry] for entry in data]  # Python ints
    assert_array_equal(acc[:n + 2], expected)
    assert int(acc[2].reshape(-1)[0]) == -128 and int(acc[2].reshape(-1)[1]) == -1
    assert_array_equal(read_out(res, "out", cfg, n + 2), expected)


def test_acc_load_overwrites_out():
    """A later acc/acc8 LOAD replaces out entries a GEMM wrote earlier."""
    cfg = TINY
    rng = rng_for("acc-over")
    a = inp_entries(cfg, rng, 1)
    w = np.full((1, cfg.block_out, cfg.block_in), 100, np.int8)
    a[:] = 100   # GEMM result 4 * 100 * 100 = 40000 saturates out to 127
    big = acc_values(cfg, rng, 3, -100000, 100000)
    small = rng.integers(-128, 128, (2, cfg.batch, cfg.block_out)).astype(np.int8)
    prog = single_shot(
        cfg, uops=[Uop(0, 0, 0)],
        segments={"a": a, "w": w, "big": big.astype(np.int32), "small": small,
                  "out": out_bytes(cfg, 8)},
        loads=[load("a", MemType.INP, x_size=1), load("w", MemType.WGT, x_size=1)],
        compute=[Gemm(reset=True, iter_out=8, dst_factor_out=1),
                 Gemm(iter_out=8, dst_factor_out=1),                 # rows 0..7 = 40000
                 load("big", MemType.ACC, sram_base=1, x_size=3),    # then overwrite some
                 load("small", MemType.ACC8, sram_base=5, x_size=2)],
        stores=[store("out", x_size=8)])
    res = run(prog)
    expected = np.full((8, cfg.batch, cfg.block_out), 40000, np.int64)
    expected[1:4] = big
    expected[5:7] = small
    assert_array_equal(res.datapath.acc[:8], expected)
    assert_array_equal(res.datapath.out[:8], sat8(expected))
    assert_array_equal(read_out(res, "out", cfg, 8), sat8(expected))


# ========================================================================= 4. GEMM
def gemm_reference(acc, inp, wgt, uops, iter_out, iter_in, f):
    """The documented GEMM loop nest, sequentially, in int64, wrapped at the end."""
    acc = acc.astype(np.int64).copy()
    for o in range(iter_out):
        for i in range(iter_in):
            for u in uops:
                d = u.dst + o * f["dst_factor_out"] + i * f["dst_factor_in"]
                s = u.src + o * f["src_factor_out"] + i * f["src_factor_in"]
                w = u.wgt + o * f["wgt_factor_out"] + i * f["wgt_factor_in"]
                acc[d] += inp[s].astype(np.int64) @ wgt[w].astype(np.int64).T
    return wrap32(acc)


def dst_sequence(uops, iter_out, iter_in, dfo, dfi):
    return [u.dst + o * dfo + i * dfi for o in range(iter_out) for i in range(iter_in)
            for u in uops]


def has_hazard(dsts, distance):
    last = {}
    for j, d in enumerate(dsts):
        if d in last and j - last[d] < distance:
            return True
        last[d] = j
    return False


GEMM_DISTANCE = 3  # docs/timing.md: GEMM latency 3, one op per cycle


def run_gemm_case(cfg, uops, iter_out, iter_in, factors, seed, n_inp=40, n_wgt=40, n_acc=48):
    rng = rng_for("gemm", cfg.name, seed)
    inp = inp_entries(cfg, rng, n_inp)
    wgt = wgt_entries(cfg, rng, n_wgt)
    acc0 = acc_values(cfg, rng, n_acc, -100000, 100000)
    insn = Gemm(uop_begin=0, uop_end=len(uops), iter_out=iter_out, iter_in=iter_in, **factors)
    prog = single_shot(cfg, uops=uops,
                       segments={"inp": inp, "wgt": wgt, "acc": acc0.astype(np.int32),
                                 "out": out_bytes(cfg, n_acc)},
                       loads=[load("inp", MemType.INP, x_size=n_inp),
                              load("wgt", MemType.WGT, x_size=n_wgt),
                              load("acc", MemType.ACC, x_size=n_acc)],
                       compute=[insn], stores=[store("out", x_size=n_acc)])
    dsts = dst_sequence(uops, iter_out, iter_in, factors["dst_factor_out"],
                        factors["dst_factor_in"])
    if has_hazard(dsts, GEMM_DISTANCE):
        with pytest.raises(HazardError):
            run(prog)
        return False
    res = run(prog)
    expected = gemm_reference(acc0, inp, wgt, uops, iter_out, iter_in, factors)
    assert_array_equal(res.datapath.acc[:n_acc], expected)
    assert not res.datapath.acc[n_acc:].any()
    assert_array_equal(read_out(res, "out", cfg, n_acc), sat8(expected))
    return True


_factor = st.integers(0, 7)


@settings(FEW, max_examples=50)
@given(uops=st.lists(st.builds(Uop, st.integers(0, 7), st.integers(0, 7), st.integers(0, 7)),
                     min_size=1, max_size=3, unique_by=lambda u: u.dst),
       iter_out=st.integers(1, 3), iter_in=st.integers(1, 3),
       factors=st.fixed_dictionaries({k: _factor for k in (
           "dst_factor_out", "dst_factor_in", "src_factor_out", "src_factor_in",
           "wgt_factor_out", "wgt_factor_in")}),
       seed=st.integers(0, 3))
def test_gemm_loop_nest_hypothesis(uops, iter_out, iter_in, factors, seed):
    """Random nests; those that repeat a dst row too soon must raise HazardError instead."""
    run_gemm_case(TINY, uops, iter_out, iter_in, factors, seed)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gemm_loop_nest_all_factors(cfg):
    """Three uops, both loops, every factor nonzero, no dst repeated too soon."""
    uops = [Uop(dst=0, src=1, wgt=2), Uop(dst=1, src=0, wgt=0), Uop(dst=2, src=3, wgt=1)]
    factors = dict(dst_factor_out=7, dst_factor_in=3, src_factor_out=5, src_factor_in=2,
                   wgt_factor_out=4, wgt_factor_in=1)
    assert run_gemm_case(cfg, uops, iter_out=3, iter_in=2, factors=factors, seed=1)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gemm_reduction_over_k(cfg):
    """dst factor 0 on the outer loop accumulates a K reduction into the same rows."""
    uops = [Uop(dst=d, src=0, wgt=d) for d in range(3)]
    factors = dict(dst_factor_out=0, dst_factor_in=3, src_factor_out=1, src_factor_in=5,
                   wgt_factor_out=3, wgt_factor_in=0)
    assert run_gemm_case(cfg, uops, iter_out=4, iter_in=2, factors=factors, seed=2)


def test_gemm_hazard_at_distance_two_raises():
    uops = [Uop(dst=0), Uop(dst=1)]
    factors = dict(dst_factor_out=0, dst_factor_in=0, src_factor_out=1, src_factor_in=0,
                   wgt_factor_out=0, wgt_factor_in=0)
    assert not run_gemm_case(TINY, uops, iter_out=2, iter_in=1, factors=factors, seed=0)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gemm_reset(cfg):
    rng = rng_for("reset", cfg.name)
    n = 16
    acc0 = acc_values(cfg, rng, n, -10**6, 10**6)
    acc0[acc0 == 0] = 7
    uops = [Uop(dst=1), Uop(dst=2)]
    # rows 1, 2, 6, 7, 11, 12 reset by the nest (o: +5)
    insn = Gemm(reset=True, uop_begin=0, uop_end=2, iter_out=3, dst_factor_out=5,
                src_factor_out=9, wgt_factor_out=9)   # src/wgt factors are ignored by reset
    res, final, out = run_on_acc(cfg, acc0, [insn], uops=uops)
    expected = acc0.copy()
    expected[[1, 2, 6, 7, 11, 12]] = 0
    assert_array_equal(final, expected)
    assert_array_equal(out, sat8(expected))


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gemm_accumulates_across_instructions(cfg):
    rng = rng_for("two-gemms", cfg.name)
    inp, wgt = inp_entries(cfg, rng, 4), wgt_entries(cfg, rng, 4)
    uops = [Uop(dst=r, src=r, wgt=r) for r in range(3)] \
        + [Uop(dst=r, src=r + 1, wgt=r + 1) for r in range(3)]
    g1 = Gemm(uop_begin=0, uop_end=3)
    g2 = Gemm(uop_begin=3, uop_end=6)   # same rows, src + 1, wgt + 1
    prog = single_shot(cfg, uops=uops,
                       segments={"inp": inp, "wgt": wgt, "out": out_bytes(cfg, 3)},
                       loads=[load("inp", MemType.INP, x_size=4),
                              load("wgt", MemType.WGT, x_size=4)],
                       compute=[Gemm(reset=True, uop_begin=0, uop_end=3), g1, g2],
                       stores=[store("out", x_size=3)])
    res = run(prog)
    i64, w64 = inp.astype(np.int64), wgt.astype(np.int64)
    expected = np.stack([i64[r] @ w64[r].T + i64[r + 1] @ w64[r + 1].T for r in range(3)])
    assert_array_equal(res.datapath.acc[:3], expected)
    assert_array_equal(read_out(res, "out", cfg, 3), sat8(expected))


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gemm_int32_wraparound(cfg):
    k = cfg.block_in
    acc0 = np.zeros((3, cfg.batch, cfg.block_out), np.int64)
    acc0[0] = I32_MAX - 100
    acc0[1] = I32_MIN + 50
    acc0[2] = I32_MAX - 10 * k * 127 * 127   # does not overflow
    inp = np.full((1, cfg.batch, cfg.block_in), 127, np.int8)
    wgt = np.stack([np.full((cfg.block_out, cfg.block_in), 127, np.int8),
                    np.full((cfg.block_out, cfg.block_in), -128, np.int8)])
    uops = [Uop(dst=0, src=0, wgt=0), Uop(dst=1, src=0, wgt=1), Uop(dst=2, src=0, wgt=0)]
    prog = single_shot(cfg, uops=uops,
                       segments={"inp": inp, "wgt": wgt, "acc": acc0.astype(np.int32),
                                 "out": out_bytes(cfg, 3)},
                       loads=[load("inp", MemType.INP, x_size=1),
                              load("wgt", MemType.WGT, x_size=2),
                              load("acc", MemType.ACC, x_size=3)],
                       compute=[Gemm(uop_begin=0, uop_end=3, iter_out=2)],  # each row twice
                       stores=[store("out", x_size=3)])
    res = run(prog)
    up, down = 2 * k * 127 * 127, 2 * k * 127 * -128
    expected = np.array([I32_MAX - 100 + up - 2**32, I32_MIN + 50 + down + 2**32,
                         I32_MAX - 10 * k * 127 * 127 + up])
    assert expected[0] < 0 < expected[1]              # really wrapped, both ways
    got = res.datapath.acc[:3].astype(np.int64)
    assert_array_equal(got, np.broadcast_to(expected[:, None, None], got.shape))
    assert_array_equal(read_out(res, "out", cfg, 3), sat8(got))
    assert (read_out(res, "out", cfg, 3)[0] == -128).all()


# ================================================================= 5. ALU ops
def shr_ref(a, b):
    """Arithmetic shift right by b; a negative b shifts left (wrapping to 32 bits)."""
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    out = np.empty(a.shape, np.int64)
    for idx in np.ndindex(a.shape):
        x, s = int(a[idx]), int(b[idx])
        out[idx] = x >> s if s >= 0 else wrap32(x << min(-s, 64))
    return out


def clip_lanes(lo, hi):
    """The CLIP operand lane: lo in bits 0..15, hi in bits 16..31 (as an int32 value)."""
    word = (np.asarray(lo, np.int64) & 0xFFFF) | ((np.asarray(hi, np.int64) & 0xFFFF) << 16)
    return np.where(word >= 2**31, word - 2**32, word)


def requant_ref(a, scale):
    """onnxruntime-style float32 scale and round-half-even, saturated to int32."""
    y = np.asarray(a).astype(np.float32) * np.asarray(scale, dtype=np.float32)
    assert y.dtype == np.float32
    return np.clip(np.rint(y).astype(np.float64), I32_MIN, I32_MAX).astype(np.int64)


REF = {
    "MIN": np.minimum,
    "MAX": np.maximum,
    "ADD": lambda a, b: wrap32(a + b),
    "SUB": lambda a, b: wrap32(a - b),
    "MUL": lambda a, b: wrap32(a * b),
    "SHR": shr_ref,
}


def tensor_operand(name, cfg, rng, n):
    shape = (n, cfg.batch, cfg.block_out)
    if name == "SHR":
        b = rng.integers(-40, 41, shape)
        flat = b.reshape(-1)
        flat[:6] = [0, 31, 32, -32, I32_MIN, I32_MAX]
        return b
    if name == "MUL":
        b = mixed_acc(cfg, rng, n)
        b.reshape(-1)[-1] = -1
        return b
    return mixed_acc(cfg, rng, n)


def run_alu_tensor(cfg, opcode, a, b):
    """acc rows 0..n-1 = op(a, b) with b in rows n..2n-1; returns (acc rows 0..2n-1, out)."""
    n = a.shape[0]
    insn = Alu(alu_op=opcode, uop_begin=0, uop_end=1, iter_out=n, dst_factor_out=1,
               src_factor_out=1)
    _, final, out = run_on_acc(cfg, np.concatenate([a, b]), [insn], uops=[Uop(dst=0, src=n)])
    return final, out


@pytest.mark.parametrize("name", sorted(REF))
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_tensor(cfg, name):
    rng = rng_for("alu-t", cfg.name, name)
    n = 6
    a = mixed_acc(cfg, rng, n)
    b = tensor_operand(name, cfg, rng, n)
    final, out = run_alu_tensor(cfg, OP[name], a, b)
    expected = REF[name](a, b)
    assert_array_equal(final[:n], expected)
    assert_array_equal(final[n:], b)                 # operand rows untouched
    assert_array_equal(out, sat8(final))


IMMS_32 = {
    "MIN": [0, -5, 12345, I32_MIN, I32_MAX],
    "MAX": [0, -5, 12345, I32_MIN, I32_MAX],
    "ADD": [1, -1, I32_MAX, I32_MIN],
    "SUB": [1, -7, I32_MIN, I32_MAX],
    "MUL": [3, -3, 65537, I32_MIN, 0],
    "SHR": [0, 1, 7, 31, 32, 40, 1000, I32_MAX, -1, -8, -31, -32, -40, I32_MIN],
}
IMMS_16 = {
    "MIN": [0, -5, 12345, -32768, 32767],
    "MAX": [0, -5, 12345, -32768, 32767],
    "ADD": [1, -1, 32767, -32768],
    "SUB": [1, -7, -32768, 32767],
    "MUL": [3, -3, 32767, -32768],
    "SHR": [0, 1, 7, 31, 32, 40, 32767, -1, -8, -31, -32, -33, -32768],
}


@pytest.mark.parametrize("name", sorted(REF))
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_immediate(cfg, name):
    imm_bits = get_isa(cfg).imm_bits
    imms = IMMS_32[name] if imm_bits == 32 else IMMS_16[name]
    rng = rng_for("alu-i", cfg.name, name)
    n = 5
    a = mixed_acc(cfg, rng, n)
    # one ALU instruction per immediate, each on its own copy of a (rows k*n..k*n+n-1)
    acc0 = np.concatenate([a] * len(imms))
    uops = [Uop(dst=k * n) for k in range(len(imms))]
    compute = [Alu(alu_op=OP[name], use_imm=True, imm=imm, uop_begin=k, uop_end=k + 1,
                   iter_out=n, dst_factor_out=1)
               for k, imm in enumerate(imms)]
    _, final, out = run_on_acc(cfg, acc0, compute, uops=uops)
    for k, imm in enumerate(imms):
        expected = REF[name](a, np.full(a.shape, imm, np.int64))
        assert_array_equal(final[k * n:(k + 1) * n], expected, err_msg=f"{name} imm={imm}")
    assert_array_equal(out, sat8(final))


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_clip_tensor(cfg):
    rng = rng_for("clip-t", cfg.name)
    n = 5
    a = mixed_acc(cfg, rng, n)
    lo = rng.integers(-32768, 0, (n, cfg.batch, cfg.block_out))
    hi = rng.integers(0, 32768, (n, cfg.batch, cfg.block_out))
    flat_lo, flat_hi = lo.reshape(-1), hi.reshape(-1)
    flat_lo[:3], flat_hi[:3] = [-32768, 0, 50], [32767, 0, 10]   # full, zero, lo > hi
    final, out = run_alu_tensor(cfg, OP["CLIP"], a, clip_lanes(lo, hi))
    assert_array_equal(final[:n], np.minimum(np.maximum(a, lo), hi))
    assert_array_equal(out, sat8(final))


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_clip_immediate(cfg):
    half = get_isa(cfg).imm_bits // 2
    top = 2 ** (half - 1)
    bounds = [(0, 6), (-128, 127), (-top, top - 1), (-5, -5), (10, -10), (0, 0)]
    rng = rng_for("clip-i", cfg.name)
    n = 4
    a = mixed_acc(cfg, rng, n)
    acc0 = np.concatenate([a] * len(bounds))
    uops = [Uop(dst=k * n) for k in range(len(bounds))]
    compute = [Alu(alu_op=OP["CLIP"], use_imm=True, imm=clip_imm(lo, hi, 2 * half),
                   uop_begin=k, uop_end=k + 1, iter_out=n, dst_factor_out=1)
               for k, (lo, hi) in enumerate(bounds)]
    _, final, out = run_on_acc(cfg, acc0, compute, uops=uops)
    for k, (lo, hi) in enumerate(bounds):
        assert_array_equal(final[k * n:(k + 1) * n], np.minimum(np.maximum(a, lo), hi),
                           err_msg=f"CLIP [{lo}, {hi}]")
    assert_array_equal(out, sat8(final))


def requant_lanes(scales):
    m, shift = requant.scale_to_params(np.asarray(scales, dtype=np.float32))
    return requant.pack_params(m, shift).astype(np.int64)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_requant_tensor(cfg):
    rng = rng_for("rq-t", cfg.name)
    n = 6
    a = mixed_acc(cfg, rng, n)
    a[0] = np.arange(cfg.batch * cfg.block_out).reshape(cfg.batch, cfg.block_out) * 2 + 1  # odd
    scales = np.float32(2.0) ** rng.uniform(-24, 6, cfg.block_out).astype(np.float32)
    scales[:4] = [0.5, 0.0, 1000.0, 2.0**-130]   # ties, zero, int32 saturation, subnormal
    scales = scales.astype(np.float32)
    b = np.broadcast_to(requant_lanes(scales), (n, cfg.batch, cfg.block_out)).copy()
    final, out = run_alu_tensor(cfg, OP["REQUANT"], a, b)
    expected = requant_ref(a, scales)
    assert_array_equal(final[:n], expected)
    assert_array_equal(out, sat8(final))
    assert (expected == I32_MAX).any() or (expected == I32_MIN).any()   # saturation exercised


@FEW
@given(acc=st.lists(st.integers(I32_MIN, I32_MAX), min_size=8, max_size=8),
       scales=st.lists(st.floats(0, 2.0**20, width=32, allow_subnormal=True),
                       min_size=4, max_size=4))
def test_alu_requant_tensor_hypothesis(acc, scales):
    cfg = TINY
    a = np.array(acc, np.int64).reshape(2, 1, 4)
    scales = np.array(scales, np.float32)
    b = np.broadcast_to(requant_lanes(scales), a.shape).copy()
    final, _ = run_alu_tensor(cfg, OP["REQUANT"], a, b)
    assert_array_equal(final[:2], requant_ref(a, scales))


@pytest.mark.parametrize("scale", [0.5, 0.125, 1.0, 3.0, 0.0078125 * 1.5, 1e-3, 7.25e-6,
                                   2.0**-120, 65535.0])
def test_alu_requant_immediate_tiny(scale):
    """On tiny the immediate is 32 bits wide: a packed parameter word fits as is."""
    cfg = TINY
    assert get_isa(cfg).imm_bits == 32
    word = int(requant_lanes([scale])[0])
    assert I32_MIN <= word <= I32_MAX
    rng = rng_for("rq-i", scale)
    n = 6
    a = mixed_acc(cfg, rng, n)
    a[0, 0] = [1, 3, 5, -7]       # ties at scale 0.5
    insn = Alu(alu_op=OP["REQUANT"], use_imm=True, imm=word, uop_begin=0, uop_end=1,
               iter_out=n, dst_factor_out=1)
    _, final, out = run_on_acc(cfg, a, [insn], uops=[Uop(dst=0)])
    assert_array_equal(final, requant_ref(a, np.float32(scale)))
    assert_array_equal(out, sat8(final))


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_src_equals_dst(cfg):
    """An op whose operand is its own dst row reads the old value (a + a, a * a)."""
    rng = rng_for("self", cfg.name)
    n = 5
    a = mixed_acc(cfg, rng, n)
    compute = [Alu(alu_op=OP["ADD"], uop_begin=0, uop_end=1, iter_out=n, dst_factor_out=1,
                   src_factor_out=1),
               Alu(alu_op=OP["MUL"], uop_begin=0, uop_end=1, iter_out=n, dst_factor_out=1,
                   src_factor_out=1)]
    _, final, out = run_on_acc(cfg, a, compute, uops=[Uop(dst=0, src=0)])
    doubled = wrap32(2 * a)
    assert_array_equal(final, wrap32(doubled * doubled))
    assert_array_equal(out, sat8(final))


def test_alu_reset_and_empty_nests():
    """ALU reset zeroes dst rows (any alu_op); nests with no iterations change nothing."""
    cfg = TINY
    rng = rng_for("alu-reset")
    acc0 = acc_values(cfg, rng, 10, 1, 1000)
    compute = [Alu(reset=True, alu_op=15, uop_begin=0, uop_end=1, iter_out=3,
                   dst_factor_out=3),                                        # rows 1, 4, 7
               Alu(alu_op=OP["ADD"], use_imm=True, imm=5, iter_out=0, uop_end=1),
               Alu(alu_op=OP["ADD"], use_imm=True, imm=5, uop_begin=1, uop_end=1),
               Gemm(iter_in=0, uop_end=1)]
    _, final, out = run_on_acc(cfg, acc0, compute, uops=[Uop(dst=1)])
    expected = acc0.copy()
    expected[[1, 4, 7]] = 0
    assert_array_equal(final, expected)
    assert_array_equal(out, sat8(expected))


# ============================================= 6. sequential semantics and hazards
def alu_reference(acc, uops, iter_out, iter_in, f, op, imm=None):
    """The documented ALU loop nest, one row operation after the other."""
    acc = acc.astype(np.int64).copy()
    for o in range(iter_out):
        for i in range(iter_in):
            for u in uops:
                d = u.dst + o * f.get("dst_factor_out", 0) + i * f.get("dst_factor_in", 0)
                s = u.src + o * f.get("src_factor_out", 0) + i * f.get("src_factor_in", 0)
                b = np.full(acc[d].shape, imm, np.int64) if imm is not None else acc[s]
                acc[d] = op(acc[d], b)
    return acc


#: Hazard distances from docs/timing.md: ceil(write latency / ii); the tensor form
#: writes one cycle later than the immediate form.
TENSOR_DISTANCE = {"MAX": 2, "ADD": 2, "MUL": 3, "SHR": 2, "REQUANT": 4}
IMM_DISTANCE = {"MAX": 3, "ADD": 3, "MUL": 4, "SHR": 3, "REQUANT": 6}


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
@pytest.mark.parametrize("name", ["MAX", "ADD", "MUL"])
def test_alu_pooling_repeated_dst(cfg, name):
    """Interleaved dst rows (as many as the hazard distance) each fold K different src rows."""
    rng = rng_for("pool", cfg.name, name)
    k = 5
    acc0 = mixed_acc(cfg, rng, 40) if name != "MUL" else acc_values(cfg, rng, 40, -9, 9)
    uops = [Uop(dst=r, src=10 * (r + 1)) for r in range(TENSOR_DISTANCE[name])]
    f = dict(dst_factor_out=0, src_factor_out=1)
    insn = Alu(alu_op=OP[name], uop_begin=0, uop_end=len(uops), iter_out=k, **f)
    _, final, out = run_on_acc(cfg, acc0, [insn], uops=uops)
    expected = alu_reference(acc0, uops, k, 1, f, REF[name])
    assert_array_equal(final, expected)
    if name == "MAX":   # the running max, spelled out
        assert_array_equal(final[0], np.maximum(acc0[0], acc0[10:15].max(axis=0)))
        assert_array_equal(final[1], np.maximum(acc0[1], acc0[20:25].max(axis=0)))
    if name == "ADD":
        assert_array_equal(final[0], wrap32(acc0[0] + acc0[10:15].sum(axis=0)))
    assert_array_equal(out, sat8(final))


@pytest.mark.parametrize("name", ["MAX", "ADD", "MUL", "SHR", "REQUANT"])
def test_alu_repeated_dst_hazard_boundary_tensor(name):
    cfg = TINY
    dist = TENSOR_DISTANCE[name]
    rng = rng_for("hz-t", name)
    acc0 = acc_values(cfg, rng, 40, -50, 50)
    if name == "REQUANT":
        acc0[20:40] = requant_lanes([0.75, 1.5, 0.25, 2.0])
        ref = lambda a, b: requant_ref(a, np.float32([0.75, 1.5, 0.25, 2.0]))
    elif name == "SHR":
        acc0[20:40] = rng.integers(-3, 4, acc0[20:40].shape)
        ref = REF[name]
    else:
        ref = REF[name]
    f = dict(dst_factor_out=0, src_factor_out=dist)
    # dist rows written round-robin: each dst row recurs exactly dist ops later
    ok_uops = [Uop(dst=r, src=20 + r) for r in range(dist)]
    insn = Alu(alu_op=OP[name], uop_begin=0, uop_end=dist, iter_out=3, **f)
    _, final, _ = run_on_acc(cfg, acc0, [insn], uops=ok_uops)
    assert_array_equal(final, alu_reference(acc0, ok_uops, 3, 1, f, ref))
    # one row fewer: a row recurs dist - 1 ops later
    bad_uops = ok_uops[:-1] if dist > 1 else ok_uops
    bad = insn.replace(uop_end=len(bad_uops))
    with pytest.raises(HazardError, match=f"ALU {name}.*needs {dist}"):
        run_on_acc(cfg, acc0, [bad], uops=bad_uops)


@pytest.mark.parametrize("name", ["MAX", "ADD", "MUL", "REQUANT"])
def test_alu_repeated_dst_hazard_boundary_imm(name):
    cfg = TINY
    dist = IMM_DISTANCE[name]
    rng = rng_for("hz-i", name)
    acc0 = acc_values(cfg, rng, 16, -50, 50)
    imm = int(requant_lanes([0.75])[0]) if name == "REQUANT" else 3
    ref = (lambda a, b: requant_ref(a, np.float32(0.75))) if name == "REQUANT" else REF[name]
    uops = [Uop(dst=r) for r in range(dist)]
    insn = Alu(alu_op=OP[name], use_imm=True, imm=imm, uop_begin=0, uop_end=dist, iter_out=3)
    _, final, _ = run_on_acc(cfg, acc0, [insn], uops=uops)
    assert_array_equal(final, alu_reference(acc0, uops, 3, 1, {}, ref, imm=imm))
    with pytest.raises(HazardError, match=f"needs {dist}"):
        run_on_acc(cfg, acc0, [insn.replace(uop_end=dist - 1)], uops=uops)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_reads_row_written_earlier_in_same_instruction(cfg):
    """acc[o+2] += acc[o]: each op reads the row written two ops before (ADD tensor: allowed)."""
    rng = rng_for("chain", cfg.name)
    n = 10
    acc0 = acc_values(cfg, rng, n + 2, -1000, 1000)
    uops = [Uop(dst=2, src=0)]
    f = dict(dst_factor_out=1, src_factor_out=1)
    insn = Alu(alu_op=OP["ADD"], uop_begin=0, uop_end=1, iter_out=n, **f)
    _, final, out = run_on_acc(cfg, acc0, [insn], uops=uops)
    expected = acc0.copy()
    for o in range(n):
        expected[o + 2] = expected[o + 2] + expected[o]
    assert_array_equal(final, wrap32(expected))
    # a batched (non-sequential) evaluation would give acc0[o + 2] + acc0[o]:
    assert not np.array_equal(final[4:], acc0[4:] + acc0[2:-2])
    assert_array_equal(out, sat8(final))


def test_alu_reads_rows_written_by_previous_outer_iteration():
    """Outer iteration o reads the four rows iteration o-1 wrote (distance 4), MAX and MUL."""
    cfg = TINY
    rng = rng_for("chain4")
    acc0 = acc_values(cfg, rng, 16, -20, 20)
    uops = [Uop(dst=4 + r, src=r) for r in range(4)]
    f = dict(dst_factor_out=4, src_factor_out=4)
    for name in ("MAX", "MUL"):
        insn = Alu(alu_op=OP[name], uop_begin=0, uop_end=4, iter_out=3, **f)
        _, final, _ = run_on_acc(cfg, acc0, [insn], uops=uops)
        assert_array_equal(final, alu_reference(acc0, uops, 3, 1, f, REF[name]))


def test_alu_operand_hazard_raises():
    """Reading a row written one op earlier (ADD tensor needs 2) is a hazard."""
    cfg = TINY
    acc0 = np.ones((8, 1, 4), np.int64)
    insn = Alu(alu_op=OP["ADD"], uop_begin=0, uop_end=1, iter_out=5, dst_factor_out=1,
               src_factor_out=1)
    with pytest.raises(HazardError, match="operand.*needs 2"):
        run_on_acc(cfg, acc0, [insn], uops=[Uop(dst=1, src=0)])
    # REQUANT tensor needs 4: distance 3 is not enough either
    acc0[:] = requant_lanes([1.0] * 4)
    rq = insn.replace(alu_op=OP["REQUANT"], iter_out=4)
    with pytest.raises(HazardError, match="operand.*needs 4"):
        run_on_acc(cfg, acc0, [rq], uops=[Uop(dst=3, src=0)])


# ================================================================ 7. epilogues
def gemm_then(cfg, rows, epilogue, seed, extra_acc=None, extra_uops=()):
    """GEMM rows 0..rows-1 (reset + one accumulate), then ``epilogue`` ALU instructions.

    ``extra_acc`` (if given) is loaded into acc rows ``rows..``. Returns the raw GEMM
    result (numpy), the final acc rows and the stored out rows.
    """
    rng = rng_for("epi", cfg.name, seed)
    inp, wgt = inp_entries(cfg, rng, rows), wgt_entries(cfg, rng, 1)
    uops = [Uop(dst=0, src=0, wgt=0), *extra_uops]
    segments = {"inp": inp, "wgt": wgt, "out": out_bytes(cfg, rows)}
    loads = [load("inp", MemType.INP, x_size=rows), load("wgt", MemType.WGT, x_size=1)]
    if extra_acc is not None:
        segments["extra"] = acc_entries(cfg, extra_acc)
        loads.append(load("extra", MemType.ACC, sram_base=rows, x_size=extra_acc.shape[0]))
    prog = single_shot(cfg, uops=uops, segments=segments, loads=loads,
                       compute=[Gemm(reset=True, iter_out=rows, dst_factor_out=1),
                                Gemm(iter_out=rows, dst_factor_out=1, src_factor_out=1),
                                *epilogue],
                       stores=[store("out", x_size=rows)])
    res = run(prog)
    g = inp.astype(np.int64) @ wgt[0].astype(np.int64).T
    return g, res.datapath.acc[:rows].astype(np.int64), read_out(res, "out", cfg, rows)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_relu_and_clip_epilogue(cfg):
    bits = get_isa(cfg).imm_bits
    rows = 8
    epi = [Alu(alu_op=OP["MAX"], use_imm=True, imm=0, iter_out=rows, dst_factor_out=1),
           Alu(alu_op=OP["CLIP"], use_imm=True, imm=clip_imm(-20, 100, bits),
               iter_out=rows, dst_factor_out=1)]
    g, final, out = gemm_then(cfg, rows, epi, seed=0)
    expected = np.minimum(np.maximum(np.maximum(g, 0), -20), 100)
    assert (g < 0).any() and (g > 100).any()
    assert_array_equal(final, expected)
    assert_array_equal(out, expected)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_shift_and_scale_epilogue(cfg):
    rows = 8
    epi = [Alu(alu_op=OP["MUL"], use_imm=True, imm=77, iter_out=rows, dst_factor_out=1),
           Alu(alu_op=OP["SHR"], use_imm=True, imm=9, iter_out=rows, dst_factor_out=1)]
    g, final, out = gemm_then(cfg, rows, epi, seed=1)
    expected = wrap32(g * 77) >> 9
    assert_array_equal(final, expected)
    assert_array_equal(out, sat8(expected))


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_per_channel_scale_epilogue(cfg):
    """MUL by a per-channel multiplier row (tensor operand), SHR, then relu."""
    rows = 6
    mult = np.arange(cfg.batch * cfg.block_out).reshape(1, cfg.batch, cfg.block_out) * 37 - 50
    epi = [Alu(alu_op=OP["MUL"], uop_begin=1, uop_end=2, iter_out=rows, dst_factor_out=1),
           Alu(alu_op=OP["SHR"], use_imm=True, imm=7, iter_out=rows, dst_factor_out=1),
           Alu(alu_op=OP["MAX"], use_imm=True, imm=0, iter_out=rows, dst_factor_out=1)]
    g, final, out = gemm_then(cfg, rows, epi, seed=2, extra_acc=mult,
                              extra_uops=[Uop(dst=0, src=rows)])
    expected = np.maximum(wrap32(g * mult) >> 7, 0)
    assert_array_equal(final, expected)
    assert_array_equal(out, sat8(expected))


# ====================================================== 8. immediate out of range
@pytest.mark.parametrize("imm", [2**16, -(2**16) - 1, 10**6])
def test_alu_immediate_out_of_range_pynq(imm):
    cfg = PYNQ
    assert get_isa(cfg).imm_bits == 17
    insn = Alu(alu_op=OP["ADD"], use_imm=True, imm=imm, iter_out=1)
    with pytest.raises(EncodingError) as info:
        run_on_acc(cfg, np.zeros((1, 1, 16), np.int64), [insn], uops=[Uop()])
    msg = str(info.value)
    assert "imm" in msg and "[-65536, 65535]" in msg and str(imm) in msg
    assert info.value.field == "imm"


def test_alu_immediate_out_of_range_tiny():
    insn = Alu(alu_op=OP["ADD"], use_imm=True, imm=2**31, iter_out=1)
    with pytest.raises(EncodingError, match=r"imm must be in \[-2147483648, 2147483647\]"):
        run_on_acc(TINY, np.zeros((1, 1, 4), np.int64), [insn], uops=[Uop()])


# ============================================================== 9. MOV
def imm_range(cfg):
    bits = get_isa(cfg).imm_bits
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_mov_tensor(cfg):
    """MOV copies the operand row: acc[o] = acc[n + o]; the old dst value is ignored."""
    rng = rng_for("mov-t", cfg.name)
    n = 7
    a, b = mixed_acc(cfg, rng, n), mixed_acc(cfg, rng, n)
    final, out = run_alu_tensor(cfg, OP["MOV"], a, b)
    assert_array_equal(final[:n], b)
    assert_array_equal(final[n:], b)                 # operand rows untouched
    assert_array_equal(out, sat8(final))


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_mov_immediate(cfg):
    """MOV imm fills every lane of the dst rows with the sign-extended immediate."""
    lo, hi = imm_range(cfg)
    imms = [0, -1, 1, 12345 % hi, lo, hi]
    rng = rng_for("mov-i", cfg.name)
    n = 4
    acc0 = mixed_acc(cfg, rng, n * len(imms))
    uops = [Uop(dst=k * n) for k in range(len(imms))]
    compute = [Alu(alu_op=OP["MOV"], use_imm=True, imm=v, uop_begin=k, uop_end=k + 1,
                   iter_out=n, dst_factor_out=1) for k, v in enumerate(imms)]
    _, final, out = run_on_acc(cfg, acc0, compute, uops=uops)
    for k, v in enumerate(imms):
        assert (final[k * n:(k + 1) * n] == v).all(), f"MOV imm={v}"
    assert_array_equal(out, sat8(final))


def test_alu_mov_tensor_runs_one_row_per_cycle():
    """MOV's tensor form issues every cycle (it reads only src): n rows take n - 1 cycles
    fewer than ADD's tensor form (every other cycle) and one fewer write-latency cycle."""
    cfg = TINY
    rng = rng_for("mov-ii")
    n = 9
    a, b = mixed_acc(cfg, rng, n), mixed_acc(cfg, rng, n)
    cycles = {}
    for name in ("MOV", "ADD"):
        insn = Alu(alu_op=OP[name], uop_begin=0, uop_end=1, iter_out=n, dst_factor_out=1,
                   src_factor_out=1)
        res, _, _ = run_on_acc(cfg, np.concatenate([a, b]), [insn], uops=[Uop(dst=0, src=n)])
        cycles[name] = res.stats.cycles
    # docs/timing.md: ADD tensor: ii 2, writes at 3 + 1; MOV tensor: ii 1, writes at 3.
    assert cycles["ADD"] - cycles["MOV"] == ((n - 1) * 2 + 4) - ((n - 1) * 1 + 3)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_alu_mov_reads_row_written_three_ops_earlier(cfg):
    """acc[o + 3] = acc[o]: each op copies the row written three ops before (distance 3)."""
    rng = rng_for("mov-chain", cfg.name)
    n = 10
    acc0 = mixed_acc(cfg, rng, n + 3)
    insn = Alu(alu_op=OP["MOV"], uop_begin=0, uop_end=1, iter_out=n, dst_factor_out=1,
               src_factor_out=1)
    _, final, out = run_on_acc(cfg, acc0, [insn], uops=[Uop(dst=3, src=0)])
    expected = acc0.copy()
    for o in range(n):
        expected[o + 3] = expected[o]
    assert_array_equal(final, expected)
    assert_array_equal(final[3:], np.concatenate([acc0[:3]] * 4)[:n])   # acc0[0..2] repeated
    assert_array_equal(out, sat8(final))


def test_alu_mov_operand_hazard_raises():
    """MOV's tensor form writes 3 cycles after issue at one op per cycle: distance 3."""
    cfg = TINY
    acc0 = np.ones((8, 1, 4), np.int64)
    insn = Alu(alu_op=OP["MOV"], uop_begin=0, uop_end=1, iter_out=5, dst_factor_out=1,
               src_factor_out=1)
    with pytest.raises(HazardError, match="operand.*needs 3"):
        run_on_acc(cfg, acc0, [insn], uops=[Uop(dst=2, src=0)])


@pytest.mark.parametrize("use_imm", [False, True], ids=["tensor", "imm"])
def test_alu_mov_repeated_dst_is_no_hazard(use_imm):
    """MOV does not read dst: writing one row on consecutive ops is fine, the last wins."""
    cfg = TINY
    rng = rng_for("mov-dst", use_imm)
    acc0 = mixed_acc(cfg, rng, 12)
    insn = Alu(alu_op=OP["MOV"], use_imm=use_imm, imm=-77, uop_begin=0, uop_end=1, iter_out=4,
               src_factor_out=1)
    _, final, _ = run_on_acc(cfg, acc0, [insn], uops=[Uop(dst=1, src=5)])
    expected = acc0.copy()
    expected[1] = -77 if use_imm else acc0[8]
    assert_array_equal(final, expected)


# ====================================================== 10. compute units (overlap)
def gemm_rows(inp, wgt0, rows):
    """acc rows 0..rows-1 = inp[r] @ wgt0.T (a reset GEMM then one accumulate)."""
    return inp[:rows].astype(np.int64) @ wgt0.astype(np.int64).T


def unit_span(insns):
    """Cycles from the first start to the last end of compute instructions that push no
    tokens and wait for nothing else, by the rule of docs/timing.md ("Compute units"):
    in order, at most one start per cycle, an overlapped GEMM/ALU waits for its own unit,
    anything else for both; each takes its own formula's cycles."""
    free = {"gemm": 0, "alu": 0}
    start = -1
    for insn in insns:
        unit = "gemm" if isinstance(insn, Gemm) else "alu" if isinstance(insn, Alu) else None
        awaited = [unit] if unit and insn.overlap else ["gemm", "alu"]
        start = max([start + 1] + [free[u] for u in awaited])
        cycles = timing.gemm_cycles(insn) if isinstance(insn, Gemm) else timing.alu_cycles(insn)
        for u in ([unit] if unit else ["gemm", "alu"]):
            free[u] = start + cycles
    return max(free.values())


def overlap_program(cfg, compute, rows, n, seed):
    """inp/wgt loads, acc rows B..B+2n-1 (B: the first row of bank 1) loaded from ``extra``,
    ``compute``, a barrier (an empty ALU without overlap: it waits for both units) that
    releases the stores of rows 0..rows-1 and B..B+2n-1.

    Uops: 0 = the GEMM's rows from 0; 1 = dst B, src B+n; 2 = dst B, src 0."""
    rng = rng_for("ovl", cfg.name, seed)
    bank = cfg.acc_bank_rows
    assert rows <= bank and 2 * n <= bank
    inp, wgt = inp_entries(cfg, rng, rows), wgt_entries(cfg, rng, 1)
    extra = mixed_acc(cfg, rng, 2 * n)
    uops = [Uop(dst=0, src=0, wgt=0), Uop(dst=bank, src=bank + n), Uop(dst=bank, src=0)]
    prog = single_shot(
        cfg, uops=uops,
        segments={"inp": inp, "wgt": wgt, "extra": acc_entries(cfg, extra),
                  "out0": out_bytes(cfg, rows), "out1": out_bytes(cfg, 2 * n)},
        loads=[load("inp", MemType.INP, x_size=rows), load("wgt", MemType.WGT, x_size=1),
               load("extra", MemType.ACC, sram_base=bank, x_size=2 * n)],
        compute=[*compute, Alu(iter_out=0)],
        stores=[store("out0", x_size=rows), store("out1", sram_base=bank, x_size=2 * n)])
    return prog, inp, wgt, extra


def gemm_on_bank0(rows, **flags):
    return [Gemm(reset=True, iter_out=rows, dst_factor_out=1, **flags),
            Gemm(iter_out=rows, dst_factor_out=1, src_factor_out=1, **flags)]


def alus_on_bank1(n, overlap):
    """ADD the operand rows (tensor), then relu (immediate), on rows B..B+n-1."""
    row = dict(uop_begin=1, uop_end=2, iter_out=n, dst_factor_out=1, overlap=overlap)
    return [Alu(alu_op=OP["ADD"], src_factor_out=1, **row),
            Alu(alu_op=OP["MAX"], use_imm=True, imm=0, **row)]


@pytest.mark.parametrize("n", [6, 24], ids=["gemm-longer", "alu-longer"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_overlap_gemm_and_alu_on_different_banks(cfg, n):
    """ALU instructions with overlap run on bank 1 beside the GEMM on bank 0: same results
    as without overlap, faster by exactly what the unit rule predicts."""
    rows = 40
    cycles = {}
    for overlap in (False, True):
        compute = gemm_on_bank0(rows) + alus_on_bank1(n, overlap)
        prog, inp, wgt, extra = overlap_program(cfg, compute, rows, n, seed=n)
        res = run(prog)
        cycles[overlap] = res.stats.cycles
        expected_g = gemm_rows(inp, wgt[0], rows)
        expected_a = np.maximum(wrap32(extra[:n] + extra[n:]), 0)
        bank = cfg.acc_bank_rows
        assert_array_equal(res.datapath.acc[:rows], expected_g)
        assert_array_equal(res.datapath.acc[bank:bank + n], expected_a)
        assert_array_equal(read_out(res, "out0", cfg, rows), sat8(expected_g))
        assert_array_equal(read_out(res, "out1", cfg, 2 * n),
                           sat8(np.concatenate([expected_a, extra[n:]])))
    body = gemm_on_bank0(rows)[1:] + alus_on_bank1(n, True)   # the reset runs first either way
    serial = sum(timing.gemm_cycles(i) if isinstance(i, Gemm) else timing.alu_cycles(i)
                 for i in body)
    g, a1, a2 = (timing.gemm_cycles(body[0]), timing.alu_cycles(body[1]),
                 timing.alu_cycles(body[2]))
    assert unit_span(body) == max(g, 1 + a1 + a2)     # the ALUs start the cycle after the GEMM
    assert cycles[False] - cycles[True] == serial - max(g, 1 + a1 + a2) > 0


def test_overlap_chain_alternates_units():
    """G, A(ov), A(ov), G(ov), A(ov), G(ov reset), A(ov), A(ov reset) after a GEMM reset:
    each overlapped instruction may run beside the other unit's, on the other bank; the
    results are those of program order, the time saved what the unit rule predicts."""
    cfg = TINY
    rows, n = 12, 8
    bank = cfg.acc_bank_rows
    row = dict(uop_begin=1, uop_end=2, iter_out=n, dst_factor_out=1, overlap=True)
    chain = [*gemm_on_bank0(rows),                                          # rows 0.. = g
             Alu(alu_op=OP["ADD"], src_factor_out=1, **row),                # B.. += B+n..
             Alu(alu_op=OP["MOV"], use_imm=True, imm=-3, **dict(row, iter_out=2)),  # B, B+1 = -3
             Gemm(iter_out=rows, dst_factor_out=1, src_factor_out=1, overlap=True),  # += g
             Alu(alu_op=OP["MUL"], use_imm=True, imm=5, **row),              # B.. *= 5
             Gemm(reset=True, iter_out=2, dst_factor_out=1, overlap=True),   # rows 0, 1 = 0
             Alu(alu_op=OP["MOV"], src_factor_out=1, **dict(row, iter_out=2)),   # B, B+1 = B+n..
             Alu(reset=True, **dict(row, iter_out=1))]                      # B = 0
    results = {}
    for overlap in (False, True):
        insns = [i.replace(overlap=overlap) if i.overlap else i for i in chain]
        prog, inp, wgt, extra = overlap_program(cfg, insns, rows, n, seed="chain")
        results[overlap] = run(prog)
    g = gemm_rows(inp, wgt[0], rows)
    expected_g = wrap32(2 * g)
    expected_g[:2] = 0
    a = wrap32(extra[:n] + extra[n:])
    a[:2] = -3
    a = wrap32(a * 5)
    a[:2] = extra[n:n + 2]
    a[0] = 0
    for res in results.values():
        assert_array_equal(res.datapath.acc[:rows], expected_g)
        assert_array_equal(res.datapath.acc[bank:bank + n], a)
        assert_array_equal(read_out(res, "out0", cfg, rows), sat8(expected_g))
        assert_array_equal(read_out(res, "out1", cfg, 2 * n),
                           sat8(np.concatenate([a, extra[n:]])))
    body = chain[1:]
    saved = results[False].stats.cycles - results[True].stats.cycles
    assert saved == sum(timing.gemm_cycles(i) if isinstance(i, Gemm) else timing.alu_cycles(i)
                        for i in body) - unit_span(body) > 0


def test_overlap_on_the_same_bank_raises():
    """An ALU with overlap on the GEMM's bank (dst, or only its tensor operand) is refused."""
    cfg = TINY
    rows, n = 40, 4
    same_dst = Alu(alu_op=OP["ADD"], use_imm=True, imm=1, uop_begin=0, uop_end=1, iter_out=n,
                   dst_factor_out=1, overlap=True)                  # rows 0.., the GEMM's
    prog, *_ = overlap_program(cfg, gemm_on_bank0(rows) + [same_dst], rows, n, seed="same")
    with pytest.raises(HazardError, match="bank 0"):
        run(prog)
    # dst in bank 1 but the operand rows in bank 0
    operand_in_bank0 = Alu(alu_op=OP["MOV"], uop_begin=2, uop_end=3, iter_out=n,
                           dst_factor_out=1, src_factor_out=1, overlap=True)
    prog, *_ = overlap_program(cfg, gemm_on_bank0(rows) + [operand_in_bank0], rows, n,
                               seed="same")
    with pytest.raises(HazardError, match="bank 0"):
        run(prog)
    # the same programs without overlap run
    for alu in (same_dst, operand_in_bank0):
        prog, *_ = overlap_program(cfg, gemm_on_bank0(rows) + [alu.replace(overlap=False)],
                                   rows, n, seed="same")
        run(prog)


def test_overlap_pushing_into_the_same_queue_raises():
    """Two instructions running at once must not push into the same token queue."""
    cfg = TINY
    rows, n = 40, 4
    g_reset, g = gemm_on_bank0(rows)
    alu = alus_on_bank1(n, True)[1]
    prog, *_ = overlap_program(cfg, [g_reset, g.replace(push_next=True),
                                     alu.replace(push_next=True)], rows, n, seed="queue")
    with pytest.raises(HazardError, match="compute->store"):
        run(prog)


@pytest.mark.parametrize("skew", [-2, -1, 0, 1, 2])
@pytest.mark.parametrize("cfg", [TINY, TINY_B2], ids=["tiny", "tiny-b2"])
def test_overlapped_units_push_into_different_queues(cfg, skew):
    """The GEMM pushes to load, the overlapped ALU beside it to store, ``skew`` cycles
    after the GEMM's push (0: in the same cycle); each token releases its consumer."""
    rows = 30
    bank = cfg.acc_bank_rows
    g_reset, g = gemm_on_bank0(rows)
    g = g.replace(push_prev=True)
    # The ALU starts one cycle after the GEMM: pick n so that it ends skew cycles later.
    alu = lambda n: Alu(alu_op=OP["SUB"], use_imm=True, imm=9, uop_begin=1, uop_end=2,
                        iter_out=n, dst_factor_out=1, overlap=True, push_next=True)
    n = next(n for n in range(1, bank) if 1 + timing.alu_cycles(alu(n))
             == timing.gemm_cycles(g) + skew)
    rng = rng_for("queues", cfg.name, skew)
    inp, wgt = inp_entries(cfg, rng, rows), wgt_entries(cfg, rng, 1)
    extra = mixed_acc(cfg, rng, n)
    p = Program(cfg)
    p.add_uops("uops", [Uop(dst=0, src=0, wgt=0), Uop(dst=bank)])
    for name, data in (("inp", inp), ("wgt", wgt), ("extra", acc_entries(cfg, extra)),
                       ("out0", out_bytes(cfg, rows)), ("out1", out_bytes(cfg, n))):
        p.add_segment(name, data)
    dma = lambda name, mem, **f: dict(mem=mem, dram_base=p.elem_addr(name, mem),
                                      y_size=1, x_stride=f["x_size"], **f)
    p.emit(Load(**dma("inp", MemType.INP, x_size=rows)),
           Load(**dma("wgt", MemType.WGT, x_size=1), push_next=True),
           Load(**dma("uops", MemType.UOP, x_size=2), pop_prev=True),
           Load(**dma("extra", MemType.ACC, x_size=n, sram_base=bank)),
           g_reset, g, alu(n),
           Load(mem=MemType.INP, x_size=0, pop_next=True, push_next=True),   # takes g's token
           Store(**dma("out1", MemType.OUT, x_size=n, sram_base=bank), pop_prev=True),
           Alu(iter_out=0, push_next=True),      # waits for both units: g has ended
           Store(**dma("out0", MemType.OUT, x_size=rows), pop_prev=True, push_prev=True),
           Finish(pop_prev=True, pop_next=True))
    res = run(p)
    expected_g = gemm_rows(inp, wgt[0], rows)
    assert_array_equal(read_out(res, "out0", cfg, rows), sat8(expected_g))
    assert_array_equal(read_out(res, "out1", cfg, n), sat8(wrap32(extra - 9)))


def test_overlap_beside_a_push_blocked_on_a_full_queue():
    """The ALU unit's instruction waits to push into the full compute->store queue (store
    is busy with a long STORE): the GEMM unit keeps running overlapped instructions, the
    next overlapped ALU waits for the push."""
    cfg = TINY
    depth, bank = cfg.token_queue_depth, cfg.acc_bank_rows
    rows = 20
    p = Program(cfg)
    p.add_uops("uops", [Uop(dst=0), Uop(dst=bank)])
    p.add_segment("big", out_bytes(cfg, 100))
    p.add_segment("out", out_bytes(cfg, 2 * bank))
    out = lambda name, **f: dict(mem=MemType.OUT, dram_base=p.elem_addr(name, MemType.OUT),
                                 y_size=1, x_stride=f["x_size"], **f)
    p.emit(Store(**out("big", x_size=100)),                       # long, pops nothing
           Load(mem=MemType.UOP, dram_base=p.elem_addr("uops", MemType.UOP), y_size=1,
                x_size=2, x_stride=2),
           *[Alu(iter_out=0, overlap=True, push_next=True) for _ in range(depth + 1)],
           Gemm(reset=True, iter_out=rows, dst_factor_out=1, overlap=True),
           Alu(alu_op=OP["MOV"], use_imm=True, imm=-5, uop_begin=1, uop_end=2, iter_out=rows,
               dst_factor_out=1, overlap=True),
           Alu(iter_out=0, push_next=True),                        # both units done
           *[Store(mem=MemType.OUT, x_size=0, pop_prev=True) for _ in range(depth + 1)],
           Store(**out("out", x_size=2 * bank), pop_prev=True, push_prev=True),
           Finish(pop_next=True))
    res = run(p)
    got = read_out(res, "out", cfg, 2 * bank)
    assert (got[:rows] == 0).all() and (got[bank:bank + rows] == -5).all()
    # the store module's long STORE kept the queue full: compute waited on it
    assert res.stats.modules["compute"].wait_queue > 0


# ------------------------------------------------ the table memory and the LUT plug-in
def run_lut(cfg, a, tables, *, base=None, bases=None):
    """``LOAD tbl`` of ``tables`` (flat int8 entries from entry 0), then LUT over acc rows
    0..n-1 holding ``a``: with the immediate ``base``, or with per-lane ``bases`` (rows
    n..2n-1, the tensor form). Returns the final accumulator rows 0..n-1 and the output."""
    from tessera.isa import ALU_OPS
    lanes = cfg.batch * cfg.block_out
    rows = np.asarray(tables, dtype=np.int8).reshape(-1, lanes)
    n = a.shape[0]
    acc0 = a if bases is None else np.concatenate([a, bases])
    lut = ALU_OPS.by_name("LUT").opcode
    if bases is None:
        insn = Alu(alu_op=lut, use_imm=True, imm=base, uop_begin=0, uop_end=1, iter_out=n,
                   dst_factor_out=1)
        uop = Uop(dst=0)
    else:
        insn = Alu(alu_op=lut, uop_begin=0, uop_end=1, iter_out=n, dst_factor_out=1,
                   src_factor_out=1)
        uop = Uop(dst=0, src=n)
    prog = single_shot(
        cfg, uops=[uop],
        segments={"tbl": rows, "acc": acc_entries(cfg, acc0), "out": out_bytes(cfg, n)},
        compute=[load("tbl", MemType.TBL, x_size=rows.shape[0]),
                 load("acc", MemType.ACC, x_size=acc0.shape[0]), insn],
        stores=[store("out", x_size=n)])
    result = run(prog)
    return result.datapath.acc[:n].astype(np.int64), read_out(result, "out", cfg, n)


def lut_reference(a, bases, tables):
    """``tables[(base + byte of a saturated to int8) mod entries]``, written out per lane."""
    flat = np.asarray(tables, dtype=np.int64).reshape(-1)
    out = np.empty(a.shape, dtype=np.int64)
    for idx in np.ndindex(a.shape):
        byte = max(-128, min(127, int(a[idx]))) & 0xFF
        out[idx] = flat[(int(bases[idx]) + byte) % flat.size]
    return out


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_lut_immediate_looks_up_every_byte(cfg):
    """Every int8 value (and wider values, whose low byte counts) through the second of
    the config's resident tables."""
    rng = rng_for("lut-i", cfg.name)
    tables = rng.integers(-128, 128, cfg.table_entries).astype(np.int8)
    lanes = cfg.batch * cfg.block_out
    values = np.concatenate([np.arange(-128, 128), [I32_MIN, I32_MAX, 1000, -1000]])
    values = np.resize(values, -(-values.size // lanes) * lanes)
    a = acc_entries(cfg, values).astype(np.int64)
    final, out = run_lut(cfg, a, tables, base=256)
    assert_array_equal(final, lut_reference(a, np.full(a.shape, 256), tables))
    assert_array_equal(out, sat8(final))


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_lut_tensor_operand_picks_a_table_per_lane(cfg):
    rng = rng_for("lut-t", cfg.name)
    tables = rng.integers(-128, 128, cfg.table_entries).astype(np.int8)
    n = 4
    a = rng.integers(-300, 300, (n, cfg.batch, cfg.block_out))
    bases = rng.integers(0, cfg.table_entries // 256, a.shape) * 256 + rng.integers(0, 3, a.shape)
    final, _ = run_lut(cfg, a, tables, bases=bases)
    assert_array_equal(final, lut_reference(a, bases, tables))


def test_lut_and_table_loads_need_the_table_memory():
    from tessera.errors import MalformedInstructionError
    from tessera.isa import ALU_OPS, check_instruction
    bare = TINY.replace(name="tiny-notable", table_entries=0)
    with pytest.raises(MalformedInstructionError, match="no ALU table memory"):
        check_instruction(Load(mem=MemType.TBL, x_size=1, y_size=1, x_stride=1), bare, 3)
    lut = Alu(alu_op=ALU_OPS.by_name("LUT").opcode, use_imm=True, uop_end=1)
    with pytest.raises(MalformedInstructionError, match="LUT reads the ALU table memory"):
        check_instruction(lut, bare, 4)
    assert "LUT" not in [op.name for op in ALU_OPS.available(bare)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_lut_reads_a_padded_strided_table_load(cfg):
    """LOAD tbl is a 2-D DMA like the others: strided rows, pads of ``pad_value`` in every
    lane, into the second table (the only one on tiny, imm 256 wrapping to it); a LUT over
    every byte then reads what it wrote (and zeros elsewhere)."""
    from tessera.isa import ALU_OPS
    lanes = cfg.batch * cfg.block_out
    rng = rng_for("lut-pad", cfg.name)
    src = rng.integers(-128, 128, (10, lanes)).astype(np.int8)
    slot = 256 % cfg.table_entries // lanes  # the second table's first row (or the first's)
    y_size, x_size, x_stride, pad = 2, 3, 5, -3
    expected = np.zeros((cfg.table_rows, lanes), dtype=np.int64)
    for r in range(1 + y_size):              # one top pad row, then the data rows
        for col in range(1 + x_size):        # one left pad entry, then the data
            row = slot + r * (1 + x_size) + col
            expected[row] = pad if r == 0 or col == 0 else src[(r - 1) * x_stride + col - 1]
    a = acc_entries(cfg, np.resize(np.arange(-128, 128), 256 // lanes * lanes)).astype(np.int64)
    n = a.shape[0]
    lut = Alu(alu_op=ALU_OPS.by_name("LUT").opcode, use_imm=True, imm=256, uop_begin=0,
              uop_end=1, iter_out=n, dst_factor_out=1)
    prog = single_shot(
        cfg, uops=[Uop(dst=0)],
        segments={"tbl": src, "acc": acc_entries(cfg, a), "out": out_bytes(cfg, n)},
        compute=[load("tbl", MemType.TBL, y_size=y_size, x_size=x_size, x_stride=x_stride,
                      y_pad_0=1, x_pad_0=1, pad_value=pad, sram_base=slot),
                 load("acc", MemType.ACC, x_size=n), lut],
        stores=[store("out", x_size=n)])
    result = run(prog)
    assert_array_equal(result.datapath.tbl.astype(np.int64), expected)
    assert_array_equal(result.datapath.acc[:n], lut_reference(a, np.full(a.shape, 256), expected))
