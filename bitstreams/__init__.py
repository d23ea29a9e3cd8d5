"""Where installed bitstreams live, and finding the one built for a config.

``tessera hw bitstream`` (:mod:`tessera.bitstreams.build`) installs each build as a folder
``<root>/<board>/<config-id>/`` (``config-id``: :func:`tessera.regmap.config_id` in
8 hex digits) holding ``tessera.bit``, ``tessera.hwh`` beside it (pynq reads the
``tessera.hwh`` with the bitstream's stem), the Vivado reports and ``manifest.json``: the
config, its name and id, the board, the part, the clock, the Vivado version, when it
was built, the sha256 of the ``.bit`` and the ``tessera.hwh``, and the resource and timing
summaries.

The roots searched (:func:`search_paths`) are the ``TESSERA_BITSTREAMS`` environment
variable, a path list (``os.pathsep``-separated) whose first entry is where builds
install, or else the ``bitstreams/`` folder of a source checkout and the user's data
folder (``$XDG_DATA_HOME/tessera/bitstreams``, by default
``~/.local/share/tessera/bitstreams``). :func:`find_bitstream` checks what it finds
(the manifest's config id, the files and their sha256) so a renamed, misplaced or
damaged copy is refused with a message that says what to do.

Core: the standard library and the rest of the tessera core only, shared by the flow
that installs (:mod:`tessera.bitstreams.build`) and the driver that looks up
(:mod:`tessera.runtime.pynq_device`), so a board with just the runtime installed can
find its bitstreams.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tessera.boards import BOARDS
from tessera.config import PRESETS, HwConfig
from tessera.errors import DeviceError
from tessera.regmap import config_id

__all__ = ["BIT_NAME", "ENV_VAR", "HWH_NAME", "MANIFEST_FORMAT", "MANIFEST_NAME",
           "bitstream_dir", "check_bitstream_dir", "config_key", "default_install_root",
           "find_bitstream", "install_root", "read_manifest", "search_paths", "sha256_file",
           "source_checkout"]

#: Environment variable: the bitstream roots, ``os.pathsep``-separated; the first is
#: where ``tessera hw bitstream`` installs.
ENV_VAR = "TESSERA_BITSTREAMS"
#: The files of an installed bitstream folder. The ``tessera.hwh`` has the ``.bit``'s stem
#: because that is how pynq finds it.
BIT_NAME = "tessera.bit"
HWH_NAME = "tessera.hwh"
MANIFEST_NAME = "manifest.json"
#: Version of the manifest's layout; a reader refuses a newer one.
MANIFEST_FORMAT = 1

_CHUNK = 1 << 20


def config_key(config: HwConfig) -> str:
    """The folder name of ``config``'s bitstreams: its config id in 8 hex digits."""
    return f"{config_id(config):08x}"


def source_checkout() -> Path | None:
    """The repository root when tessera runs from a source checkout (an editable install
    or ``PYTHONPATH``), else ``None`` (an installed wheel)."""
    import tessera
    root = Path(tessera.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    # A wheel's site-packages has no pyproject.toml (reading it fails); a checkout's names
    # the project.
    with contextlib.suppress(OSError):
        if 'name = "tessera"' in pyproject.read_text(errors="replace") and (root / "hw").is_dir():
            return root
    return None


def default_install_root() -> Path:
    """Where builds install without ``TESSERA_BITSTREAMS``: the checkout's ``bitstreams/``
    folder, else ``$XDG_DATA_HOME/tessera/bitstreams`` (``~/.local/share/...``)."""
    checkout = source_checkout()
    if checkout is not None:
        return checkout / "bitstreams"
    return _user_root()


def _user_root() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser() / "tessera" / "bitstreams"


def _env_paths() -> list[Path]:
    value = os.environ.get(ENV_VAR, "")
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()]


def search_paths() -> list[Path]:
    """The bitstream roots, in the order they are searched (existing or not):
    ``TESSERA_BITSTREAMS`` when set, else the checkout's ``bitstreams/`` (in a source
    checkout) and the user's data folder."""
    paths = _env_paths()
    if not paths:
        checkout = source_checkout()
        paths = ([checkout / "bitstreams"] if checkout is not None else []) + [_user_root()]
    unique: list[Path] = []
    for p in paths:
        if p not in unique:
            unique.append(p)
    return unique


def install_root() -> Path:
    """Where a build installs: the first ``TESSERA_BITSTREAMS`` entry, else
    :func:`default_install_root`."""
    env = _env_paths()
    return env[0] if env else default_install_root()


