"""Dataset checks that turn silent label shifts and deep stack traces into one error naming the file and the fix.

- :func:`check_classes`: the class lists of the train / val / test datasets agree with each other, with every
  head's ``num_classes`` and with the classes a checkpoint was trained on; a COCO file has every class the dataset
  names.
- :class:`CheckAnnotations`: a pipeline step after ``LoadAnnotations`` (:func:`configure_annotation_checks` puts it
  there when a run starts): a label map has its image's size and only values of the dataset's classes; an image has
  the size its annotation file gives.
- :func:`annotation_file_error`: which annotation file of a dataloader is not valid JSON, with line and column.
- :func:`check_dataset_paths`: the dataset folders and files of a config exist, else where to get them.

Only mmengine and numpy are needed: the checks read what mmdet / mmseg / mmpretrain datasets and heads expose.
"""
from __future__ import annotations

import json
import os
import os.path as osp
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import torch.nn as nn

from mmwf.registry import TRANSFORMS

CLASSES_FIX = ('Give every split the same classes in the same order: the same class folders (an empty folder is a '
               'class too), or the same metainfo=dict(classes=(...)) on every dataset.')
_ROTATED: set[str] = set()  # images already warned about, per process
# heads whose num_classes must equal the dataset's class count (mmdet's RPN is class-agnostic: not listed)
CLASS_HEADS = ('bbox_head', 'mask_head', 'decode_head', 'auxiliary_head', 'head', 'data_preprocessor')


def dataset_configs(dataloader: dict) -> list[dict]:
    """Dataset configs inside a dataloader config, through wrappers (RepeatDataset, ConcatDataset, ...)."""
    found = []
    stack = [dataloader.get('dataset')]
    while stack:
        ds = stack.pop()
        if isinstance(ds, dict):
            if 'dataset' in ds or 'datasets' in ds:
                stack.extend([ds.get('dataset')] + list(ds.get('datasets', [])))
            else:
                found.append(ds)
    return found


def leaf_datasets(dataset: object) -> Iterator[object]:
    """A built dataset and, through wrappers, the datasets it is made of."""
    inner = getattr(dataset, 'datasets', None) or ([dataset.dataset] if hasattr(dataset, 'dataset') else None)
    if inner is None:
        yield dataset
        return
    for ds in inner:
        yield from leaf_datasets(ds)


def describe(dataset: object) -> str:
    """Where a built dataset reads from: its annotation file, else its image folder(s)."""
    ds = next(leaf_datasets(dataset))
    ann = getattr(ds, 'ann_file', '')
    if ann:
        return ann
    prefix = getattr(ds, 'data_prefix', None) or {}
    return ', '.join(str(v) for v in prefix.values() if v) or getattr(ds, 'data_root', '') or type(ds).__name__


def classes_of(dataset: object) -> tuple[str, ...] | None:
    """The dataset's class names (``metainfo['classes']``), or None when it names none."""
    classes = (getattr(dataset, 'metainfo', None) or {}).get('classes')
    return tuple(str(c) for c in classes) if classes else None


def _names(classes: Sequence[str], limit: int = 8) -> str:
    shown = ', '.join(classes[:limit])
    return shown + (f', ... ({len(classes)} in all)' if len(classes) > limit else '')


def compare_classes(a: tuple[str, str], a_classes: tuple[str, ...], b: tuple[str, str],
                    b_classes: tuple[str, ...]) -> str | None:
    """Why two class lists differ, or None: ``a`` and ``b`` are (what, where) of each list's owner."""
    if a_classes == b_classes:
        return None
    only_a = [c for c in a_classes if c not in b_classes]
    only_b = [c for c in b_classes if c not in a_classes]
    lines = [f'the classes of {a[0]} ({a[1]}: {len(a_classes)}) and {b[0]} ({b[1]}: {len(b_classes)}) differ, so '
             'the same label would mean different classes.']
    if only_a:
        lines.append(f'only in {a[0]}: {_names(only_a)}')
    if only_b:
        lines.append(f'only in {b[0]}: {_names(only_b)}')
    if not only_a and not only_b:
        moved = [f'{i}: {x} vs {y}' for i, (x, y) in enumerate(zip(a_classes, b_classes)) if x != y]
        lines.append(f'the same names in another order (label {_names(moved, 4)})')
    return '\n'.join(lines)


