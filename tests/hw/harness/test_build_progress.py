"""A Verilator build, which takes a minute or more, says what it is doing (issue 22)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("amaranth")

from tessera.hw.harness import verilator_build  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_a_fresh_verilator_build_prints_its_stages(tmp_path):
    # a cache of its own, so the build really runs (tiny: ~30-60 s); zig's C++ runtime, a
    # toolchain cache built once per zig install (~60 s), stays where the user's is
    env = dict(os.environ, TESSERA_CACHE=str(tmp_path))
    env.setdefault("ZIG_GLOBAL_CACHE_DIR", str(verilator_build.cache_root() / "zig"))
    env.pop("TESSERA_PROGRESS", None)
    code = ("from tessera.config import get_config; from tests.rtl import rtl_sim; "
            "rtl_sim(get_config('tiny'))")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=1200, check=True)
    lines = done.stderr.splitlines()
    label = "building the RTL simulation of config 'tiny' (cached afterwards)"
    assert any(line.startswith(f"{label}: Verilator: Verilog to C++ at") for line in lines)
    assert any(line.startswith(f"{label}: compiling the C++") for line in lines)
    assert lines[-1].startswith(f"{label}: done in")
