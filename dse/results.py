"""The results file of a sweep: one JSON line per finished job, appended and flushed as it
finishes, so a crash (of the driver, a worker, the machine) loses no finished job and a
re-run skips every job the file already holds.

A job's key is what its result depends on: the config's fields, the part, the job (the
resources or a model's digest) and, for a synthesis, the design's sources and yosys
version (:func:`~tessera.dse.evaluate.design_key`), so a changed RTL synthesizes again.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from tessera.config import HwConfig
from tessera.errors import CLI, PYTHON, DseError

__all__ = ["ResultsFile", "job_key"]


def job_key(config: HwConfig, part: str, job: str, identity: str) -> str:
    """The key of ``job`` (its result's dependencies: ``identity`` is the model's digest
    or the design key) on ``config`` for ``part``."""
    data = {"config": {k: v for k, v in config.to_dict().items() if k != "name"},
            "part": part, "job": job, "identity": identity}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:20]


class ResultsFile:
    """A JSON-lines file of job rows (``key``, ``point``, ``job``, ``values``, ``result``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: dict[str, dict[str, Any]] = {}
        if self.path.is_dir():
            raise DseError(f"results file {str(self.path)!r} is a folder",
                           fix={PYTHON: "give results= a file path",
                                CLI: "give --results FILE.jsonl"})
        if self.path.exists():
            self._drop_cut_line()
            for row in self._read():
                self.rows[row["key"]] = row

    def _drop_cut_line(self) -> None:
        """Cut a last line a crash left unfinished (no newline): its job runs again, and
        the next row starts on a line of its own."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def _read(self) -> Iterator[dict[str, Any]]:
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or "key" not in row or "result" not in row:
                    raise ValueError("not a job row")
            except ValueError as exc:
                raise DseError(f"{self.path}:{number} is not a results row ({exc})",
                               fix={PYTHON: "give results= a file a sweep wrote, or a new one",
                                    CLI: "give --results a file tessera dse wrote, or a new "
                                         "one"}) from None
            yield row

    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def append(self, row: dict[str, Any]) -> None:
        """Add ``row`` and make it durable before returning (flush and fsync)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows[row["key"]] = row
