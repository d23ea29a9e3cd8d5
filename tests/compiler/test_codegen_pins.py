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
('mlp', 'pynq'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', '811329982d9eebc323e6515ee63ac87b9c6d5c4a676f325b36da7d069ffc6686'),
    ('lenet', 'pynq'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', '45df74fee24467def5276711b5b6d17ffc8c87eb0725fb9cb6f8aca3a0baea32'),
    ('small_resnet', 'pynq'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '5b0c11c16877d99ef04b03e92d1834a09c330812738197944eec2f4eacbd6be2'),
    ('mobilenet', 'pynq'): ('30279c9d6c8d0a1b16a2be032ddb6b36b2754229a4caec2597670c0c428e32db', '180efba76de7e7d1de9ed40e10e3071ad909ba38f6f4d25c067134806bc4f6e1'),
    ('resnet18', 'pynq'): ('9bd857259fb169003c58b916ae1674485002a005564f140f2c225c1500aa9846', '494284a3475b58fb908a91aa53642b5e4bc55be4df53b54bd659f33af0199bdf'),
    ('mlp', 'tiny'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', 'a69e763525c54591376689fad704acf6e5be4c3dde964f379f40293d9f2f12c4'),
    ('lenet', 'tiny'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', 'cb858810f0431787700c4ba7735b9f4cec04884b3e47b372cdfde214396079fb'),
    ('small_resnet', 'tiny'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', 'ba279aa43027d357068cb888605818a99ee2a8941995ba700d73362863ac8562'),
    ('small_resnet', 'zcu104'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '64e684ef34d780953d2922fbc536994bebd8275f68648a102d244a744e03be54'),
    ('captioning', 'pynq'): ('b80da74d121ccb6c3fefb10057b582a20dd5638b478361837633ef036ab8350f', '523abeb24ce4712ceb6fd353aca9d904442b7e9adf2b6dfc8975b4f8ab4684b6'),
    ('inception', 'pynq'): ('7c39f3990135144954ad7c6baa2dbb531e616bb0513b8ad68f5a1edc13db6dc3', '7a79a685c9b6302dbba0ce9d14631574edeccf2e710740ee6137770d98e9c36f'),
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
