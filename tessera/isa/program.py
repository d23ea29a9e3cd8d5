"""The :class:`Program` container and its binary file format.

A program is an instruction list plus a DRAM image made of named segments
(uop kernels, inputs, weights, outputs...). DRAM addresses are byte addresses;
instructions address DRAM in elements of their memory type, so segments are
aligned to :data:`SEGMENT_ALIGN`, a multiple of every element size. The
instruction stream goes right after the last segment.

File format (``.tsp``, little-endian): magic ``TSPROG``, u16 format version,
u32 header length, the header as JSON (config, segment table, instruction
count), the instruction stream, the segment bytes in table order, and a
CRC-32 of everything before it.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..config import HwConfig
from ..errors import ProgramError, ProgramFileError
from .encoding import INSN_BYTES, get_isa
from .instructions import Instruction, MemType, Uop

SEGMENT_ALIGN = 4096
MAGIC = b"TSPROG"
FORMAT_VERSION = 1


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


@dataclass(eq=False)
class Segment:
    """A named, aligned DRAM region and its initial bytes."""

    name: str
    addr: int
    data: np.ndarray

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def end(self) -> int:
        return self.addr + self.size

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Segment) and (self.name, self.addr) == (other.name, other.addr)
                and np.array_equal(self.data, other.data))


class Program:
    """Instructions plus DRAM segments, for one :class:`HwConfig`."""

    def __init__(self, config: HwConfig, instructions: Iterable[Instruction] = (),
                 segments: Iterable[Segment] = ()) -> None:
        self.config = config
        self.isa = get_isa(config)
        self.instructions: list[Instruction] = list(instructions)
        self.segments: list[Segment] = []
        self._stream: tuple[tuple[Instruction, ...], bytes] | None = None
        for seg in segments:
            self._place(seg)

    # --------------------------------------------------------- building
    def _place(self, seg: Segment) -> Segment:
        if seg.addr % SEGMENT_ALIGN:
            raise ProgramError(f"segment {seg.name!r} address {seg.addr:#x} must be a multiple "
                               f"of {SEGMENT_ALIGN}")
        for other in self.segments:
            if other.name == seg.name:
                raise ProgramError(f"segment {seg.name!r} is defined twice")
            if seg.addr < other.end and other.addr < seg.end:
                raise ProgramError(f"segment {seg.name!r} [{seg.addr:#x}, {seg.end:#x}) overlaps "
                                   f"{other.name!r} [{other.addr:#x}, {other.end:#x})")
        self.segments.append(seg)
        self.segments.sort(key=lambda s: s.addr)
        return seg

    def add_segment(self, name: str, data: np.ndarray | bytes | int) -> Segment:
        """Append a segment after the last one: ``data`` (any array, taken as raw bytes) or a
        size in bytes for a zero-filled segment (outputs)."""
        if isinstance(data, int):
            raw = np.zeros(data, dtype=np.uint8)
        else:
            raw = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint8).copy()
        addr = align_up(self.segments[-1].end, SEGMENT_ALIGN) if self.segments else 0
        return self._place(Segment(name, addr, raw))

    def add_uops(self, name: str, uops: Sequence[Uop]) -> Segment:
        """A segment of encoded uops."""
        return self.add_segment(name, self.isa.encode_uops(uops))

    def segment(self, name: str) -> Segment:
        for seg in self.segments:
            if seg.name == name:
                return seg
        raise ProgramError(f"no segment named {name!r}; segments: "
                           f"{[s.name for s in self.segments]}")

    def elem_addr(self, name: str, mem: MemType, offset_elems: int = 0) -> int:
        """The DRAM element address (``dram_base``) of segment ``name`` for memory type ``mem``."""
        return self.segment(name).addr // self.isa.elem_bytes(mem) + offset_elems

    def emit(self, *insns: Instruction) -> None:
        self.instructions.extend(insns)

    # ------------------------------------------------------------ image
    @property
    def insn_addr(self) -> int:
        """Byte address of the instruction stream: after the last segment."""
        return align_up(self.segments[-1].end, SEGMENT_ALIGN) if self.segments else 0

    def encode_instructions(self) -> bytes:
        """The encoded instruction stream. Kept while the instructions are the same (they
        are frozen, so while the list holds the same ones): a program run many times, on
        the RTL say, is encoded once (3 ms for a ResNet layer's 241)."""
        instructions = tuple(self.instructions)
        if self._stream is None or self._stream[0] != instructions:
            self._stream = (instructions, self.isa.encode_program(self.instructions))
        return self._stream[1]

    def dram_image(self, stream: bytes | None = None) -> np.ndarray:
        """The initial DRAM contents: every segment and the instruction stream (``stream``:
        the instructions already encoded)."""
        stream = np.frombuffer(self.encode_instructions() if stream is None else stream,
                               dtype=np.uint8)
        image = np.zeros(self.insn_addr + stream.size, dtype=np.uint8)
        for seg in self.segments:
            image[seg.addr:seg.end] = seg.data
        image[self.insn_addr:] = stream
        return image

    def read(self, dram: np.ndarray, name: str, dtype: np.dtype | str = np.uint8,
             shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Segment ``name`` out of a DRAM image (e.g. after a run), viewed as ``dtype``."""
        seg = self.segment(name)
        values = dram[seg.addr:seg.end].view(dtype)
        return values.reshape(shape) if shape is not None else values

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Program) and self.config == other.config
                and self.instructions == other.instructions and self.segments == other.segments)

    def __repr__(self) -> str:
        return (f"Program(config={self.config.name!r}, {len(self.instructions)} instructions, "
                f"segments={[s.name for s in self.segments]})")

    # ------------------------------------------------------------- files
    def to_bytes(self) -> bytes:
        header = json.dumps({
            "config": self.config.to_dict(),
            "instructions": len(self.instructions),
            "segments": [{"name": s.name, "addr": s.addr, "size": s.size} for s in self.segments],
        }).encode()
        body = (MAGIC + struct.pack("<HI", FORMAT_VERSION, len(header)) + header
                + self.encode_instructions() + b"".join(s.data.tobytes() for s in self.segments))
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def from_bytes(cls, blob: bytes, source: str = "program") -> "Program":
        def bad(msg: str) -> ProgramFileError:
            return ProgramFileError(f"{source}: {msg}")

        if len(blob) < len(MAGIC) + 10 or not blob.startswith(MAGIC):
            raise bad("not a Tessera program file (bad magic)")
        body, (crc,) = blob[:-4], struct.unpack("<I", blob[-4:])
        if zlib.crc32(body) != crc:
            raise bad("checksum mismatch: the file is damaged or truncated")
        version, hlen = struct.unpack_from("<HI", body, len(MAGIC))
        if version != FORMAT_VERSION:
            raise bad(f"format version {version} is not supported (this Tessera reads "
                      f"version {FORMAT_VERSION})")
        pos = len(MAGIC) + 6
        try:
            header = json.loads(body[pos:pos + hlen])
        except ValueError:
            raise bad("header is not valid JSON") from None
        pos += hlen
        config = HwConfig.from_dict(header["config"])
        n = header["instructions"] * INSN_BYTES
        insns = get_isa(config).decode_program(body[pos:pos + n])
        pos += n
        segments = []
        for s in header["segments"]:
            data = np.frombuffer(body[pos:pos + s["size"]], dtype=np.uint8).copy()
            if data.size != s["size"]:
                raise bad(f"segment {s['name']!r} is truncated")
            segments.append(Segment(s["name"], s["addr"], data))
            pos += s["size"]
        if pos != len(body):
            raise bad(f"{len(body) - pos} trailing bytes after the last segment")
        return cls(config, insns, segments)

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def load(cls, path: str | Path) -> "Program":
        try:
            blob = Path(path).read_bytes()
        except OSError as exc:
            raise ProgramFileError(f"cannot read program file {path}: {exc.strerror}") from None
        return cls.from_bytes(blob, source=str(path))
