"""The synthetic demo data generator (mmwf.datasets.synthetic)."""
import json

from mmwf.datasets import generate, write_coco


def test_generator_is_deterministic(tmp_path):
    generate(str(tmp_path / 'a'), size=64, train=3, val=2, seed=3)
    generate(str(tmp_path / 'b'), size=64, train=3, val=2, seed=3)
    for rel in ('coco/annotations/instances_train.json', 'ade/annotations/training/00002.png', 'coco/val/00001.jpg'):
        assert (tmp_path / 'a' / rel).read_bytes() == (tmp_path / 'b' / rel).read_bytes()
    coco = json.loads((tmp_path / 'a/coco/annotations/instances_train.json').read_text())
    assert {c['name'] for c in coco['categories']} == {'circle', 'square', 'triangle'}
    ann = coco['annotations'][0]
    assert len(ann['segmentation'][0]) >= 6 and ann['area'] > 0 and ann['bbox'][2] > 0


def test_non_square_images(tmp_path):
    import numpy as np
    write_coco(str(tmp_path), 'train', 2, (48, 80), np.random.default_rng(0))
    coco = json.loads((tmp_path / 'annotations/instances_train.json').read_text())
    assert {(im['height'], im['width']) for im in coco['images']} == {(48, 80)}
    for ann in coco['annotations']:
        x, y, w, h = ann['bbox']
        assert 0 <= x and x + w <= 80 and 0 <= y and y + h <= 48
