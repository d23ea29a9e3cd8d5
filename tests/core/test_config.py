import json
import re

import pytest

from tessera.config import MODULES, PRESETS, HwConfig, get_config
from tessera.errors import ConfigError, TesseraError


def test_pynq_preset_matches_vta_pynq_buffers():
    c = PRESETS["pynq"]
    assert (c.batch, c.block_in, c.block_out) == (1, 16, 16)
    assert c.uop_depth * 4 == 32 * 1024          # 32 KiB of 32-bit uops
    assert c.inp_depth * c.inp_entry_bytes == 32 * 1024
    assert c.wgt_depth * c.wgt_entry_bytes == 256 * 1024
    assert c.acc_depth * c.acc_entry_bytes == 128 * 1024
    assert c.out_depth * c.out_entry_bytes == 32 * 1024
    assert c.clock_mhz == 100 and c.bus_bytes == 8
    assert c.peak_macs_per_cycle == 256
    assert c.peak_gops == pytest.approx(51.2)


def test_derived_index_widths():
    c = PRESETS["pynq"]
    assert (c.uop_index_bits, c.inp_index_bits, c.wgt_index_bits, c.acc_index_bits) == (13, 11, 10, 11)
    t = PRESETS["tiny"]
    assert t.peak_macs_per_cycle == 16 and t.inp_entry_bytes == 4 and t.wgt_entry_bytes == 16


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_json_round_trip(name, tmp_path):
    c = PRESETS[name]
    assert HwConfig.from_json(c.to_json()) == c
    path = tmp_path / "c.json"
    c.save(path)
    assert HwConfig.load(path) == c
    assert get_config(str(path)) == c
    ports = {m: c.ports_of(m)[0] if len(c.ports_of(m)) == 1 else list(c.ports_of(m))
             for m in MODULES}
    assert json.loads(c.to_json())["module_ports"] == ports


def test_load_module_reads_over_several_ports():
    """The load module may name a tuple of ports (a JSON list); one port in a list is the
    plain port, so the config and its JSON stay those of a single-port config."""
    c = PRESETS["pynq"].replace(dram_ports=6, module_ports=(0, [1, 4], 2, 3))
    assert c.ports_of("load") == (1, 4) and c.port_of("load") == 1
    assert c.ports_of("store") == (3,)
    assert HwConfig.from_json(c.to_json()) == c
    single = PRESETS["pynq"].replace(module_ports=(0, [1], 2, 3))
    assert single == PRESETS["pynq"] and single.to_json() == PRESETS["pynq"].to_json()


@pytest.mark.parametrize("ports, message", [
    ((0, (1, 4), (2, 5), 3), r"module_ports\[compute\] names several ports \(2, 5\): only the "
                              "load module"),
    ((0, (1, 1), 2, 3), r"power of two of distinct ports, not \(1, 1\)"),
    ((0, (1, 4, 5), 2, 3), "power of two of distinct ports"),
    ((0, (1, 2), 2, 3), r"shares port\(s\) \[2\] with \['compute'\]"),
    ((0, (1, 6), 2, 3), r"module_ports\[load\] must be a port in \[0, 5\] or a tuple"),
])
def test_multi_port_validation(ports, message):
    with pytest.raises(ConfigError, match=message):
        PRESETS["pynq"].replace(dram_ports=6, module_ports=ports)


def test_store_may_share_a_port_of_a_multi_port_load():
    """The store only writes: its AXI channels are not the load's."""
    c = PRESETS["pynq"].replace(dram_ports=5, module_ports=(0, (1, 4), 2, 4))
    assert c.ports_of("store") == (4,)


@pytest.mark.parametrize("changes, message", [
    (dict(block_in=12), "block_in must be a power of two"),
    (dict(inp_width=4), "inp_width must be one of"),
    (dict(out_depth=1024), "out_depth must equal acc_depth"),
    (dict(module_ports=(0, 1, 2, 4)), r"module_ports\[store\] must be a port in \[0, 3\]"),
    (dict(module_ports=(0, 1)), "one port for each"),
    (dict(dram_latency=0), "dram_latency must be at least 1"),
    (dict(ddr_bytes_per_cycle=0), "ddr_bytes_per_cycle must be positive"),
    (dict(max_burst_beats=300), "max_burst_beats"),
    (dict(batch=2.0), "batch must be an integer"),
    (dict(acc_depth=1 << 16, out_depth=1 << 16), "reduce buffer depths"),
])
def test_validation_messages(changes, message):
    with pytest.raises(ConfigError, match=message):
        # The ISA check (fields fit 128 bits) runs when the layout is derived.
        from tessera.isa import get_isa
        get_isa(PRESETS["pynq"].replace(**changes))


def test_errors_are_tessera_errors():
    with pytest.raises(TesseraError):
        get_config("no-such-preset")
    with pytest.raises(ConfigError, match="unknown HwConfig fields"):
        HwConfig.from_dict({"blok_in": 4})
    with pytest.raises(ConfigError, match="not valid JSON"):
        HwConfig.from_json("{")


def test_config_is_frozen_and_hashable():
    c = PRESETS["tiny"]
    with pytest.raises(Exception):
        c.batch = 2  # type: ignore[misc]
    assert {c: 1}[c.replace()] == 1


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("batch"), r"fields \['batch'\] are missing"),
    (lambda d: d.update(blok_in=4), r"unknown HwConfig fields \['blok_in'\]"),
    (lambda d: d.update(batch="two"), "batch must be an integer, not 'two'"),
    (lambda d: d.update(batch=3), "batch must be a power of two"),
    (lambda d: d.update(clock_mhz=None), "clock_mhz must be a number, not None"),
    (lambda d: d.update(module_ports=5), "module_ports must give one port for each"),
    (lambda d: d.update(module_ports={"load": 0}), r"module_ports lacks"),
    (lambda d: d.update(name=7), "name must be a string"),
])
def test_config_file_errors_name_the_file_and_the_key(tmp_path, edit, message):
    """A config file is a whole config: a missing, unknown or malformed key is an error
    naming the file and the key (a .tsr's config, from_dict, stays lenient on missing keys
    so older files load)."""
    data = PRESETS["pynq"].to_dict()
    edit(data)
    path = tmp_path / "my.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"config file {re.escape(str(path))}: {message}"):
        get_config(path)


def test_a_missing_key_says_how_to_write_a_whole_file_in_each_interface(tmp_path):
    from tessera.errors import CLI
    data = PRESETS["pynq"].to_dict()
    del data["clock_mhz"]
    path = tmp_path / "my.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as exc:
        HwConfig.load(path)
    assert ".save(path)" in str(exc.value) and "python -c" in exc.value.describe(CLI)
    del data["batch"]
    assert HwConfig.from_dict(data).batch == PRESETS["pynq"].batch   # .tsr files: lenient
