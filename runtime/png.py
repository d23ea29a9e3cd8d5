"""A raster toolkit in numpy alone: a 5x7 bitmap font and an RGB PNG writer.

The timelines (:mod:`tessera.runtime.timeline`, :mod:`tessera.runtime.schedule_timeline`)
draw with these, so a picture needs no matplotlib or Pillow on a board or in CI.

>>> img = np.full((12, 40, 3), 255, np.uint8)
>>> draw_text(img, 2, 2, "Hi", (0, 0, 0))
>>> text_width("Hi")
11
"""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from tessera.errors import TimelineError

__all__ = ["ADVANCE", "FONT", "GLYPH_H", "RGB", "draw_text", "text_width", "write_png"]

RGB = tuple[int, int, int]


# --------------------------------------------------------------------------- font

# 5x7 glyphs of ASCII 32..126, five column bytes each (bit 0 = top row), the classic
# HD44780-style character-LCD font.
_FONT_HEX = (
    "0000000000 00005F0000 0007000700 147F147F14 242A7F2A12 2313086462 3649552250 0005030000 "
    "001C224100 0041221C00 14083E0814 08083E0808 0050300000 0808080808 0060600000 2010080402 "
    "3E5149453E 00427F4000 4261514946 2141454B31 1814127F10 2745454539 3C4A494930 0171090503 "
    "3649494936 064949291E 0036360000 0056360000 0814224100 1414141414 0041221408 0201510906 "
    "324979413E 7E1111117E 7F49494936 3E41414122 7F4141221C 7F49494941 7F09090901 3E4149497A "
    "7F0808087F 00417F4100 2040413F01 7F08142241 7F40404040 7F020C027F 7F0408107F 3E4141413E "
    "7F09090906 3E4151215E 7F09192946 4649494931 01017F0101 3F4040403F 1F2040201F 3F4038403F "
    "6314081463 0708700807 6151494543 007F414100 0204081020 0041417F00 0402010204 4040404040 "
    "0001020400 2054545478 7F48444438 3844444420 384444487F 3854545418 087E090102 0C5252523E "
    "7F08040478 00447D4000 2040443D00 7F10284400 00417F4000 7C04180478 7C08040478 3844444438 "
    "7C14141408 081414187C 7C08040408 4854545420 043F444020 3C4040207C 1C2040201C 3C4030403C "
    "4428102844 0C5050503C 4464544C44 0008364100 00007F0000 0041360800 0804081008"
)
GLYPH_H, ADVANCE = 7, 6       # glyphs are 5 columns wide, plus one of spacing


def _build_font() -> np.ndarray:
    cols = np.frombuffer(bytes.fromhex(_FONT_HEX.replace(" ", "")), np.uint8).reshape(95, 5)
    rows = np.arange(GLYPH_H, dtype=np.uint8)
    # (glyph, row, column) booleans, one blank spacing column appended
    glyphs = ((cols[:, None, :] >> rows[None, :, None]) & 1).astype(bool)
    return np.concatenate([glyphs, np.zeros((95, GLYPH_H, 1), bool)], axis=2)


FONT = _build_font()


def text_width(text: str, scale: int = 1) -> int:
    return max(0, len(text) * ADVANCE - 1) * scale


def draw_text(img: np.ndarray, x: int, y: int, text: str, colour: RGB, *, scale: int = 1,
               clip_x: int | None = None) -> None:
    """Paint ``text`` with its top-left corner at (x, y), clipped to the image and to
    columns < ``clip_x``; characters outside printable ASCII show as ``?``."""
    if not text:
        return
    codes = np.frombuffer(text.encode("ascii", "replace"), np.uint8).astype(np.int64)
    codes = np.where((codes < 32) | (codes > 126), ord("?"), codes) - 32
    mask = FONT[codes].transpose(1, 0, 2).reshape(GLYPH_H, -1)[:, :-1]
    if scale > 1:
        mask = mask.repeat(scale, axis=0).repeat(scale, axis=1)
    h, w = mask.shape
    right = min(img.shape[1], x + w, clip_x if clip_x is not None else img.shape[1])
    x0, y0, y1 = max(x, 0), max(y, 0), min(img.shape[0], y + h)
    if right <= x0 or y1 <= y0:
        return
    sub = mask[y0 - y:y1 - y, x0 - x:right - x]
    img[y0:y1, x0:right][sub] = colour


# --------------------------------------------------------------------------- PNG

def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def write_png(rgb: np.ndarray, path: str | Path) -> Path:
    """Write an (height, width, 3) uint8 array as an 8-bit RGB PNG; returns the path.

    Every scanline uses filter 0 (none): the picture is flat colour runs that zlib
    already shrinks well, and it keeps the encoder to a few vectorised lines.
    """
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        raise TimelineError(f"write_png needs a non-empty (height, width, 3) array, "
                            f"not shape {rgb.shape}")
    h, w, _ = rgb.shape
    raw = np.zeros((h, 1 + 3 * w), np.uint8)
    raw[:, 1:] = rgb.reshape(h, 3 * w)
    png = (b"\x89PNG\r\n\x1a\n"
           + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
           + _chunk(b"IEND", b""))
    path = Path(path)
    path.write_bytes(png)
    return path
