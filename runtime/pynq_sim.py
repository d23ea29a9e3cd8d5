"""A simulated PYNQ board, so the ``pynq`` backend runs on a laptop and in CI.

:class:`SimulatedBoard` is a ``pynq`` device (a ``pynq.pl_server.device.Device``):
installed as pynq's active device, it is what ``pynq.Overlay``, ``pynq.MMIO`` and
``pynq.allocate`` talk to, so :class:`~tessera.runtime.pynq_device.PynqDevice` runs
unchanged on it. Behind the board's register window (from the ``.hwh``) sits the
accelerator's RTL (the Verilator model of :mod:`tessera.hw.harness.rtlsim`, ``model="rtl"``,
the default) or the cycle simulator (:class:`tessera.sim.registers.SimRegisters`,
``model="sim"``); its DDR is the model's DRAM, buffers in it come from a
:class:`~tessera.runtime.memory.PageAllocator`, and a buffer's
``sync_to_device``/``sync_from_device`` copies between the host array and that DRAM,
as a cache flush and invalidate do on the board. Downloading a bitstream powers the
model up (on-chip buffers zeroed).

The RTL model runs only when driven: each register read while a run is in progress
advances it by a slice of cycles, so the driver's STATUS polling makes progress and
a hung program runs into the driver's timeout, as on a board.

>>> with open_simulated_pynq("tiny") as dev:                # doctest: +SKIP
...     result = dev.run(program)

Needs pynq 4.0 (``pip install -e ".[pynq]"``); the board driver itself needs only
what pynq 3.1 and 4.0 share.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tessera.boards import Board, PlClock, Window, get_board
from tessera.config import HwConfig, get_config
from tessera.errors import DeviceError
from tessera.hwh import hwh_xml
from tessera.regmap import CTRL_ADDR_BITS, config_id

from .memory import PAGE_BYTES, PageAllocator
from .models import DRAM_BYTES, make_model
from .pynq_device import PynqDevice

try:
    from pynq.buffer import PynqBuffer
    from pynq.pl_server.device import Device as PynqBaseDevice
    from pynq.ps import Clocks
    from pynqmetadata.frontends import Metadata
    from pynqmetadata.views.runtime import RuntimeMetadataParser
except ImportError:
    raise DeviceError('the simulated PYNQ board needs the pynq package: pip install -e ".[pynq]"'
                      ) from None

__all__ = ["SimulatedBoard", "SimulatedPynqDevice", "open_simulated_pynq", "simulated_board"]

#: Register offsets inside the window alias modulo the AXI4-Lite slave's address width.
_CONTROL_SPAN = 1 << CTRL_ADDR_BITS
_BITSTREAM_HEADER = "TESSERA SIMULATED BITSTREAM"
_NO_DEVICE = object()


class SimulatedBoard(PynqBaseDevice):
    """A PYNQ board (``board``: ``pynq-z1``, ``pynq-z2`` or ``zcu104``) whose FPGA holds
    ``config``'s accelerator, simulated by ``model`` (``"rtl"`` or ``"sim"``).

    Creating one installs it as pynq's active device and writes its bitstream files into
    ``directory`` (default: a temporary folder, removed on :meth:`close`):
    :attr:`bitstream` ``tessera_<config>.bit``, a placeholder that says so, and the
    matching ``.hwh`` from :func:`tessera.hwh.hwh_xml`. :meth:`close` (or leaving a
    ``with`` block) restores the active device there was before. ``memory_bytes`` is
    the size of the simulated DDR; ``rtl_options`` go to :class:`tessera.hw.harness.rtlsim.RtlSim`.
    """

    _probe_priority_ = 1000
    #: Boards installed and not yet closed, the active one last.
    _installed: ClassVar[list[SimulatedBoard]] = []
    #: pynq's active device before the first board was installed (or _NO_DEVICE).
    _outside: ClassVar[Any] = _NO_DEVICE

    @classmethod
    def _probe_(cls) -> list[SimulatedBoard]:
        return list(cls._installed)

    def __init__(self, config: str | HwConfig, *, board: str | Board = "pynq-z2",
                 model: str = "rtl", directory: str | Path | None = None,
                 memory_bytes: int = DRAM_BYTES, **rtl_options: Any) -> None:
        self.config = get_config(config)
        self.board = get_board(board)
        self.board.check(self.config)
        super().__init__(f"tessera-sim-{self.board.name}")
        self.name = f"simulated {self.board.title}"
        #: pynq's MMIO calls read_registers/write_registers on a REGISTER_RW device.
        self.capabilities = {"REGISTER_RW": True}
        #: pynq picks the PS clock driver by the board's CPU architecture.
        self.arch = self.board.ps.arch
        self._ps = _PsRegisters(self.board, self.board.pl_clock(self.config.clock_mhz))
        self._memory = _Memory(self)
        self._host: dict[int, np.ndarray] = {}      # device address -> host bytes of a buffer
        self._closed = False
        self._tempdir = None if directory is not None else Path(
            tempfile.mkdtemp(prefix="tessera-pynq-"))
        #: The placeholder bitstream; its ``.hwh`` is beside it.
        self.bitstream = self._write_files(self._tempdir or Path(directory))
        self.allocator = PageAllocator(PAGE_BYTES, memory_bytes - PAGE_BYTES)
        try:
            self.model = make_model(model, self.config, memory_bytes, self.allocator,
                                    rtl_options)
        except BaseException:
            self._remove_files()
            raise
        self._install()

    # ------------------------------------------------------------- files
    def _write_files(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        bit = directory / f"tessera_{self.config.name}.bit"
        bit.write_text(
            f"{_BITSTREAM_HEADER}: a placeholder, not an FPGA bitstream.\n"
            "Only the simulated board of tessera.runtime.pynq_sim loads it; the board flow "
            "builds real ones.\n"
            f"config: {self.config.name}\nconfig_id: {config_id(self.config):#010x}\n"
            f"board: {self.board.name}\n")
        bit.with_suffix(".hwh").write_text(hwh_xml(self.config, self.board))
        return bit

    # ------------------------------------------------------ pynq Device API
    def get_bitfile_metadata(self, bitfile_name: str, partial: bool = False) -> Any:
        """pynq's parse of the ``.hwh`` beside ``bitfile_name``."""
        hwh = Path(bitfile_name).with_suffix(".hwh")
        if not hwh.is_file():
            raise DeviceError(f"no hardware handoff {hwh} beside the bitstream {bitfile_name}")
        return RuntimeMetadataParser(Metadata(input=str(hwh)))

    def download(self, bitstream: Any, parser: Any = None) -> None:
        """Load ``bitstream``: power the model up (on-chip buffers zeroed)."""
        self._check_bitstream(Path(bitstream.bitfile_name))
        self.model.power_up()
        if parser is None:
            parser = self.get_bitfile_metadata(bitstream.bitfile_name)
        self.post_download(bitstream, parser, self.name)

    def _check_bitstream(self, path: Path) -> None:
        """Refuse a bitstream that is not a placeholder for the config this board simulates:
        the simulated FPGA cannot change what it holds."""
        lines = path.read_text(errors="replace").splitlines()
        if not lines or not lines[0].startswith(_BITSTREAM_HEADER):
            raise DeviceError(f"{path} is not a simulated bitstream (tessera.runtime.pynq_sim "
                              "writes them): the simulated board cannot load a real one")
        want = f"config_id: {config_id(self.config):#010x}"
        if want not in lines:
            raise DeviceError(f"{path} is for another config than the {self.config.name!r} this "
                              f"simulated board holds: make a board for that config "
                              "(simulated_board(config))")

    @property
    def default_memory(self) -> _Memory:
        return self._memory

    def flush(self, bo: int, offset: int, ptr: int, size: int) -> None:
        """A buffer's host bytes to the board's DDR (``PynqBuffer.sync_to_device``)."""
        host = self._host_bytes(bo)
        self.model.write_memory(bo + offset, host[offset:offset + size])

    def invalidate(self, bo: int, offset: int, ptr: int, size: int) -> None:
        """The board's DDR to a buffer's host bytes (``PynqBuffer.sync_from_device``)."""
        host = self._host_bytes(bo)
        host[offset:offset + size] = self.model.read_memory(bo + offset, size)

    def read_registers(self, address: int, length: int) -> bytes:
        """``length`` bytes of registers at physical ``address`` (whole 32-bit words)."""
        _check_words(address, length)
        return b"".join(self._read_word(a).to_bytes(4, "little")
                        for a in range(address, address + length, 4))

    def write_registers(self, address: int, data: bytes) -> None:
        """Write ``data`` (whole 32-bit words) to the registers at physical ``address``."""
        _check_words(address, len(data))
        for i in range(0, len(data), 4):
            self._write_word(address + i, int.from_bytes(data[i:i + 4], "little"))

    # ---------------------------------------------------------- internals
    def _read_word(self, address: int) -> int:
        if address in self.board.registers:
            return self.model.read((address - self.board.registers.base) % _CONTROL_SPAN)
        return self._ps.read(address)

    def _write_word(self, address: int, value: int) -> None:
        if address in self.board.registers:
            self.model.write((address - self.board.registers.base) % _CONTROL_SPAN, value)
        else:
            self._ps.write(address, value)

    def _allocate(self, shape: Any, dtype: Any) -> PynqBuffer:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        address = self.allocator.allocate(nbytes)
        host = np.zeros(max(nbytes, 1), dtype=np.uint8)
        buf = PynqBuffer(shape, dtype, buffer=host, device=self, device_address=address,
                         bo=address, coherent=False)
        # pynq's freebuffer() hands a buffer with a pointer back to return_to; its other
        # path unmaps XRT memory, which this is not, so mark that path done.
        buf.memory = buf.return_to = self._memory
        buf.pointer, buf.freed = address, True
        self._host[address] = host
        return buf

    def _free(self, address: int) -> None:
        self._host.pop(address, None)
        self.allocator.free(address)

    def _host_bytes(self, bo: int) -> np.ndarray:
        try:
            return self._host[bo]
        except KeyError:
            raise DeviceError(f"the buffer at {bo:#x} was freed: allocate a new one") from None

    # ------------------------------------------------------------ lifecycle
    def _install(self) -> None:
        if not SimulatedBoard._installed:
            # Read the class attribute itself: the property would probe for devices.
            SimulatedBoard._outside = vars(PynqBaseDevice).get("_active_device", _NO_DEVICE)
        SimulatedBoard._installed.append(self)
        PynqBaseDevice.active_device = self
        _forget_clock_driver()

    def close(self) -> None:
        """Uninstall the board (pynq's active device is again the one before it) and free
        the model (idempotent)."""
        if self._closed:
            return
        self._closed = True
        installed = SimulatedBoard._installed
        installed.remove(self)
        if vars(PynqBaseDevice).get("_active_device") is self:
            if installed:
                PynqBaseDevice.active_device = installed[-1]
            elif SimulatedBoard._outside is not _NO_DEVICE:
                PynqBaseDevice.active_device = SimulatedBoard._outside
            else:
                del PynqBaseDevice._active_device
        if Clocks.device is self:
            _forget_clock_driver()
        self.model.close()
        self._remove_files()

    def _remove_files(self) -> None:
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)

    def __enter__(self) -> SimulatedBoard:  # noqa: PYI034 - no typing_extensions here
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._host)} buffers"
        return (f"<SimulatedBoard {self.board.name} config={self.config.name!r} "
                f"model={type(self.model).__name__} {state}>")


