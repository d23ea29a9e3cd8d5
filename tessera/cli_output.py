"""What the ``tessera`` commands print besides their results: other packages' log lines
and warnings (onnxruntime's ``WARNING:root:`` lines during quantization, onnx's
warnings) are collected and shown only with ``--verbose``."""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import logging
import sys
import warnings
from pathlib import Path
from typing import Iterator

__all__ = ["third_party_output", "tune_arg", "verbose_arg"]


class _Collect(logging.Handler):
    """A root log handler that keeps the records of :data:`_NOISY_PACKAGES` and hands
    every other record to the handlers it replaced (Python's last resort, printing
    warnings and errors, when there were none)."""

    def __init__(self, replaced: list[logging.Handler]) -> None:
        super().__init__()
        self.replaced = replaced or [logging.lastResort]
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if _third_party(record.pathname):
            self.records.append(record)
            return
        for handler in self.replaced:
            if handler is not None and record.levelno >= handler.level:
                handler.handle(record)


@contextlib.contextmanager
def third_party_output(verbose: bool) -> Iterator[None]:
    """Hide onnxruntime's and onnx's own log lines and Python warnings unless
    ``verbose``; one line on stderr then says how many were hidden.

    onnxruntime's quantizer logs through the root logger (``logging.warning``), which
    installs a ``WARNING:root:`` handler when the root logger has none: a handler of our
    own on the root logger keeps that from happening and collects the records.
    """
    if verbose:
        yield
        return
    root = logging.getLogger()
    saved = root.handlers[:]
    collect = _Collect(saved)
    root.handlers = [collect]
    try:
        # record=True keeps the filters in force: what they would hide stays hidden
        with warnings.catch_warnings(record=True) as caught:
            yield
    finally:
        root.handlers = saved
    noise = [w for w in caught if _third_party(w.filename)]
    for w in caught:
        if w not in noise:        # Tessera's (and others') warnings are meant for the user
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    hidden = len(collect.records) + len(noise)
    if hidden:
        print(f"({hidden} log line(s) and warning(s) of onnxruntime/onnx hidden; --verbose "
              "shows them)", file=sys.stderr)


#: The packages whose log lines and warnings :func:`third_party_output` hides.
_NOISY_PACKAGES = ("onnx", "onnxruntime")


@functools.lru_cache(maxsize=None)
def _noisy_roots() -> tuple[Path, ...]:
    """The folders of the installed :data:`_NOISY_PACKAGES`."""
    roots = []
    for name in _NOISY_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots += [Path(r).resolve() for r in spec.submodule_search_locations]
    return tuple(roots)


def _third_party(filename: str) -> bool:
    """Whether ``filename`` is a file of one of :data:`_NOISY_PACKAGES`."""
    path = Path(filename).resolve()
    return any(path.is_relative_to(root) for root in _noisy_roots())


def verbose_arg(p: argparse.ArgumentParser) -> None:
    """Add ``--verbose`` (see :func:`third_party_output`) to a command."""
    p.add_argument("--verbose", action="store_true",
                   help="show onnxruntime's and onnx's own log lines and warnings")


def tune_arg(p: argparse.ArgumentParser) -> None:
    """Add ``--tune model|sim`` (``tessera.compile``'s ``tune``) to a command."""
    p.add_argument("--tune", choices=("model", "sim"), default="model",
                   help="sim: check each convolution's tiling on the simulator, which picks "
                        "where the cost model is off by more than 2%% (slower compile; "
                        "default model)")
