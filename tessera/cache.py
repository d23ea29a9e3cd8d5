"""Where Tessera keeps build caches (Verilator models, JIT-compiled CPU kernels)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    """The cache folder for ``kind`` (e.g. ``"verilator"``, ``"llvm"``):
    ``$TESSERA_CACHE/<kind>``, else ``$XDG_CACHE_HOME/tessera/<kind>``, else
    ``~/.cache/tessera/<kind>``. Not created here."""
    base = os.environ.get("TESSERA_CACHE")
    if base:
        return Path(base) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg or Path.home() / ".cache") / "tessera" / kind