class SimulatedPynqDevice(PynqDevice):
    """A :class:`PynqDevice` on a :class:`SimulatedBoard` it owns: closing the device closes
    the board."""

    def __init__(self, board: SimulatedBoard) -> None:
        #: The simulated board under the driver.
        self.board = board
        super().__init__(board.config, bitstream=board.bitstream)

    def _close(self) -> None:
        super()._close()
        self.board.close()


def simulated_board(config: str | HwConfig, *, board: str | Board = "pynq-z2",
                    model: str = "rtl", directory: str | Path | None = None,
                    **options: Any) -> SimulatedBoard:
    """A :class:`SimulatedBoard` for ``config``, installed as pynq's active device; open
    :attr:`SimulatedBoard.bitstream` with ``PynqDevice`` (or ``pynq.Overlay``) as on a
    board. ``options``: ``memory_bytes``, and for the RTL model :class:`RtlSim`'s."""
    return SimulatedBoard(config, board=board, model=model, directory=directory, **options)


def open_simulated_pynq(config: str | HwConfig, *, board: str | Board = "pynq-z2",
                        model: str = "rtl", directory: str | Path | None = None,
                        **options: Any) -> SimulatedPynqDevice:
    """The ``pynq`` backend on a new simulated board (see :func:`simulated_board`); closing
    the device closes the board."""
    sim_board = simulated_board(config, board=board, model=model, directory=directory,
                                **options)
    try:
        return SimulatedPynqDevice(sim_board)
    except BaseException:
        sim_board.close()
        raise


