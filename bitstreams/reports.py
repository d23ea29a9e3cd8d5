"""Reading what Vivado writes: its version from the log, utilisation and timing from its
reports (the figures an installed bitstream's manifest records)."""
from __future__ import annotations

import re
from typing import Any

__all__ = ["parse_timing_summary", "parse_utilization", "parse_vivado_version"]

_VERSION_RE = re.compile(r"\bVivado v(\d{4}\.\d+(?:\.\d+)?)")
# The utilisation report's row names (7-series "Slice", UltraScale+ "CLB").
_RESOURCE_ROWS = {
    "LUT": ("Slice LUTs", "CLB LUTs"),
    "FF": ("Slice Registers", "CLB Registers"),
    "BRAM": ("Block RAM Tile",),
    "DSP": ("DSPs",),
    "URAM": ("URAM",),
}


def parse_vivado_version(log: str) -> str | None:
    """The Vivado version (``2023.2``) a log names, or ``None``."""
    m = _VERSION_RE.search(log)
    return m.group(1) if m else None


def _number(text: str) -> float | int | None:
    text = text.strip().lstrip("<")
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def parse_utilization(text: str) -> dict[str, dict[str, float | int | None]]:
    """LUT, FF, BRAM, DSP (and URAM on UltraScale+) ``used``/``available``/``percent``
    from a Vivado ``report_utilization`` text report; the rows found."""
    found: dict[str, dict[str, float | int | None]] = {}
    columns: dict[str, int] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if "Used" in cells:
            # a table's header: only the "Site Type" tables hold the summary rows, and
            # their columns differ by version (Prohibited appeared in 2019.x)
            columns = {name: i for i, name in enumerate(cells)} \
                if cells[0] == "Site Type" else None
            continue
        if columns is None or "Used" not in columns or "Available" not in columns:
            continue
        name = cells[0].rstrip("*").strip()
        for key, rows in _RESOURCE_ROWS.items():
            if name in rows and key not in found and len(cells) == len(columns):
                found[key] = {
                    "used": _number(cells[columns["Used"]]),
                    "available": _number(cells[columns["Available"]]),
                    "percent": _number(cells[columns["Util%"]]) if "Util%" in columns else None,
                }
    return found


def parse_timing_summary(text: str) -> dict[str, Any]:
    """WNS, TNS, WHS, THS (ns), failing endpoints and ``met`` from a Vivado
    ``report_timing_summary`` text report. ``met`` needs a WNS and WHS of at least 0
    and no failing endpoints: a report without constraints does not count as met."""
    lines = text.splitlines()
    values: dict[str, str] = {}
    for i, line in enumerate(lines):
        if re.match(r"\s*WNS\(ns\)\s+TNS\(ns\)", line):
            header = re.split(r"\s{2,}", line.strip())
            for row in lines[i + 1:i + 4]:
                cells = row.split()
                if cells and not set(row.strip()) <= {"-", " "} and len(cells) == len(header):
                    values = dict(zip(header, cells))
                    break
            break
    result: dict[str, Any] = {
        "wns_ns": _number(values.get("WNS(ns)", "")),
        "tns_ns": _number(values.get("TNS(ns)", "")),
        "whs_ns": _number(values.get("WHS(ns)", "")),
        "ths_ns": _number(values.get("THS(ns)", "")),
        "failing_endpoints": _number(values.get("TNS Failing Endpoints", "")),
        "failing_hold_endpoints": _number(values.get("THS Failing Endpoints", "")),
    }
    met = (result["wns_ns"] is not None and result["wns_ns"] >= 0
           and (result["whs_ns"] is None or result["whs_ns"] >= 0)
           and not result["failing_endpoints"] and not result["failing_hold_endpoints"])
    if "Timing constraints are not met" in text:
        met = False
    result["met"] = bool(met)
    return result
