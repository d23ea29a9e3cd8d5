"""tessera.hostmodel: the host CPU's cost model (arithmetic, checks, files, resolution) and
the shipped board models."""
from __future__ import annotations

import json
import math

import pytest

from tessera.errors import ConfigError
from tessera.hostmodel import (KINDS, HostModel, KernelCost, Work, builtin_host_models,
                               default_host_name, get_host_model, local_host_path)


def _model(name: str = "test", **changes) -> HostModel:
    kernels = {k: KernelCost(1e-6 * (i + 1), 1e-9, 2e-9, 3e-9) for i, k in enumerate(KINDS)}
    fields = dict(name=name, cpu="a test CPU", cores=2, kernels=kernels, launch_seconds=1e-4,
                  copy_bytes_per_second=1e9, flush_bytes_per_second=2e9, source="made up",
                  details={"note": [1, 2]})
    fields.update(changes)
    return HostModel(**fields)


def test_kernel_cost_is_the_linear_form() -> None:
    cost = KernelCost(fixed=1.0, per_op=2.0, per_element=3.0, per_byte=4.0)
    assert cost.seconds(Work("pool", ops=10, elements=100, bytes=1000)) == 1 + 20 + 300 + 4000


def test_model_prices_kernels_launches_and_transfers() -> None:
    model = _model()
    work = Work("reduce", ops=5, elements=7, bytes=11)
    assert model.kernel_seconds(work) == pytest.approx(8e-6 + 5e-9 + 14e-9 + 33e-9)
    assert model.transfer_seconds(1000) == pytest.approx(1000 / 1e9 + 1000 / 2e9)
    with pytest.raises(ConfigError, match="no kernel kind 'bogus'"):
        model.kernel_seconds(Work("bogus"))


def test_scaled_slows_kernels_only() -> None:
    model, work = _model(), Work("gemm_int8", ops=1000, elements=10, bytes=100)
    slow = model.scaled(3)
    assert slow.kernel_seconds(work) == pytest.approx(3 * model.kernel_seconds(work))
    assert slow.launch_seconds == model.launch_seconds
    assert slow.transfer_seconds(64) == model.transfer_seconds(64)
    assert slow.name == "test x3"


@pytest.mark.parametrize("changes, words", [
    ({"kernels": {k: KernelCost() for k in list(KINDS)[1:]}}, "no coefficients"),
    ({"kernels": {**{k: KernelCost() for k in KINDS}, "gpu": KernelCost()}}, "unknown kernel"),
    ({"cores": 0}, "cores must be >= 1"),
    ({"kernels": {k: KernelCost(per_op=-1e-9) for k in KINDS}}, "negative or non-finite"),
    ({"kernels": {k: KernelCost(fixed=math.nan) for k in KINDS}}, "negative or non-finite"),
    ({"launch_seconds": -1.0}, "launch_seconds must be finite"),
    ({"copy_bytes_per_second": 0.0}, "must be > 0"),
    ({"flush_bytes_per_second": -5.0}, "must be > 0"),
])
def test_bad_models_are_refused(changes: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        _model(**changes)


def test_file_round_trip(tmp_path) -> None:
    model = _model(flush_bytes_per_second=math.inf)     # a coherent host: flushing is free
    path = model.save(tmp_path / "sub" / "host.json")
    assert HostModel.load(path) == model
    assert HostModel.load(path).transfer_seconds(1e9) == pytest.approx(1.0)


def test_bad_files_say_what_is_wrong(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read host model"):
        HostModel.load(tmp_path / "missing.json")
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        HostModel.load(tmp_path / "text.json")
    data = _model().to_dict()
    del data["launch_seconds"]
    (tmp_path / "short.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="malformed"):
        HostModel.load(tmp_path / "short.json")


def test_resolution_of_names(tmp_path, monkeypatch) -> None:
    builtins = builtin_host_models()
    model = _model()
    assert get_host_model(model) is model
    assert get_host_model(None, "pynq").name == default_host_name("pynq") == "cortex-a9"
    assert get_host_model(None, "zcu104").name == "cortex-a53"
    assert get_host_model("cortex-a53") == builtins["cortex-a53"]
    path = model.save(tmp_path / "mine.json")
    assert get_host_model(str(path)) == model
    monkeypatch.setenv("TESSERA_HOST_MODEL", str(tmp_path / "local.json"))
    assert local_host_path() == tmp_path / "local.json"
    with pytest.raises(ConfigError, match="calibrate-host"):
        get_host_model("local")
    _model("here").save(local_host_path())
    assert get_host_model("local").name == "here"
    with pytest.raises(ConfigError, match="unknown host model 'nope'"):
        get_host_model("nope")


def test_local_path_defaults_to_the_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("TESSERA_HOST_MODEL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert local_host_path() == tmp_path / "tessera" / "host.json"


@pytest.mark.parametrize("name, cores", [("cortex-a9", 2), ("cortex-a53", 4)])
def test_shipped_models_name_their_method(name: str, cores: int) -> None:
    model = builtin_host_models()[name]
    assert model.cores == cores
    assert "llvm-mca" in model.source and "PROVISIONAL" not in model.source
    assert {"llvm-mca", "llvmlite"} <= set(model.details["tools"])
    assert set(model.details["kinds"]) == set(KINDS)
    for kind, cost in model.kernels.items():
        assert min(cost.fixed, cost.per_op, cost.per_element, cost.per_byte) >= 0
        assert cost.seconds(Work(kind, 10**6, 10**6, 10**6)) > 0, kind
        assert model.details["kinds"][kind]["max_rel"] >= 0
    assert model.launch_seconds > 0 and model.copy_bytes_per_second > 0
    assert model.details["sources"]["memcpy"].startswith("https://")


def test_the_boards_cpus_rank_as_they_should() -> None:
    """The Cortex-A53 at 1.2 GHz runs every kind's mid-size call faster than the A9 at
    650 MHz (the analysis, not an assumption, gives the figures; this checks their sense)."""
    a9, a53 = builtin_host_models()["cortex-a9"], builtin_host_models()["cortex-a53"]
    for kind in KINDS:
        calls = a9.details["kinds"][kind]["calls"]
        work = Work.from_dict(calls[len(calls) // 2]["work"])
        assert a53.kernel_seconds(work) < a9.kernel_seconds(work), kind
