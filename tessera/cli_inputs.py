"""What a command-line user gives a model command, as the Python API takes it.

``--input-shape NAME=D0,D1,...`` becomes ``input_shapes``; ``--inputs`` and
``--calibration`` files (``.npz`` files of arrays named as the model's inputs, or
``NAME=FILE.npy``) become a feed ``{input name: array}`` or a list of calibration feeds.
A calibration array is one sample when it has the input's rank, and a stack of samples
when it has one more, leading, axis; the samples of several files follow one another.
Every problem is a :class:`~tessera.errors.TesseraError` naming the file and the array.
"""
from __future__ import annotations

import zipfile
from typing import Sequence

import numpy as np

from .errors import TesseraError

__all__ = ["calibration_samples", "input_feeds", "input_ranks", "load_arrays",
           "parse_shapes", "random_feeds"]


def parse_shapes(items: Sequence[str] | None) -> dict[str, list[int]] | None:
    """``{name: dims}`` from ``NAME=D0,D1,...`` items (``None`` for none)."""
    if not items:
        return None
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise TesseraError(f"--input-shape {item!r}: write NAME=D0,D1,... (e.g. "
                               "input=1,3,224,224)") from None
    return shapes


def load_arrays(items: Sequence[str]) -> list[tuple[str, np.ndarray, str]]:
    """``(name, array, file)`` of every array in .npz files (named by key) and NAME=FILE.npy
    items, read in full so that a damaged file fails here, naming itself."""
    arrays = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = "", item
        try:
            data = np.load(path, allow_pickle=False)
            if isinstance(data, np.ndarray):
                found = [(name, data)]
            else:
                with data:
                    found = [(name or k, data[k]) for k in data.files]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise TesseraError(f"cannot read {path!r} as .npz or .npy arrays: {exc}") from None
        if found and not found[0][0]:
            raise TesseraError(f"{path!r} is a .npy file: name the input it holds, "
                               f"NAME={path}")
        arrays += [(n, x, path) for n, x in found]
    return arrays


def input_feeds(items: Sequence[str]) -> dict[str, np.ndarray]:
    """One feed ``{input name: array}`` from ``--inputs`` items."""
    feeds: dict[str, np.ndarray] = {}
    for name, array, path in load_arrays(items):
        if name in feeds:
            raise TesseraError(f"input {name!r} is given twice (again in {path!r})")
        feeds[name] = array
    return feeds


def random_feeds(inputs, seed: int) -> dict[str, np.ndarray]:
    """A feed of random arrays for a compiled model's ``inputs`` (its ``TensorSig``s):
    standard normal for float inputs, uniform over the dtype's range for integer ones."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in inputs:
        if np.dtype(t.dtype).kind == "f":
            feeds[t.name] = rng.standard_normal(t.shape).astype(t.dtype)
        else:
            info = np.iinfo(t.dtype)
            feeds[t.name] = rng.integers(info.min, info.max, t.shape, endpoint=True,
                                         dtype=t.dtype)
    return feeds


def input_ranks(proto, shapes: dict[str, list[int]] | None) -> dict[str, int | None]:
    """The rank of each input of the ONNX model ``proto`` (not its initializers, which old
    models list as inputs too), from ``shapes`` first; ``None`` where neither says."""
    weights = {t.name for t in proto.graph.initializer}
    shapes = shapes or {}
    return {v.name: len(shapes[v.name]) if v.name in shapes else
            len(v.type.tensor_type.shape.dim) if v.type.tensor_type.HasField("shape") else None
            for v in proto.graph.input if v.name not in weights}


def calibration_samples(items: Sequence[str], ranks: dict[str, int | None]) -> list[dict]:
    """Calibration feeds from ``--calibration`` items, for a model whose inputs have
    ``ranks`` (see the module doc for one sample or a stack)."""
    samples: dict[str, list[np.ndarray]] = {}
    for name, array, path in load_arrays(items):
        if name not in ranks:
            raise TesseraError(f"{path!r} holds {name!r}, which is not an input of the model "
                               f"(its inputs: {', '.join(ranks) or 'none'})")
        rank = ranks[name]
        if rank is not None and array.ndim not in (rank, rank + 1):
            raise TesseraError(f"{path!r}: {name!r} has shape {list(array.shape)}; give one "
                               f"sample of the input's {rank} dims, or a stack of samples "
                               "with one more, leading, axis")
        one = rank is None or array.ndim == rank
        samples.setdefault(name, []).extend([array] if one else list(array))
    counts = {name: len(v) for name, v in samples.items()}
    if not counts:
        raise TesseraError("the calibration files hold no arrays")
    if len(set(counts.values())) != 1:
        raise TesseraError(f"the calibration files hold different numbers of samples per "
                           f"input ({counts}); give every input the same number")
    return [{name: v[i] for name, v in samples.items()} for i in range(max(counts.values()))]
