"""CPU-kernel tests compile into a per-session cache folder, so results never depend on
(or pollute) the user's ``~/.cache/tessera``."""
from __future__ import annotations

import pytest

from tessera.runtime import jit


@pytest.fixture(scope="session", autouse=True)
def _session_llvm_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_CACHE", str(tmp_path_factory.mktemp("tessera-cache")))
    # A Jit made before this fixture would still point at the old folder.
    mp.setattr(jit, "_jit", None)
    yield
    mp.undo()
