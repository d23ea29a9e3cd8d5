"""Tables the benchmark scripts print: aligned text, or markdown for the docs."""
from __future__ import annotations

from typing import Sequence


def table(head: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    """``rows`` under ``head``, aligned text or a markdown table."""
    if markdown:
        cells = [list(head), *rows]
        lines = ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in cells]
        return "\n".join([lines[0], "|" + "---|" * len(head), *lines[1:]])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    return "\n".join(lines + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows])
