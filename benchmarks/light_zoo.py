"""The onnx package's 9 classic CNNs, compiled for "pynq", run on ``sim`` and compared
with onnxruntime, per model, weights and quantizer.

    python benchmarks/light_zoo.py [--models squeezenet,vgg19] [--quantizers tessera,...]
                                   [--weights shipped,random] [--seed N]

Weights "shipped" are the files as onnx ships them (every weight ``ConstantOfShape(0.02)``);
"random" gives every parameter random values of its shape (``tests/compiler/light_zoo.py``
``with_random_weights``). Quantizers: "tessera" (``tessera.compile(model,
calibration=...)``), "ort-default", "ort-u8-activations", "ort-per-channel"
(onnxruntime's ``quantize_static``, the QDQ model then given to ``tessera.compile``).
Calibration: 4 samples (noise and smooth waves) at 1x3x224x224; the compared input is
another structured one.

Prints one row per run as it finishes: graph nodes after fusion, conv and dense layers on
the accelerator / in the model, the fraction of int8 output values identical to
onnxruntime's (the worst output), the largest difference in steps, compile and ``sim``
seconds, and whether it meets the acceptance (every layer on the accelerator, >= 99.9%
identical, at most 1 step). Exit status 1 if a run misses it.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tessera.errors import TesseraError  # noqa: E402
from tests.compiler.light_zoo import MODELS, QUANTIZERS, Result, run  # noqa: E402

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--quantizers", default=",".join(QUANTIZERS))
    parser.add_argument("--weights", default="shipped,random")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    models, quantizers = args.models.split(","), args.quantizers.split(",")
    unknown = sorted(set(models) - set(MODELS)) + sorted(set(quantizers) - set(QUANTIZERS))
    if unknown or not set(args.weights.split(",")) <= {"shipped", "random"}:
        parser.error(f"unknown model, quantizer or weights {unknown or args.weights}; "
                     f"models: {MODELS}; quantizers: {list(QUANTIZERS)}")
    print(Result.HEADER, flush=True)
    failed = []
    for name in models:
        for weights in args.weights.split(","):
            for quantizer in quantizers:
                try:
                    result = run(name, quantizer, random_weights=weights == "random",
                                 seed=args.seed)
                except TesseraError as exc:
                    print(f"{name:<14}{weights:<9}{quantizer:<20}  ERROR {exc}", flush=True)
                    failed.append(exc)
                    continue
                print(result.row(), flush=True)
                for layer in result.layers_on_cpu:
                    print(f"    on the CPU: {layer}", flush=True)
                if not result.accepted:
                    failed.append(result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