# ----------------------------------------------------------------- memory
class _Memory:
    """The board's DDR as pynq's memory object (``Device.default_memory``)."""

    def __init__(self, board: SimulatedBoard) -> None:
        self._board = board

    def allocate(self, shape: Any, dtype: Any, **kwargs: Any) -> PynqBuffer:
        """A ``PynqBuffer`` whose ``device_address`` is a page-aligned address in the DDR."""
        return self._board._allocate(shape, dtype)

    def return_pointer(self, pointer: int) -> None:
        """``PynqBuffer.freebuffer`` gives the buffer back here."""
        self._board._free(pointer)


# ---------------------------------------------------------- PS registers
class _PsRegisters:
    """The PS clock registers pynq's clock driver (``pynq.ps.Clocks``) reads and writes when
    an overlay is downloaded, as the board's boot firmware leaves them: the PLL that feeds
    the PL clocks, and PL clock 0 at the config's clock. Any other address outside our
    register window is a bus error, as on the board."""

    def __init__(self, board: Board, clock: PlClock) -> None:
        self._board = board
        self._windows, self._values = _CLOCK_REGISTERS[board.ps.module](board, clock)

    def read(self, address: int) -> int:
        self._check(address)
        return self._values.get(address, 0)

    def write(self, address: int, value: int) -> None:
        self._check(address)
        self._values[address] = value

    def _check(self, address: int) -> None:
        if not any(address in w for w in self._windows):
            raise DeviceError(f"nothing answers at address {address:#010x} on the simulated "
                              f"{self._board.name} (a bus error on a board): the accelerator's "
                              f"registers are at {self._board.registers.base:#010x}")


