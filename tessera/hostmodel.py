"""The host CPU's cost model: what a CPU kernel, an accelerator launch and a transfer
cost on the board's processor (the IIS approach: a linear regression per kernel kind).

A :class:`HostModel` holds, per kernel kind (:data:`KINDS`), the coefficients of

    seconds = fixed + ops * per_op + elements * per_element + bytes * per_byte

over a kernel call's :class:`Work` (``ops``: MACs of a conv/matmul/recurrent layer,
window taps of a pool, 0 elsewhere; ``elements``: output elements; ``bytes``: bytes read
and written), plus the cost of running an accelerator segment from the host: a launch
(register writes, start, completion) and, per byte moved between the host's tensors and
the device buffers, a copy and a cache clean (before the accelerator reads) or
invalidate (after it writes).

Models ship as JSON files in ``tessera/hostmodels/`` (one per board CPU, each naming
the method and sources of its figures: ``docs/models.md``); ``tessera calibrate-host``
measures one on the machine it runs on and writes it where :func:`get_host_model`'s
``"local"`` finds it. Core module: the compiler's placement and the runtime's profile
both read it; numpy-free.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, astuple, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from .errors import CLI, PYTHON, ConfigError

__all__ = ["KINDS", "HostModel", "KernelCost", "Work", "builtin_host_models",
           "default_host_name", "get_host_model", "local_host_path"]

#: Kernel kinds, each with its own regression, and what its ``ops`` count.
KINDS: dict[str, str] = {
    "gemm_int8": "int8 convolution, matrix product: ops = MACs",
    "gemm_float": "float convolution, matrix product, recurrent layer: ops = MACs",
    "pool": "max/average pooling: ops = window taps",
    "elementwise": "arithmetic per element (add, mul, clip, requantize, ...)",
    "transcendental": "exp, tanh, sigmoid, erf, log, softmax, normalisations per element",
    "lookup": "an int8 table lookup per element",
    "movement": "copies, transposes, concatenation, slicing, gathers, resizes: per byte",
    "reduce": "reductions over an axis: per element read",
}


@dataclass(frozen=True)
class Work:
    """A kernel call's features: its kind and the counts the regression weighs."""

    kind: str
    ops: int = 0
    elements: int = 0
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Work":
        return cls(str(d["kind"]), int(d["ops"]), int(d["elements"]), int(d["bytes"]))


@dataclass(frozen=True)
class KernelCost:
    """One kind's coefficients (seconds per call, per op, per element, per byte)."""

    fixed: float = 0.0
    per_op: float = 0.0
    per_element: float = 0.0
    per_byte: float = 0.0

    def seconds(self, work: Work) -> float:
        return (self.fixed + work.ops * self.per_op + work.elements * self.per_element
                + work.bytes * self.per_byte)


