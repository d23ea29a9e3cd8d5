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
    ('mlp', 'pynq'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', '1f6658aedb02dbd90416b980d7daac6b79780f75129390966443a4e72a5ee781'),
    ('lenet', 'pynq'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', 'fe74f77f81800eac5f8506714c4d278051cb70bef147f45d1f46d072eeae4737'),
    ('small_resnet', 'pynq'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '78574eba94adf83e8d84266957aed86e45cac5e7286086cb8159adaa07a8aee9'),
    ('mobilenet', 'pynq'): ('30279c9d6c8d0a1b16a2be032ddb6b36b2754229a4caec2597670c0c428e32db', 'd5784745bb098700544315b1044a0a6adcaf0b18a9df3b10c7a3cd8d84edcaed'),
    ('resnet18', 'pynq'): ('9bd857259fb169003c58b916ae1674485002a005564f140f2c225c1500aa9846', '354abaf1f4a95a9a3b668538d744f56357ca1cbf798f2ac6ef84db24315c83a7'),
    ('mlp', 'tiny'): ('794177fb30c565f4b5dff15e3f981228ff1fb05963435bed19b9e1b6379f3f2d', '0ea6091e5da0423600642e4624b415b76f4813a5fa71d413da83614976b4aad3'),
    ('lenet', 'tiny'): ('cbc79b95e331fb8aa4f36e5907f1052f99ce9dfbb212fd6408ad8cf30c15096a', 'a751b2b184941a594b2bbededfbd933cc7827a7c3e93b055a300fbcd3ca3e44d'),
    ('small_resnet', 'tiny'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', '9c324b5d87b00215c66ba7324400e7860c2371b855fae3967f5a3ad032480b2a'),
    ('small_resnet', 'zcu104'): ('ab6c77075349f2204d8030652b1c7f831457d71fefaf48827624ae66b9c68ec1', 'c959c06184568e9a639b9d7a6cf5fb0669784fc9925a3bf5d488c280545f0f16'),
    ('captioning', 'pynq'): ('b80da74d121ccb6c3fefb10057b582a20dd5638b478361837633ef036ab8350f', 'dfafdc54bbbeadeae4dfc338909680d7ee965eab669b6ce5939964cddb9a8f8f'),
    ('inception', 'pynq'): ('7c39f3990135144954ad7c6baa2dbb531e616bb0513b8ad68f5a1edc13db6dc3', '212cbcd1fd6dbab584968f97b706f3b48a7eec3d32c52729bda3c853785c78ce'),
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
