"""The compiled-model container: one ``.tsr`` file per model.

A :class:`ModelFile` holds everything a runtime needs: a graph manifest (JSON),
the :class:`~tessera.config.HwConfig`, named binary sections (raw bytes,
numpy arrays, and :class:`~tessera.isa.Program` files) and named text sections
(e.g. CPU-kernel LLVM IR). Loading it needs only numpy and the standard library.

File format (``.tsr``, little-endian):

====================  ========================================================
``TSRMODEL``          8-byte magic
u16                   format version (:data:`FORMAT_VERSION`)
u32                   header length in bytes
header                JSON object (ASCII): ``format_version`` (again),
                      ``tessera_version`` (or null), ``created`` (UTC, ISO
                      8601), ``config`` (``HwConfig.to_dict()``), ``config_id``
                      (:func:`tessera.regmap.config_id`), ``manifest`` and
                      ``sections``, the section table
zero padding          up to the next multiple of :data:`ALIGN` bytes: the data
                      area starts there
sections              in table order, each starting at a multiple of
                      :data:`ALIGN` from the data-area start (zero padding
                      between), so a loader can mmap arrays in place
u32                   CRC-32 of every byte before it
====================  ========================================================

Each section-table entry has ``name``, ``kind`` (``blob``: raw bytes,
``array``: a numpy array, ``text``: UTF-8 text), ``offset`` (from the start of
the data area), ``size`` in bytes, ``dtype`` (numpy ``dtype.str``, e.g.
``"<i4"``) and ``shape`` (a list; both null unless ``kind`` is ``array``;
arrays are stored C-contiguous) and ``sha256`` (hex digest of the section).
Blobs and arrays share one namespace (:attr:`ModelFile.blobs`), texts another.
Programs are blobs holding the program's own ``.tsp`` bytes.

Loading checks, in order: the magic, the format version (a file of another
version must be recompiled), the header length, the header (valid JSON, the
fields above with the right types, a consistent section table; if these fail
in a file that also fails its CRC, the file is reported damaged), the file size
against the table (truncated), the CRC (damaged), the config (valid, and its id
as this Tessera computes it) and each section's sha256. Every failure is a
:class:`~tessera.errors.ProgramFileError` that says what is wrong and what to do.

The writer is deterministic: the same content and creation time give the same
bytes (sections are written sorted by name, the header with sorted keys).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from .config import HwConfig
from .errors import ConfigError, ProgramFileError, TesseraError
from .isa.program import Program
from .regmap import config_id

MAGIC = b"TSRMODEL"
FORMAT_VERSION = 1
#: Alignment of the data area and of every section in it (a cache line, and a
#: multiple of every numpy item size, so mmapped arrays are aligned).
ALIGN = 64
KINDS = ("blob", "array", "text")

_PREFIX = struct.Struct("<8sHI")           # magic, format version, header length
_CRC = struct.Struct("<I")
#: The dtypes an array section may have, as written by ``dtype.str``: byte order, a
#: numeric/bool/string/datetime kind (no objects, no structured records) and a size.
_DTYPE_RE = re.compile(r"[<>|][biufcSUMm][1-9][0-9]{0,5}(\[[0-9]{0,6}[a-zA-Z]{1,2}\])?")

BlobValue = bytes | np.ndarray


@dataclass(eq=False)
class ModelFile:
    """A compiled model: manifest, config, binary and text sections.

    ``blobs`` maps names to ``bytes`` or numpy arrays (arrays load back with the
    same dtype and shape); ``texts`` maps names to strings. ``created`` is the
    creation time written to the file (``None``: the time of writing; a naive
    datetime is taken as UTC) and is set from the file on load, so re-saving a
    loaded model gives the same bytes. ``tessera_version`` is the version that
    wrote a loaded file (saving always writes the running version).
    Equality compares content only, not ``created`` or ``tessera_version``.
    """

    manifest: dict[str, Any]
    config: HwConfig
    blobs: dict[str, BlobValue] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    created: datetime | None = None
    tessera_version: str | None = None

    # ------------------------------------------------------------ access
    def array(self, name: str) -> np.ndarray:
        """The array section ``name``."""
        value = self._lookup(self.blobs, name, "binary")
        if not isinstance(value, np.ndarray):
            raise ProgramFileError(f"section {name!r} holds raw bytes, not an array")
        return value

    def text(self, name: str) -> str:
        """The text section ``name``."""
        return self._lookup(self.texts, name, "text")

    def add_program(self, name: str, program: Program) -> None:
        """Store ``program`` (for this model's config) as the blob section ``name``."""
        if program.config != self.config:
            raise ConfigError(f"program {name!r} is for config {program.config.name!r}, "
                              f"this model for {self.config.name!r}; compile it for the "
                              "model's config")
        self.blobs[name] = program.to_bytes()

    def program(self, name: str) -> Program:
        """The :class:`Program` stored by :meth:`add_program` as section ``name``."""
        value = self._lookup(self.blobs, name, "binary")
        if isinstance(value, np.ndarray):
            raise ProgramFileError(f"section {name!r} is an array, not a program")
        try:
            return Program.from_bytes(value, source=f"section {name!r}")
        except ProgramFileError:
            raise
        except (TesseraError, KeyError, TypeError, ValueError) as exc:
            # Program.from_bytes trusts a header that passed its CRC; a crafted one may not fit.
            raise ProgramFileError(f"section {name!r} is not a valid program ({exc!r}); "
                                   "recompile the model") from None

    @staticmethod
    def _lookup(sections: Mapping[str, Any], name: str, what: str) -> Any:
        if name not in sections:
            raise ProgramFileError(f"no {what} section named {name!r}; {what} sections: "
                                   f"{sorted(sections)}")
        return sections[name]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ModelFile) and self.manifest == other.manifest
                and self.config == other.config and self.texts == other.texts
                and self.blobs.keys() == other.blobs.keys()
                and all(_same_blob(v, other.blobs[k]) for k, v in self.blobs.items()))

    __hash__ = None  # type: ignore[assignment]  # mutable: dicts of sections

    # ----------------------------------------------------------- writing
    def to_bytes(self) -> bytes:
        """The ``.tsr`` file contents (see the module docstring)."""
        if not isinstance(self.manifest, dict):
            raise TypeError(f"manifest must be a dict, not {type(self.manifest).__name__}")
        table, payloads = [], []
        offset = 0
        for name, kind, payload, dtype, shape in self._sections():
            offset = _align(offset)
            table.append({"name": name, "kind": kind, "offset": offset, "size": len(payload),
                          "dtype": dtype, "shape": shape,
                          "sha256": hashlib.sha256(payload).hexdigest()})
            payloads.append((offset, payload))
            offset += len(payload)
        header = _dumps({
            "format_version": FORMAT_VERSION,
            "tessera_version": _tessera_version(),
            "created": _iso_utc(self.created or datetime.now(timezone.utc)),
            "config": self.config.to_dict(),
            "config_id": config_id(self.config),
            "manifest": self.manifest,
            "sections": table,
        })
        head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header
        data = bytearray(offset)
        for start, payload in payloads:
            data[start:start + len(payload)] = payload
        body = head + bytes(_align(len(head)) - len(head)) + data
        return body + _CRC.pack(zlib.crc32(body))

    def _sections(self) -> list[tuple[str, str, bytes, str | None, list[int] | None]]:
        """(name, kind, payload, dtype, shape) of every section, in file order."""
        out = []
        for name, value in sorted(self.blobs.items()):
            _check_name(name)
            if isinstance(value, np.ndarray):
                dtype = _array_dtype(name, value)
                out.append((name, "array", np.ascontiguousarray(value).tobytes(), dtype,
                            list(value.shape)))
            elif isinstance(value, (bytes, bytearray, memoryview)):
                out.append((name, "blob", bytes(value), None, None))
            else:
                raise TypeError(f"blob {name!r} must be bytes or a numpy array, "
                                f"not {type(value).__name__}")
        for name, value in sorted(self.texts.items()):
            _check_name(name)
            if not isinstance(value, str):
                raise TypeError(f"text {name!r} must be a str, not {type(value).__name__}")
            out.append((name, "text", value.encode("utf-8"), None, None))
        return out

    def save(self, path: str | Path) -> None:
        """Write the model to ``path`` (through a temporary file, so a failed write never
        leaves a half-written model under the final name)."""
        path = Path(path)
        blob = self.to_bytes()
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise ProgramFileError(f"cannot write model file {path}: {exc.strerror}") from None

    # ----------------------------------------------------------- reading
    @classmethod
    def load(cls, path: str | Path) -> "ModelFile":
        """Read a ``.tsr`` file; any problem is a :class:`ProgramFileError` naming ``path``."""
        try:
            blob = Path(path).read_bytes()
        except OSError as exc:
            raise ProgramFileError(f"cannot read model file {path}: {exc.strerror}") from None
        return cls.from_bytes(blob, source=str(path))

    @classmethod
    def from_bytes(cls, blob: bytes, source: str = "model") -> "ModelFile":
        """Parse ``.tsr`` bytes; ``source`` names them in error messages."""
        blob = bytes(blob)
        bad = functools.partial(_error, source)
        data_start, header_json = _read_prefix(blob, bad)
        try:
            header = _parse(header_json, bad)
            created, version, manifest, table = _check_header(header, bad)
        except ProgramFileError:
            # A header that fails its checks in an intact file is a writer bug or a crafted
            # file; in a file that fails its CRC, it is damage, and that is what to report.
            if _crc_ok(blob):
                raise
            raise bad(_DAMAGED) from None
        data_len = table[-1]["offset"] + table[-1]["size"] if table else 0
        expected = data_start + data_len + _CRC.size
        if len(blob) < expected:
            raise bad(f"truncated: the file has {len(blob)} bytes but its header describes "
                      f"{expected}; copy it again or recompile the model")
        if len(blob) > expected:
            raise bad(f"{len(blob) - expected} unexpected bytes after the last section: the "
                      "file is damaged; copy it again or recompile the model")
        if not _crc_ok(blob):
            raise bad(_DAMAGED)
        config = _check_config(header, bad)
        blobs, texts = _read_sections(memoryview(blob)[data_start:data_start + data_len],
                                      table, bad)
        return cls(manifest, config, blobs, texts, created=created, tessera_version=version)