def head_class_counts(model: nn.Module) -> dict[str, int]:
    """``{module name: num_classes}`` of the model's class-aware heads (mmdet's box and mask heads, mmseg's decode
    and auxiliary heads, mmpretrain's head and Mixup / CutMix data preprocessor, mmwf backbones with
    ``out_type='logits'``)."""
    counts = {}
    for name, module in model.named_modules():
        parts = [p for p in name.split('.') if not p.isdigit()]
        n = getattr(module, 'num_classes', None)
        if (parts and parts[-1] in CLASS_HEADS and 'rpn_head' not in parts and isinstance(n, int)
                and not isinstance(n, bool) and n > 0):
            counts[name] = n
        head = getattr(module, 'head', None)
        if getattr(module, 'out_type', None) == 'logits' and isinstance(head, nn.Linear):
            counts[f'{name}.head' if name else 'head'] = head.out_features
    return counts


def check_coco_categories(dataset: object) -> None:
    """A COCO-format dataset's annotation file defines what its annotations refer to (mmdet silently drops an
    annotation of an unlisted category), and every class the dataset names is one of its categories (mmdet looks the
    classes up by name and silently drops those it does not find). Reads the file once more: mmdet keeps only the
    ids it found."""
    for ds in leaf_datasets(dataset):
        cat_ids, classes, ann = getattr(ds, 'cat_ids', None), classes_of(ds), getattr(ds, 'ann_file', '')
        if cat_ids is None or not str(ann).endswith('.json') or not osp.isfile(ann):
            continue
        with open(ann, encoding='utf-8') as f:
            content = json.load(f)
        entry = coco_entry_error(ann, content)
        if entry:
            raise ValueError(f'annotation file {ann!r}: {entry}. Add the missing entry to the file or remove the '
                             'annotation.')
        if not classes or len(cat_ids) >= len(classes):
            continue
        found = [str(c['name']) for c in content.get('categories', [])]
        absent = [c for c in classes if c not in found]
        raise ValueError(f'annotation file {ann!r} has no category named {_names(absent)} ({len(absent)} of the '
                         f"dataset's {len(classes)} classes); its categories are {_names(found)}. Set the dataset's "
                         "metainfo=dict(classes=(...)) to the file's category names (mmdet's default is the 80 COCO "
                         'classes).')


REMAP_KEY = 'remap_classes'  # the config key that allows a dataset type to remap labels by class name


def label_remaps(dataset: object) -> list[str]:
    """How the dataset changes the labels its files hold to reach its classes, one line per change (empty: it keeps
    them): mmseg's ``label_map`` (a dataset type with built-in classes given other classes maps its built-in labels
    by name, and ignores the built-in classes not named), and mmdet's COCO filtering (the annotations of categories
    that are not among the dataset's classes are dropped)."""
    changes = []
    for ds in leaf_datasets(dataset):
        classes = classes_of(ds) or ()
        label_map = (getattr(ds, 'metainfo', None) or {}).get('label_map')
        if label_map:
            builtin = tuple(str(c) for c in getattr(type(ds), 'METAINFO', {}).get('classes', ()))
            moved = [f'{i} ({builtin[i] if i < len(builtin) else "?"}) -> '
                     + (f'{j} ({classes[j]})' if 0 <= j < len(classes) else 'ignored')
                     for i, j in sorted(label_map.items()) if i != j]
            changes.append(f'{type(ds).__name__} ({describe(ds)}) has {len(builtin)} built-in classes and maps its '
                           f'files\' labels by name to the {len(classes)} given: {_names(moved, 6)}')
        cat_ids, ann = getattr(ds, 'cat_ids', None), str(getattr(ds, 'ann_file', ''))
        if cat_ids is not None and ann.endswith('.json') and osp.isfile(ann):
            with open(ann, encoding='utf-8') as f:
                found = [str(c['name']) for c in json.load(f).get('categories', [])]
            dropped = [c for c in found if c not in classes]
            if classes and dropped:
                changes.append(f'{type(ds).__name__} ({ann}) drops the annotations of the file\'s categories that are '
                               f'not among its {len(classes)} classes: {_names(dropped)}')
    return changes


