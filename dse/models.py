"""The models a sweep measures: zoo names or ONNX files, named cheaply first
(:class:`ModelRef`, enough to know which results a file already holds) and quantized only
when some job still needs them (:func:`prepare`)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tessera.errors import CLI, PYTHON, DseError

from .evaluate import RESOURCES, ModelSpec

__all__ = ["ModelRef", "model_refs", "prepare"]

#: Calibration feeds for a float model (the zoo's default, onnxruntime's MinMax).
CALIBRATION_SAMPLES = 8


@dataclass(frozen=True)
class ModelRef:
    """A model by name: a zoo entry (``source`` empty) or an ONNX file, and ``digest``,
    what its results are keyed by (the zoo name, or the file's sha256)."""

    name: str
    source: str
    digest: str


def model_refs(models: Sequence[str]) -> list[ModelRef]:
    """Each of ``models`` (zoo names or ``.onnx`` paths) as a :class:`ModelRef`;
    :class:`DseError` for one that is neither, or two of one name."""
    from tessera.compiler.frontend import zoo
    refs = []
    for text in models:
        path = Path(text)
        if text in zoo.ZOO:
            refs.append(ModelRef(text, "", f"zoo:{text}"))
        elif path.suffix == ".onnx" and path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            refs.append(ModelRef(path.stem, str(path), f"file:{digest}"))
        else:
            raise DseError(f"model {text!r} is neither a zoo model ({', '.join(zoo.ZOO)}) nor "
                           "an .onnx file", fix={PYTHON: "give zoo names or ONNX file paths",
                                                CLI: "give --model NAME or --model FILE.onnx"})
    names = [r.name for r in refs]
    clash = sorted({n for n in names if names.count(n) > 1 or n == RESOURCES})
    if clash:
        raise DseError(f"two models, or a model and the resources job, named {clash}",
                       fix={CLI: "rename one of the ONNX files"})
    if not refs:
        raise DseError("no models to measure", fix={CLI: "give --model resnet18 (or more)"})
    return refs


def prepare(ref: ModelRef) -> ModelSpec:
    """``ref`` as every job runs it: an int8 QDQ model (a float model quantized by
    onnxruntime, calibrated on random normal feeds), one input feed, its MACs."""
    import onnx

    from tessera.compiler.frontend import zoo
    model = zoo.ZOO[ref.name]() if not ref.source else onnx.load(ref.source)
    is_qdq = any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    qdq = model if is_qdq else zoo.to_qdq(model, zoo.calibration_data(model,
                                                                      CALIBRATION_SAMPLES))
    feed = zoo.calibration_data(model, 1, seed=1)[0]
    return ModelSpec(ref.name, qdq.SerializeToString(), feed, zoo.mac_count(model), ref.digest)
