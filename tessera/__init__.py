"""Tessera: an FPGA deep-learning accelerator co-design toolkit.

The core package holds what every layer shares and imports nothing heavy:
the hardware configuration (:mod:`tessera.config`), the instruction set
(:mod:`tessera.isa`), the timing model (:mod:`tessera.timing`) and the error
hierarchy (:mod:`tessera.errors`).

The model API sits on top and loads the compiler and the runtime only when called::

    model = tessera.compile("net.onnx", target="pynq", calibration=samples)
    outputs, profile = model.run({"input": x}, backend="sim")
    model.save("net.tsr")
    model = tessera.load("net.tsr")
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .config import PRESETS, HwConfig, get_config
from .errors import TesseraError

if TYPE_CHECKING:
    from .runtime.executor import Model

__version__ = "0.1.0"
__all__ = ["HwConfig", "PRESETS", "TesseraError", "compile", "get_config", "load",
           "__version__"]


def compile(model: Any, target: str | HwConfig = "pynq", *,
            calibration: Sequence[Mapping[str, Any]] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            force_cpu: Sequence[str] = (), host: Any = None, progress: Any = None,
            activations: str = "exact", pieces: int | None = None,
            tolerance: float | None = None, placement: str = "dp",
            skip_zero_blocks: bool = True, tune: str = "model") -> "Model":
    """Compile an ONNX model (``ModelProto``, path or bytes) for the config ``target``.

    A float model is quantized to int8 from ``calibration`` (a list of input feeds);
    an int8 QDQ model compiles as it is. ``force_cpu`` keeps named nodes off the
    accelerator; ``host`` (a :class:`~tessera.hostmodel.HostModel`, a built-in's name,
    ``"local"`` or a file) is what the placement assumes of the host CPU; ``placement`` is
    ``"dp"`` (least projected latency), ``"greedy"`` or ``"cpu"``.
    ``activations="approximate"`` (with ``pieces=K`` or ``tolerance=T`` LSBs) runs
    activations the config has no exact intrinsic for as sums of shifted ReLUs on the
    accelerator (it changes results; ``"exact"`` by default). Weight blocks of zeros (a
    pruned model's) are skipped on the accelerator unless ``skip_zero_blocks=False``.
    ``tune="sim"`` lets the simulator pick a convolution's tiling where the cost model is
    off by more than 2% (slower to compile).
    Returns a
    :class:`~tessera.runtime.executor.Model`
    (``run``, ``save``, ``summary``). See :func:`tessera.compiler.model.compile_model`.
    """
    from .compiler.model import compile_model
    from .runtime.executor import Model
    return Model(compile_model(model, target, calibration=calibration,
                               input_shapes=input_shapes, force_cpu=force_cpu, host=host,
                               progress=progress, activations=activations, pieces=pieces,
                               tolerance=tolerance, placement=placement,
                               skip_zero_blocks=skip_zero_blocks, tune=tune))


def load(path: Any) -> "Model":
    """Load a compiled model file (``.tsr``) written by ``Model.save``."""
    from .runtime.executor import Model
    return Model.load(path)
