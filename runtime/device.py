"""The Device API: one interface over the simulator, the RTL and a PYNQ board.

Every backend is driven the way a driver drives the board: buffers in device
memory at physical addresses, the instruction stream in one of them, then
INSN_ADDR, INSN_COUNT and CONTROL through the accelerator's register map
(``tessera.regmap``), STATUS polled until done, CYCLES and the error registers
read back. A backend supplies only memory and register access
(:class:`Device`'s ``_mem_*`` and ``_reg_*`` hooks); the protocol, the DMA
firewall and the bookkeeping are here, once.

>>> from tessera.runtime import open_device
>>> with open_device("sim", "pynq") as dev:          # doctest: +SKIP
...     result = dev.run(program)                     # a tessera.isa.Program
...     out = result.read("out", np.int8)
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

import numpy as np

from tessera.config import HwConfig
from tessera.errors import DeviceError, DeviceTimeoutError
from tessera.isa import INSN_BYTES, Instruction, Program, get_isa
from tessera.regmap import (CONTROL_START, ERROR_MEANINGS, REG, STATUS_DONE, STATUS_ERROR,
                            STATUS_RUNNING, VERSION, ErrorCode, config_id)

from .firewall import Region, check_launch, relocate

__all__ = ["Device", "DeviceBuffer", "Completion", "LoadedProgram", "RunResult"]

class DeviceBuffer:
    """A physically contiguous, page-aligned buffer in device memory.

    ``address`` is the physical byte address the accelerator's DMA uses; the
    host reads and writes the buffer through :meth:`write` and :meth:`read`
    (which make the data visible to the device, or the device's writes to the
    host: cache flushes and invalidations on a board).
    """

    def __init__(self, device: "Device", address: int, size: int, name: str,
                 handle: Any) -> None:
        self.device = device
        self.address = address
        self.size = size
        self.name = name
        self._handle = handle
        self.live = True
        #: Host writes so far: a launch's firewall verdict on this buffer as a stream
        #: holds while it is unchanged.
        self.writes = 0

    @property
    def region(self) -> Region:
        return Region(self.name, self.address, self.address + self.size)

    def _check(self, offset: int, nbytes: int, what: str) -> None:
        if not self.live:
            raise DeviceError(f"buffer {self.name!r} was freed; allocate a new one")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise DeviceError(f"{what} bytes [{offset}, {offset + nbytes}) of buffer "
                              f"{self.name!r}, which is {self.size} bytes long")

    def write(self, data: np.ndarray | bytes, offset: int = 0) -> None:
        """Copy ``data`` (any array, taken as its raw bytes) into the buffer at byte ``offset``."""
        raw = np.frombuffer(np.ascontiguousarray(data).tobytes() if isinstance(data, np.ndarray)
                            else bytes(data), dtype=np.uint8)
        self._check(offset, raw.size, "cannot write")
        self.device._mem_write(self._handle, offset, raw)
        self.device._bytes_written += raw.size
        self.writes += 1

    def read(self, dtype: np.dtype | str = np.uint8, shape: tuple[int, ...] | None = None,
             offset: int = 0, nbytes: int | None = None) -> np.ndarray:
        """A copy of the buffer's bytes from ``offset`` (``nbytes``, default: to the end, or as
        many as ``shape`` needs), viewed as ``dtype`` and ``shape``."""
        itemsize = np.dtype(dtype).itemsize
        if nbytes is None:
            nbytes = (int(np.prod(shape)) * itemsize if shape is not None
                      else (self.size - offset) // itemsize * itemsize)
        self._check(offset, nbytes, "cannot read")
        raw = self.device._mem_read(self._handle, offset, nbytes)
        self.device._bytes_read += nbytes
        values = raw.view(dtype)
        return values.reshape(shape) if shape is not None else values

    def free(self) -> None:
        """Return the buffer to the device (idempotent)."""
        if self.live:
            self.device._free_buffer(self)

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "" if self.live else ", freed"
        return f"DeviceBuffer({self.name!r}, address={self.address:#x}, size={self.size}{state})"


@dataclass(frozen=True)
class Completion:
    """What :meth:`Device.wait` returns for a run that finished without error."""

    cycles: int
    instructions: int
    wall_seconds: float


@dataclass
class RunResult:
    """A :class:`Program` run through :meth:`Device.run`: its segments read back after the run."""

    program: Program
    backend: str
    cycles: int
    wall_seconds: float
    #: The program's DRAM image after the run, in the program's own addresses (segments
    #: only; the instruction stream is not part of it).
    dram: np.ndarray
    #: The simulator's statistics on the ``sim`` backend, else None.
    stats: Any = None

    def read(self, segment: str, dtype: np.dtype | str = np.uint8,
             shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Segment ``segment`` after the run, viewed as ``dtype`` and ``shape``."""
        return self.program.read(self.dram, segment, dtype, shape)


