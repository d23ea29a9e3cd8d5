"""The fast RTL simulation: the accelerator's Verilog compiled by Verilator.

:class:`RtlSim` compiles ``tessera_top`` (from :func:`tessera.hw.synth.export.verilog`, or
Verilog you pass), behind a registered reset (:func:`.verilator_build.sim_top_source`: it
keeps Verilator from re-evaluating every register's next value on each ``eval``), together
with the C++ harness ``hw/harness/verilator/harness.cpp`` into a shared library
(:mod:`.verilator_build`, which caches builds) and drives it through ctypes. The harness
puts the DRAM model of docs/hardware.md ("DRAM model") behind every ``m_axi_p<k>`` master of
:func:`tessera.regmap.axi_ports` and an AXI4-Lite master on ``s_axi_control``.

:func:`run_program` runs a :class:`tessera.isa.Program` the way the board driver
does: DRAM image at address 0, INSN_ADDR, INSN_COUNT, CONTROL start, wait for
``interrupt``, read the registers and DRAM back.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from tessera.config import HwConfig
from tessera.errors import DeadlockError, ProgramError, RtlSimError
from tessera.regmap import (CONTROL_START, CTRL_ADDR_BITS, REG, REGISTERS, STATUS_DONE,
                            STATUS_ERROR, STATUS_RUNNING, ErrorCode, config_id)

from .verilator_build import HARNESS_ABI, build_library, harness_ports

if TYPE_CHECKING:
    from tessera.isa import Program

__all__ = ["DEFAULT_DRAM_BYTES", "DEFAULT_MAX_CYCLES", "Handshake", "PortStats", "RtlResult",
           "RtlSim", "RtlSimError", "run_program"]

DEFAULT_DRAM_BYTES = 1 << 28
DEFAULT_MAX_CYCLES = 20_000_000
RESET_CYCLES = 4
MMIO_TIMEOUT = 10_000
_CHUNK = 1 << 20
CHANNELS = ("AR", "R", "AW", "W", "B")
_STAT_FIELDS = ("ar", "r", "aw", "w", "b", "read_grants", "r_slverr", "b_slverr")


# --------------------------------------------------------------------- ctypes
_u64, _u32, _int, _vp = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "tsim_abi_version": ([], _int),
    "tsim_num_ports": ([], _int),
    "tsim_bus_bytes": ([], _int),
    "tsim_create": ([_u64, _u64, ctypes.c_double, ctypes.c_char_p], _vp),
    "tsim_destroy": ([_vp], None),
    "tsim_reset": ([_vp, _int, _int], None),
    "tsim_step": ([_vp, _u64], _u64),
    "tsim_run_until_interrupt": ([_vp, _u64], _u64),
    "tsim_interrupt": ([_vp], _int),
    "tsim_cycle": ([_vp], _u64),
    "tsim_mmio_write": ([_vp, _u32, _u32, _u32, _u64, ctypes.POINTER(_u64)], _int),
    "tsim_mmio_read": ([_vp, _u32, ctypes.POINTER(_u32), _u64, ctypes.POINTER(_u64)], _int),
    "tsim_dram_bytes": ([_vp], _u64),
    "tsim_dram_read": ([_vp, _u64, _vp, _u64], _int),
    "tsim_dram_write": ([_vp, _u64, _vp, _u64], _int),
    "tsim_dram_fill": ([_vp, _u64, _int, _u64], _int),
    "tsim_log_enable": ([_vp, _int], None),
    "tsim_log_take": ([_vp, _vp, _u64], _u64),
    "tsim_log_size": ([_vp], _u64),
    "tsim_port_stats": ([_vp, _int, ctypes.POINTER(_u64), _int], _int),
    "tsim_port_index": ([_vp, _int], _int),
    "tsim_protocol_errors": ([_vp], _u64),
    "tsim_settles": ([_vp], _u64),
    "tsim_settle_always": ([_vp, _int], None),
    "tsim_protocol_message": ([_vp], ctypes.c_char_p),
    "tsim_trace_flush": ([_vp], None),
}
_loaded: dict[str, ctypes.CDLL] = {}


def _load(path: Path) -> ctypes.CDLL:
    key = str(path)
    if key not in _loaded:
        try:
            lib = ctypes.CDLL(key)
        except OSError as exc:
            raise RtlSimError(f"cannot load the RTL simulation library {path}: {exc}; delete "
                              f"{path.parent} to rebuild it") from None
        for name, (argtypes, restype) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = restype
        if lib.tsim_abi_version() != HARNESS_ABI:
            raise RtlSimError(f"{path} was built from another harness version; delete "
                              f"{path.parent} to rebuild it")
        _loaded[key] = lib
    return _loaded[key]


class Handshake(NamedTuple):
    """One AXI handshake seen by the DRAM model: ``cycle``, port ``k`` of ``m_axi_p<k>``,
    ``channel`` (AR, R, AW, W or B)."""

    cycle: int
    port: int
    channel: str


@dataclass(frozen=True)
class PortStats:
    """Handshake counts of one ``m_axi_p<k>`` port since the last reset."""

    ar: int
    r: int
    aw: int
    w: int
    b: int
    read_grants: int      # read beats the DDR budget was charged for
    r_slverr: int
    b_slverr: int


def _reg_offset(reg: int | str) -> tuple[int, str]:
    if isinstance(reg, str):
        name = reg.upper()
        if name not in REG:
            raise RtlSimError(f"unknown register {reg!r}; registers: {', '.join(REG)}")
        return REG[name], name
    offset = int(reg)
    if not 0 <= offset < 2 ** CTRL_ADDR_BITS or offset % 4:
        raise RtlSimError(f"register offset {offset:#x} is not a word in the "
                          f"{2 ** CTRL_ADDR_BITS}-byte control window")
    names = [r.name for r in REGISTERS if r.offset == offset]
    return offset, names[0] if names else f"{offset:#04x}"


class RtlSim:
    """One Verilator model of ``tessera_top`` with the harness's DRAM model.

    ``verilog`` defaults to ``tessera.hw.synth.export.verilog(config)``. ``dram_latency`` and
    ``ddr_bytes_per_cycle`` default to the config's; ``trace`` names a VCD (or ``...hw.fst``)
    file to record every signal into (a separate, slower build). ``cxx`` is the C++
    compiler's command (default: ``$CXX``, else the ``ziglang`` wheel's clang, else g++;
    each compiler's build is cached apart). The model is reset on construction.
    """

    def __init__(self, config: HwConfig, verilog: str | None = None, *,
                 dram_bytes: int = DEFAULT_DRAM_BYTES, dram_latency: int | None = None,
                 ddr_bytes_per_cycle: float | None = None, trace: str | Path | None = None,
                 cache_dir: str | Path | None = None, jobs: int = 2, quiet: bool = False,
                 cxx: str | None = None) -> None:
        self._h = None
        self.config = config
        self.ports = harness_ports(config)
        self.dram_latency = config.dram_latency if dram_latency is None else int(dram_latency)
        self.ddr_bytes_per_cycle = float(config.ddr_bytes_per_cycle if ddr_bytes_per_cycle is None
                                         else ddr_bytes_per_cycle)
        if self.dram_latency < 1:
            raise RtlSimError(f"dram_latency must be at least 1 cycle, not {self.dram_latency}")
        if not self.ddr_bytes_per_cycle > 0:
            raise RtlSimError(f"ddr_bytes_per_cycle must be positive, not "
                              f"{self.ddr_bytes_per_cycle}")
        if dram_bytes < 1:
            raise RtlSimError(f"dram_bytes must be positive, not {dram_bytes}")
        self.library, self.built = build_library(config, verilog, trace=trace,
                                                 cache_dir=cache_dir, jobs=jobs, quiet=quiet,
                                                 cxx=cxx)
        self._lib = lib = _load(self.library)
        if lib.tsim_num_ports() != len(self.ports) or lib.tsim_bus_bytes() != config.bus_bytes:
            raise RtlSimError(f"{self.library} does not match config {config.name!r}; delete "
                              f"{self.library.parent} to rebuild it")
        self.trace = None if trace is None else Path(trace)
        h = lib.tsim_create(int(dram_bytes), self.dram_latency, self.ddr_bytes_per_cycle,
                            str(self.trace).encode() if self.trace else None)
        if not h:
            raise RtlSimError(f"cannot allocate {dram_bytes} bytes of simulated DRAM")
        self._h = h
        self.dram_bytes = int(dram_bytes)
        self.reset()

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Free the model (and close the trace file); the object is unusable afterwards."""
        if self._h:
            self._lib.tsim_destroy(self._h)
            self._h = None

    def __enter__(self) -> RtlSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:   # interpreter shutdown
            pass

    def _handle(self):
        if not self._h:
            raise RtlSimError("this RtlSim is closed")
        return self._h

    def reset(self, cycles: int = RESET_CYCLES, *, power_on: bool = False) -> None:
        """Hold ``aresetn`` low for ``cycles`` cycles and empty the DRAM model's queues (not
        the DRAM); :attr:`cycle` restarts at 0.

        A reset, as on the board, leaves the on-chip memories as they were;
        ``power_on=True`` first replaces the model by a fresh one (every register and
        memory at its initial value, as after loading the bitstream; a trace restarts)."""
        self._lib.tsim_reset(self._handle(), max(1, int(cycles)), int(power_on))

    # ---------------------------------------------------------------- clock
    @property
    def cycle(self) -> int:
        """Cycles since the end of the last reset."""
        return self._lib.tsim_cycle(self._handle())

    @property
    def interrupt(self) -> bool:
        return bool(self._lib.tsim_interrupt(self._handle()))

    def step(self, n: int = 1) -> None:
        """Run ``n`` clock cycles."""
        if n < 0:
            raise RtlSimError(f"cannot step {n} cycles")
        self._lib.tsim_step(self._handle(), int(n))

    def run_until_interrupt(self, max_cycles: int) -> int:
        """Run until ``interrupt`` is high (at most ``max_cycles``); returns the cycles run.
        Check :attr:`interrupt` to tell an interrupt from a timeout."""
        h, done = self._handle(), 0
        while done < max_cycles:
            n = self._lib.tsim_run_until_interrupt(h, min(_CHUNK, max_cycles - done))
            done += n
            if self._lib.tsim_interrupt(h):
                break
        return done

    # -------------------------------------------------------------- control
    def mmio_write(self, offset: int, value: int, strb: int = 0xF) -> int:
        """One AXI4-Lite write (consumes cycles); returns BRESP."""
        if not 0 <= value < 2 ** 32:
            raise RtlSimError(f"register value {value} does not fit 32 bits")
        offset, name = _reg_offset(offset)
        cycles = _u64()
        resp = self._lib.tsim_mmio_write(self._handle(), offset, value, strb, MMIO_TIMEOUT,
                                         ctypes.byref(cycles))
        if resp < 0:
            raise RtlSimError(f"writing register {name}: s_axi_control did not complete the "
                              f"write within {MMIO_TIMEOUT} cycles (awready/wready/bvalid never "
                              "came); the control slave hangs")
        return resp

    def mmio_read(self, offset: int) -> tuple[int, int]:
        """One AXI4-Lite read (consumes cycles); returns (RDATA, RRESP)."""
        offset, name = _reg_offset(offset)
        data, cycles = _u32(), _u64()
        resp = self._lib.tsim_mmio_read(self._handle(), offset, ctypes.byref(data), MMIO_TIMEOUT,
                                        ctypes.byref(cycles))
        if resp < 0:
            raise RtlSimError(f"reading register {name}: s_axi_control did not answer within "
                              f"{MMIO_TIMEOUT} cycles (arready/rvalid never came); the control "
                              "slave hangs")
        return data.value, resp

    def write_reg(self, reg: int | str, value: int) -> None:
        """Write a control register by offset or name (``"INSN_ADDR"``)."""
        offset, name = _reg_offset(reg)
        resp = self.mmio_write(offset, int(value))
        if resp:
            raise RtlSimError(f"writing register {name} returned response {resp} "
                              f"({'SLVERR' if resp == 2 else 'DECERR' if resp == 3 else 'EXOKAY'})")

    def read_reg(self, reg: int | str) -> int:
        """Read a control register by offset or name (``"STATUS"``)."""
        offset, name = _reg_offset(reg)
        data, resp = self.mmio_read(offset)
        if resp:
            raise RtlSimError(f"reading register {name} returned response {resp} "
                              f"({'SLVERR' if resp == 2 else 'DECERR' if resp == 3 else 'EXOKAY'})")
        return data

    # ----------------------------------------------------------------- DRAM
    def _check_range(self, addr: int, n: int, what: str) -> None:
        if addr < 0 or n < 0 or addr + n > self.dram_bytes:
            raise RtlSimError(f"{what} [{addr:#x}, {addr + n:#x}) is outside the simulated DRAM "
                              f"of {self.dram_bytes:#x} bytes (RtlSim(dram_bytes=...))")

    def read_dram(self, addr: int, n: int) -> np.ndarray:
        """``n`` bytes of DRAM from ``addr`` (a copy, ``np.uint8``; no cycles)."""
        self._check_range(addr, n, "DRAM read")
        out = np.empty(n, dtype=np.uint8)
        self._lib.tsim_dram_read(self._handle(), addr, out.ctypes.data, n)
        return out

    def write_dram(self, addr: int, data: bytes | bytearray | np.ndarray) -> None:
        """Copy ``data`` (bytes, or any array taken as raw bytes) into DRAM at ``addr``."""
        if isinstance(data, np.ndarray):
            raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        else:
            raw = np.frombuffer(bytes(data), dtype=np.uint8)
        self._check_range(addr, raw.size, "DRAM write")
        self._lib.tsim_dram_write(self._handle(), addr, raw.ctypes.data, raw.size)

    def fill_dram(self, addr: int, n: int, value: int = 0) -> None:
        """Set ``n`` bytes of DRAM from ``addr`` to ``value``."""
        self._check_range(addr, n, "DRAM fill")
        self._lib.tsim_dram_fill(self._handle(), addr, value & 0xFF, n)

    # ----------------------------------------------------------- inspection
    def log_handshakes(self, on: bool = True) -> None:
        """Record every AXI master handshake (see :meth:`take_handshakes`); clears the log."""
        self._lib.tsim_log_enable(self._handle(), int(on))

    def take_handshakes(self) -> list[Handshake]:
        """The handshakes recorded since the last call, oldest first."""
        h = self._handle()
        n = self._lib.tsim_log_size(h)
        raw = np.empty(n, dtype=np.uint64)
        n = self._lib.tsim_log_take(h, raw.ctypes.data, n)
        return [Handshake(int(e >> 16), int((e >> 8) & 0xFF), CHANNELS[int(e & 0xFF)])
                for e in raw[:n].tolist()]

    def port_stats(self) -> dict[int, PortStats]:
        """Per-port handshake counts since the last reset, by the ``k`` of ``m_axi_p<k>``."""
        h, out = self._handle(), {}
        buf = (_u64 * len(_STAT_FIELDS))()
        for i in range(len(self.ports)):
            self._lib.tsim_port_stats(h, i, buf, len(_STAT_FIELDS))
            out[self._lib.tsim_port_index(h, i)] = PortStats(*(int(v) for v in buf))
        return out

    @property
    def settled_cycles(self) -> int:
        """Cycles since the last reset in which the DRAM model's or the control master's
        signals changed, so the harness evaluated the model at the falling edge too (the
        others take one evaluation: nothing follows unchanged inputs)."""
        return self._lib.tsim_settles(self._handle())

    def settle_every_cycle(self, on: bool = True) -> None:
        """Evaluate the model at every falling edge, whether or not its inputs changed
        (the default skips those evaluations, which change nothing): for tests and
        measurements that compare the two."""
        self._lib.tsim_settle_always(self._handle(), int(on))

    @property
    def protocol_errors(self) -> list[str]:
        """AXI protocol violations the DRAM model saw (the first few, with their cycle):
        bursts crossing 4 KiB, a size other than the bus width, a non-INCR burst, a wlast
        that does not match awlen, valid/ready depending combinationally on the model."""
        h = self._handle()
        if not self._lib.tsim_protocol_errors(h):
            return []
        lines = self._lib.tsim_protocol_message(h).decode().splitlines()
        extra = self._lib.tsim_protocol_errors(h) - len(lines)
        return lines + ([f"... and {extra} more"] if extra > 0 else [])

    def flush_trace(self) -> None:
        self._lib.tsim_trace_flush(self._handle())

    def __repr__(self) -> str:
        return (f"RtlSim(config={self.config.name!r}, dram_bytes={self.dram_bytes:#x}, "
                f"latency={self.dram_latency}, ddr_bytes_per_cycle={self.ddr_bytes_per_cycle}, "
                f"cycle={self.cycle if self._h else 'closed'})")


