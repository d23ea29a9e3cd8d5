"""Model compression: prune a float ONNX model's weights to the patterns Tessera's
backends run faster (accelerator weight blocks, CPU N:M groups; :mod:`tessera.sparsity`).

>>> result = tessera.compress.prune("net.onnx", pattern="block", sparsity=0.75,
...                                 calibration=samples)          # doctest: +SKIP
>>> print(result); result.save("net-pruned.onnx")                 # doctest: +SKIP

:func:`prune` chooses each layer's sparsity by a knapsack DP over the output errors
onnxruntime measures with one layer pruned at a time (:mod:`.prune`).
"""
from .prune import STRATEGIES, LayerResult, PruneResult, prune

__all__ = ["LayerResult", "PruneResult", "STRATEGIES", "prune"]