@dataclass
class _Launch:
    instructions: list[Instruction]
    started: float


class LoadedProgram:
    """A program resident on a device (:meth:`Device.load`): a buffer per segment and the
    relocated instruction stream, written once.

    Each :meth:`run` writes only the segments it is given, launches (through the DMA
    firewall, whose verdict on the unchanged stream holds) and reads back only
    the segments asked for, so a model's weights cross to the device once, not every
    run. Segments a run does not write keep what the last run left in them.
    """

    def __init__(self, device: "Device", program: Program, buffers: dict[str, DeviceBuffer],
                 stream: DeviceBuffer, count: int) -> None:
        self.device = device
        self.program = program
        self.buffers = buffers
        self.stream = stream
        self.count = count

    @property
    def live(self) -> bool:
        """The device is open and none of the program's buffers was freed."""
        return (not self.device._closed and self.stream.live
                and all(b.live for b in self.buffers.values()))

    def run(self, segments: Mapping[str, np.ndarray | bytes] | None = None, *,
            read: Iterable[str] | None = None, timeout: float | None = None,
            progress: Callable[[int], None] | None = None) -> RunResult:
        """Write ``segments`` (``{segment name: its whole new contents}``), run, and read
        back the segments named in ``read`` (default: all); ``timeout`` and ``progress``
        as in :meth:`Device.wait`. The result's ``dram`` holds the segments read back
        (zeros elsewhere)."""
        started = time.perf_counter()
        if not self.live:
            raise DeviceError("the loaded program's buffers were freed (or its device was "
                              "closed): load it again with Device.load")
        if self.device.busy:
            raise DeviceError("a run is already in progress: wait() for it before running "
                              "a loaded program")
        readback = list(self.buffers if read is None else read)
        for name in readback:
            self._buffer(name)              # an unknown name fails before anything changes
        for name, data in (segments or {}).items():
            buf = self._buffer(name)
            nbytes = data.nbytes if isinstance(data, np.ndarray) else len(data)
            if nbytes != buf.size:
                raise DeviceError(f"segment {name!r} is {buf.size} bytes; {nbytes} bytes were "
                                  "given to replace it (pass the whole segment)")
            buf.write(data)
        self.device.launch(self.stream, self.count, buffers=list(self.buffers.values()))
        done = self.device.wait(timeout, progress=progress)
        dram = np.zeros(self.program.insn_addr, dtype=np.uint8)
        for name in readback:
            seg = self.program.segment(name)
            dram[seg.addr:seg.end] = self.buffers[name].read()
        return RunResult(self.program, self.device.backend, done.cycles,
                         time.perf_counter() - started, dram, self.device._run_stats())

    def _buffer(self, name: str) -> DeviceBuffer:
        if name not in self.buffers:
            raise DeviceError(f"the program has no segment {name!r}; its segments are "
                              f"{', '.join(self.buffers)}")
        return self.buffers[name]

    def free(self) -> None:
        """Free the program's buffers (idempotent)."""
        for buf in [*self.buffers.values(), self.stream]:
            buf.free()

    def __enter__(self) -> "LoadedProgram":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        size = sum(b.size for b in self.buffers.values())
        return (f"<LoadedProgram {self.count} instructions, {len(self.buffers)} segments "
                f"({size} bytes) on {self.device.backend}{'' if self.live else ', freed'}>")


