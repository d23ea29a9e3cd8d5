"""The compiler's frontend: models in, a verified graph of integer nodes out.

* :mod:`.onnx_import`: ONNX in and out of the graph IR (checks, shapes, constant
  folding), built on :mod:`.upgrade` (old IR versions repaired, opsets 7-27 converted to
  17, ops newer than 17 expanded into their function bodies) and :mod:`.shapes` (shape
  subgraphs folded, constant-condition ``If`` inlined); :mod:`.graph`: the graph IR.
* :mod:`.passes`: graph passes (batch-norm folding, identity removal).
* :mod:`.quantize`: onnxruntime's static int8 quantization (its QDQ model is the reference).
* :mod:`.qoperator`: QOperator-format nodes (QLinearConv, QLinearAdd, ...) rewritten as
  QDQ, so one fusion serves both formats.
* :mod:`.qdq`: QDQ fusion into the integer ``tessera`` nodes the backends lower;
  :mod:`.qshift`: uint8 tensors as int8 (shifted by 128); :mod:`.qlookup`: quantized
  activations as onnxruntime's 256-entry lookup tables; :mod:`.qlinear`: onnxruntime's
  arithmetic of the fused nodes (shared by the golden model and both backends).
* :mod:`.zoo`: models built in code from seeded numpy weights (``tessera.compiler.zoo``).
"""
