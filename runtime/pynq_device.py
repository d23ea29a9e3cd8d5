"""The ``pynq`` backend: the accelerator on a PYNQ board, through the pynq package.

``pynq.Overlay`` loads the bitstream and reads the ``.hwh`` beside it, which says
where our IP's registers sit (:data:`tessera.hwh.IP_VLNV` finds it); ``pynq.MMIO``
reaches the registers, ``pynq.allocate`` gives the physically contiguous buffers
the accelerator's DMA reads and writes. The same code runs on a PYNQ-Z1/Z2 (the
v3.1 image: pynq 3.1, Python 3.10), on pynq 4.0 boards, and on a laptop against the
simulated board of :mod:`tessera.runtime.pynq_sim`. It uses only the pynq API the
3.1 and 4.0 releases share: ``Overlay(path, download=)``, ``Overlay.ip_dict``,
``Overlay.device``, ``Overlay.download()``, ``MMIO(addr, length, device=)`` with
``read``/``write``, ``allocate(shape=, dtype=, target=)``, and
``PynqBuffer.device_address``, ``sync_to_device``, ``sync_from_device``,
``freebuffer``.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tessera.config import HwConfig
from tessera.errors import DeviceError
from tessera.hwh import IP_VLNV
from tessera.regmap import CTRL_ADDR_BITS

from tessera.bitstreams import find_bitstream
from .device import Device
from .memory import PAGE_BYTES

__all__ = ["PynqDevice"]

#: How long the driver sleeps between two STATUS polls.
POLL_SECONDS = 1e-3


class PynqDevice(Device):
    """The accelerator in the overlay ``bitstream`` (a ``.bit`` with its ``.hwh`` beside it).

    Without ``bitstream``, the one installed for ``config`` is used
    (:func:`tessera.bitstreams.find_bitstream`, restricted to ``board`` when
    given): ``tessera hw bitstream`` installs them, ``TESSERA_BITSTREAMS`` says where.
    ``download=False`` uses the bitstream already in the FPGA (pynq still reads the
    ``.hwh``). ``ip_name`` picks our IP by its instance name in the block design when
    the design has several; by default the one IP with the VLNV
    :data:`tessera.hwh.IP_VLNV` is used. Opening checks VERSION and CONFIG_ID, so a
    bitstream built for another config is refused.
    """

    backend = "pynq"
    #: A board at 100 MHz runs 10**9 cycles in this time.
    default_timeout = 10.0

    def __init__(self, config: HwConfig, *, bitstream: str | Path | None = None,
                 download: bool = True, ip_name: str | None = None,
                 board: str | None = None) -> None:
        super().__init__(config)
        if bitstream is None:
            # Look it up before importing pynq: a missing bitstream is the likelier
            # mistake, and its message says where to put one.
            try:
                bitstream = find_bitstream(config, board)
            except DeviceError as exc:
                raise DeviceError(f"the pynq backend needs the bitstream to load and none was "
                                  f"given: {exc}") from None
        self._pynq = _import_pynq()
        path = _check_bitstream(Path(bitstream))
        try:
            self.overlay = self._pynq.Overlay(str(path), download=download)
        except Exception as exc:
            raise DeviceError(f"pynq could not load the overlay {path}: {type(exc).__name__}: "
                              f"{exc} (is this a PYNQ board, or a simulated one from "
                              "tessera.runtime.pynq_sim?)") from exc
        #: The IP's instance name and its ``ip_dict`` entry.
        self.ip_name, self.ip = _find_ip(self.overlay.ip_dict, ip_name, path)
        self.mmio = self._pynq.MMIO(self.ip["phys_addr"], self.ip["addr_range"],
                                    device=self.overlay.device)
        self.check_identity()

    # ------------------------------------------------------------------ memory
    def _mem_alloc(self, nbytes: int) -> tuple[int, Any]:
        # A zero-length buffer has no address: give it one byte.
        buf = self._pynq.allocate(shape=(max(nbytes, 1),), dtype=np.uint8,
                                  target=self.overlay.device)
        address = int(buf.device_address)
        if address % PAGE_BYTES:
            buf.freebuffer()
            raise DeviceError(f"pynq.allocate returned a buffer at {address:#x}, which is not "
                              f"{PAGE_BYTES}-byte aligned: the accelerator needs page-aligned "
                              "buffers (check the board's CMA allocator)")
        return address, buf

    def _mem_free(self, handle: Any) -> None:
        handle.freebuffer()

    def _mem_write(self, handle: Any, offset: int, data: np.ndarray) -> None:
        view = handle[offset:offset + data.size]
        view[:] = data
        view.sync_to_device()

    def _mem_read(self, handle: Any, offset: int, nbytes: int) -> np.ndarray:
        view = handle[offset:offset + nbytes]
        view.sync_from_device()
        return np.array(view, dtype=np.uint8)

    # --------------------------------------------------------------- registers
    def _reg_read(self, offset: int) -> int:
        return int(self.mmio.read(offset))

    def _reg_write(self, offset: int, value: int) -> None:
        # pynq's MMIO takes a Python int only (numpy integers are rejected).
        self.mmio.write(offset, int(value))

    def _idle(self, seconds: float) -> None:
        time.sleep(min(seconds, POLL_SECONDS))

    def _reset(self) -> None:
        # Downloading the bitstream again is the one power-up reset a board offers.
        self.overlay.download()

    def _close(self) -> None:
        self.mmio = None
        self.overlay = None


def _import_pynq() -> Any:
    try:
        import pynq
    except ImportError:
        raise DeviceError('the pynq backend needs the pynq package: pip install -e ".[pynq]" '
                          "(on a board it comes with the PYNQ image)") from None
    return pynq


def _check_bitstream(path: Path) -> Path:
    """The absolute path of the bitstream, after checking it and its ``.hwh`` exist."""
    if not path.is_file():
        raise DeviceError(f"bitstream {path} does not exist: build it with the board flow "
                          "(tessera hw bitstream), or give the path of one")
    hwh = path.with_suffix(".hwh")
    if not hwh.is_file():
        raise DeviceError(f"bitstream {path} has no hardware handoff {hwh} beside it: pynq needs "
                          "the .hwh Vivado wrote with the bitstream to find the accelerator")
    return path.resolve()


def _find_ip(ip_dict: Any, ip_name: str | None, path: Path) -> tuple[str, dict]:
    """Our IP's name and ``ip_dict`` entry: ``ip_name``, else the one with our VLNV."""
    found = ", ".join(f"{name} ({entry.get('type')})" for name, entry in ip_dict.items())
    if ip_name is not None:
        if ip_name not in ip_dict:
            raise DeviceError(f"the overlay {path} has no IP named {ip_name!r}; its .hwh lists: "
                              f"{found or 'no IP'}")
        name = ip_name
    else:
        names = [n for n, entry in ip_dict.items() if entry.get("type") == IP_VLNV]
        if not names:
            raise DeviceError(f"the overlay {path} has no Tessera accelerator (an IP of type "
                              f"{IP_VLNV}); its .hwh lists: {found or 'no IP'}. Load a Tessera "
                              "bitstream, or pass ip_name= if the IP was packaged under "
                              "another VLNV")
        if len(names) > 1:
            raise DeviceError(f"the overlay {path} has {len(names)} Tessera accelerators "
                              f"({', '.join(names)}): pass ip_name= to choose one")
        name = names[0]
    entry = ip_dict[name]
    window = entry.get("addr_range") or 0
    if entry.get("phys_addr") is None or window < 1 << CTRL_ADDR_BITS:
        raise DeviceError(f"IP {name!r} in the overlay {path} has no register window of at least "
                          f"{1 << CTRL_ADDR_BITS} bytes (phys_addr {entry.get('phys_addr')}, "
                          f"addr_range {entry.get('addr_range')}): is its s_axi_control "
                          "mapped in the block design's address editor?")
    return name, entry
