"""The one exception hierarchy of Tessera.

Every message says what was wrong, where (instruction index, field, node) and,
where it helps, what to do. Catch :class:`TesseraError` to catch them all.

What to do, by interface
------------------------
How to fix a problem often depends on how the user called Tessera: from Python one
passes ``calibration=[...]`` or ``input_shapes={...}``, on the command line one gives
``--calibration FILE.npz`` or ``--input-shape NAME=D0,D1,...``. Such advice goes in the
error's ``fix``, a dict keyed by interface (:data:`PYTHON`, :data:`CLI`), not in its
message::

    raise CompileError(f"model {name!r} is a float model",
                       fix={PYTHON: "pass calibration=[{input name: array}, ...]",
                            CLI: "give --calibration FILE.npz"})

``str(exc)`` is the message and the Python advice (the API is the default interface);
``exc.describe(CLI)`` is the message and the command-line advice, which is what the
``tessera`` command prints. An interface without advice of its own gets the Python one,
so an error a command can reach should give both. The builders below (e.g.
:func:`input_shape_fix`) keep advice that several modules give in one place. Advice that
is the same in every interface stays in the message.
"""
from __future__ import annotations

from typing import Mapping, Sequence

#: The interfaces a :attr:`TesseraError.fix` is keyed by: the Python API and the CLI.
PYTHON = "python"
CLI = "cli"
INTERFACES = (PYTHON, CLI)


class TesseraError(Exception):
    """Base class of every error Tessera raises on bad input.

    ``fix`` maps an interface (:data:`PYTHON`, :data:`CLI`) to what to do in it (see the
    module doc); ``str(exc)`` shows the Python advice, :meth:`describe` any interface's.
    """

    def __init__(self, *args: object, fix: Mapping[str, str] | None = None) -> None:
        super().__init__(*args)
        unknown = set(fix or ()) - set(INTERFACES)
        if unknown:
            raise ValueError(f"fix is keyed by {INTERFACES}, not {sorted(unknown)}")
        self.fix: dict[str, str] = dict(fix or {})

    def describe(self, interface: str = PYTHON) -> str:
        """The message with the advice for ``interface`` (the Python advice if it has
        none of its own)."""
        message = super().__str__()
        advice = self.fix.get(interface, self.fix.get(PYTHON))
        return f"{message}; {advice}" if advice else message

    def __str__(self) -> str:
        return self.describe(PYTHON)


def input_shape_fix(name: str, example: Sequence[int | str]) -> dict[str, str]:
    """Advice to give input ``name`` a static shape, ``example`` (e.g. ``(1, 3, 224, 224)``,
    or placeholders such as ``("N", "C", "H", "W")``)."""
    dims = [str(d) for d in example]
    python = ", ".join(dims) + ("," if len(dims) == 1 else "")
    return {PYTHON: f"give its shape, e.g. input_shapes={{{name!r}: ({python})}}",
            CLI: f"give its shape, e.g. --input-shape {name}={','.join(dims)}"}


class ConfigError(TesseraError, ValueError):
    """An invalid or unknown hardware configuration."""


class EncodingError(TesseraError, ValueError):
    """A value that does not fit an instruction or uop field."""

    def __init__(self, message: str, *, field: str | None = None,
                 index: int | None = None, where: str | None = None) -> None:
        self.field = field
        self.index = index
        self.where = where
        super().__init__(_locate(message, index, where))


class RegistryError(TesseraError, ValueError):
    """A clash or a bad entry when registering an intrinsic."""