def bitstream_dir(config: HwConfig, board: str, root: str | Path | None = None) -> Path:
    """The folder of ``config``'s bitstream for ``board`` under ``root`` (default
    :func:`install_root`)."""
    return Path(root if root is not None else install_root()) / board / config_key(config)


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The ``manifest.json`` of an installed bitstream folder, or :class:`DeviceError`
    when it is missing or unreadable."""
    path = Path(directory) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DeviceError(f"{directory} has no {MANIFEST_NAME}: it is not an installed "
                          "bitstream folder (tessera hw bitstream installs them)") from None
    except (OSError, ValueError) as exc:
        raise DeviceError(f"{path} is damaged ({exc}): copy the bitstream folder again, or "
                          "rebuild it with tessera hw bitstream") from None
    if not isinstance(manifest, dict):
        raise DeviceError(f"{path} is damaged (not a JSON object): copy the bitstream folder "
                          "again, or rebuild it with tessera hw bitstream")
    if manifest.get("format", 0) > MANIFEST_FORMAT:
        raise DeviceError(f"{path} has manifest format {manifest.get('format')}, this tessera "
                          f"reads up to {MANIFEST_FORMAT}: upgrade tessera on this machine")
    return manifest


def check_bitstream_dir(directory: str | Path, config: HwConfig,
                        board: str | None = None) -> Path:
    """The ``.bit`` of the installed folder ``directory`` after checking it holds
    ``config``'s bitstream (for ``board`` when given) intact: the manifest's config id,
    both files present and their sha256 as the manifest records. Raises
    :class:`DeviceError` saying what is wrong and what to do."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    key = config_key(config)
    theirs = str(manifest.get("config_id", "?"))
    if theirs != key:
        raise DeviceError(
            f"{directory} holds the bitstream of config {manifest.get('config_name')!r} "
            f"(config id {theirs}), not of {config.name!r} (config id {key}): a bitstream "
            f"folder must keep its name <board>/<config-id>; copy the folder of config id {key} "
            f"(or build it: {_build_hint(config, board)})")
    if board is not None and manifest.get("board") not in (None, board):
        raise DeviceError(f"{directory} holds a bitstream for board {manifest.get('board')!r}, "
                          f"not {board!r}: copy the one built for {board} (or build it: "
                          f"{_build_hint(config, board)})")
    sums = manifest.get("sha256") or {}
    for name in (BIT_NAME, HWH_NAME):
        path = directory / name
        if not path.is_file():
            raise DeviceError(f"{directory} lacks {name} (its manifest lists it): copy the "
                              "whole bitstream folder again")
        want = sums.get(name)
        if want is None:
            raise DeviceError(f"{directory / MANIFEST_NAME} has no sha256 of {name}: the manifest "
                              "is damaged; copy the bitstream folder again")
        got = sha256_file(path)
        if got != want:
            raise DeviceError(f"{path} is damaged: its sha256 is {got[:16]}..., the manifest "
                              f"records {str(want)[:16]}... (a truncated or altered copy); copy "
                              "the bitstream folder again or rebuild it")
    return directory / BIT_NAME


def _candidate_boards(config: HwConfig, root: Path) -> list[str]:
    """Board folders to try under ``root``: the boards whose preset is the config's name
    first, then any other board folder there."""
    preferred = [name for name, b in BOARDS.items() if b.preset == config.name]
    try:
        others = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in preferred)
    except OSError:
        others = []
    return preferred + others


def _build_hint(config: HwConfig, board: str | None) -> str:
    if board is None:
        boards = [name for name, b in BOARDS.items() if b.preset == config.name]
        board = boards[-1] if boards else "BOARD"
    # A preset is named on the command line; any other config goes in as its JSON file.
    cfg = config.name if PRESETS.get(config.name) == config else f"{config.name}.json"
    return f"tessera hw bitstream --board {board} --config {cfg}"


def find_bitstream(config: HwConfig, board: str | None = None) -> Path:
    """The installed ``.bit`` built for ``config`` (for ``board`` when given), its ``tessera.hwh``
    beside it.

    Searches ``<root>/<board>/<config-id>/`` in each of :func:`search_paths`; without
    ``board``, the boards whose preset is the config's name come first, then any board
    folder found. Each candidate is checked (:func:`check_bitstream_dir`); the first
    intact one wins. Raises :class:`DeviceError` listing where it looked (and what was
    wrong with what it found) and how to build one.
    """
    key = config_key(config)
    problems: list[str] = []
    roots = search_paths()
    for root in roots:
        boards = [board] if board is not None else _candidate_boards(config, root)
        for name in boards:
            directory = root / name / key
            if not directory.is_dir():
                continue
            try:
                return check_bitstream_dir(directory, config, name)
            except DeviceError as exc:
                problems.append(str(exc))
    where = ", ".join(str(r) for r in roots)
    env = os.environ.get(ENV_VAR)
    source = f"{ENV_VAR}={env}" if env else f"the defaults; set {ENV_VAR} to search elsewhere"
    on = f"board {board}" if board is not None else "any board"
    found = ("; ".join(problems) + ". ") if problems else ""
    raise DeviceError(
        f"{found}no usable bitstream for config {config.name!r} (config id {key}) on {on}: "
        f"looked for <board>/{key}/{MANIFEST_NAME} in {where} ({source}). Build one with "
        f"`{_build_hint(config, board)}` and copy the folder <board>/{key}/ it installs into "
        "one of these, or give the path of a .bit (bitstream=..., tessera run --bitstream)")
