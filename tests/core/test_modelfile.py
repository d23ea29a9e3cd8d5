"""The ``.tsr`` model container: round trips, determinism, and clear errors on bad files."""
import contextlib
import json
import struct
import zlib
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tessera.config import get_config
from tessera.errors import ConfigError, ProgramFileError
from tessera.isa import Finish, Load, MemType, Program
from tessera.modelfile import ALIGN, FORMAT_VERSION, MAGIC, ModelFile

CREATED = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
PREFIX = struct.Struct("<8sHI")


def make_program() -> Program:
    p = Program(get_config("tiny"))
    p.add_segment("wgt", np.arange(64, dtype=np.int8))
    p.emit(Load(mem=MemType.WGT, dram_base=p.elem_addr("wgt", MemType.WGT), y_size=1,
                x_size=4, x_stride=4), Finish())
    return p


def make_model(**overrides: Any) -> ModelFile:
    fortran = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    blobs = {
        "int8": np.arange(-6, 6, dtype=np.int8).reshape(2, 3, 2),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float64),
        "bool": np.array([True, False, True]),
        "big_endian": np.arange(5, dtype=">u2"),
        "complex": np.array([1 + 2j, np.nan], dtype=np.complex128),
        "times": np.array(["2024-01-01", "NaT"], dtype="datetime64[D]"),
        "strings": np.array(["a", "ünï"]),
        "fortran_view": fortran[:, ::2],
        "raw": bytes(range(256)),
        "no_bytes": b"",
    }
    model = ModelFile(
        manifest={"graph": {"nodes": [{"op": "conv", "name": "ç1"}], "inputs": ["x"]},
                  "scale": 0.25, "none": None},
        config=get_config("tiny"), blobs=blobs,
        texts={"kernel.ll": "; ünïcode 🎉\ndefine void @f() {\n  ret void\n}\n", "empty": ""},
        created=CREATED)
    model.add_program("main", make_program())
    for key, value in overrides.items():
        setattr(model, key, value)
    return model


def split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """The header and the data area of a valid file."""
    _, _, hlen = PREFIX.unpack_from(blob)
    end = PREFIX.size + hlen
    start = -(-end // ALIGN) * ALIGN
    return json.loads(blob[PREFIX.size:end]), blob[start:-4]


def assemble(header_json: bytes, data: bytes, version: int = FORMAT_VERSION) -> bytes:
    """A file with a correct CRC around any header and data area."""
    head = PREFIX.pack(MAGIC, version, len(header_json)) + header_json
    body = head + bytes(-len(head) % ALIGN) + data
    return body + struct.pack("<I", zlib.crc32(body))


def rewrite(blob: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """``blob`` with its header edited in place and the CRC fixed, as a crafted file is."""
    header, data = split(blob)
    edit(header)
    return assemble(json.dumps(header).encode(), data)


@pytest.fixture(scope="module")
def good() -> bytes:
    return make_model().to_bytes()


# ------------------------------------------------------------------------ round trips
def test_round_trip_through_a_file(tmp_path):
    model = make_model()
    path = tmp_path / "m.tsr"
    model.save(path)
    loaded = ModelFile.load(path)
    assert loaded == model
    assert loaded.manifest == model.manifest and loaded.config == model.config
    for name, value in model.blobs.items():
        got = loaded.blobs[name]
        if isinstance(value, np.ndarray):
            assert got.dtype == value.dtype and got.shape == value.shape
            assert got.tobytes() == np.ascontiguousarray(value).tobytes()
            assert got.flags.writeable
        else:
            assert got == value
    assert loaded.array("scalar").shape == () and loaded.array("empty").shape == (0, 4)
    assert loaded.text("kernel.ll") == model.texts["kernel.ll"]
    assert loaded.program("main") == make_program()
    assert loaded.created == CREATED and loaded.tessera_version is not None
    assert not list(tmp_path.glob("*.tmp"))


def test_empty_model_round_trips():
    model = ModelFile({}, get_config("pynq"), created=CREATED)
    assert ModelFile.from_bytes(model.to_bytes()) == model


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, min_side=0, max_side=4)))
def test_any_numeric_array_round_trips(array):
    model = ModelFile({}, get_config("tiny"), blobs={"a": array}, created=CREATED)
    got = ModelFile.from_bytes(model.to_bytes()).array("a")
    assert got.dtype == array.dtype and got.shape == array.shape
    assert got.tobytes() == array.tobytes()


# ------------------------------------------------------------------------ determinism
def test_same_content_gives_the_same_bytes(good):
    again = make_model()
    again.blobs = dict(reversed(list(again.blobs.items())))
    again.texts = dict(reversed(list(again.texts.items())))
    assert again.to_bytes() == good
    assert ModelFile.from_bytes(good).to_bytes() == good   # re-saving a loaded model


def test_naive_creation_time_is_utc(good):
    naive = make_model(created=CREATED.replace(tzinfo=None))
    assert naive.to_bytes() == good


