"""Writing Tcl for the board flow: quoting, ``set_property -dict`` lists, block-design
handles, and :class:`TclScript`, the lines a flow's steps append to."""
from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["TclScript", "bd_intf", "bd_pin", "mhz", "tcl_dict", "tcl_word"]


def mhz(value: float) -> str:
    """A frequency in MHz to the microhertz, without trailing zeros."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def tcl_word(value: object) -> str:
    """``value`` as one Tcl word."""
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_.:/+\-]+", text):
        return text
    if "\\" not in text and _balanced(text):
        return "{" + text + "}"
    return re.sub(r'([\\\[\]{}$";\s])', r"\\\1", text)


def _balanced(text: str) -> bool:
    """Whether the braces of ``text`` nest, so that ``{text}`` is one Tcl word."""
    depth = 0
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def tcl_dict(values: Mapping[str, object], prefix: str = "") -> str:
    """A ``[list K {V} ...]`` for ``set_property -dict``, one pair per line."""
    pairs = [f"    {prefix}{name} {{{value}}}" for name, value in values.items()]
    return "[list \\\n" + " \\\n".join(pairs) + " \\\n]"


def bd_pin(cell: str, pin: str) -> str:
    """The Tcl that finds the block-design pin ``cell/pin``."""
    return f"[get_bd_pins {cell}/{pin}]"


def bd_intf(cell: str, pin: str) -> str:
    """The Tcl that finds the block-design interface pin ``cell/pin``."""
    return f"[get_bd_intf_pins {cell}/{pin}]"


class TclScript:
    """A Tcl script being written, line by line."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def emit(self, *lines: str) -> None:
        """Append ``lines`` (each may hold line continuations)."""
        self.lines.extend(lines)

    def section(self, title: str, *why: str) -> None:
        """Start a section: a rule, its title and the comment lines saying why."""
        self.emit("# " + "-" * 78, f"# {title}", *(f"# {line}" for line in why))

    def text(self) -> str:
        """The script so far."""
        return "\n".join(self.lines)