# ---------------------------------------------------------------- programs
@dataclass
class RtlResult:
    """What an RTL run produced: final DRAM (the program's image), registers, model stats."""

    program: Program
    dram: np.ndarray
    cycles: int                 # the CYCLES register
    error: ErrorCode
    error_index: int
    status: int
    sim_cycles: int             # clock cycles from the end of the start write to the interrupt
    port_stats: dict[int, PortStats] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NONE and not self.status & STATUS_ERROR

    def read(self, segment: str, dtype: np.dtype | str = np.uint8,
             shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A segment of the final DRAM, viewed as ``dtype`` and ``shape``."""
        return self.program.read(self.dram, segment, dtype, shape)


def run_program(program: Program, sim: RtlSim | None = None, *,
                max_cycles: int = DEFAULT_MAX_CYCLES, power_on: bool = True,
                check_protocol: bool = True, **sim_options) -> RtlResult:
    """Run ``program`` on the RTL: image at DRAM 0, INSN_ADDR/INSN_COUNT, start, wait for the
    interrupt. ``sim_options`` go to :class:`RtlSim` when ``sim`` is not given.

    The model is reset first; with ``power_on`` (the default) it starts as after loading
    the bitstream, on-chip memories zeroed like the simulator's, so a run does not depend
    on the runs before it (``power_on=False``: only ``aresetn``, memories keep their data).

    Raises :class:`tessera.errors.DeadlockError` if no interrupt comes within
    ``max_cycles``, and :class:`RtlSimError` if the design broke the AXI rules the DRAM
    model relies on (``check_protocol``). A run the hardware stopped with an error
    returns normally with :attr:`RtlResult.error` set.
    """
    config = program.config
    image = program.dram_image()
    if sim is None:
        dram_bytes = max(sim_options.pop("dram_bytes", DEFAULT_DRAM_BYTES), image.size)
        sim = RtlSim(config, dram_bytes=dram_bytes, **sim_options)
    elif sim_options:
        raise TypeError(f"options {sorted(sim_options)} only apply when run_program builds "
                        "the RtlSim")
    elif sim.config != config:
        raise ProgramError(f"the program was built for config {config.name!r}, the RTL "
                           f"simulation runs {sim.config.name!r}: rebuild the program or the "
                           "RtlSim")
    if image.size > sim.dram_bytes:
        raise RtlSimError(f"the program's DRAM image ({image.size:#x} bytes) does not fit the "
                          f"simulated DRAM ({sim.dram_bytes:#x}): RtlSim(dram_bytes=...)")
    sim.reset(power_on=power_on)
    got = sim.read_reg("CONFIG_ID")
    if got != config_id(config):
        raise RtlSimError(f"the RTL reports CONFIG_ID {got:#010x}, config {config.name!r} is "
                          f"{config_id(config):#010x}: the Verilog was built for another config")
    sim.write_dram(0, image)
    sim.write_reg("INSN_ADDR", program.insn_addr)
    sim.write_reg("INSN_COUNT", len(program.instructions))
    sim.write_reg("CONTROL", CONTROL_START)
    start = sim.cycle
    sim.run_until_interrupt(max_cycles)
    if not sim.interrupt:
        status = sim.read_reg("STATUS")
        state = ", ".join(n for bit, n in ((STATUS_RUNNING, "running"), (STATUS_DONE, "done"),
                                          (STATUS_ERROR, "error")) if status & bit) or "idle"
        raise DeadlockError(
            f"no FINISH after {max_cycles} cycles on the RTL of config {config.name!r} "
            f"(STATUS {status:#x}: {state}): the program may deadlock (run it on the simulator, "
            f"tessera.sim.simulate(program), for a diagnosis) or need more cycles "
            f"(run_program(..., max_cycles=...))")
    sim_cycles = sim.cycle - start
    cycles = sim.read_reg("CYCLES_LO") | sim.read_reg("CYCLES_HI") << 32
    status = sim.read_reg("STATUS")
    code = sim.read_reg("ERROR_CODE")
    index = sim.read_reg("ERROR_INDEX")
    try:
        error = ErrorCode(code)
    except ValueError:
        raise RtlSimError(f"the RTL reports ERROR_CODE {code}, which is not an ErrorCode") from None
    if check_protocol and sim.protocol_errors:
        raise RtlSimError(f"the RTL of config {config.name!r} broke the AXI protocol the DRAM "
                          "model relies on:\n  " + "\n  ".join(sim.protocol_errors))
    return RtlResult(program, sim.read_dram(0, image.size), cycles, error, index, status,
                     sim_cycles, sim.port_stats())
