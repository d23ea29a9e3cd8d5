"""Tessera: an FPGA deep-learning accelerator co-design toolkit.

The core package holds what every layer shares and imports nothing heavy:
the hardware configuration (:mod:`tessera.config`), the instruction set
(:mod:`tessera.isa`), the timing model (:mod:`tessera.timing`) and the error
hierarchy (:mod:`tessera.errors`).
"""
from .config import PRESETS, HwConfig, get_config
from .errors import TesseraError

__version__ = "0.1.0"
__all__ = ["HwConfig", "PRESETS", "TesseraError", "get_config", "__version__"]
