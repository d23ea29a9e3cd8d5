"""The accelerator's external interface: control registers, error codes, AXI ports.

This is the one definition the RTL (``tessera.hw``), the RTL simulation
harness, the runtime's drivers and the board flows all build from. It is
plain Python (no Amaranth) so a board with only the runtime installed can use
it.

Control registers sit behind a 32-bit AXI4-Lite slave (``s_axi_control``).
The DRAM masters are AXI4 ports named ``m_axi_p<k>``, one per DRAM port the
config's ``module_ports`` uses (the load module may read over several); see
:func:`axi_ports`.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from enum import IntEnum

from .config import MODULES, HwConfig

#: Width of the AXI4-Lite address (the register window is 2**CTRL_ADDR_BITS bytes).
CTRL_ADDR_BITS = 8
CTRL_DATA_BITS = 32
#: AXI4 masters: 32-bit byte addresses, IDs name the issuing module (its index in MODULES).
AXI_ADDR_BITS = 32
AXI_ID_BITS = 2
AXI_LEN_BITS = 8
#: AXI bursts must not cross a 4 KiB boundary.
AXI_BOUNDARY_BYTES = 4096
#: Read back from VERSION: "TS" and the interface version 1.
VERSION = 0x5453_0001


@dataclass(frozen=True)
class Register:
    """One 32-bit control register."""

    name: str
    offset: int
    access: str          # "rw", "r" or "w"
    doc: str


REGISTERS: tuple[Register, ...] = (
    Register("CONTROL", 0x00, "w", "write 1 to bit 0 to start a run (ignored while running)"),
    Register("STATUS", 0x04, "r", "bit 0 done, bit 1 error, bit 2 running; a start clears done and error"),
    Register("INSN_ADDR", 0x08, "rw", "DRAM byte address of the instruction stream (4 KiB aligned)"),
    Register("INSN_COUNT", 0x0C, "rw", "number of instructions in the stream"),
    Register("CYCLES_LO", 0x10, "r", "cycles of the current or last run, low word"),
    Register("CYCLES_HI", 0x14, "r", "cycles of the current or last run, high word"),
    Register("ERROR_CODE", 0x18, "r", "an ErrorCode; 0 when the last run had no error"),
    Register("ERROR_INDEX", 0x1C, "r", "index of the instruction that raised the error"),
    Register("CONFIG_ID", 0x20, "r", "config_id() of the HwConfig the bitstream was built from"),
    Register("VERSION", 0x24, "r", f"interface version, {VERSION:#010x}"),
)
REG = {r.name: r.offset for r in REGISTERS}

STATUS_DONE = 1 << 0
STATUS_ERROR = 1 << 1
STATUS_RUNNING = 1 << 2
CONTROL_START = 1 << 0


#: Width of ERROR_CODE's value in the hardware.
ERROR_CODE_BITS = 4


class ErrorCode(IntEnum):
    """Why the hardware stopped a run (read from ERROR_CODE); :data:`ERROR_MEANINGS` says
    what each means.

    The hardware checks what is cheap to check and stops instead of writing
    out of range; the simulator raises the matching ``tessera.errors`` class.
    """

    NONE = 0
    OPCODE = 1
    MEM_TYPE = 2
    SRAM_BOUNDS = 3
    UOP_BOUNDS = 4
    INDEX_BOUNDS = 5
    ALU_OP = 6
    DRAM_ADDRESS = 7
    AXI_RESPONSE = 8
    SIMULATOR = 15


ERROR_MEANINGS: dict[ErrorCode, str] = {
    ErrorCode.NONE: "no error",
    ErrorCode.OPCODE: "a reserved opcode",
    ErrorCode.MEM_TYPE: "a reserved memory type, or one the module cannot move",
    ErrorCode.SRAM_BOUNDS: "a LOAD/STORE past the end of its on-chip buffer",
    ErrorCode.UOP_BOUNDS: "a GEMM/ALU uop range past the uop buffer",
    ErrorCode.INDEX_BOUNDS: "a GEMM/ALU buffer index past the end of its buffer",
    ErrorCode.ALU_OP: "an ALU opcode with no hardware in this build",
    ErrorCode.DRAM_ADDRESS: "a DRAM byte address past 2**32",
    ErrorCode.AXI_RESPONSE: "the DRAM answered SLVERR/DECERR",
    # Never from the hardware: the cycle simulator's register model (tessera.sim.registers).
    ErrorCode.SIMULATOR: "a fault the simulator detects and the hardware does not check "
                         "(a hazard, a deadlock, no FINISH)",
}
assert set(ERROR_MEANINGS) == set(ErrorCode)

assert max(ErrorCode) < 1 << ERROR_CODE_BITS


def config_id(config: HwConfig) -> int:
    """A 32-bit identity of ``config`` (CRC-32 of its canonical JSON).

    The hardware reports it in CONFIG_ID so a driver can refuse a bitstream
    built for another config.
    """
    canonical = json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":"))
    return zlib.crc32(canonical.encode())


@dataclass(frozen=True)
class AxiPort:
    """One AXI4 master port: which modules read and write through it."""

    index: int
    readers: tuple[str, ...]      # modules issuing reads (fetch, load, compute)
    writer: bool                  # the store module writes through it
    data_bits: int

    @property
    def name(self) -> str:
        return f"m_axi_p{self.index}"

    @property
    def reads(self) -> bool:
        return bool(self.readers)


def axi_ports(config: HwConfig) -> list[AxiPort]:
    """The AXI4 master ports of ``config``, in port order (unused ports omitted)."""
    ports = []
    for p in range(config.dram_ports):
        users = [m for m in MODULES if p in config.ports_of(m)]
        if users:
            ports.append(AxiPort(p, tuple(m for m in users if m != "store"), "store" in users,
                                 config.bus_bytes * 8))
    return ports


def axi_id(module: str) -> int:
    """The AXI ID a module's transactions carry."""
    return MODULES.index(module)


def describe(config: HwConfig) -> dict:
    """The register map and ports as a JSON-able dict (written by ``tessera hw verilog``)."""
    return {
        "config": config.to_dict(),
        "config_id": f"{config_id(config):#010x}",
        "version": f"{VERSION:#010x}",
        "clock": {"port": "aclk", "mhz": config.clock_mhz},
        "reset": {"port": "aresetn", "active": "low"},
        "interrupt": {"port": "interrupt", "doc": "high while STATUS.done is set"},
        "control": {"port": "s_axi_control", "protocol": "AXI4-Lite",
                    "addr_bits": CTRL_ADDR_BITS, "data_bits": CTRL_DATA_BITS,
                    "registers": [asdict(r) for r in REGISTERS]},
        "status_bits": {"done": STATUS_DONE, "error": STATUS_ERROR, "running": STATUS_RUNNING},
        "error_codes": {e.name: {"code": int(e), "meaning": ERROR_MEANINGS[e]}
                        for e in ErrorCode},
        "masters": [{"port": p.name, "protocol": "AXI4", "dram_port": p.index,
                     "data_bits": p.data_bits, "addr_bits": AXI_ADDR_BITS,
                     "id_bits": AXI_ID_BITS, "read": p.reads, "write": p.writer,
                     "modules": list(p.readers) + (["store"] if p.writer else [])}
                    for p in axi_ports(config)],
    }
