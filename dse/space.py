"""The design space of a sweep: a base config, the fields it varies, and each point's config.

A point's config is the base with the point's values set; the config's own checks
(:class:`~tessera.config.HwConfig` validation) decide its legality before anything is
synthesized or compiled, so an illegal point costs nothing but its line in the report.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tessera.boards import BOARDS, Board
from tessera.config import HwConfig, get_config
from tessera.errors import CLI, ConfigError, DseError

__all__ = ["Axis", "Point", "Space", "parse_axis", "refuse_without_dsps"]

#: Fields that follow another when a sweep varies it alone: the output buffer mirrors the
#: accumulator rows (``out_depth == acc_depth`` is a config rule, not a design choice).
FOLLOWERS: dict[str, tuple[str, ...]] = {"acc_depth": ("out_depth",)}

#: Fields a sweep may not vary: the config's identity and the part it is placed on (the
#: sweep's ``part`` sets it for every point).
_FIXED = ("name", "part")


@dataclass(frozen=True)
class Axis:
    """One dimension of the space: ``fields`` (one, or several that move together, such as
    ``block_in`` and ``block_out`` of a square core) take each of ``values`` in turn."""

    fields: tuple[str, ...]
    values: tuple[Any, ...]

    @property
    def label(self) -> str:
        return ",".join(self.fields)


@dataclass(frozen=True)
class Point:
    """A point of the space: its ``values`` by field, its config (``None`` when the config's
    checks refuse it) and the refusal."""

    values: tuple[tuple[str, Any], ...]
    config: HwConfig | None
    error: str = ""

    @property
    def label(self) -> str:
        """``block_out=8 wgt_depth=512``: the point's values, short enough for a table."""
        return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in self.values) or "base"

    @property
    def legal(self) -> bool:
        return self.config is not None


@dataclass(frozen=True)
class Space:
    """``base`` varied along ``axes`` (their cartesian product), placed on ``part``."""

    base: HwConfig
    axes: tuple[Axis, ...] = field(default_factory=tuple)
    part: str = ""

    @classmethod
    def of(cls, base: str | HwConfig, axes: Mapping[str, Sequence[Any]] | Sequence[Axis],
           part: str | None = None) -> "Space":
        """A space from a preset name (or config) and ``{"block_out": [8, 16], "block_in,
        block_out": [8, 16], ...}`` (a key naming several fields moves them together)."""
        config = get_config(base)
        part = board_part(part or config.part)
        if isinstance(axes, Mapping):
            axes = [Axis(tuple(f.strip() for f in k.split(",")), tuple(v))
                    for k, v in axes.items()]
        space = cls(config, tuple(axes), part)
        space.check()
        return space

    def check(self) -> None:
        """:class:`DseError` for an axis naming an unknown or fixed field, a field on two
        axes, or no values."""
        known = set(HwConfig.__dataclass_fields__)
        seen: set[str] = set()
        for axis in self.axes:
            for name in axis.fields:
                if name not in known or name in _FIXED:
                    why = "is fixed by the sweep" if name in _FIXED else "is not a field"
                    raise DseError(f"axis {axis.label!r}: {name!r} {why}; the fields a sweep "
                                   f"varies: {', '.join(numeric_fields())}",
                                   fix={CLI: "give --vary FIELD=V1,V2 with one of them"})
                if name in seen:
                    raise DseError(f"field {name!r} is on two axes",
                                   fix={CLI: "give each field in one --vary only"})
                seen.add(name)
            if not axis.values:
                raise DseError(f"axis {axis.label!r} has no values",
                               fix={CLI: f"give values: --vary {axis.label}=V1,V2"})

    def points(self) -> list[Point]:
        """Every point of the space, legal or not, in a fixed order."""
        grids = [[(axis, v) for v in axis.values] for axis in self.axes]
        return [self._point(combo) for combo in itertools.product(*grids)]

    def _point(self, combo: Sequence[tuple[Axis, Any]]) -> Point:
        values = tuple((axis.label, v) for axis, v in combo)
        changes: dict[str, Any] = {"part": self.part}
        for axis, v in combo:
            for name in axis.fields:
                changes[name] = v
                for follower in FOLLOWERS.get(name, ()):
                    if not any(follower in a.fields for a in self.axes):
                        changes[follower] = v
        try:
            config = self.base.replace(**changes)
            config = config.replace(name=design_name(config))
            board = board_of(self.part)
            if board is not None:
                board.check(config)
        except (ConfigError, TypeError) as exc:
            return Point(values, None, _without_name(str(exc)))
        return Point(values, config)


