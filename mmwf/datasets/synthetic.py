"""The synthetic demo datasets (seeded, deterministic): coloured shapes on textured backgrounds.

- COCO instance format: ``coco/{train,val}/*.jpg`` and ``coco/annotations/instances_{train,val}.json`` with
  polygon masks; categories circle, square, triangle.
- ADE20K layout: ``ade/images/{training,validation}/*.jpg`` and ``ade/annotations/{training,validation}/*.png``;
  labels 1 = background, 2 = circle, 3 = square, 4 = triangle (0 is reserved, as ADE20K's "other", and ignored
  with ``reduce_zero_label``).
- ImageNet-style folders: ``cls/{train,val}/{circle,square,triangle}/*.jpg``, one shape per image.
- The generation demo's folders: ``gen/{train,val}/{circle,square,triangle}/*.png``, 32 x 32, one shape of a random
  colour on a plain background of another: the shape alone tells the classes apart.
The command line is ``tools/generate_demo_data.py`` (it also writes the demos' stand-in softmax DeiT-T,
:func:`mmwf.demo.write_softmax_stand_in`).
"""
from __future__ import annotations

import json
import os
import os.path as osp

import cv2
import numpy as np

CLASSES = ('circle', 'square', 'triangle')
# each class has its own saturated colour family (jittered per object), so that a model trained from scratch
# for a few minutes on a CPU can learn the task; shapes still decide the masks and boxes
CLASS_COLOURS = np.array([[40, 40, 230], [40, 210, 40], [230, 60, 40]], np.float32)  # BGR: red, green, blue


