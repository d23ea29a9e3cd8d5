"""A sweep's outputs: the table ``tessera dse`` prints, and its points as CSV and JSON."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from .sweep import PARETO_RESOURCES, PointResult, Sweep

__all__ = ["records", "table", "write_csv", "write_json"]


def records(sweep: Sweep) -> list[dict[str, Any]]:
    """One flat record per point (the illegal ones too): its values, config name, legality,
    resources used, fits, each model's latency/cycles/utilisation/floor ratio, Pareto."""
    front = {id(r) for r in sweep.pareto()}
    rows = []
    for r in sweep.results:
        rec: dict[str, Any] = {"point": r.point.label, "config": r.point.config.name,
                               **dict(r.point.values), "legal": True}
        used = (r.resources or {}).get("used", {})
        rec.update({res: used.get(res) for res in (*PARETO_RESOURCES, "FF", "LUTRAM")})
        rec["fits"] = r.fits
        for m in sweep.models:
            fig = r.models.get(m, {})
            for k in ("latency_ms", "cycles", "gemm_utilisation", "accel_mac_share",
                      "floor_ratio"):
                rec[f"{m}.{k}"] = fig.get(k)
        rec["errors"] = "; ".join(r.errors)
        rec["pareto"] = id(r) in front
        rows.append(rec)
    for p in sweep.illegal:
        rows.append({"point": p.label, "config": None, **dict(p.values), "legal": False,
                     "errors": p.error, "pareto": False})
    return rows


def write_csv(sweep: Sweep, path: str | Path) -> Path:
    rows = records(sweep)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    out = Path(path)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    return out


def write_json(sweep: Sweep, path: str | Path) -> Path:
    out = Path(path)
    data = {"base": sweep.space.base.name, "part": sweep.part, "models": sweep.models,
            "axes": {a.label: list(a.values) for a in sweep.space.axes},
            "points": records(sweep)}
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


def _cell(r: PointResult, model: str) -> str:
    fig = r.models.get(model)
    if fig is None:
        return "-"
    if "error" in fig:
        return "error"
    floor = "-" if fig["floor_ratio"] is None else f"{fig['floor_ratio']:.2f}x"
    share = fig["accel_mac_share"]
    off = f", {1 - share:.0%} of MACs on the CPU" if share is not None and share < 0.995 else ""
    return f"{fig['latency_ms']:.2f} ({floor}{off})"


def _resource_cells(r: PointResult) -> list[str]:
    if r.resources is None:
        return ["-"] * (len(PARETO_RESOURCES) + 1)
    if "error" in r.resources:
        return ["error"] * (len(PARETO_RESOURCES) + 1)
    used = r.resources["used"]
    cells = [f"{used[k]:,.1f}".removesuffix(".0") + f" ({r.share(k):.0%})"
             if r.share(k) is not None else f"{used[k]:,}" for k in PARETO_RESOURCES]
    return cells + ["yes" if r.fits else "NO"]


def _tuning_lines(sweep: Sweep) -> list[str]:
    """How often the simulator overruled the tiling cost model, per model (``tune="sim"``)."""
    lines = []
    for m in sweep.models:
        runs = [r.models[m]["tuning"] for r in sweep.results
                if r.models.get(m, {}).get("tuning")]
        if runs:
            total = {k: sum(t[k] for t in runs) for k in ("layers", "disagreed", "changed",
                                                           "model_cycles", "tuned_cycles")}
            saved = 1 - total["tuned_cycles"] / total["model_cycles"]
            lines.append(f"{m}: the cost model's tiling was off by > {runs[0]['margin']:.0%} "
                         f"on {total['disagreed']} of {total['layers']} layer checks; the "
                         f"simulator chose another on {total['changed']} ({saved:.2%} fewer "
                         "cycles in those layers)")
    return lines


def table(sweep: Sweep) -> str:
    """The points by the first model's latency, Pareto points marked ``*``, then what was
    refused or failed."""
    front = {id(r) for r in sweep.pareto()}
    head = ["point", *PARETO_RESOURCES, "fits", *(f"{m} ms (x floor)" for m in sweep.models),
            "Pareto"]
    first = sweep.models[0]
    ordered = sorted(sweep.results, key=lambda r: r.models.get(first, {}).get(
        "latency_ms", float("inf")))
    body = [[r.point.label, *_resource_cells(r), *(_cell(r, m) for m in sweep.models),
             "*" if id(r) in front else ""] for r in ordered]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))) for row in [head, *body]]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"{len(sweep.results)} legal points on {sweep.part}, {len(front)} on the "
                 f"Pareto front (latency of {', '.join(sweep.models)} against "
                 + (", ".join(PARETO_RESOURCES) if sweep.synthesized else "nothing else: "
                    "not synthesized") + "); x floor: accelerator cycles over the compute floor "
                 "of the MACs placed on the accelerator (its MACs / peak MACs per cycle)")
    lines += _tuning_lines(sweep)
    lines += [f"refused by the config's checks: {p.label}: {p.error}" for p in sweep.illegal]
    lines += [f"error at {r.point.label}: {e}" for r in sweep.results for e in r.errors]
    lines += [f"not finished (run again to retry): {f.job.label}: {f.job.job}: {f.reason}"
              for f in sweep.failures]
    return "\n".join(lines)