class AsmError(TesseraError, ValueError):
    """A syntax or semantic error in assembly text."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"{message} (line {line})" if line is not None else message)


class ProgramError(TesseraError):
    """A program that cannot run: malformed fields, bad ranges, deadlock...

    ``index`` is the instruction index in the program (when one is to blame);
    ``code`` is the :class:`tessera.regmap.ErrorCode` the hardware reports for the same
    fault, or ``None`` when the hardware does not check it (hazards, deadlocks...).
    """

    def __init__(self, message: str, *, index: int | None = None,
                 where: str | None = None, code: int | None = None) -> None:
        self.index = index
        self.where = where
        self.code = code
        super().__init__(_locate(message, index, where))


class MalformedInstructionError(ProgramError):
    """An instruction whose fields are inconsistent (reserved opcode, bad flag...)."""


class BoundsError(ProgramError):
    """An SRAM or DRAM access outside the buffer or the program's DRAM segments."""


class HazardError(ProgramError):
    """A read-after-write hazard inside a pipeline that the hardware does not check."""


class DeadlockError(ProgramError):
    """Every module waits and nothing can make progress."""


class MissingFinishError(ProgramError):
    """The program never executes FINISH, or FINISH retires with work pending."""


class ProgramFileError(TesseraError, ValueError):
    """A program file that is not a Tessera program or is damaged."""


def _locate(message: str, index: int | None, where: str | None) -> str:
    parts = []
    if index is not None:
        parts.append(f"instruction {index}")
    if where:
        parts.append(where)
    return f"{message} ({', '.join(parts)})" if parts else message


class CompileError(TesseraError, ValueError):
    """An operator or graph the compiler cannot turn into a program for a config.

    Messages say what is wrong, where (operator name, tensor, dimension) and
    what to do about it; ``op`` names the operator when there is one.
    """

    def __init__(self, message: str, *, op: str | None = None,
                 fix: Mapping[str, str] | None = None) -> None:
        self.op = op
        super().__init__(message, fix=fix)


class VerificationError(CompileError):
    """A program that violates the dependency-token discipline (``tessera.compiler.accel.verify``).

    ``index`` is the instruction index to blame, when there is one.
    """

    def __init__(self, message: str, *, index: int | None = None) -> None:
        self.index = index
        super().__init__(f"{message} (instruction {index})" if index is not None else message)


class HardwareToolError(TesseraError):
    """A hardware tool (Verilator, yosys) is missing, failed or did not finish in time."""


class SynthesisError(HardwareToolError):
    """yosys is missing, failed, or did not finish in time (``tessera hw resources``)."""


class RtlSimError(HardwareToolError):
    """The RTL simulation cannot be built or run (missing tools, bad Verilog, a hung bus)."""



class DeviceError(TesseraError):
    """A device (``tessera.runtime``) that cannot do what was asked: a missing backend or
    bitstream, a config mismatch, a buffer misuse, or a run the hardware stopped with an
    error code (``code``, an :class:`tessera.regmap.ErrorCode`, and ``index``, the
    instruction the hardware blames, are set then)."""

    def __init__(self, message: str, *, code: int | None = None,
                 index: int | None = None) -> None:
        self.code = code
        self.index = index
        super().__init__(message)


class DeviceTimeoutError(DeviceError, TimeoutError):
    """A run that did not finish within the timeout given to ``Device.wait``."""


class FirewallError(ProgramError):
    """A LOAD, STORE or instruction fetch whose DRAM range is not inside one of the buffers
    allocated for the run: refused before launch, nothing runs."""


class CpuKernelError(TesseraError, ValueError):
    """A CPU fallback kernel that cannot be built, compiled (llvmlite) or called with the
    arrays given (wrong shape or dtype)."""


class RunError(TesseraError, ValueError):
    """A compiled model was given inputs it cannot run on (names, shapes, dtypes, values)."""


class StructureError(TesseraError, ValueError):
    """A recursive model's input structure is malformed: a cycle in a tree or DAG, a node
    with more children than the cell declares, an empty batch, a leaf value that is not an
    input index. Raised by the linearizer, before anything is launched."""


class TimelineError(TesseraError, ValueError):
    """A timeline that cannot be drawn: no trace recorded, a bad span, too narrow an image."""


class DseError(TesseraError, ValueError):
    """A design-space sweep that cannot run as given: an axis naming no config field, a
    model that cannot be read, a results file of another sweep."""