class Device(ABC):
    """An accelerator for one :class:`HwConfig`, behind its register map.

    Use :func:`tessera.runtime.open_device` to get one. The life of a run:
    :meth:`allocate` buffers, :meth:`DeviceBuffer.write` inputs, :meth:`launch`
    an instruction stream (checked by the DMA firewall first), :meth:`wait`,
    :meth:`DeviceBuffer.read` outputs. :meth:`run` does all of it for a
    :class:`~tessera.isa.Program`.
    """

    #: The backend's name (``sim``, ``rtl``, ``pynq``).
    backend: ClassVar[str]
    #: Seconds :meth:`wait` waits when no timeout is given (None: no limit, for backends
    #: that detect a hung program themselves).
    default_timeout: ClassVar[float | None] = 60.0

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        self.isa = get_isa(config)
        self._buffers: dict[int, DeviceBuffer] = {}
        self._launch: _Launch | None = None
        self._closed = False
        self._runs = 0
        self._total_cycles = 0
        self._last_cycles = 0
        self._bytes_written = 0
        self._bytes_read = 0
        # id(stream buffer) -> ((writes, count, regions), instructions) of its last launch
        # that passed the firewall.
        self._verdicts: dict[int, tuple[tuple, list[Instruction]]] = {}

    # ----------------------------------------------------------- backend hooks
    @abstractmethod
    def _mem_alloc(self, nbytes: int) -> tuple[int, Any]:
        """Allocate page-aligned device memory: (physical address, backend handle)."""

    @abstractmethod
    def _mem_free(self, handle: Any) -> None: ...

    @abstractmethod
    def _mem_write(self, handle: Any, offset: int, data: np.ndarray) -> None: ...

    @abstractmethod
    def _mem_read(self, handle: Any, offset: int, nbytes: int) -> np.ndarray: ...

    @abstractmethod
    def _reg_read(self, offset: int) -> int: ...

    @abstractmethod
    def _reg_write(self, offset: int, value: int) -> None: ...

    @abstractmethod
    def _idle(self, seconds: float) -> None:
        """Let up to ``seconds`` pass while a run is in progress (sleep, or advance a model)."""

    def _error_detail(self) -> Exception | None:
        """The backend's own account of the last run's error, if it has one."""
        return None

    def _run_stats(self) -> Any:
        """Backend statistics of the last run (the simulator's SimStats), if any."""
        return None

    def _close(self) -> None:
        """Release the backend (after every buffer is freed)."""

    def _reset(self) -> None:
        """Bring the accelerator to its power-up state (on-chip buffers cleared)."""

    # ------------------------------------------------------------------ memory
    def allocate(self, nbytes: int, name: str = "") -> DeviceBuffer:
        """A new buffer of ``nbytes`` bytes (page-aligned, contents undefined)."""
        self._check_open()
        nbytes = int(nbytes)
        if nbytes < 0:
            raise DeviceError(f"cannot allocate {nbytes} bytes for buffer {name!r}: the size "
                              "must not be negative")
        address, handle = self._mem_alloc(nbytes)
        buf = DeviceBuffer(self, address, nbytes, name or f"buffer@{address:#x}", handle)
        self._buffers[id(buf)] = buf
        return buf

    def _free_buffer(self, buf: DeviceBuffer) -> None:
        if self._launch is not None:
            raise DeviceError(f"cannot free buffer {buf.name!r} while a run is in progress: "
                              "wait() for it first")
        self._buffers.pop(id(buf), None)
        self._verdicts.pop(id(buf), None)
        buf.live = False
        self._mem_free(buf._handle)

    @property
    def buffers(self) -> list[DeviceBuffer]:
        """The live buffers, in allocation order."""
        return list(self._buffers.values())

    # -------------------------------------------------------------------- runs
    def launch(self, stream: DeviceBuffer, count: int | None = None, *,
               buffers: Sequence[DeviceBuffer] | None = None) -> None:
        """Start the ``count`` instructions at the start of ``stream`` (default: as many as
        it holds) and return at once.

        The DMA firewall checks every instruction first against ``buffers``, the buffers
        the run may touch (default: every live buffer of this device); on a violation it
        raises and nothing is launched. A stream that passed with the same buffers and
        was not written since is not checked again.
        """
        self._check_open()
        if self._launch is not None:
            raise DeviceError("a run is already in progress: wait() for it before launching "
                              "another")
        self._check_mine(stream, "stream")
        if count is None:
            count = stream.size // INSN_BYTES
        if count <= 0:
            raise DeviceError(f"count must be at least 1 instruction, not {count}")
        if count * INSN_BYTES > stream.size:
            raise DeviceError(f"{count} instructions need {count * INSN_BYTES} bytes; stream "
                              f"buffer {stream.name!r} holds {stream.size}")
        run_buffers = self.buffers if buffers is None else list(buffers)
        for b in run_buffers:
            self._check_mine(b, "buffers")
        insns = self._checked_stream(stream, count, run_buffers)
        self._reg_write(REG["INSN_ADDR"], stream.address)
        self._reg_write(REG["INSN_COUNT"], count)
        self._reg_write(REG["CONTROL"], CONTROL_START)
        self._launch = _Launch(insns, time.perf_counter())

    def _checked_stream(self, stream: DeviceBuffer, count: int,
                        run_buffers: list[DeviceBuffer]) -> list[Instruction]:
        """The stream's instructions, decoded from device memory and passed by the DMA
        firewall. Decoding and checking a long stream takes long (0.6 s for ResNet-18's
        21,643 instructions on a laptop), so a stream launched again with the same
        buffers and not written since keeps its verdict; unless the run may write the
        stream itself (it is one of the run's buffers), which is then checked afresh."""
        key = (stream.writes, count, tuple(b.region for b in run_buffers))
        known = self._verdicts.get(id(stream))
        if known is not None and known[0] == key:
            return known[1]
        insns = self.isa.decode_program(stream.read(nbytes=count * INSN_BYTES).tobytes())
        check_launch(insns, self.isa, stream=stream.region, regions=list(key[2]))
        if not any(b is stream for b in run_buffers):
            self._verdicts[id(stream)] = (key, insns)
        return insns

    def wait(self, timeout: float | None = None, *,
             progress: Callable[[int], None] | None = None) -> Completion:
        """Wait for the launched run; ``timeout`` in seconds (default :attr:`default_timeout`).
        ``progress(cycles)`` is called with the cycle counter at every poll.

        Raises :class:`~tessera.errors.DeviceTimeoutError` when the run has not finished
        in time (it keeps running: wait again, or :meth:`reset`), and
        :class:`~tessera.errors.DeviceError` with ``code`` and ``index`` set when the
        accelerator stopped the run with an error.
        """
        self._check_open()
        run = self._launch
        if run is None:
            raise DeviceError("nothing to wait for: launch() a run first")
        limit = self.default_timeout if timeout is None else timeout
        deadline = None if limit is None else time.perf_counter() + limit
        while True:
            status = self._reg_read(REG["STATUS"])
            if status & STATUS_DONE:
                break
            if progress is not None:
                progress(self._cycles())
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                raise DeviceTimeoutError(
                    f"the run of {len(run.instructions)} instructions on the {self.backend} "
                    f"backend did not finish within {limit:g} s (STATUS {status:#x}, "
                    f"{self._cycles()} cycles so far): the program may deadlock (run it on the "
                    "sim backend for a diagnosis) or need a longer timeout (wait(timeout=...))")
            self._idle(0.05 if deadline is None else min(0.05, deadline - now))
        self._launch = None
        cycles = self._cycles()
        self._runs += 1
        self._last_cycles = cycles
        self._total_cycles += cycles
        if status & STATUS_ERROR:
            raise self._run_error(run)
        return Completion(cycles, len(run.instructions), time.perf_counter() - run.started)

    def _cycles(self) -> int:
        return self._reg_read(REG["CYCLES_LO"]) | self._reg_read(REG["CYCLES_HI"]) << 32

    def _run_error(self, run: _Launch) -> DeviceError:
        raw = self._reg_read(REG["ERROR_CODE"])
        index = self._reg_read(REG["ERROR_INDEX"])
        try:
            code = ErrorCode(raw)
        except ValueError:
            return DeviceError(f"the accelerator stopped with unknown ERROR_CODE {raw} at "
                               f"instruction {index}: is the bitstream from another Tessera "
                               "version?", code=raw, index=index)
        where = (f"instruction {index}, {run.instructions[index].label}"
                 if 0 <= index < len(run.instructions) else f"instruction {index}")
        detail = self._error_detail()
        message = (f"the accelerator stopped the run with {code.name} "
                   f"({ERROR_MEANINGS.get(code, code.name)}) ({where})")
        if detail is not None:
            message += f": {detail}"
        error = DeviceError(message, code=int(code), index=index)
        error.__cause__ = detail
        return error

    def load(self, program: Program) -> "LoadedProgram":
        """Make ``program`` resident: a buffer per segment holding the segment's data, and
        the instruction stream relocated to them. Run it as often as needed with new data
        in some segments (:meth:`LoadedProgram.run`); the rest (weights, microcode) cross
        to the device once. Free it with :meth:`LoadedProgram.free`."""
        self._check_open()
        if program.config != self.config:
            raise DeviceError(f"the program was built for config {program.config.name!r}, this "
                              f"device runs {self.config.name!r}: compile it for "
                              f"{self.config.name!r} or open a device for "
                              f"{program.config.name!r}")
        buffers: dict[str, DeviceBuffer] = {}
        stream = None
        try:
            for seg in program.segments:
                buffers[seg.name] = self.allocate(seg.size, seg.name)
                buffers[seg.name].write(seg.data)
            insns = relocate(program, {n: b.address for n, b in buffers.items()})
            encoded = self.isa.encode_program(insns)
            stream = self.allocate(len(encoded), "instructions")
            stream.write(encoded)
        except BaseException:
            for buf in [*buffers.values(), *([stream] if stream else [])]:
                buf.free()
            raise
        return LoadedProgram(self, program, buffers, stream, len(insns))

    def run(self, program: Program, *, timeout: float | None = None,
            progress: Callable[[int], None] | None = None) -> RunResult:
        """Run ``program`` start to finish: :meth:`load` it, run it (``progress`` as in
        :meth:`wait`), read every segment back, free its buffers."""
        started = time.perf_counter()
        loaded = self.load(program)
        try:
            result = loaded.run(timeout=timeout, progress=progress)
        finally:
            if self._launch is None:        # a run that timed out still owns its buffers
                loaded.free()
        result.wall_seconds = time.perf_counter() - started
        return result

    def reset(self) -> None:
        """Return the accelerator to its power-up state: a run in progress is abandoned and
        the on-chip buffers are cleared (device memory keeps its contents)."""
        self._check_open()
        self._reset()
        self._launch = None

    # ---------------------------------------------------------------- queries
    def counters(self) -> dict[str, int]:
        """Runs completed, cycles (last run and total), bytes moved by the host, buffers."""
        self._check_open()
        return {"runs": self._runs, "last_cycles": self._last_cycles,
                "total_cycles": self._total_cycles, "host_bytes_written": self._bytes_written,
                "host_bytes_read": self._bytes_read, "live_buffers": len(self._buffers),
                "live_bytes": sum(b.size for b in self._buffers.values())}

    @property
    def busy(self) -> bool:
        """A run was launched and not yet waited for."""
        return self._launch is not None

    def check_identity(self) -> None:
        """Refuse hardware built for another config or interface version (VERSION, CONFIG_ID)."""
        version = self._reg_read(REG["VERSION"])
        if version != VERSION:
            raise DeviceError(f"the accelerator reports interface VERSION {version:#010x}, this "
                              f"Tessera drives {VERSION:#010x}: rebuild the bitstream with this "
                              "version (tessera hw bitstream)")
        got, want = self._reg_read(REG["CONFIG_ID"]), config_id(self.config)
        if got != want:
            raise DeviceError(f"the accelerator reports CONFIG_ID {got:#010x}, config "
                              f"{self.config.name!r} is {want:#010x}: load the bitstream built "
                              "for this config, or open the device with the config the "
                              "bitstream was built for")

    def status(self) -> dict[str, bool]:
        """STATUS as flags: done, error, running."""
        s = self._reg_read(REG["STATUS"])
        return {"done": bool(s & STATUS_DONE), "error": bool(s & STATUS_ERROR),
                "running": bool(s & STATUS_RUNNING)}

    # -------------------------------------------------------------- lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise DeviceError(f"the {self.backend} device was closed; open a new one")

    def _check_mine(self, buf: DeviceBuffer, what: str) -> None:
        if not isinstance(buf, DeviceBuffer) or buf.device is not self:
            raise DeviceError(f"{what}: {buf!r} is not a buffer of this device")
        if not buf.live:
            raise DeviceError(f"{what}: buffer {buf.name!r} was freed")

    def close(self) -> None:
        """Free every buffer and release the backend (idempotent). A run in progress is
        abandoned."""
        if self._closed:
            return
        self._launch = None
        for buf in self.buffers:
            buf.free()
        self._close()
        self._closed = True

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._buffers)} buffers"
        return f"<{type(self).__name__} {self.backend} config={self.config.name!r} {state}>"

