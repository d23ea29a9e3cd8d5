"""The cycle simulator behind the accelerator's register map.

:class:`SimRegisters` is what a driver sees of the hardware (``tessera.regmap``),
with the cycle-level simulator doing the work: write INSN_ADDR and INSN_COUNT,
write CONTROL start, poll STATUS, read CYCLES and the error registers. The
runtime's ``sim`` backend drives it, and so does the simulated PYNQ board, so
the register protocol is the same on every backend.

The instruction stream and every buffer it touches live in ``memory``, a flat
byte array shared with the owner (address 0 is its first byte). A start
decodes the stream from memory and simulates it in a background thread; STATUS
reads ``running`` until the run ends, then ``done`` (and ``error`` if the
simulator rejected the program). The simulator's exception stays in
:attr:`SimRegisters.error` for drivers that can show it; over the registers, a
fault the hardware also checks reads back as the hardware's ``ErrorCode``, any
other as ``ErrorCode.SIMULATOR``.

Unlike the hardware, each run starts with zeroed on-chip buffers (the
simulator's ``Datapath`` is per run).
"""
from __future__ import annotations

import threading

import numpy as np

from tessera.config import HwConfig
from tessera.errors import ProgramError
from tessera.isa import INSN_BYTES, Instruction, Program, Segment
from tessera.regmap import (CONTROL_START, REG, STATUS_DONE, STATUS_ERROR, STATUS_RUNNING,
                            VERSION, ErrorCode, config_id)

from .facts import program_facts
from .simulator import SimResult, Simulator

__all__ = ["SimRegisters"]

_MASK32 = (1 << 32) - 1


class SimRegisters:
    """The register file of one simulated accelerator for ``config``, over ``memory``."""

    def __init__(self, config: HwConfig, memory: np.ndarray, *, trace: bool = False) -> None:
        if memory.dtype != np.uint8 or memory.ndim != 1:
            raise TypeError("memory must be a flat uint8 array")
        self.config = config
        self.memory = memory
        self.trace = trace
        self._simulator = Simulator(config, trace=trace)
        #: How much of ``memory`` a run sees: set it to the end of the highest buffer so a
        #: run copies only that much (default: all of it).
        self.extent = memory.size
        self._insn_addr = 0
        self._insn_count = 0
        self._status = 0
        self._cycles = 0
        self._error_code = ErrorCode.NONE
        self._error_index = 0
        self._thread: threading.Thread | None = None
        #: The result of the last run that finished without error.
        self.result: SimResult | None = None
        #: The simulator's exception for the last run, if it rejected the program (a
        #: TesseraError; anything else is a simulator bug, kept for the driver to raise).
        self.error: Exception | None = None

    # ---------------------------------------------------------------- bus
    def read(self, offset: int) -> int:
        """A 32-bit register read (unmapped offsets read 0, like the hardware)."""
        if self.running:
            # CYCLES counts up during a run, as the hardware's counter does.
            self._cycles = self._simulator.cycles
        values = {
            REG["STATUS"]: self._status, REG["INSN_ADDR"]: self._insn_addr,
            REG["INSN_COUNT"]: self._insn_count, REG["CYCLES_LO"]: self._cycles & _MASK32,
            REG["CYCLES_HI"]: self._cycles >> 32, REG["ERROR_CODE"]: int(self._error_code),
            REG["ERROR_INDEX"]: self._error_index, REG["CONFIG_ID"]: config_id(self.config),
            REG["VERSION"]: VERSION,
        }
        return values.get(offset, 0)

    def write(self, offset: int, value: int) -> None:
        """A 32-bit register write; writes while running are ignored, like the hardware."""
        if self.running:
            return
        value &= _MASK32
        if offset == REG["INSN_ADDR"]:
            self._insn_addr = value
        elif offset == REG["INSN_COUNT"]:
            self._insn_count = value
        elif offset == REG["CONTROL"] and value & CONTROL_START:
            self._start()

    @property
    def running(self) -> bool:
        return bool(self._status & STATUS_RUNNING)

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the current run; True once it has ended."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    # ---------------------------------------------------------------- run
    def _start(self) -> None:
        self._status = STATUS_RUNNING
        self._cycles = 0
        self._error_code, self._error_index = ErrorCode.NONE, 0
        self.result, self.error = None, None
        # A fresh simulator counts from 0 until the run thread starts it; the last one
        # would read back its final count.
        self._simulator = Simulator(self.config, trace=self.trace)
        self._thread = threading.Thread(target=self._run, name="tessera-sim", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            result = self._simulator.run(self._program())
        except Exception as exc:  # noqa: BLE001 - a driver reads it back through the registers
            self._fail(exc)
            return
        extent = min(self.extent, self.memory.size)
        self.memory[:extent] = result.dram[:extent]
        self.result = result
        self._cycles = result.stats.cycles
        self._status = STATUS_DONE

    def _program(self) -> "DecodedProgram":
        """The stream at INSN_ADDR over one segment that is the whole (used) memory (decoded
        and checked once while it stays the same, :func:`~.facts.program_facts`)."""
        start, n = self._insn_addr, self._insn_count * INSN_BYTES
        if start + n > self.memory.size:
            raise ProgramError(f"the instruction stream [{start:#x}, {start + n:#x}) runs past "
                               f"the end of memory ({self.memory.size:#x} bytes)",
                               code=ErrorCode.AXI_RESPONSE)
        stream = self.memory[start:start + n].tobytes()
        insns = [f.insn for f in program_facts(self.config, stream)]
        extent = min(self.extent, self.memory.size)
        return DecodedProgram(self.config, stream, insns,
                              [Segment("memory", 0, self.memory[:extent])])

    def _fail(self, exc: Exception) -> None:
        code = getattr(exc, "code", None)
        index = getattr(exc, "index", None)
        self.error = exc
        self._error_code = ErrorCode(code) if code is not None else ErrorCode.SIMULATOR
        self._error_index = index if index is not None else 0
        self._status = STATUS_DONE | STATUS_ERROR


class DecodedProgram(Program):
    """A program decoded from the instruction stream in memory, which it keeps: encoding
    its instructions gives the stream back without encoding them again."""

    def __init__(self, config: HwConfig, stream: bytes, instructions: list[Instruction],
                 segments: list[Segment]) -> None:
        super().__init__(config, instructions, segments)
        self._stream = (tuple(self.instructions), stream)   # Program's encoding, given