def background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth, muted colour noise plus faint stripes: a texture the model must learn to ignore."""
    coarse = rng.uniform(70, 190, (4, 4, 3)).astype(np.float32)
    img = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    yy, xx = np.mgrid[0:height, 0:width]
    angle, freq = rng.uniform(0, np.pi), rng.uniform(0.05, 0.2)
    stripes = 12 * np.sin(freq * (np.cos(angle) * xx + np.sin(angle) * yy))
    img = img + stripes[..., None] + rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


VERTICES = (32, 4, 3)  # of each class's polygon: circle, square, triangle


def shape_polygon(rng: np.random.Generator, cls: int, height: int, width: int,
                  radius: tuple[float, float] = (0.12, 0.25), equal_area: bool = False,
                  centre_jitter: float | None = None, upright: bool = False) -> np.ndarray:
    """Polygon (K, 2) of one object, inside the image; its radius a uniform share ``radius`` of the shorter side,
    or with ``equal_area`` the radius that gives the area of a circle of that radius (every class the same size);
    its centre anywhere it fits, or within ``centre_jitter`` pixels of the image centre; turned by a random angle,
    or ``upright`` (a square's sides along the axes, a triangle's apex up)."""
    n = VERTICES[cls]
    r = rng.uniform(*radius) * min(height, width)
    if equal_area:  # a regular n-gon of circumradius R covers n / 2 sin(2 pi / n) R^2
        r *= np.sqrt(np.pi / (n / 2 * np.sin(2 * np.pi / n)))
    if centre_jitter is None:
        cx, cy = rng.uniform(r + 2, np.array([width, height]) - r - 2)
    else:
        cx, cy = np.array([width, height]) / 2 + rng.uniform(-centre_jitter, centre_jitter, 2)
    angles = np.linspace(0, 2 * np.pi, n, endpoint=False)
    if cls == 1:
        angles += np.pi / 4 if upright else rng.uniform(0, np.pi / 2)
    elif cls == 2:
        angles += -np.pi / 2 if upright else rng.uniform(0, 2 * np.pi)
    return np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1)


def image_shape(size: int | tuple[int, int]) -> tuple[int, int]:
    """(height, width) of a square ``size`` or of a ``(height, width)`` pair."""
    return (size, size) if isinstance(size, int) else tuple(size)


def make_image(rng: np.random.Generator, size: int | tuple[int, int], max_objects: int,
               cls: int | None = None) -> tuple[np.ndarray, list, np.ndarray]:
    """An image of ``size`` (square, or (height, width)), its objects [(class, polygon)] and a label map
    (1 background, 2.. classes); every object of class ``cls`` when it is given, else of random classes."""
    height, width = image_shape(size)
    img = background(rng, height, width)
    labels = np.ones((height, width), np.uint8)
    objects = []
    for _ in range(rng.integers(1, max_objects + 1)):
        obj_cls = int(rng.integers(len(CLASSES))) if cls is None else cls
        poly = shape_polygon(rng, obj_cls, height, width)
        mask = np.zeros((height, width), np.uint8)
        cv2.fillPoly(mask, [np.round(poly).astype(np.int32)], 1)
        if (mask.astype(bool) & (labels > 1)).any():
            continue  # keep objects disjoint so polygons and label maps agree exactly
        img[mask > 0] = np.clip(CLASS_COLOURS[obj_cls] + rng.uniform(-50, 50, 3), 0, 255).astype(np.uint8)
        labels[mask > 0] = obj_cls + 2
        objects.append((obj_cls, poly))
    return img, objects, labels


def write_coco(root: str, split: str, count: int, size: int | tuple[int, int], rng: np.random.Generator) -> None:
    os.makedirs(osp.join(root, split), exist_ok=True)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    images, annotations = [], []
    for i in range(count):
        img, objects, _ = make_image(rng, size, max_objects=3)
        name = f'{i:05d}.jpg'
        cv2.imwrite(osp.join(root, split, name), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        height, width = image_shape(size)
        images.append(dict(id=i + 1, file_name=name, width=width, height=height))
        for cls, poly in objects:
            x0, y0 = poly.min(0)
            x1, y1 = poly.max(0)
            area = float(cv2.contourArea(poly.astype(np.float32)))
            annotations.append(dict(id=len(annotations) + 1, image_id=i + 1, category_id=cls + 1, iscrowd=0,
                                    bbox=[float(x0), float(y0), float(x1 - x0), float(y1 - y0)], area=area,
                                    segmentation=[poly.round(2).flatten().tolist()]))
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(CLASSES)]
    with open(osp.join(root, 'annotations', f'instances_{split}.json'), 'w') as f:
        json.dump(dict(images=images, annotations=annotations, categories=categories), f)


def write_ade(root: str, split: str, count: int, size: int | tuple[int, int], rng: np.random.Generator) -> None:
    for sub in ('images', 'annotations'):
        os.makedirs(osp.join(root, sub, split), exist_ok=True)
    for i in range(count):
        img, _, labels = make_image(rng, size, max_objects=4)
        cv2.imwrite(osp.join(root, 'images', split, f'{i:05d}.jpg'), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        cv2.imwrite(osp.join(root, 'annotations', split, f'{i:05d}.png'), labels)


def write_classification(root: str, split: str, count: int, size: int | tuple[int, int],
                         rng: np.random.Generator) -> None:
    """An ImageNet-style folder: ``root/split/<class>/*.jpg``, one shape per image, classes in turn."""
    for i in range(count):
        cls = i % len(CLASSES)
        img, _, _ = make_image(rng, size, max_objects=1, cls=cls)
        os.makedirs(osp.join(root, split, CLASSES[cls]), exist_ok=True)
        cv2.imwrite(osp.join(root, split, CLASSES[cls], f'{i:05d}.jpg'), img, [cv2.IMWRITE_JPEG_QUALITY, 95])


def write_generation(root: str, split: str, count: int, size: int, rng: np.random.Generator) -> None:
    """The generation demo's class folders, ``root/split/<class>/*.png`` (lossless, ``size`` x ``size``): one
    shape per image (classes in turn, each covering the area of a circle of radius 19-27 % of the side, so that size
    does not tell the classes apart), filled with a random saturated colour, on a plain background of a random muted
    colour."""
    for i in range(count):
        cls = i % len(CLASSES)
        img = np.empty((size, size, 3), np.uint8)
        img[:] = rng.uniform(60, 200, 3)
        hue = np.array([[[rng.uniform(0, 180), 255, 255]]], np.uint8)
        colour = cv2.cvtColor(hue, cv2.COLOR_HSV2BGR)[0, 0].tolist()
        poly = shape_polygon(rng, cls, size, size, radius=(0.2, 0.27), equal_area=True, centre_jitter=size / 16,
                             upright=True)
        cv2.fillPoly(img, [np.round(poly * 16).astype(np.int32)], colour, lineType=cv2.LINE_AA, shift=4)
        os.makedirs(osp.join(root, split, CLASSES[cls]), exist_ok=True)
        cv2.imwrite(osp.join(root, split, CLASSES[cls], f'{i:05d}.png'), img)


# what the generation demo's folders hold, written to gen/layout.txt: tools/demo.py writes older folders again
GENERATION_LAYOUT = 'one upright, centred shape of one area per image'


def stale_generation_folder(out: str) -> bool:
    """Whether ``out/gen`` exists but was written with another :data:`GENERATION_LAYOUT` (or before it was recorded)."""
    layout = osp.join(out, 'gen', 'layout.txt')
    if not osp.isdir(osp.join(out, 'gen')):
        return False
    if not osp.exists(layout):
        return True
    with open(layout) as f:
        return f.read() != GENERATION_LAYOUT


def generate(out: str = 'data/demo', size: int = 128, train: int = 160, val: int = 40, seed: int = 0) -> None:
    """Write the demo datasets under ``out`` (deterministic for a seed): COCO and the ADE20K layout (``train`` /
    ``val`` images of ``size``), an ImageNet-style folder with twice ``train`` images, and the generation demo's
    folders (32 x 32) with four times ``train`` and twice ``val`` images, and their :data:`GENERATION_LAYOUT` in
    ``gen/layout.txt``."""
    rng = np.random.default_rng(seed)
    write_coco(osp.join(out, 'coco'), 'train', train, size, rng)
    write_coco(osp.join(out, 'coco'), 'val', val, size, rng)
    write_ade(osp.join(out, 'ade'), 'training', train, size, rng)
    write_ade(osp.join(out, 'ade'), 'validation', val, size, rng)
    write_classification(osp.join(out, 'cls'), 'train', 2 * train, size, rng)
    write_classification(osp.join(out, 'cls'), 'val', val, size, rng)
    write_generation(osp.join(out, 'gen'), 'train', 4 * train, 32, rng)
    write_generation(osp.join(out, 'gen'), 'val', 2 * val, 32, rng)
    with open(osp.join(out, 'gen', 'layout.txt'), 'w') as f:
        f.write(GENERATION_LAYOUT)