# ------------------------------------------------------------------ writing helpers
def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dumps(header: dict[str, Any]) -> bytes:
    try:
        return json.dumps(header, sort_keys=True, separators=(",", ":")).encode("ascii")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the manifest must hold JSON values only: {exc}") from None


@functools.lru_cache(maxsize=1)
def _tessera_version() -> str | None:
    try:
        return metadata.version("tessera")
    except metadata.PackageNotFoundError:
        return None


def _iso_utc(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat()


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"section names must be non-empty strings, not {name!r}")


def _array_dtype(name: str, value: np.ndarray) -> str:
    """``value.dtype.str`` if a loader can rebuild the dtype from it."""
    if not _DTYPE_RE.fullmatch(value.dtype.str):
        raise TypeError(f"array {name!r} has dtype {value.dtype}, which a model file cannot "
                        "hold (no object, structured or zero-size dtypes)")
    return value.dtype.str


def _same_blob(a: BlobValue, b: BlobValue) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        # Bytes, not values: NaNs compare equal and dtypes must match exactly.
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())
    return bytes(a) == bytes(b)


# ------------------------------------------------------------------ reading helpers
Bad = Callable[[str], ProgramFileError]
_DAMAGED = "checksum mismatch: the file is damaged; copy it again or recompile the model"