def test_layout_is_documented_and_aligned(good):
    magic, version, _ = PREFIX.unpack_from(good)
    assert (magic, version) == (MAGIC, FORMAT_VERSION)
    header, data = split(good)
    assert header["format_version"] == FORMAT_VERSION
    assert header["created"] == "2024-05-06T07:08:09.123456+00:00"
    assert header["config"] == get_config("tiny").to_dict()
    assert isinstance(header["config_id"], int)
    start = len(good) - 4 - len(data)
    assert start % ALIGN == 0
    by_name = {s["name"]: s for s in header["sections"]}
    assert all(s["offset"] % ALIGN == 0 for s in header["sections"])
    entry = by_name["int8"]
    assert (entry["kind"], entry["dtype"], entry["shape"]) == ("array", "|i1", [2, 3, 2])
    # An array can be used in place, as an mmap of the file would be.
    view = np.frombuffer(good, dtype=entry["dtype"], count=12, offset=start + entry["offset"])
    assert np.array_equal(view.reshape(entry["shape"]), make_model().blobs["int8"])
    assert by_name["raw"]["dtype"] is None and by_name["kernel.ll"]["kind"] == "text"


# ------------------------------------------------------------------------ bad files
def flip(blob: bytes, index: int) -> bytes:
    return blob[:index] + bytes([blob[index] ^ 0xFF]) + blob[index + 1:]


def patched_section(blob: bytes) -> bytes:
    header, data = split(blob)
    start = next(s["offset"] for s in header["sections"] if s["name"] == "raw")
    data = data[:start] + b"X" + data[start + 1:]
    return assemble(json.dumps(header).encode(), data)


def set_config_field(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda header: header["config"].update(changes)


CORRUPTIONS = {
    "empty": (lambda b: b"", "not a Tessera model file"),
    "bad magic": (lambda b: b"TSPROG" + b[6:], "not a Tessera model file"),
    "magic only": (lambda b: b[:8], "truncated"),
    "truncated in the header": (lambda b: b[:40], "truncated"),
    "truncated in the data": (lambda b: b[:-100], "truncated"),
    "crc lost": (lambda b: b[:-4], "truncated"),
    "trailing bytes": (lambda b: b + b"\0" * 8, "8 unexpected bytes"),
    "data flipped": (lambda b: flip(b, len(b) - 50), "damaged"),
    "header flipped": (lambda b: flip(b, 30), "damaged"),
    "crc flipped": (lambda b: flip(b, len(b) - 1), "damaged"),
    "section edited": (patched_section, r"section 'raw' is damaged \(sha256 mismatch\)"),
    "future version": (lambda b: assemble(b"{}", b"", version=2),
                       ("format version 2 is not supported: this Tessera reads version 1; "
                        "recompile the model with this version")),
    "header not JSON": (lambda b: assemble(b"{nope", b""), "header invalid: not valid JSON"),
    "header not an object": (lambda b: assemble(b"[]", b""), "not a JSON object"),
    "deep JSON": (lambda b: assemble(b"[" * 100_000, b""), "not valid JSON"),
    "header version differs": (
        lambda b: rewrite(b, lambda h: h.update(format_version=2)),
        "format_version 2 does not match"),
    "missing manifest": (lambda b: rewrite(b, lambda h: h.pop("manifest")),
                         "header invalid: 'manifest' is None"),
    "no created": (lambda b: rewrite(b, lambda h: h.pop("created")),
                   "header invalid: 'created' is None"),
    "bad created": (lambda b: rewrite(b, lambda h: h.update(created="yesterday")),
                    "created 'yesterday' is not an ISO time"),
    "unknown kind": (lambda b: rewrite(b, lambda h: h["sections"][0].update(kind="tensor")),
                     "unknown kind 'tensor'"),
    "bad dtype": (lambda b: rewrite(b, lambda h: h["sections"][0].update(dtype="|O8")),
                  "unsupported dtype '|O8'"),
    "bad shape": (lambda b: rewrite(b, lambda h: h["sections"][0].update(shape=[1, 2])),
                  "needs a different size"),
    "overlapping sections": (lambda b: rewrite(b, lambda h: h["sections"][1].update(offset=0)),
                             "not an aligned range"),
    "config invalid": (lambda b: rewrite(b, set_config_field(block_in=12)),
                       "config invalid: block_in must be a power of two"),
    "config field of wrong type": (lambda b: rewrite(b, set_config_field(clock_mhz="fast")),
                                   "config invalid"),
    "config unknown field": (lambda b: rewrite(b, set_config_field(turbo=True)),
                             "config invalid: unknown HwConfig fields"),
    "config id differs": (lambda b: rewrite(b, lambda h: h.update(config_id=1)),
                          "config id mismatch: the file says 0x00000001"),
}


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruption_is_a_clear_error(good, name):
    corrupt, message = CORRUPTIONS[name]
    with pytest.raises(ProgramFileError, match=message) as info:
        ModelFile.from_bytes(corrupt(good), source="net.tsr")
    assert str(info.value).startswith("net.tsr: ")


def test_every_file_error_says_what_to_do(good):
    for corrupt, _ in CORRUPTIONS.values():
        with pytest.raises(ProgramFileError) as info:
            ModelFile.from_bytes(corrupt(good))
        assert any(hint in str(info.value) for hint in ("recompile", "copy it again",
                                                        "come from the compiler"))


def test_crafted_program_section_is_a_file_error(good):
    model = ModelFile.from_bytes(good)
    model.blobs["main"] = b"TSPROG" + b"\0" * 20
    with pytest.raises(ProgramFileError, match="section 'main'"):
        model.program("main")


# ------------------------------------------------------------------------ fuzzing
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.binary(max_size=300).map(lambda b: MAGIC + b))
def test_random_bytes_are_rejected(blob):
    with pytest.raises(ProgramFileError):
        ModelFile.from_bytes(blob)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_truncated_or_flipped_files_are_rejected(good, data):
    cut = data.draw(st.integers(0, len(good) - 1))
    with pytest.raises(ProgramFileError):
        ModelFile.from_bytes(good[:cut])
    index = data.draw(st.integers(0, len(good) - 1))
    mask = data.draw(st.integers(1, 255))
    with pytest.raises(ProgramFileError):
        ModelFile.from_bytes(good[:index] + bytes([good[index] ^ mask]) + good[index + 1:])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=10)