@dataclass(frozen=True)
class HostModel:
    """A host CPU: its kernels' costs, its cores, and what driving the accelerator costs."""

    name: str
    cpu: str                               # e.g. "2x ARM Cortex-A9 at 650 MHz, NEON"
    cores: int
    kernels: Mapping[str, KernelCost]
    #: A segment's launch: register writes, start, waiting for completion.
    launch_seconds: float
    #: Host copies between the model's tensors and the device buffers.
    copy_bytes_per_second: float
    #: Cache clean before the accelerator reads a buffer, invalidate after it writes.
    flush_bytes_per_second: float
    #: How the figures were obtained (method and sources).
    source: str = ""
    #: Anything the method recorded (per-kind fit residuals, tool versions, ...).
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ConfigError(f"host model {self.name!r}: {problem}",
                              fix={CLI: "re-run tessera calibrate-host",
                                   PYTHON: f"kernels needs exactly the kinds {list(KINDS)}, "
                                           "with finite coefficients >= 0"})

    def _problem(self) -> str | None:
        """What is wrong with the figures (None if nothing): a model that prices
        anything below zero, or divides by a zero rate, would mislead every schedule."""
        missing = sorted(set(KINDS) - set(self.kernels))
        unknown = sorted(set(self.kernels) - set(KINDS))
        if missing or unknown or self.cores < 1:
            return (f"no coefficients for kernel kinds {missing}" if missing
                    else f"unknown kernel kinds {unknown}" if unknown
                    else f"cores must be >= 1, not {self.cores}")
        bad = [k for k, c in self.kernels.items()
               if not all(0 <= x < float("inf") for x in astuple(c))]
        if bad:
            return f"kernel kinds {bad} have a negative or non-finite coefficient"
        if not 0 <= self.launch_seconds < float("inf"):
            return f"launch_seconds must be finite and >= 0, not {self.launch_seconds}"
        if not (self.copy_bytes_per_second > 0 and self.flush_bytes_per_second > 0):
            return ("copy_bytes_per_second and flush_bytes_per_second must be > 0 (inf: "
                    f"free), not {self.copy_bytes_per_second} and "
                    f"{self.flush_bytes_per_second}")
        return None

    def kernel_seconds(self, work: Work) -> float:
        """Modelled time of one kernel call on one core."""
        if work.kind not in self.kernels:
            raise ConfigError(f"host model {self.name!r} has no kernel kind {work.kind!r}; "
                              f"the kinds are {list(KINDS)}")
        return self.kernels[work.kind].seconds(work)

    def transfer_seconds(self, nbytes: int) -> float:
        """Moving ``nbytes`` between the host's tensors and a device buffer, either way:
        the copy and the cache maintenance of those bytes."""
        return nbytes / self.copy_bytes_per_second + nbytes / self.flush_bytes_per_second

    def scaled(self, factor: float) -> "HostModel":
        """This model with every kernel ``factor`` times as slow (a what-if: a slower or,
        below 1, faster CPU with the same accelerator link)."""
        kernels = {k: KernelCost(*(factor * c for c in astuple(v)))
                   for k, v in self.kernels.items()}
        return replace(self, name=f"{self.name} x{factor:g}", kernels=kernels)

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kernels"] = {k: asdict(v) for k, v in self.kernels.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "host model") -> "HostModel":
        try:
            kernels = {k: KernelCost(**v) for k, v in d["kernels"].items()}
            return cls(str(d["name"]), str(d["cpu"]), int(d["cores"]), kernels,
                       float(d["launch_seconds"]), float(d["copy_bytes_per_second"]),
                       float(d["flush_bytes_per_second"]), str(d.get("source", "")),
                       dict(d.get("details", {})))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{where} is malformed ({exc!r})",
                              fix={CLI: "write it again with tessera calibrate-host",
                                   PYTHON: "HostModel.save writes a valid one"}) from None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "HostModel":
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read host model {path}: {exc.strerror}",
                              fix={CLI: "pass --host with a board CPU's name or a file "
                                        "tessera calibrate-host wrote"}) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"host model {path} is not JSON ({exc})") from None
        return cls.from_dict(data, f"host model {path}")


_BUILTIN_DIR = Path(__file__).with_name("hostmodels")


def builtin_host_models() -> dict[str, HostModel]:
    """The shipped models by name (``tessera/hostmodels/<name>.json``)."""
    return {p.stem: HostModel.load(p) for p in sorted(_BUILTIN_DIR.glob("*.json"))}


def local_host_path() -> Path:
    """Where ``tessera calibrate-host`` writes this machine's model by default
    (``$TESSERA_HOST_MODEL`` if set)."""
    env = os.environ.get("TESSERA_HOST_MODEL")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "tessera" / "host.json"


def default_host_name(config_name: str) -> str:
    """The host model of the board a config is the preset of (the PYNQ-Z2's for a config
    of no board: the spec's first board)."""
    from .boards import BOARDS
    for board in BOARDS.values():
        if board.preset == config_name:
            return board.host
    return BOARDS["pynq-z2"].host


def get_host_model(spec: "str | Path | HostModel | None" = None,
                   config_name: str = "pynq") -> HostModel:
    """A host model: ``None`` for the config's board, a built-in's name, ``"local"`` for
    the one ``tessera calibrate-host`` measured here, or a JSON file's path."""
    if isinstance(spec, HostModel):
        return spec
    name = default_host_name(config_name) if spec is None else str(spec)
    builtins = builtin_host_models()
    if name in builtins:
        return builtins[name]
    if name == "local":
        path = local_host_path()
        if not path.exists():
            raise ConfigError(f"no host model measured on this machine ({path} does not "
                              "exist)", fix={CLI: "run tessera calibrate-host first",
                                             PYTHON: "run tessera calibrate-host first, or "
                                                     "pass host= a built-in's name"})
        return HostModel.load(path)
    if Path(name).suffix == ".json" or os.sep in name:
        return HostModel.load(name)
    raise ConfigError(f"unknown host model {name!r}; the built-in ones are "
                      f"{sorted(builtins)}, or 'local', or a .json file",
                      fix={CLI: "--host " + "|".join([*sorted(builtins), "local", "FILE.json"]),
                           PYTHON: "host=" + repr(sorted(builtins)[0]) if builtins else ""})