def _ps7_clock_registers(board: Board, clock: PlClock) -> tuple[list[Window], dict[int, int]]:
    slcr = 0xF800_0000
    return [Window(slcr, 0x1000)], {
        slcr + 0x108: board.ps.pll.fbdiv << 12,                                # IO_PLL_CTRL
        slcr + 0x170: clock.divisor1 << 20 | clock.divisor0 << 8,             # FPGA0_CLK_CTRL
    }


def _psu_clock_registers(board: Board, clock: PlClock) -> tuple[list[Window], dict[int, int]]:
    crl, crf = 0xFF5E_0000, 0xFD1A_0000
    pll = board.ps.pll
    return [Window(crl, 0x1000), Window(crf, 0x1000)], {
        crl + 0x20: int(pll.div2) << 16 | pll.fbdiv << 8,                       # IOPLL_CTRL
        crl + 0xC0: 1 << 24 | clock.divisor1 << 16 | clock.divisor0 << 8,     # PL0_REF_CTRL
    }


_CLOCK_REGISTERS = {"processing_system7": _ps7_clock_registers,
                    "zynq_ultra_ps_e": _psu_clock_registers}


def _forget_clock_driver() -> None:
    """``pynq.ps.Clocks`` keeps the clock driver of the first device it served: drop it, so
    the next overlay gets one for the board it is on."""
    if "_real_instance" in vars(Clocks):
        del Clocks._real_instance
    Clocks.device = None


def _check_words(address: int, length: int) -> None:
    if address % 4 or length % 4:
        raise DeviceError(f"register access of {length} bytes at {address:#x}: the simulated "
                          "board takes whole, aligned 32-bit words")