REMOVE = object()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_crafted_headers_are_rejected_or_loaded(good, data):
    """A header field (or a section-table or config field) replaced by any JSON value or
    removed, with a valid CRC: either the file still loads or it is a ProgramFileError."""
    header, _ = split(good)
    targets = [header, header["config"], *header["sections"]]
    target = data.draw(st.sampled_from(targets))
    key = data.draw(st.sampled_from(sorted(target)) | st.text(max_size=4))
    value = data.draw(JSON_VALUES | st.just(REMOVE))

    def edit(h: dict[str, Any]) -> None:
        if target is header:
            edited = h
        elif target is header["config"]:
            edited = h["config"]
        else:
            edited = h["sections"][header["sections"].index(target)]
        if value is REMOVE:
            edited.pop(key, None)
        else:
            edited[key] = value

    # Loading may succeed (the edit kept the header valid) or refuse cleanly; any other
    # exception fails the test.
    with contextlib.suppress(ProgramFileError):
        ModelFile.from_bytes(rewrite(good, edit))


# ------------------------------------------------------------------------ files and helpers
def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.tsr"
    with pytest.raises(ProgramFileError, match=f"cannot read model file {path}: No such file"):
        ModelFile.load(path)


def test_directory_names_the_path(tmp_path):
    with pytest.raises(ProgramFileError, match=f"cannot read model file {tmp_path}"):
        ModelFile.load(tmp_path)
    with pytest.raises(ProgramFileError, match=f"cannot write model file {tmp_path}"):
        make_model().save(tmp_path)
    assert not list(tmp_path.parent.glob(f"{tmp_path.name}.tmp"))


def test_save_into_a_missing_directory(tmp_path):
    path = tmp_path / "no" / "m.tsr"
    with pytest.raises(ProgramFileError, match=f"cannot write model file {path}"):
        make_model().save(path)


def test_section_accessors_explain_mistakes():
    model = make_model()
    with pytest.raises(ProgramFileError, match=r"no binary section named 'x'; binary sections: "
                                               r"\['big_endian'"):
        model.array("x")
    with pytest.raises(ProgramFileError, match="no text section named 'x'"):
        model.text("x")
    with pytest.raises(ProgramFileError, match="'raw' holds raw bytes, not an array"):
        model.array("raw")
    with pytest.raises(ProgramFileError, match="'int8' is an array, not a program"):
        model.program("int8")
    with pytest.raises(ProgramFileError, match="not a Tessera program file"):
        model.program("raw")


def test_program_for_another_config_is_refused():
    model = ModelFile({}, get_config("pynq"))
    with pytest.raises(ConfigError, match="program 'main' is for config 'tiny'"):
        model.add_program("main", make_program())


@pytest.mark.parametrize("change, message", [
    (dict(blobs={"o": np.array([object()])}), "array 'o' has dtype object"),
    (dict(blobs={"r": np.zeros(2, dtype="i4,f4")}), "array 'r' has dtype"),
    (dict(blobs={"l": [1, 2]}), "blob 'l' must be bytes or a numpy array, not list"),
    (dict(texts={"t": b"bytes"}), "text 't' must be a str, not bytes"),
    (dict(texts={"": "x"}), "section names must be non-empty strings"),
    (dict(manifest={"f": {1, 2}}), "the manifest must hold JSON values only"),
    (dict(manifest=[1]), "manifest must be a dict, not list"),
])
def test_unsavable_content_is_a_type_error(change, message):
    with pytest.raises(TypeError, match=message):
        make_model(**change).to_bytes()
