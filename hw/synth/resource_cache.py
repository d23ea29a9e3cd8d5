"""Cached resource reports: one yosys synthesis of a config for a part, kept on disk.

Synthesis of a large config takes minutes, and its result changes only with the design's
sources, the part, the yosys script and the yosys version; :func:`cache_key` hashes them
all. The design's sources come in as one string (``sources``) because what the exported
Verilog depends on is worked out where the Verilator builds are cached
(:func:`tessera.hw.harness.verilator_build.source_key`), a layer above this one. Entries
live under ``tessera.cache.cache_dir("resources")``, one JSON file each, holding the cell
counts the report is rebuilt from (so a capacity table edit needs no new synthesis).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from tessera.cache import cache_dir
from tessera.config import HwConfig

from . import export, resources
from .resources import ResourceReport, count_resources, family_of, synth_script, yosys_version

__all__ = ["cache_key", "load", "store", "synthesize_and_store"]

#: Bumped whenever what an entry holds changes.
_FORMAT = 1


def cache_key(sources: str, top: str, part: str) -> str:
    """The key of a synthesis of ``top`` for ``part``: the design's ``sources`` key, the
    part, the yosys script :func:`~.resources.synthesize` runs and the yosys version."""
    data = {"format": _FORMAT, "sources": sources, "part": part.lower(),
            "script": synth_script(top, family_of(part)), "yosys": yosys_version()}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def _path(key: str) -> Path:
    return cache_dir("resources") / f"{key}.json"


def load(key: str) -> ResourceReport | None:
    """The cached report of ``key``, or ``None`` (none cached, or an unreadable entry)."""
    try:
        entry = json.loads(_path(key).read_text())
        return count_resources(entry["cells"], entry["top"], entry["part"], entry["warnings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(key: str, report: ResourceReport) -> Path:
    """Keep ``report`` under ``key``; written to a temporary file and renamed, so a
    concurrent reader never sees half an entry."""
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"top": report.top, "part": report.part, "cells": dict(report.cells),
             "warnings": list(report.warnings)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    os.replace(tmp, path)
    return path


def synthesize_and_store(config: HwConfig, part: str, key: str,
                         progress: Callable[[str], None] | None = None,
                         timeout: float | None = None,
                         reuse: bool = True) -> tuple[ResourceReport, bool]:
    """``(report, synthesized)``: ``config``'s design (:func:`~.export.design_config`)
    synthesized for ``part``, the report kept under ``key``; ``progress`` gets the export's and yosys's stages, ``timeout``
    bounds yosys (:func:`~.resources.synthesize`'s default if ``None``).

    The sources key misses whenever a source the export imports changed, even where this
    design's Verilog did not (an edit for another config): the report is also kept under
    the Verilog's own key, and found there without synthesizing again (unless not
    ``reuse``: the caller asked for a new synthesis)."""
    stage = progress or (lambda text: None)
    verilog = export.verilog(export.design_config(config), stage)
    by_text = cache_key(hashlib.sha256(verilog.encode()).hexdigest(), export.TOP_NAME, part)
    report = load(by_text) if reuse else None
    synthesized = report is None
    if report is None:
        bound = {} if timeout is None else {"timeout": timeout}
        report = resources.synthesize(verilog, export.TOP_NAME, part,
                                      progress=lambda name: stage(f"yosys {name}"), **bound)
        store(by_text, report)
    store(key, report)
    return report, synthesized