def refuse_without_dsps(point: Point, part: str) -> Point:
    """``point`` refused when its GEMM core alone needs more DSP48s than ``part`` has (a
    multiplier each, :func:`tessera.hw.tensor.gemm_multipliers`): no synthesis is spent
    on a design that cannot fit. Needs the hw extra, as synthesis does."""
    from tessera.hw.synth.resources import part_capacity
    from tessera.hw.tensor import gemm_multipliers
    if point.config is None:
        return point
    need, have = gemm_multipliers(point.config), part_capacity(part).dsp
    if need <= have:
        return point
    return Point(point.values, None, f"its GEMM core needs {need} DSP48s (a multiplier each), "
                                     f"more than the {have} of {part}")


def board_of(part: str) -> Board | None:
    """The board carrying ``part`` exactly, if any."""
    return next((b for b in BOARDS.values() if b.part.lower() == part.lower()), None)


def board_part(part: str) -> str:
    """``part`` in full: a board's part it abbreviates (``xc7z020`` -> the PYNQ boards'
    ``xc7z020clg400-1``), else as given."""
    for board in BOARDS.values():
        if board.part.lower().startswith(part.lower()):
            return board.part
    return part


def _without_name(message: str) -> str:
    """A config check's message without the config name it ends with (the base's, or a
    generated one: the point's values say which it is)."""
    return re.sub(r" \(config '[^']*'\)", "", message)


def numeric_fields() -> list[str]:
    """The HwConfig fields a sweep can vary from the command line (integers and numbers)."""
    return [f.name for f in dataclasses.fields(HwConfig)
            if f.type in ("int", "float", int, float) and f.name not in _FIXED]


def design_name(config: HwConfig) -> str:
    """``dse-<hash>``: the same name for the same design whatever sweep found it, so caches
    keyed by the config (the yosys resource cache) serve every sweep."""
    data = {k: v for k, v in config.to_dict().items() if k != "name"}
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    return f"dse-{digest[:10]}"


def parse_axis(text: str, base: HwConfig) -> Axis:
    """``FIELD[,FIELD]=V1,V2,...`` (the CLI's ``--vary``) as an :class:`Axis`, each value
    parsed as the type of the first field in ``base``."""
    names, sep, values = text.partition("=")
    fields = tuple(n.strip() for n in names.split(",") if n.strip())
    if not sep or not fields or not values.strip():
        raise DseError(f"--vary {text!r} is not FIELD=V1,V2,...",
                       fix={CLI: "give e.g. --vary block_out=8,16 or --vary "
                                 "block_in,block_out=8,16"})
    kind = type(getattr(base, fields[0], None))
    if kind not in (int, float):
        raise DseError(f"--vary {text!r}: {fields[0]!r} is not one of the numeric HwConfig "
                       f"fields a sweep varies ({', '.join(numeric_fields())})",
                       fix={CLI: "vary one of those; give other settings in a config file "
                                 "passed as --base"})
    parsed = []
    for raw in values.split(","):
        try:
            parsed.append(kind(raw.strip()))
        except ValueError:
            raise DseError(f"--vary {text!r}: {raw!r} is not a {kind.__name__}",
                           fix={CLI: f"give {kind.__name__} values for {fields[0]}"}) from None
    return Axis(fields, tuple(parsed))
