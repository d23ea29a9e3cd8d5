"""The accelerator backend: integer nodes in, one program per segment out.

In pipeline order:

* :mod:`.lower`: fused integer graph nodes to the operators of :mod:`.ops` (conv2d, dense,
  pooling, elementwise, with epilogue stages).
* :mod:`.build`: :func:`~.build.compile_ops`, the driver: layouts (:mod:`.layout`,
  :mod:`.packing`), each operator tensorized, DRAM planned (:mod:`.dram`), tokens inserted
  (:mod:`.sync`), the program verified (:mod:`.verify`).
* Tiling and tensorization: :mod:`.convplan` (geometry and legality), :mod:`.convcost`
  (the cycle model that picks a tiling), :mod:`.conv` (GEMM tensorizer; transposed
  convolutions as its sub-pixel phases, :mod:`.convtranspose`); :mod:`.pool` and
  :mod:`.eltwise` on the tensor ALU (:mod:`.acctile` is their shared tiling);
  :mod:`.epilogue` (stages to ALU steps); :mod:`.nest` (loop nests to hardware loops and
  uop kernels); :mod:`.emit` (the program under construction).
* :mod:`.access` (what each instruction touches: the token pass's and the verifier's
  hazard analysis) and :mod:`.roofline` (bounds for the profile and the placement).
"""
