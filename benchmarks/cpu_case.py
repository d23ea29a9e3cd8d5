"""One CPU-kernel benchmark case (shared by ``cpu_cases_math.py``, ``cpu_cases_data.py``
and the runner ``cpu_kernels.py``; separate module to avoid a circular import)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Case:
    """``setup()`` prepares data, compiles the kernel (its time is reported as compile
    time) and returns ``(numpy_fn, kernel_fn)``: zero-argument callables on that data
    whose results must agree (allclose for floats)."""

    op: str                 # e.g. "softmax"
    shape: str              # e.g. "1x1000"
    dtype: str
    target: float           # 1.0, or 2.0 for fused chains of >= 3 elementwise ops
    setup: Callable[[], tuple[Callable[[], object], Callable[[], object]]]


class KernelCall:
    """``kernel_fn`` of a case: calls a loaded kernel on fixed arrays and returns its
    first output. ``threads`` is what an automatic call uses; :meth:`serial` is the
    same call forced onto one thread (the runner reports both)."""

    def __init__(self, loaded, *arrays: np.ndarray) -> None:
        self.loaded = loaded
        self.arrays = arrays

    @property
    def threads(self) -> int:
        return self.loaded.threads

    def __call__(self) -> np.ndarray:
        return self.loaded(*self.arrays)[0]

    def serial(self) -> Callable[[], np.ndarray]:
        loaded, arrays = self.loaded, self.arrays
        return lambda: loaded(*arrays, threads=1)[0]
