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
    ('mlp', 'pynq'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', 'e1b7ccdc593476f00062ce305b84a1cbe356e43fdef21e8e4ab93ea583a4dd25'),
    ('lenet', 'pynq'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', '4d1db3a7abe318497d6ae2c9a56c02dfb46dd4c204109301beabe39f70a0f2f1'),
    ('small_resnet', 'pynq'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '46a152a998115d2ab9f8115045b76f0ae439162e4e040fc1eae554dd55af5f54'),
    ('mobilenet', 'pynq'): ('30279c9d6c8d0a1b16a2be032ddb6b36b2754229a4caec2597670c0c428e32db', '2f4260a2efaa72536dfaeb1d66f3646d39d6af73df35d4ef478bc070d871f6ba'),
    ('resnet18', 'pynq'): ('9bd857259fb169003c58b916ae1674485002a005564f140f2c225c1500aa9846', '20e1d233882dd0da6c79dad9c8c0a9b81515329b828b09770dfd3d614c0aa059'),
    ('mlp', 'tiny'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', 'd1e2c39647be6ce73f44e2bfdd05207f0c763c31cfc7d40519e6a47893bdd66f'),
    ('lenet', 'tiny'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', 'eb19c93b0ad8b8083603ef66594cd8b00ee379c6a11637a59e747f8afdde6ea7'),
    ('small_resnet', 'tiny'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '4add7390219fbfd8625dea5d85e4c057c85e5d285951ac11964bc37a08bbdbf1'),
    ('small_resnet', 'zcu104'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', 'd1f43a3c21c635fda20cc17d7e7168909d23c56aa565678e235635447ca62b13'),
    ('captioning', 'pynq'): ('b80da74d121ccb6c3fefb10057b582a20dd5638b478361837633ef036ab8350f', 'c899120bd22a19c0a4c42b1ca6917362570843f128e92e94f38b31ce39259c13'),
    ('inception', 'pynq'): ('7c39f3990135144954ad7c6baa2dbb531e616bb0513b8ad68f5a1edc13db6dc3', '35502526bd8755ed5bdd63ee20d0c0a1af8e89e8acca5527f3158390c96e6e5f'),
}

CASES = [("mlp", "pynq"), ("lenet", "pynq"), ("small_resnet", "pynq"), ("mobilenet", "pynq"),
         ("resnet18", "pynq"), ("mlp", "tiny"), ("lenet", "tiny"), ("small_resnet", "tiny"),
         ("small_resnet", "zcu104"), ("captioning", "pynq"), ("inception", "pynq")]


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