def check_label_remaps(splits: dict[str, object], allow: bool = False) -> list[str]:
    """No dataset of ``splits`` changes its files' labels (:func:`label_remaps`) unless ``allow`` (the config's
    ``remap_classes=True``); returns the changes allowed, to be logged. Raises ValueError naming the classes and the
    two ways out."""
    changes = [f'the {split} dataset: {line}' for split, ds in splits.items() for line in label_remaps(ds)]
    if changes and not allow:
        raise ValueError('\n'.join([
            'a dataset would change the labels its files hold (pixels or boxes would train as another class, or '
            'be dropped):', *changes,
            'Use a dataset type without built-in classes whose files hold indices into your classes (mmseg: '
            "type='BaseSegDataset', mmdet: every category of the file in metainfo=dict(classes=(...))), or, if "
            f'that mapping is what you want, set {REMAP_KEY}=True (--cfg-options {REMAP_KEY}=True): it is logged.']))
    return changes


def check_classes(splits: dict[str, object], model: nn.Module,
                  checkpoint: tuple[str, Sequence[str]] | None = None, remap: bool = False) -> list[str]:
    """Before any batch: the class lists of the built ``splits`` ({'train': dataset, ...}) agree with each other
    (train first), with every head's ``num_classes`` (:func:`head_class_counts`; the box and mask heads of a
    panoptic dataset count its ``thing_classes``) and with ``checkpoint`` = (path,
    the classes it was trained on); COCO files have every class named; no dataset remaps its labels unless ``remap``
    (:func:`check_label_remaps`). Raises ValueError with the numbers, the names that differ and the fix; returns the
    remappings allowed, to be logged."""
    named = {split: (ds, classes_of(ds)) for split, ds in splits.items()}
    for ds, _ in named.values():
        check_coco_categories(ds)
    remapped = check_label_remaps(splits, remap)
    with_classes = [(split, ds, classes) for split, (ds, classes) in named.items() if classes]
    if not with_classes:
        return remapped
    first, first_ds, first_classes = with_classes[0]
    for split, ds, classes in with_classes[1:]:
        why = compare_classes((f'the {first} dataset', describe(first_ds)), first_classes,
                              (f'the {split} dataset', describe(ds)), classes)
        if why:
            raise ValueError(f'{why}\n{CLASSES_FIX}')
    for split, ds, classes in with_classes:
        things = (getattr(ds, 'metainfo', None) or {}).get('thing_classes')  # panoptic: boxes and masks of things
        wrong = {head: n for head, n in head_class_counts(model).items() if n != (
            len(things) if things and {'bbox_head', 'mask_head'} & set(head.split('.')) else len(classes))}
        if wrong:
            heads = ', '.join(f'{head} has num_classes={n}' for head, n in wrong.items())
            raise ValueError(f'the {split} dataset ({describe(ds)}) has {len(classes)} classes ({_names(classes)}) but '
                             f'{heads}. Set num_classes={len(classes)} on every head (and on the data preprocessor '
                             'for Mixup / CutMix), or give the dataset the classes the model was built for '
                             '(metainfo=dict(classes=(...)), or its class folders).')
    if checkpoint and checkpoint[1]:
        path, trained = checkpoint
        split, ds, classes = with_classes[0]
        why = compare_classes((f'checkpoint {path!r}', 'the classes it was trained on'), tuple(map(str, trained)),
                              (f'the {split} dataset', describe(ds)), classes)
        if why:
            raise ValueError(f'{why}\nUse the checkpoint trained on these classes, or give the dataset the '
                             "checkpoint's classes in its order (metainfo=dict(classes=(...))).")
    return remapped


def annotation_files(cfg: dict | list) -> list[str]:
    """The ``.json`` annotation files a dataloader config (its datasets' ``data_root`` + ``ann_file``) or an
    evaluator config (its metrics' ``ann_file``) reads."""
    if isinstance(cfg, dict) and 'dataset' in cfg:
        paths = [osp.join(ds.get('data_root') or '', ds.get('ann_file') or '') for ds in dataset_configs(cfg)
                 if ds.get('ann_file')]
    else:
        metrics = cfg if isinstance(cfg, (list, tuple)) else cfg.get('metrics', [cfg]) if isinstance(cfg, dict) else []
        metrics = metrics if isinstance(metrics, (list, tuple)) else [metrics]
        paths = [m['ann_file'] for m in metrics if isinstance(m, dict) and m.get('ann_file')]
    return [p for p in paths if str(p).endswith('.json')]


