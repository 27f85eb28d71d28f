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


def test_generation_folders_hold_shapes_whose_colour_does_not_tell_the_class(tmp_path):
    """Four times ``train`` and twice ``val`` lossless 32 x 32 images, classes in turn; each on a plain background
    (the four corners alike) with a shape of its own colour, so that within one class the shapes' colours vary."""
    import cv2
    import numpy as np
    generate(str(tmp_path), size=64, train=6, val=3, seed=4)
    for split, count in (('train', 24), ('val', 6)):
        files = sorted((tmp_path / 'gen' / split).glob('*/*.png'))
        assert len(files) == count
        assert {f.parent.name for f in files} == {'circle', 'square', 'triangle'}
    hues = {}
    for path in (tmp_path / 'gen' / 'train').glob('*/*.png'):
        img = cv2.imread(str(path))
        assert img.shape == (32, 32, 3)
        corners = img[[0, 0, -1, -1], [0, -1, 0, -1]]
        assert (corners == corners[0]).all()  # a plain background
        shape = img[(np.abs(img.astype(int) - corners[0]).sum(-1) > 60)]
        hsv = cv2.cvtColor(shape[None].astype(np.uint8), cv2.COLOR_BGR2HSV)[0]
        hues.setdefault(path.parent.name, []).append(int(np.median(hsv[:, 0])) // 30)  # six hue sectors
    assert all(len(set(h)) >= 4 for h in hues.values()), hues


def test_generation_shapes_differ_only_in_shape(tmp_path):
    """The generation demo's shapes: about one area in every class (the means within 30 %; the circumradius alone
    would give circles 2.4 times a triangle's area), centred (within 1/16 of the side, and rounding), squares with
    their sides along the axes (filling their bounding box) and triangles apex up (narrow at the top of their box)."""
    import cv2
    import numpy as np
    generate(str(tmp_path), size=64, train=30, val=3, seed=2)
    areas = {}
    for path in (tmp_path / 'gen' / 'train').glob('*/*.png'):
        img = cv2.imread(str(path)).astype(int)
        mask = np.abs(img - img[0, 0]).sum(-1) > 57  # half the least difference of a saturated shape and background
        ys, xs = np.nonzero(mask)
        assert abs(xs.mean() - 15.5) < 3 and abs(ys.mean() - 15.5) < 3
        box = mask[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
        cls = path.parent.name
        areas.setdefault(cls, []).append(mask.sum())
        if cls == 'square':
            assert box.mean() > 0.9
        elif cls == 'triangle':
            rows = box.sum(1)
            third = len(rows) // 3
            assert rows[:third].mean() < 0.5 * rows[-third:].mean()
        else:
            assert 0.6 < box.mean() < 0.88  # pi / 4 and rasterisation
    means = [np.mean(a) for a in areas.values()]
    assert len(means) == 3 and max(means) / min(means) < 1.3, areas


def test_a_generation_folder_of_another_layout_is_stale(tmp_path):
    """The demo writes gen/ again when it was written with another layout (or before layouts were recorded)."""
    from mmwf.datasets.synthetic import GENERATION_LAYOUT, stale_generation_folder
    assert not stale_generation_folder(str(tmp_path))  # nothing there: nothing stale
    generate(str(tmp_path), size=64, train=3, val=1, seed=0)
    assert (tmp_path / 'gen' / 'layout.txt').read_text() == GENERATION_LAYOUT
    assert not stale_generation_folder(str(tmp_path))
    (tmp_path / 'gen' / 'layout.txt').write_text('any size, place and angle')
    assert stale_generation_folder(str(tmp_path))
    (tmp_path / 'gen' / 'layout.txt').unlink()
    assert stale_generation_folder(str(tmp_path))
