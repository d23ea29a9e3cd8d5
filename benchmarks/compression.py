"""Block-sparse weights on the accelerator: ResNet-18's layers and the whole model pruned to
50%, 75% and 90% zero weight blocks, their cycles against dense execution.

    python benchmarks/compression.py [--config pynq] [--layers C2,...,C11]
                                     [--sparsities 0.5,0.75,0.9] [--no-model] [--markdown]
                                     [--no-fail]

Layers. Each layer of ``resnet_layers.py`` (the spec's shapes; random int8 weights; bias +
requantize + ReLU) is pruned by ``tessera.compress``'s magnitude block pruning (the
config's 16x16 GEMM blocks per kernel tap with the least L2 norm set to zero), then
compiled twice and simulated: skipping the zero blocks (the default) and densely
(``skip_zero_blocks=False``: the same weights, every block multiplied). Columns:
``density`` (blocks kept), dense and sparse cycles, ``ideal = density x dense``,
``sparse / ideal``, the layer's ``fixed`` overhead -- its cycles with every weight block
zero, i.e. the work that does not shrink with density (input loads, the bias/requantize/
ReLU epilogue on the ALU, the stores) -- and the acceptance test ``sparse <= 1.1 x ideal +
fixed``. ``exact``: the sparse and dense outputs are bit-identical.

Whole model. The zoo's float ResNet-18 pruned uniformly (``tessera.compress.prune``,
``strategy="uniform"``: every conv and the fc layer at the sparsity), quantized by
onnxruntime, compiled both ways and run on the simulator on one input: accelerator
cycles, the ideal ``sum(density x dense cycles)`` over the layers of the dense profile,
and whether the outputs are bit-identical.

Exit status 1 when a layer misses the acceptance at 75% or an output differs, unless
``--no-fail``.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np

from resnet_layers import LAYERS, layer
from tessera.compiler import compile_ops
from tessera.config import get_config
from tessera.compress.patterns import prune_blocks
from tessera.sparsity import block_density

#: The acceptance: sparse cycles <= SLACK x density x dense + the fixed overhead.
SLACK = 1.1
#: The sparsity the acceptance applies to.
TARGET_SPARSITY = 0.75


@dataclass
class LayerRow:
    name: str
    sparsity: float
    density: float
    dense: int
    sparse: int
    fixed: int
    exact: bool

    @property
    def ideal(self) -> float:
        return self.density * self.dense

    @property
    def meets(self) -> bool:
        return self.sparse <= SLACK * self.ideal + self.fixed


def cycles_and_output(op, x, config, skip_zero_blocks: bool) -> tuple[int, np.ndarray]:
    prog = compile_ops([op], {"x": x.shape}, config, skip_zero_blocks=skip_zero_blocks)
    out, result = prog.run({"x": x})
    return result.stats.cycles, out[op.output]


def layer_rows(name: str, sparsities: list[float], config) -> list[LayerRow]:
    """The layer at each sparsity, and its all-zero form for the fixed overhead."""
    op, x = layer(name, np.random.default_rng(0))
    fixed, _ = cycles_and_output(replace(op, weight=np.zeros_like(op.weight)), x, config, True)
    rows = []
    for s in sparsities:
        w = prune_blocks(op.weight, s, config.block_out, config.block_in)
        pruned = replace(op, weight=w)
        dense, y_dense = cycles_and_output(pruned, x, config, False)
        sparse, y = cycles_and_output(pruned, x, config, True)
        rows.append(LayerRow(name, s, block_density(w, config.block_out, config.block_in),
                             dense, sparse, fixed, bool(np.array_equal(y, y_dense))))
    return rows


def layer_table(rows: list[LayerRow], markdown: bool) -> str:
    head = ["layer", "sparsity", "density", "dense", "sparse", "ideal", "sparse/ideal",
            "fixed", "<= 1.1 ideal + fixed", "exact"]
    body = [[r.name, f"{r.sparsity:.0%}", f"{r.density:.3f}", f"{r.dense:,}", f"{r.sparse:,}",
             f"{r.ideal:,.0f}", f"{r.sparse / r.ideal:.3f}", f"{r.fixed:,}",
             "yes" if r.meets else "NO", "yes" if r.exact else "NO"] for r in rows]
    return format_table(head, body, markdown)


def format_table(head: list[str], body: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(h), *(len(r[k]) for r in body)) for k, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), "-" * (sum(widths) + 2 * len(widths) - 2)]
                     + [fmt.format(*r) for r in body])


# ------------------------------------------------------------------ the whole model
def model_rows(sparsities: list[float], config) -> list[list[str]]:
    """ResNet-18 pruned uniformly to each sparsity, run sparse and dense."""
    import tessera
    from tessera.compiler.frontend import zoo
    from tessera.compiler.frontend.quantize import quantize_static
    from tessera.compress import prune

    model = zoo.resnet18()
    calibration = zoo.calibration_data(model, 4)
    x = zoo.calibration_data(model, 1, seed=1)[0]
    rows = []
    for s in sparsities:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pruned = prune(model, sparsity=s, strategy="uniform", config=config,
                           calibration=calibration).model
        qdq = quantize_static(pruned, calibration)
        runs = {}
        for skip in (False, True):
            m = tessera.compile(qdq, config, skip_zero_blocks=skip)
            outputs, profile = m.run(x, backend="sim")
            runs[skip] = (outputs, profile, m.compiled.placements)
            m.close()
        (y_dense, dense, placements), (y_sparse, sparse, _) = runs[False], runs[True]
        density = {p.node: p.density for p in placements if p.density is not None}
        ideal = sum(layer.cycles * density.get(layer.name, 1.0) for layer in dense.layers
                    if layer.cycles)
        exact = all(np.array_equal(y_dense[k], y_sparse[k]) for k in y_dense)
        kept = sum(d for d in density.values()) / max(1, len(density))
        rows.append([f"{s:.0%}", f"{kept:.3f}", f"{dense.accel_cycles:,}",
                     f"{sparse.accel_cycles:,}", f"{ideal:,.0f}",
                     f"{sparse.accel_cycles / ideal:.3f}",
                     f"{dense.accel_cycles / sparse.accel_cycles:.2f}x",
                     f"{config.cycles_to_seconds(sparse.accel_cycles) * 1e3:.1f} ms",
                     "yes" if exact else "NO", f"{time.perf_counter() - t0:.0f} s"])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="pynq")
    ap.add_argument("--layers", default=",".join(n for n in LAYERS if n != "C1"))
    ap.add_argument("--sparsities", default="0.5,0.75,0.9")
    ap.add_argument("--no-model", action="store_true", help="skip the whole-model runs")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--no-fail", action="store_true")
    args = ap.parse_args()
    config = get_config(args.config)
    sparsities = [float(s) for s in args.sparsities.split(",")]
    names = [n.strip() for n in args.layers.split(",") if n.strip()]
    print(f"ResNet-18 layers on {config.name!r}, weight blocks {config.block_out}x"
          f"{config.block_in} per tap pruned by L2 norm (simulated cycles)\n")
    rows = [r for name in names for r in layer_rows(name, sparsities, config)]
    rows.sort(key=lambda r: (r.sparsity, list(LAYERS).index(r.name)))
    print(layer_table(rows, args.markdown))
    target = [r for r in rows if abs(r.sparsity - TARGET_SPARSITY) < 1e-9]
    ok = all(r.meets and r.exact for r in target) and all(r.exact for r in rows)
    if target:
        worst = max(target, key=lambda r: r.sparse / r.ideal)
        best = min(r.sparse / r.ideal for r in target)
        print(f"\nat {TARGET_SPARSITY:.0%}: sparse / ideal {best:.3f} to "
              f"{worst.sparse / worst.ideal:.3f} ({worst.name}); "
              f"{sum(r.meets for r in target)}/{len(target)} within {SLACK} x ideal + fixed")
    if not args.no_model:
        print(f"\nResNet-18 (zoo, float) pruned uniformly, quantized, on {config.name!r}:\n")
        body = model_rows(sparsities, config)
        print(format_table(["sparsity", "density", "dense cycles", "sparse cycles", "ideal",
                            "sparse/ideal", "speedup", "latency", "exact", "time"], body,
                           args.markdown))
        ok = ok and all(r[8] == "yes" for r in body)
    print("\nall targets met" if ok else "\nTARGET MISSED")
    return 0 if ok or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