def coco_entry_error(path: str, content: object) -> str | None:
    """What in a COCO-format annotation file refers to something the file does not define: an annotation of an
    image or a category it does not list (mmdet drops the one and fails on the other with a bare ``KeyError``)."""
    if not isinstance(content, dict) or not {'images', 'annotations', 'categories'} <= set(content):
        return None
    images = {i.get('id') for i in content['images'] if isinstance(i, dict)}
    categories = {c.get('id') for c in content['categories'] if isinstance(c, dict)}
    for ann in content['annotations']:
        if not isinstance(ann, dict):
            continue
        for key, known, listed in (('image_id', images, 'images'), ('category_id', categories, 'categories')):
            if ann.get(key) not in known:
                return (f'annotation {ann.get("id")!r} has {key} {ann.get(key)!r}, which is not among its {listed} '
                        f'({len(known)} listed)')
    return None


def annotation_file_error(cfg: dict | list) -> ValueError | None:
    """The error for the first annotation file of a dataloader or evaluator config that is not valid JSON (path,
    line, column, size and the fix), or None when every one parses."""
    for path in annotation_files(cfg):
        if not osp.isfile(path):
            continue
        try:
            with open(path, encoding='utf-8') as f:
                json.load(f)
        except json.JSONDecodeError as err:
            what = f'{err.msg} at line {err.lineno}, column {err.colno} (character {err.pos})'
        except UnicodeDecodeError as err:
            what = f'it is not UTF-8 text ({err.reason} at byte {err.start})'
        else:
            continue
        return ValueError(f'cannot read annotation file {path!r} ({os.path.getsize(path)} bytes): {what}. The file '
                          'is truncated or not JSON: download or copy it again (an interrupted copy leaves such a '
                          'file), or point ann_file at the right file.')
    return None


@TRANSFORMS.register_module()
class CheckAnnotations:
    """Pipeline step after ``LoadAnnotations``: the annotations fit their image, else one error naming both files.

    - a label map (``gt_seg_map``) has the image's size and, in mmseg datasets, holds only class values below
      ``num_classes`` or ``ignore_index`` (after ``reduce_zero_label``; mmdet's semantic maps of HTC / SCNet have
      their own class count and are not checked);
    - an image has the ``height`` / ``width`` its annotation file gives (mmdet: boxes and polygons are in that
      frame).

    Args:
        num_classes (int, optional): the dataset's class count, for the label values; the runner sets it from the
            dataset. Defaults to None (values not checked).
        ignore_index (int): the label value the losses ignore. Defaults to 255.
    """

    def __init__(self, num_classes: int | None = None, ignore_index: int = 255) -> None:
        self.num_classes, self.ignore_index = num_classes, ignore_index

    def __call__(self, results: dict) -> dict:
        ori = results.get('ori_shape')
        image = results.get('img_path')
        seg = results.get('gt_seg_map')
        if seg is not None and ori is not None and tuple(seg.shape[:2]) != tuple(ori[:2]):
            rotated = tuple(seg.shape[:2]) == tuple(ori[1::-1])
            fix = ("the image was probably turned by its EXIF orientation tag when decoded (the label map is not): "
                   "load images with color_type='color_ignore_orientation' in LoadImageFromFile" if rotated else
                   'export it again at that size, or check that the two files belong together')
            raise ValueError(f"label map {results.get('seg_map_path')!r} is {seg.shape[1]} x {seg.shape[0]} (W x H) "
                             f"but its image {image!r} is {ori[1]} x {ori[0]}. A label map must have its image's "
                             f'size: {fix}.')
        if seg is not None and self.num_classes and 'reduce_zero_label' in results:  # mmseg's label maps
            values = np.flatnonzero(np.bincount(seg.ravel(), minlength=1)) if seg.dtype == np.uint8 else np.unique(seg)
            bad = [int(v) for v in values if v >= self.num_classes and v != self.ignore_index]
            if bad:
                stored = (f'{[v + 1 for v in bad[:8]]} ({bad[:8]} after reduce_zero_label: every value minus 1, '
                          '0 ignored)') if results.get('reduce_zero_label') else f'{bad[:8]}'
                raise ValueError(f"label map {results.get('seg_map_path')!r} holds class values {stored} but the "
                                 f'dataset has {self.num_classes} classes (values 0..{self.num_classes - 1}, '
                                 f'{self.ignore_index} ignored). Fix the label map, or the dataset\'s classes '
                                 '(metainfo) and the heads\' num_classes.')
        height, width = results.get('height'), results.get('width')
        if ori is not None and height and width and (height, width) != tuple(ori[:2]):
            if (width, height) == tuple(ori[:2]):  # an EXIF-rotated photo: OpenCV applied its orientation tag
                if image not in _ROTATED:
                    _ROTATED.add(image)
                    warnings.warn(f'image {image!r} was decoded rotated by its EXIF orientation ({ori[1]} x {ori[0]}) '
                                  f'but its annotation file gives {width} x {height}: its boxes and masks do not fit '
                                  "the pixels. Load images with color_type='color_ignore_orientation' in "
                                  'LoadImageFromFile if the annotations are in the stored frame.', stacklevel=2)
            else:
                raise ValueError(f'image {image!r} is {ori[1]} x {ori[0]} (W x H) but its annotation file gives '
                                 f'{width} x {height}, the frame of its boxes and masks. Fix the width / height of '
                                 'this image in the annotation file, or use the image it was annotated on.')
        return results

    def __repr__(self) -> str:
        return f'{type(self).__name__}(num_classes={self.num_classes}, ignore_index={self.ignore_index})'


