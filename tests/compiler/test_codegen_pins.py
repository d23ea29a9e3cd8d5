"""Process replay: refactors must not change generated code.

Every zoo model (and ResNet-18) is quantized, compiled and digested: the accelerator
programs (instruction streams, uop kernels, packed weights, the DRAM image), their
manifests, the CPU kernels' LLVM IR and constants, and the placements. The digests are
pinned below; a change that alters codegen on purpose re-pins them with::

    python -m tests.compiler.test_codegen_pins

The digest of the quantized model each compile starts from is pinned too: onnxruntime's
calibration runs the float model, so another onnxruntime version (or another MLAS path on
another CPU) can produce other scales. Then the program digests do not apply and the test
says so instead of reporting a codegen change that did not happen.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from onnx import numpy_helper

import tessera
from tessera.compiler import zoo

#: (model, config) -> (digest of the QDQ model compiled, digest of the compiled model).
PINS: dict[tuple[str, str], tuple[str, str]] = {
    ('mlp', 'pynq'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', '955e54d851981267f544a6669d782403c8871d28d35c79e2a82739dc46e61345'),
    ('lenet', 'pynq'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', '8f2903d8d305924c17d17bb0ca6653f91fbbc26d702336a51b5b0b8633b92220'),
    ('small_resnet', 'pynq'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', 'b80260d5c10dfda10b1ca05853bf2af9545dd47fd8654709a783598d980145bc'),
    ('mobilenet', 'pynq'): ('30279c9d6c8d0a1b16a2be032ddb6b36b2754229a4caec2597670c0c428e32db', '7f3dcd70cdbcda29762236ef63258e4e918265f4554e74c1b4e71c9e045f316f'),
    ('resnet18', 'pynq'): ('9bd857259fb169003c58b916ae1674485002a005564f140f2c225c1500aa9846', '67694365ea30a264af5df26f31642e306f2d1f539092e3c73a68b730c1bdacb7'),
    ('mlp', 'tiny'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', '9d6f41fc1d264b827f676a1fd23a405c5e35b591a20d06cf2ecef088c87bb4d0'),
    ('lenet', 'tiny'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', '0f5d9a460011dad70c91c58dbf1070af92d87d78ae1444722d8aa0179c21657d'),
    ('small_resnet', 'tiny'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '6dd5a23e0a6d95338da9d862e2a53c7fc42bb36fece391daa7162efa79b66675'),
    ('small_resnet', 'zcu104'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '08c60687629fd1dbe4c6fa84df6260a7006dea040f980445dd7adb5e730a0fc9'),
}

CASES = [("mlp", "pynq"), ("lenet", "pynq"), ("small_resnet", "pynq"), ("mobilenet", "pynq"),
         ("resnet18", "pynq"), ("mlp", "tiny"), ("lenet", "tiny"), ("small_resnet", "tiny"),
         ("small_resnet", "zcu104")]


def quantized_digest(reference) -> str:
    """Digest of a QDQ model's initializers (weights, scales, zero points) and nodes."""
    h = hashlib.sha256()
    for t in sorted(reference.graph.initializer, key=lambda t: t.name):
        h.update(t.name.encode())
        h.update(np.ascontiguousarray(numpy_helper.to_array(t)).tobytes())
    for node in reference.graph.node:
        h.update(node.SerializeToString())
    return h.hexdigest()


def compiled_digest(compiled) -> str:
    """Digest of everything a compiled model file holds but the compile time."""
    mf = compiled.to_modelfile()
    manifest = {**mf.manifest, "compile_seconds": 0.0}
    h = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode())
    for name in sorted(mf.blobs):
        value = mf.blobs[name]
        h.update(name.encode())
        h.update(value.tobytes() if isinstance(value, np.ndarray) else bytes(value))
    for name in sorted(mf.texts):
        h.update(name.encode())
        h.update(mf.texts[name].encode())
    return h.hexdigest()


def digests(model_name: str, config: str) -> tuple[str, str]:
    """(QDQ digest, compiled digest) of a zoo model compiled for ``config``."""
    model = zoo.ZOO[model_name]()
    compiled = tessera.compile(model, config, calibration=zoo.calibration_data(model)).compiled
    return quantized_digest(compiled.reference), compiled_digest(compiled)


@pytest.mark.parametrize("model_name,config", CASES, ids=[f"{m}-{c}" for m, c in CASES])
def test_compiled_programs_match_their_pins(model_name, config):
    pinned_qdq, pinned_program = PINS[(model_name, config)]
    qdq, program = digests(model_name, config)
    if qdq != pinned_qdq:
        pytest.skip(f"onnxruntime quantized {model_name} differently here (another "
                    "onnxruntime or MLAS path); the program pins apply to the pinned scales")
    assert program == pinned_program, (
        f"{model_name} on {config} compiles to other bytes than pinned; if the change "
        "means to alter codegen, re-pin with python -m tests.compiler.test_codegen_pins")


def test_every_zoo_model_is_pinned():
    assert {m for m, _ in CASES} == set(zoo.ZOO)
    assert set(PINS) == set(CASES)


if __name__ == "__main__":
    for case in CASES:
        print(f"    {case!r}: {digests(*case)!r},", flush=True)
