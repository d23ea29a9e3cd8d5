"""Finding installed bitstreams (tessera.bitstreams) and the pynq backend using them.

Installed folders are written here by hand, as ``tessera hw bitstream`` lays them out
(tests/bitstreams/test_bitstream.py checks the installer writes what this finds); the pynq
tests install the placeholder bitstream of a simulated board.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tessera.config import PRESETS, HwConfig
from tessera.errors import DeviceError
from tessera.regmap import config_id
from tessera import bitstreams
from tessera.bitstreams import (BIT_NAME, HWH_NAME, MANIFEST_NAME, config_key,
                                        find_bitstream, install_root, search_paths, sha256_file)

PYNQ = PRESETS["pynq"]
TINY = PRESETS["tiny"]


def install(root: Path, board: str, config: HwConfig, *, bit: bytes | Path = b"bitstream",
            hwh: str | Path = "<hwh/>", manifest_config: HwConfig | None = None) -> Path:
    """An installed folder ``root/board/<config-id>`` for ``config``; its manifest names
    ``manifest_config`` (default ``config``)."""
    folder = root / board / config_key(config)
    folder.mkdir(parents=True)
    for name, content in ((BIT_NAME, bit), (HWH_NAME, hwh)):
        if isinstance(content, Path):
            shutil.copyfile(content, folder / name)
        elif isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)
    named = manifest_config or config
    (folder / MANIFEST_NAME).write_text(json.dumps({
        "format": 1, "config_name": named.name, "config_id": config_key(named),
        "config": named.to_dict(), "board": board, "part": named.part,
        "sha256": {BIT_NAME: sha256_file(folder / BIT_NAME),
                   HWH_NAME: sha256_file(folder / HWH_NAME)},
    }))
    return folder


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Two bitstream roots on TESSERA_BITSTREAMS."""
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv(bitstreams.ENV_VAR, f"{first}{os.pathsep}{second}")
    return first, second


# ------------------------------------------------------------------ search paths
def test_search_paths_follow_the_environment(roots, monkeypatch, tmp_path):
    first, second = roots
    assert search_paths() == [first, second]
    assert install_root() == first
    assert bitstreams.bitstream_dir(PYNQ, "pynq-z2") == first / "pynq-z2" / config_key(PYNQ)

    monkeypatch.delenv(bitstreams.ENV_VAR)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    user = tmp_path / "data" / "tessera" / "bitstreams"
    checkout = bitstreams.source_checkout()
    assert search_paths() == ([checkout / "bitstreams"] if checkout else []) + [user]
    assert install_root() == (checkout / "bitstreams" if checkout else user)


def test_source_checkout_is_this_repository():
    # the tests run from the source tree
    assert bitstreams.source_checkout() == Path(__file__).resolve().parents[2]


def test_config_key_is_the_config_id_in_hex():
    assert config_key(PYNQ) == f"{config_id(PYNQ):08x}"
    assert len(config_key(TINY)) == 8


# ------------------------------------------------------------------ finding
def test_finds_the_folder_of_the_config_id(roots):
    first, second = roots
    install(first, "pynq-z2", TINY)                  # another config, in the first root
    want = install(second, "pynq-z2", PYNQ)
    assert find_bitstream(PYNQ) == want / BIT_NAME
    assert find_bitstream(PYNQ, "pynq-z2") == want / BIT_NAME
    # a config named after no board's preset is looked for in any board folder
    assert find_bitstream(TINY) == first / "pynq-z2" / config_key(TINY) / BIT_NAME
    with pytest.raises(DeviceError, match="on board pynq-z1"):
        find_bitstream(PYNQ, "pynq-z1")


def test_the_first_intact_copy_wins(roots):
    first, second = roots
    damaged = install(first, "pynq-z2", PYNQ)
    (damaged / BIT_NAME).write_bytes(b"bitstr")       # truncated copy
    good = install(second, "pynq-z2", PYNQ)
    assert find_bitstream(PYNQ) == good / BIT_NAME


def test_manifest_of_another_config_is_refused(roots):
    first, _ = roots
    # the tiny bitstream copied into the pynq preset's folder
    install(first, "pynq-z2", PYNQ, manifest_config=TINY)
    with pytest.raises(DeviceError) as info:
        find_bitstream(PYNQ)
    message = str(info.value)
    assert f"holds the bitstream of config 'tiny' (config id {config_key(TINY)}), not of " \
           f"'pynq' (config id {config_key(PYNQ)})" in message
    assert "must keep its name <board>/<config-id>" in message


