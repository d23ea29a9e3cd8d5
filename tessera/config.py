"""The hardware configuration every layer derives from.

One frozen :class:`HwConfig` fixes the GEMM shape, data widths, buffer depths,
queue depths, the DRAM system and the clock. The ISA field widths, the
simulator's buffers and timing, and (later) the RTL are all computed from it.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CLI, PYTHON, ConfigError

#: The four modules of the accelerator, in the order ``module_ports`` lists them.
MODULES: tuple[str, ...] = ("fetch", "load", "compute", "store")
#: The one module that may read over several DRAM ports (``module_ports`` gives it a
#: tuple): each LOAD's entries are then split between them (``tessera.timing.load_ports``).
MULTI_PORT_MODULE = "load"

_SUPPORTED_WIDTHS = {
    "inp_width": (8, 16),
    "wgt_width": (8, 16),
    "acc_width": (32,),
    "out_width": (8, 16, 32),
}


def _clog2(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1



#: The accumulator (and the output buffer that mirrors it) is split into this
#: many equal banks by row: rows [0, acc_depth/2) and [acc_depth/2, acc_depth).
#: The GEMM core and the tensor ALU can run at once on different banks
#: (docs/timing.md, "Compute units").
ACC_BANKS = 2

@dataclass(frozen=True)
class HwConfig:
    """A complete accelerator configuration (immutable, hashable, JSON-able).

    Buffer depths count entries: an input entry is ``batch x block_in``
    values, a weight entry ``block_out x block_in``, an accumulator or output
    entry ``batch x block_out``, a uop entry one uop.
    """

    name: str = "pynq"
    # GEMM core shape: BATCH x BLOCK_IN x BLOCK_OUT multiply-accumulates per cycle.
    batch: int = 1
    block_in: int = 16
    block_out: int = 16
    # Data widths in bits.
    inp_width: int = 8
    wgt_width: int = 8
    acc_width: int = 32
    out_width: int = 8
    # On-chip buffer depths in entries.
    uop_depth: int = 8192
    inp_depth: int = 2048
    wgt_depth: int = 1024
    acc_depth: int = 2048
    out_depth: int = 2048
    # The tensor ALU's table memory: int8 entries that ALU ops declaring ``reads_table``
    # (a lookup-table activation, say) read per lane; loaded by ``LOAD tbl`` in rows of
    # ``batch x block_out`` entries. 0 leaves the memory, and every op reading it, out.
    table_entries: int = 1024
    # Queues: each module's command FIFO and each of the four dependency-token FIFOs.
    cmd_queue_depth: int = 512
    token_queue_depth: int = 1024
    # Width of the GEMM/ALU loop-count fields (max loop extent is 2**loop_bits - 1).
    loop_bits: int = 13
    # DRAM system.
    bus_bytes: int = 8
    dram_ports: int = 4
    # Each module's DRAM port, in MODULES order; the load module may name a tuple of
    # several (a power of two of them), read at once (docs/timing.md, "LOAD and STORE").
    module_ports: tuple[int | tuple[int, ...], ...] = (0, 1, 2, 3)
    dram_latency: int = 32
    ddr_bytes_per_cycle: float = 21.0
    max_burst_beats: int = 16
    clock_mhz: float = 100.0
    # The FPGA part this config targets (for resource estimates).
    part: str = "xc7z020clg400-1"

    def __post_init__(self) -> None:
        if isinstance(self.module_ports, (list, tuple)):      # lists as JSON gives them
            object.__setattr__(self, "module_ports",
                               tuple(_canonical_ports(p) for p in self.module_ports))
        self._validate()

    # ----------------------------------------------------------- validation
    def _validate(self) -> None:
        def fail(msg: str) -> None:
            raise ConfigError(f"{msg} (config {self.name!r})")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
                fail(f"{f.name} must be an integer, not {value!r}")
            if f.type in ("float", float) and (not isinstance(value, (int, float))
                                               or isinstance(value, bool)):
                fail(f"{f.name} must be a number, not {value!r}")
            if f.type in ("str", str) and not isinstance(value, str):
                fail(f"{f.name} must be a string, not {value!r}")
        for name in ("batch", "block_in", "block_out", "uop_depth", "inp_depth",
                     "wgt_depth", "acc_depth", "out_depth", "bus_bytes"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                fail(f"{name} must be a power of two >= 1, not {value}")
        for name, allowed in _SUPPORTED_WIDTHS.items():
            if getattr(self, name) not in allowed:
                fail(f"{name} must be one of {allowed}, not {getattr(self, name)}")
        lanes = self.batch * self.block_out
        # Whole rows only: how big a table an op needs is the op's business (the compiler
        # says when one does not fit), not the memory's.
        if self.table_entries and (self.table_entries & (self.table_entries - 1)
                                   or self.table_entries < lanes):
            fail(f"table_entries must be 0 (no table memory) or a power of two >= {lanes} "
                 f"(whole rows of {lanes} lanes), not {self.table_entries}")
        if self.acc_depth < ACC_BANKS:
            fail(f"acc_depth must be at least {ACC_BANKS} (the accumulator has {ACC_BANKS} "
                 f"banks), not {self.acc_depth}")
        if self.out_depth != self.acc_depth:
            fail(f"out_depth must equal acc_depth ({self.acc_depth}), not {self.out_depth}: "
                 "the output buffer mirrors the accumulator rows")
        for name in ("cmd_queue_depth", "token_queue_depth"):
            if getattr(self, name) < 1:
                fail(f"{name} must be at least 1, not {getattr(self, name)}")
        if not 1 <= self.loop_bits <= 16:
            fail(f"loop_bits must be in [1, 16], not {self.loop_bits}")
        if self.dram_ports < 1:
            fail(f"dram_ports must be at least 1, not {self.dram_ports}")
        if not isinstance(self.module_ports, tuple) or len(self.module_ports) != len(MODULES):
            fail(f"module_ports must give one port for each of {MODULES}, not "
                 f"{self.module_ports!r}")
        for module, ports in zip(MODULES, self.module_ports):
            self._validate_ports(module, ports, fail)

        if self.dram_latency < 1:
            fail(f"dram_latency must be at least 1 cycle, not {self.dram_latency}")
        if not self.ddr_bytes_per_cycle > 0:
            fail(f"ddr_bytes_per_cycle must be positive, not {self.ddr_bytes_per_cycle}")
        if not 1 <= self.max_burst_beats <= 256:
            fail(f"max_burst_beats must be in [1, 256] (AXI4), not {self.max_burst_beats}")
        if not self.clock_mhz > 0:
            fail(f"clock_mhz must be positive, not {self.clock_mhz}")

    def _validate_ports(self, module: str, ports: int | tuple[int, ...], fail) -> None:
        """``module``'s entry of ``module_ports``: ports that exist; several only for the
        load module, a power of two of distinct ones that no other reading module uses."""
        several = isinstance(ports, tuple)
        for port in ports if several else (ports,):
            if not isinstance(port, int) or isinstance(port, bool) \
                    or not 0 <= port < self.dram_ports:
                fail(f"module_ports[{module}] must be a port in [0, {self.dram_ports - 1}]"
                     f"{' or a tuple of them' if module == MULTI_PORT_MODULE else ''}, "
                     f"not {port!r}")
        if not several:
            return
        if module != MULTI_PORT_MODULE:
            fail(f"module_ports[{module}] names several ports {ports}: only the "
                 f"{MULTI_PORT_MODULE} module reads over more than one")
        if len(set(ports)) != len(ports) or len(ports) & (len(ports) - 1):
            fail(f"module_ports[{module}] must be a power of two of distinct ports, not "
                 f"{ports}")
        readers = {m: self.ports_of(m) for m in MODULES if m not in (module, "store")}
        shared = sorted({p for m in readers for p in readers[m]} & set(ports))
        if shared:
            fail(f"module_ports[{module}] shares port(s) {shared} with "
                 f"{[m for m in readers if set(readers[m]) & set(ports)]}: a module reading "
                 "over several ports has them to itself")

    # ------------------------------------------------------ derived sizes
    @property
    def inp_entry_bytes(self) -> int:
        """Bytes of one input-buffer entry (``batch x block_in`` inputs)."""
        return self.batch * self.block_in * self.inp_width // 8

    @property
    def wgt_entry_bytes(self) -> int:
        """Bytes of one weight-buffer entry (``block_out x block_in`` weights)."""
        return self.block_out * self.block_in * self.wgt_width // 8

    @property
    def acc_entry_bytes(self) -> int:
        """Bytes of one accumulator entry (``batch x block_out`` accumulators)."""
        return self.batch * self.block_out * self.acc_width // 8

    @property
    def out_entry_bytes(self) -> int:
        """Bytes of one output-buffer entry (``batch x block_out`` outputs)."""
        return self.batch * self.block_out * self.out_width // 8

    @property
    def table_rows(self) -> int:
        """Rows of the ALU table memory (``table_entries / (batch x block_out)``)."""
        return self.table_entries // (self.batch * self.block_out)

    @property
    def table_index_bits(self) -> int:
        """Bits of a table-memory row index (``LOAD tbl``'s ``sram_base``)."""
        return _clog2(self.table_rows)

    @property
    def uop_index_bits(self) -> int:
        return _clog2(self.uop_depth)

    @property
    def inp_index_bits(self) -> int:
        return _clog2(self.inp_depth)

    @property
    def wgt_index_bits(self) -> int:
        return _clog2(self.wgt_depth)

    @property
    def acc_index_bits(self) -> int:
        return _clog2(self.acc_depth)

    @property
    def acc_bank_rows(self) -> int:
        """Rows per accumulator bank (``acc_depth / ACC_BANKS``); bank = row // this."""
        return self.acc_depth // ACC_BANKS

    @property
    def peak_macs_per_cycle(self) -> int:
        """Multiply-accumulates the GEMM core does per cycle."""
        return self.batch * self.block_in * self.block_out

    @property
    def peak_gops(self) -> float:
        """Peak throughput in giga-operations per second (a MAC is two ops)."""
        return 2 * self.peak_macs_per_cycle * self.clock_mhz / 1000.0

    def ports_of(self, module: str) -> tuple[int, ...]:
        """The DRAM ports ``module`` (one of :data:`MODULES`) uses: one, or the load
        module's several."""
        try:
            ports = self.module_ports[MODULES.index(module)]
        except ValueError:
            raise ConfigError(f"unknown module {module!r}; expected one of {MODULES}") from None
        return ports if isinstance(ports, tuple) else (ports,)

    def port_of(self, module: str) -> int:
        """The DRAM port ``module`` uses (the first of the load module's several)."""
        return self.ports_of(module)[0]

    def cycles_to_seconds(self, cycles: float) -> float:
        return cycles / (self.clock_mhz * 1e6)

    def replace(self, **changes: Any) -> "HwConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["module_ports"] = {m: list(p) if isinstance(p, tuple) else p
                              for m, p in zip(MODULES, self.module_ports)}
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HwConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown HwConfig fields {unknown}; known fields: {sorted(known)}")
        data = dict(data)
        ports = data.get("module_ports")
        if isinstance(ports, dict):
            missing = [m for m in MODULES if m not in ports]
            if missing:
                raise ConfigError(f"module_ports lacks {missing}")
            data["module_ports"] = tuple(ports[m] for m in MODULES)
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "HwConfig":
        return cls.from_dict(_json_object(text))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "HwConfig":
        """A config file as :meth:`save` writes it: every field given, none unknown (a
        file is a whole config; unlike a ``.tsr``'s config, which older files may write
        with fewer fields). Every error names the file."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        try:
            data = _json_object(text)
            missing = [f.name for f in dataclasses.fields(cls) if f.name not in data]
            if missing:
                raise ConfigError(f"fields {missing} are missing (a config file gives every "
                                  "field, as HwConfig.save writes it)", fix=_CONFIG_FILE_FIX)
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(f"config file {path}: {exc.args[0]}", fix=exc.fix) from None


#: How to make a whole config file.
_CONFIG_FILE_FIX = {
    PYTHON: "start from a preset: get_config('pynq').replace(batch=2, ...).save(path)",
    CLI: "start from a preset's file, written by python -c \"from tessera.config import "
         "get_config; get_config('pynq').save('my.json')\", and edit its values"}


def _canonical_ports(ports: Any) -> Any:
    """A ``module_ports`` entry as :class:`HwConfig` keeps it: a list as a tuple, one port
    as an int (so a config's JSON, and its id, stay those of a single-port config)."""
    if isinstance(ports, (list, tuple)):
        return ports[0] if len(ports) == 1 else tuple(ports)
    return ports


def _json_object(text: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object (:class:`ConfigError` otherwise)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config JSON is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("config JSON must be an object of HwConfig fields")
    return data


#: Built-in presets. ``pynq`` is the default.
PRESETS: dict[str, HwConfig] = {
    # PYNQ-Z1/Z2 (xc7z020): VTA's PYNQ buffer sizes; one 64-bit HP port per
    # module; the DDR3 gives about 2.1 GB/s shared, i.e. 21 bytes per cycle.
    # Command queues 64 deep, not VTA's 512: three 512 x 160-bit FIFOs took
    # 4.8k LUTs as distributed RAM, and no compiled ResNet-18 layer runs
    # faster with deeper queues (tokens bound how far a module runs ahead).
    "pynq": HwConfig(cmd_queue_depth=64),
    # Small enough for fast RTL unit tests.
    "tiny": HwConfig(
        name="tiny", batch=1, block_in=4, block_out=4,
        uop_depth=128, inp_depth=128, wgt_depth=64, acc_depth=128, out_depth=128,
        cmd_queue_depth=8, token_queue_depth=8, loop_bits=8, table_entries=256,
        dram_latency=8, ddr_bytes_per_cycle=16.0, part="xc7z020clg400-1",
    ),
    # ZCU104 (xczu7ev): 32x32 core at 200 MHz, 128-bit HP ports, DDR4 at
    # 19.2 GB/s (96 bytes per cycle at 200 MHz). The load module reads over two ports
    # (HP1 and HPC0, 32 bytes per cycle): layer4's 3x3 weights (one use each at batch 1)
    # would otherwise bound ResNet-18 at 1.12x its compute floor through one.
    "zcu104": HwConfig(
        name="zcu104", batch=1, block_in=32, block_out=32,
        uop_depth=8192, inp_depth=2048, wgt_depth=1024, acc_depth=2048, out_depth=2048,
        bus_bytes=16, dram_ports=5, module_ports=(0, (1, 4), 2, 3), dram_latency=40, ddr_bytes_per_cycle=96.0, clock_mhz=200.0,
        part="xczu7ev-ffvc1156-2-e",
    ),
}

DEFAULT_PRESET = "pynq"


def get_config(name_or_path: str | Path | HwConfig | None = None) -> HwConfig:
    """A preset by name, a config JSON file by path, or the default preset.

    :class:`ConfigError` for anything else: a name with a suffix or a folder part is a
    path, reported as a missing file; any other name is reported with the presets.
    """
    if name_or_path is None:
        return PRESETS[DEFAULT_PRESET]
    if isinstance(name_or_path, HwConfig):
        return name_or_path
    key = str(name_or_path)
    if key in PRESETS:
        return PRESETS[key]
    path = Path(key)
    if path.is_file():
        return HwConfig.load(key)
    presets = f"a preset ({', '.join(PRESETS)})"
    if path.is_dir():
        raise ConfigError(f"config {key!r} is a directory: give {presets} or a config JSON "
                          "file")
    # A name with a suffix or a directory part was meant as a file, not a preset.
    if path.suffix or len(path.parts) > 1:
        raise ConfigError(f"config file {str(path.resolve())!r} does not exist: give an "
                          f"existing config JSON file or {presets}")
    raise ConfigError(f"unknown config {key!r}: give {presets} or the path of a config "
                      "JSON file")
