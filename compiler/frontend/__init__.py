"""The compiler's frontend: models in, a verified graph of integer nodes out.

* :mod:`.onnx_import`: ONNX in and out of the graph IR (checks, opset conversion, shapes,
  constant folding); :mod:`.graph`: the graph IR itself.
* :mod:`.passes`: graph passes (batch-norm folding, identity removal).
* :mod:`.quantize`: onnxruntime's static int8 quantization (its QDQ model is the reference).
* :mod:`.qdq`: QDQ fusion into the integer ``tessera`` nodes the backends lower;
  :mod:`.qlinear`: onnxruntime's arithmetic of those nodes (shared by the golden model and
  both backends).
* :mod:`.zoo`: models built in code from seeded numpy weights (``tessera.compiler.zoo``).
"""