def test_damaged_bitstream_is_reported(roots):
    first, _ = roots
    folder = install(first, "pynq-z2", PYNQ)
    (folder / BIT_NAME).write_bytes(b"bitstreaM")
    with pytest.raises(DeviceError, match=rf"{BIT_NAME} is damaged: its sha256 is .* copy the "
                                          "bitstream folder again"):
        find_bitstream(PYNQ)
    (folder / HWH_NAME).unlink()
    (folder / BIT_NAME).write_bytes(b"bitstream")
    with pytest.raises(DeviceError, match=f"lacks {HWH_NAME}"):
        find_bitstream(PYNQ)
    (folder / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(DeviceError, match=f"{MANIFEST_NAME} is damaged"):
        find_bitstream(PYNQ)


def test_missing_bitstream_lists_where_it_looked(roots):
    first, second = roots
    with pytest.raises(DeviceError) as info:
        find_bitstream(PYNQ)
    message = str(info.value)
    key = config_key(PYNQ)
    assert f"no usable bitstream for config 'pynq' (config id {key}) on any board" in message
    assert f"looked for <board>/{key}/manifest.json in {first}, {second}" in message
    assert "TESSERA_BITSTREAMS=" in message
    assert "`tessera hw bitstream --board pynq-z2 --config pynq`" in message
    # a config that is not a preset is built from its JSON file
    with pytest.raises(DeviceError, match="--board BOARD --config tiny-b2.json"):
        find_bitstream(TINY.replace(batch=2, name="tiny-b2"))


# ------------------------------------------------------------------ the pynq backend


@pytest.fixture
def sim_board(tmp_path):
    """A simulated PYNQ-Z2 holding ``pynq``'s accelerator (the cycle simulator behind it)."""
    pytest.importorskip("pynq")
    from tessera.runtime.pynq_sim import simulated_board
    with simulated_board(PYNQ, model="sim", directory=tmp_path / "board") as board:
        yield board


def test_pynq_device_without_a_bitstream_uses_the_installed_one(roots, sim_board):
    from tessera.kernels.gemm import gemm_program
    from tessera.runtime import open_device
    from tessera.runtime.pynq_device import PynqDevice
    from tessera.sim import simulate

    first, _ = roots
    folder = install(first, "pynq-z2", PYNQ, bit=sim_board.bitstream,
                     hwh=sim_board.bitstream.with_suffix(".hwh"))
    rng = np.random.default_rng(0)
    program = gemm_program(PYNQ, rng.integers(-128, 128, (16, 32)),
                           rng.integers(-128, 128, (16, 32)), epilogue=[("SHR", 6)])
    with open_device("pynq", PYNQ) as dev:
        assert isinstance(dev, PynqDevice)
        assert Path(dev.overlay.bitfile_name).resolve() == (folder / BIT_NAME).resolve()
        result = dev.run(program)
    want = simulate(program)
    np.testing.assert_array_equal(result.dram, want.dram[:program.insn_addr])


def test_pynq_device_refuses_a_bitstream_of_another_config(roots, sim_board):
    from tessera.runtime.pynq_device import PynqDevice

    first, second = roots
    other = PYNQ.replace(name="pynq-b2", batch=2)
    # copied into the other config's folder: the manifest says so
    install(first, "pynq-z2", other, bit=sim_board.bitstream,
            hwh=sim_board.bitstream.with_suffix(".hwh"), manifest_config=PYNQ)
    with pytest.raises(DeviceError, match="needs the bitstream to load and none was given.*"
                                          "holds the bitstream of config 'pynq'"):
        PynqDevice(other)
    # a manifest rewritten to claim the other config: the hardware's CONFIG_ID refuses it
    install(second, "pynq-z2", other, bit=sim_board.bitstream,
            hwh=sim_board.bitstream.with_suffix(".hwh"))
    shutil.rmtree(first)
    with pytest.raises(DeviceError, match="CONFIG_ID"):
        PynqDevice(other)


def test_pynq_device_without_any_bitstream(roots):
    from tessera.runtime.pynq_device import PynqDevice

    with pytest.raises(DeviceError, match="needs the bitstream to load .*tessera hw bitstream "
                                          "--board pynq-z2 --config pynq"):
        PynqDevice(PYNQ)


def test_run_command_finds_the_installed_bitstream(roots, sim_board, tmp_path, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import tessera
    from tessera.cli import main
    from tessera.compiler import zoo

    first, _ = roots
    install(first, "pynq-z2", PYNQ, bit=sim_board.bitstream,
            hwh=sim_board.bitstream.with_suffix(".hwh"))
    net = zoo.mlp()
    model = tessera.compile(net, "pynq", calibration=zoo.calibration_data(net, 2))
    model.save(tmp_path / "mlp.tsr")
    x = zoo.calibration_data(net, 1, seed=3)[0]
    np.savez(tmp_path / "x.npz", **x)
    assert main(["run", str(tmp_path / "mlp.tsr"), "--backend", "pynq", "--inputs",
                 str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]) == 0
    assert "pynq wall time" in capsys.readouterr().out
    got = np.load(tmp_path / "y.npz")
    want, _ = tessera.load(tmp_path / "mlp.tsr").run(x, backend="sim")
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
