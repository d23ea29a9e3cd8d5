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
    ('mlp', 'pynq'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', '0671dd8c467c898b87e46bca413d89c665e0728f7e4dc7498e536c49a3656022'),
    ('lenet', 'pynq'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', 'bbdd9c07e85d6d12055d5ad237b952a2307d208b0806f7ed57d08079f826e617'),
    ('small_resnet', 'pynq'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '43bb2021e467f49035c73ed6b0a4cbddd9887b64720607931f2a0227468971c2'),
    ('mobilenet', 'pynq'): ('30279c9d6c8d0a1b16a2be032ddb6b36b2754229a4caec2597670c0c428e32db', '05356444c161695f8a723ce9cc2a57868c26c96da119a59c79f98df143a1af7f'),
    ('resnet18', 'pynq'): ('9bd857259fb169003c58b916ae1674485002a005564f140f2c225c1500aa9846', '3bb5d6fb911575d0ceea96311b3ac8325af08b242993f05e6dc77673516dade4'),
    ('mlp', 'tiny'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', 'a69e763525c54591376689fad704acf6e5be4c3dde964f379f40293d9f2f12c4'),
    ('lenet', 'tiny'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', 'cb858810f0431787700c4ba7735b9f4cec04884b3e47b372cdfde214396079fb'),
    ('small_resnet', 'tiny'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '6ddb499a898c5a0fcd061153651de7bf1975019fe36c15ed245db9024869a242'),
    ('small_resnet', 'zcu104'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '9f51d340a36dd392a515f1db5ee4ed72d9f8b9a14b8379d406311fbfaf66a5c7'),
    ('captioning', 'pynq'): ('b80da74d121ccb6c3fefb10057b582a20dd5638b478361837633ef036ab8350f', '877ce1d6277ff60c538f9d876356957f7704e5dbc590ec3dc690cf113035c525'),
    ('inception', 'pynq'): ('7c39f3990135144954ad7c6baa2dbb531e616bb0513b8ad68f5a1edc13db6dc3', '89a1b9836d74c921b7ae9a19d0989822a9ef25576e1e08ca141a7432a43fe72b'),
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