def _error(source: str, message: str) -> ProgramFileError:
    return ProgramFileError(f"{source}: {message}")


def _crc_ok(blob: bytes) -> bool:
    return len(blob) >= _CRC.size and zlib.crc32(blob[:-_CRC.size]) == _CRC.unpack(
        blob[-_CRC.size:])[0]


def _read_prefix(blob: bytes, bad: Bad) -> tuple[int, bytes]:
    """Check magic, version and header length; return the data-area start and the header
    JSON bytes."""
    if not blob or not blob[:len(MAGIC)] == MAGIC[:len(blob)]:
        raise bad("not a Tessera model file (bad magic); .tsr files come from the compiler")
    if len(blob) < _PREFIX.size + _CRC.size:
        raise bad(f"truncated: only {len(blob)} bytes; copy it again or recompile the model")
    _, version, hlen = _PREFIX.unpack_from(blob)
    if version != FORMAT_VERSION:
        raise bad(f"model file format version {version} is not supported: this Tessera reads "
                  f"version {FORMAT_VERSION}; recompile the model with this version")
    end = _PREFIX.size + hlen
    if end + _CRC.size > len(blob):
        raise bad(f"truncated: the header needs {end + _CRC.size} bytes, the file has "
                  f"{len(blob)}; copy it again or recompile the model")
    return _align(end), blob[_PREFIX.size:end]


def _parse(header_json: bytes, bad: Bad) -> dict[str, Any]:
    try:
        header = json.loads(header_json)
    except (ValueError, RecursionError):
        # RecursionError: deeply nested JSON, which no writer produces.
        raise bad("header invalid: not valid JSON; recompile the model") from None
    if not isinstance(header, dict):
        raise bad("header invalid: not a JSON object; recompile the model")
    return header


def _get(obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str,
         bad: Bad) -> Any:
    """``obj[key]`` if present and of ``types`` (never a bool for ``int``)."""
    value = obj.get(key)
    if not isinstance(value, types) or (types is int and isinstance(value, bool)):
        raise bad(f"header invalid: {where}{key!r} is {value!r}; recompile the model")
    return value


def _check_header(header: dict[str, Any], bad: Bad
                  ) -> tuple[datetime, str | None, dict[str, Any], list[dict[str, Any]]]:
    """Validate the header fields; return created, tessera version, manifest, section table."""
    if _get(header, "format_version", int, "", bad) != FORMAT_VERSION:
        raise bad(f"header invalid: format_version {header['format_version']} does not "
                  f"match the file's version {FORMAT_VERSION}; recompile the model")
    version = _get(header, "tessera_version", (str, type(None)), "", bad)
    created_text = _get(header, "created", str, "", bad)
    try:
        created = datetime.fromisoformat(created_text)
    except ValueError:
        raise bad(f"header invalid: created {created_text!r} is not an ISO time; "
                  "recompile the model") from None
    manifest = _get(header, "manifest", dict, "", bad)
    table = _get(header, "sections", list, "", bad)
    _check_table(table, bad)
    return created, version, manifest, table