def configure_annotation_checks(dataset: object, ignore_index: int | None = None) -> int:
    """Put a :class:`CheckAnnotations` step after every ``LoadAnnotations`` of a built dataset's pipelines (where
    there is none) and give each the dataset's class count (and the heads' ignore index): before the loader's
    workers start, which copy the pipeline as it is then. Returns how many steps were added."""
    classes = (getattr(dataset, 'metainfo', None) or {}).get('classes')
    added = 0
    for leaf in leaf_datasets(dataset):
        steps = getattr(getattr(leaf, 'pipeline', None), 'transforms', None)
        if not isinstance(steps, list):
            continue
        for i in range(len(steps) - 1, -1, -1):
            following = steps[i + 1] if i + 1 < len(steps) else None
            if type(steps[i]).__name__ == 'LoadAnnotations' and not isinstance(following, CheckAnnotations):
                steps.insert(i + 1, CheckAnnotations())
                added += 1
        for step in steps:
            if isinstance(step, CheckAnnotations) and classes:
                step.num_classes = len(classes)
                if ignore_index is not None:
                    step.ignore_index = ignore_index
    return added


DATASET_HELP = {
    'CocoDataset': ('COCO 2017 (train2017/, val2017/, annotations/instances_{train,val}2017.json) from '
                    'cocodataset.org, placed under data/coco/'),
    'ADE20KDataset': ('ADE20K (ADEChallengeData2016: images/ and annotations/ with training/ and validation/) '
                      'from the MIT Scene Parsing Benchmark, placed under data/ade/'),
    'ImageNet': ('ImageNet-1K (ILSVRC2012: train/ and val/, one folder per class, val images sorted into their '
                 'class folders) from image-net.org, placed under data/imagenet/'),
    'CustomDataset': 'an image folder with one sub-folder per class',
}
DEMO_HELP = ('To try mmwf without it, generate the synthetic demo data and use a demo config: '
             '`python tools/generate_demo_data.py` then e.g. `python tools/train.py '
             'configs/demo/cascade_wf_t_demo.py` (or simply `make demo`).')


def check_dataset_paths(cfg: dict, splits: tuple[str, ...] = ('train', 'val', 'test')) -> None:
    """Raise FileNotFoundError naming the missing dataset folder or file, where to get the data, and the
    demo data, before the runner starts."""
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        for ds in dataset_configs(loader):
            root = ds.get('data_root', '')
            prefix = ds.get('data_prefix') or {}
            paths = [ds.get('ann_file', ''), ds.get('split', '')] + list(
                prefix.values() if isinstance(prefix, dict) else [prefix])
            missing = [os.path.join(root, p) for p in paths if p and not os.path.exists(os.path.join(root, p))]
            if root and not os.path.isdir(root):
                missing = [root]
            if missing:
                help_text = DATASET_HELP.get(ds.get('type'), f"the {ds.get('type')} dataset")
                raise FileNotFoundError(
                    f'{split} data not found: {", ".join(missing)} (cwd {os.getcwd()}).\n'
                    f'Get {help_text}, or point the config at it with '
                    f'--cfg-options {split}_dataloader.dataset.data_root=PATH.\n{DEMO_HELP}')