def _check_table(table: list[Any], bad: Bad) -> None:
    """Every entry well-typed, aligned, in order, without overlaps or duplicate names."""
    seen: set[tuple[bool, str]] = set()
    end = 0
    for i, entry in enumerate(table):
        where = f"section {i} "
        if not isinstance(entry, dict):
            raise bad(f"header invalid: section {i} is not an object; recompile the model")
        name = _get(entry, "name", str, where, bad)
        where = f"section {name!r} "
        kind = _get(entry, "kind", str, where, bad)
        offset = _get(entry, "offset", int, where, bad)
        size = _get(entry, "size", int, where, bad)
        _get(entry, "sha256", str, where, bad)
        if kind not in KINDS:
            raise bad(f"header invalid: {where}has unknown kind {kind!r} (known: {KINDS}); "
                      "recompile the model with this version")
        if offset % ALIGN or offset < end or size < 0:
            raise bad(f"header invalid: {where}has offset {offset} and size {size}, not an "
                      f"aligned range after the previous section; recompile the model")
        key = (kind == "text", name)
        if key in seen:
            raise bad(f"header invalid: {where}appears twice; recompile the model")
        seen.add(key)
        _check_array_entry(entry, kind, size, where, bad)
        end = offset + size


def _check_array_entry(entry: dict[str, Any], kind: str, size: int, where: str,
                       bad: Bad) -> None:
    """An array's dtype and shape describe exactly ``size`` bytes; others have neither."""
    if kind != "array":
        if entry.get("dtype") is not None or entry.get("shape") is not None:
            raise bad(f"header invalid: {where}is a {kind} but has a dtype or shape; "
                      "recompile the model")
        return
    dtype = _get(entry, "dtype", str, where, bad)
    shape = _get(entry, "shape", list, where, bad)
    if not _dtype_ok(dtype):
        raise bad(f"header invalid: {where}has unsupported dtype {dtype!r}; "
                  "recompile the model")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise bad(f"header invalid: {where}has shape {shape!r}; recompile the model")
    if math.prod(shape) * np.dtype(dtype).itemsize != size:
        raise bad(f"header invalid: {where}is {size} bytes, but shape {shape} of {dtype} "
                  "needs a different size; recompile the model")


def _dtype_ok(dtype: str) -> bool:
    """Whether ``dtype`` is a string a writer produces (``np.dtype(dtype).str``)."""
    if not _DTYPE_RE.fullmatch(dtype):
        return False
    try:
        return np.dtype(dtype).str == dtype
    except TypeError:          # e.g. an unknown datetime unit or a bool of 4 bytes
        return False


def _check_config(header: dict[str, Any], bad: Bad) -> HwConfig:
    """The header's config, which must be valid and match its config id."""
    data = _get(header, "config", dict, "", bad)
    stored_id = _get(header, "config_id", int, "", bad)
    try:
        config = HwConfig.from_dict(data)
    except (ConfigError, TypeError, ValueError) as exc:
        # Wrong field types can make HwConfig's checks raise TypeError before ConfigError.
        raise bad(f"config invalid: {exc}; recompile the model for a valid config") from None
    if config_id(config) != stored_id:
        raise bad(f"config id mismatch: the file says {stored_id:#010x}, its config "
                  f"{config.name!r} gives {config_id(config):#010x} with this Tessera; "
                  "recompile the model with this version")
    return config


def _read_sections(data: memoryview, table: list[dict[str, Any]], bad: Bad
                   ) -> tuple[dict[str, BlobValue], dict[str, str]]:
    """Check every section's sha256 and decode it."""
    blobs: dict[str, BlobValue] = {}
    texts: dict[str, str] = {}
    for entry in table:
        name, kind = entry["name"], entry["kind"]
        raw = data[entry["offset"]:entry["offset"] + entry["size"]]
        if hashlib.sha256(raw).hexdigest() != entry["sha256"]:
            raise bad(f"section {name!r} is damaged (sha256 mismatch); copy the file again "
                      "or recompile the model")
        if kind == "text":
            try:
                texts[name] = str(raw, "utf-8")
            except UnicodeDecodeError:
                raise bad(f"text section {name!r} is not UTF-8; recompile the model") from None
        elif kind == "array":
            blobs[name] = np.frombuffer(raw, dtype=entry["dtype"]).reshape(entry["shape"]).copy()
        else:
            blobs[name] = bytes(raw)
    return blobs, texts
