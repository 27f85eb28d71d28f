"""Bad input of every kind gets one error that names the problem, the file or value, and the fix.

Each case builds the bad input, runs the public entry point a user would, and asserts the error type and the
words the user needs (docs/troubleshooting.md lists them)."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner
from safetensors.torch import save_file

import mmwf  # noqa: F401
from mmwf.configs import config_file, export_config
from mmwf.datasets import CheckAnnotations, check_classes, check_dataset_paths, configure_annotation_checks
from mmwf.deployment import CascadeMaskRCNNGraph
from mmwf.engine.hooks import NonFiniteLossHook, ShowPredictionsHook
from mmwf.engine.launch import named_annotation_errors
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.models.distillers import student_checkpoint
from mmwf.models.necks import SimpleFeaturePyramid
from mmwf.models.transfer import transfer_softmax_weights
from mmwf.utils import CheckpointError, UnsafeCheckpointError, load_state_dict_file
from mmwf.utils.arrays import check_image_array
from mmwf.utils.checkpoint import CheckpointMismatchError
from tests.toy import ToyData, ToyModel, make_runner

ROOT = Path(__file__).resolve().parents[1]
TINY_WF = dict(embed_dims=32, depth=2, mlp_ratio=2)
TINY_DEIT = dict(embed_dims=32, depth=2, num_heads=2, mlp_ratio=2)


def pretrained(path: Path, arch: dict = TINY_WF) -> Callable:
    """Initialise a tiny WeightFormer from ``path``, as ``init_cfg=dict(type='Pretrained')`` does in a config."""
    return lambda: WeightFormer(arch, init_cfg=dict(type='Pretrained', checkpoint=str(path))).init_weights()


def valid_checkpoint(tmp: Path) -> Path:
    path = tmp / 'wf.pth'
    torch.save(WeightFormer(TINY_WF).state_dict(), path)
    return path


def empty(tmp: Path) -> Path:
    (tmp / 'empty.pth').write_bytes(b'')
    return tmp / 'empty.pth'


def truncated(tmp: Path) -> Path:
    data = valid_checkpoint(tmp).read_bytes()
    (tmp / 'half.pth').write_bytes(data[:len(data) // 2])
    return tmp / 'half.pth'


def text_file(tmp: Path) -> Path:
    (tmp / 'notes.pth').write_text('weights are on the shared drive\n')
    return tmp / 'notes.pth'


def corrupt_safetensors(tmp: Path) -> Path:
    save_file({'w': torch.ones(2)}, str(tmp / 'good.safetensors'))
    data = (tmp / 'good.safetensors').read_bytes()
    (tmp / 'bad.safetensors').write_bytes(b'\xff' * 8 + data[8:])
    return tmp / 'bad.safetensors'


def not_a_state_dict(tmp: Path) -> Path:
    torch.save({'epoch': 3, 'lr': 0.1}, tmp / 'meta.pth')
    return tmp / 'meta.pth'


def unsafe(tmp: Path) -> Path:
    torch.save({'model': {'w': torch.ones(1)}, 'args': argparse.Namespace(lr=1)}, tmp / 'train.pth')
    return tmp / 'train.pth'


def other_size(tmp: Path) -> Path:
    torch.save(WeightFormer(dict(TINY_WF, embed_dims=48)).state_dict(), tmp / 'wf_s.pth')
    return tmp / 'wf_s.pth'


def softmax_deit(tmp: Path) -> Path:
    torch.save(DeiT(TINY_DEIT).state_dict(), tmp / 'deit.pth')
    return tmp / 'deit.pth'


def layer_decay(model: torch.nn.Module, **paramwise) -> Callable:
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope

    def build():
        init_default_scope('mmdet')
        wrapper = torch.nn.Module()
        wrapper.backbone = model
        build_optim_wrapper(wrapper, dict(constructor='LayerDecayOptimWrapperConstructor',
                                          optimizer=dict(type='AdamW', lr=1e-4), paramwise_cfg=paramwise))
    return build


class MaskRCNN(torch.nn.Module):
    """A detector without the ViTDet cascade's RoI head."""


def nan_loss_iteration() -> None:
    runner = argparse.Namespace(iter=41, work_dir='work_dirs/run')
    NonFiniteLossHook().after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(float('nan')),
                                                                 loss_cls=torch.tensor(0.7),
                                                                 loss_bbox=torch.tensor(float('inf'))))


def missing_dataset(config: str) -> Callable:
    return lambda: check_dataset_paths(Config.fromfile(str(ROOT / config)))


def cascade_head_with_resampling() -> None:
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(str(ROOT / 'configs/cascade_wf_t_coco.py'))
    rcnn = cfg.model.train_cfg.rcnn
    rcnn[2].sampler = rcnn[0].sampler
    init_default_scope('mmdet')
    MODELS.build(dict(cfg.model.roi_head, train_cfg=rcnn, test_cfg=cfg.model.test_cfg.rcnn))


def toy_checkpoint(tmp: Path) -> Path:
    """iter_3.pth of a toy run (a 4 -> 1 linear model; its dataset's classes: ('sum',))."""
    make_runner(tmp / 'toy', 3).train()
    return tmp / 'toy' / 'iter_3.pth'


def toy_load(tmp: Path, model: torch.nn.Module | None = None, checkpoint: Path | None = None, **kwargs) -> Callable:
    """Train a toy runner loading ``checkpoint`` (``load_from``, or resumed with ``resume=True``)."""
    path = checkpoint or toy_checkpoint(tmp)
    return make_runner(tmp / 'run', 6, model=model, load_from=str(path), **kwargs).train


def saved(tmp: Path, state: dict, name: str) -> Path:
    torch.save({'state_dict': state, 'meta': {}}, tmp / name)
    return tmp / name


def released(tmp: Path) -> Path:
    """Backbone weights as the WeightFormer release ships them: a safetensors file of the backbone's keys."""
    save_file({'weight': torch.ones(2, 4), 'bias': torch.ones(2)}, str(tmp / 'backbone.safetensors'))
    return tmp / 'backbone.safetensors'


class WithBackbone(ToyModel):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Linear(4, 2)


class OtherClasses(ToyData):
    metainfo = dict(classes=('product',))


def toy_test_with_other_classes(tmp: Path) -> Callable:
    checkpoint = toy_checkpoint(tmp)
    loader = dict(dataset=OtherClasses(), sampler=dict(type='DefaultSampler', shuffle=False), batch_size=4,
                  num_workers=0, collate_fn=dict(type='default_collate'))
    return make_runner(tmp / 'test', 1, load_from=str(checkpoint), test_dataloader=loader,
                       test_cfg=dict(), test_evaluator=dict(type='DumpResults', out_file_path=str(tmp / 'r.pkl'))).test


def coco_build(tmp: Path, text: str) -> Callable:
    """Build a data loader over a COCO file with ``text`` as a run does (mmwf's tools name what is wrong with it)."""
    from mmengine.registry import init_default_scope
    (tmp / 'ann.json').write_text(text)
    loader = dict(dataset=dict(type='CocoDataset', data_root=str(tmp), ann_file='ann.json', data_prefix=dict(img=''),
                               metainfo=dict(classes=('circle',)), pipeline=[]),
                  sampler=dict(type='DefaultSampler', shuffle=False), batch_size=1)

    def build():
        init_default_scope('mmdet')
        with named_annotation_errors(Config(dict(train_dataloader=loader))):
            Runner.build_dataloader(loader)
    return build


COCO = {'images': [{'id': 1, 'file_name': 'a.jpg', 'width': 8, 'height': 8}], 'annotations': [],
        'categories': [{'id': 1, 'name': 'circle'}]}


def truncated_coco(tmp: Path) -> Callable:
    return coco_build(tmp, json.dumps(COCO)[:60])


def coco_annotation_of_an_unknown_category(tmp: Path) -> Callable:
    """mmdet builds the dataset and drops the annotation; the run's dataset check names it."""
    from mmdet.datasets import CocoDataset
    ann = {'id': 7, 'image_id': 1, 'category_id': 5, 'bbox': [0, 0, 4, 4], 'area': 16, 'iscrowd': 0}
    (tmp / 'ann.json').write_text(json.dumps({**COCO, 'annotations': [ann]}))
    dataset = CocoDataset(data_root=str(tmp), ann_file='ann.json', data_prefix=dict(img=''), pipeline=[],
                          metainfo=dict(classes=('circle',)))
    return lambda: check_classes({'train': dataset}, torch.nn.Module())


def class_folders(tmp: Path, split: str, classes: tuple[str, ...]):
    import cv2
    import numpy as np
    from mmpretrain.datasets import CustomDataset

    from mmwf.datasets import make_image
    for name in classes:
        (tmp / split / name).mkdir(parents=True)
    img, _, _ = make_image(np.random.default_rng(0), 32, 1, cls=0)
    cv2.imwrite(str(tmp / split / classes[0] / '0.jpg'), img)
    return CustomDataset(data_root=str(tmp), data_prefix=split, pipeline=[])


def one_split_with_an_extra_folder(tmp: Path) -> Callable:
    train = class_folders(tmp, 'train', ('circle', 'hexagon', 'square'))  # hexagon: an empty folder
    val = class_folders(tmp, 'val', ('circle', 'square'))
    return lambda: check_classes({'train': train, 'val': val}, torch.nn.Module())


def more_classes_than_the_head() -> None:
    model = torch.nn.Module()
    model.decode_head = torch.nn.Module()
    model.decode_head.num_classes = 3
    dataset = SimpleNamespace(metainfo=dict(classes=('a', 'b', 'c', 'd')), ann_file='', data_prefix=dict(
        img_path='data/ade/images/training'))
    check_classes({'train': dataset}, model)


def coco_class_not_in_file(tmp: Path) -> Callable:
    (tmp / 'ann.json').write_text(json.dumps({'categories': [{'id': 1, 'name': 'circle'}, {'id': 2, 'name': 'box'}]}))
    dataset = SimpleNamespace(metainfo=dict(classes=('circle', 'square')), ann_file=str(tmp / 'ann.json'), cat_ids=[1])
    return lambda: check_classes({'val': dataset}, torch.nn.Module())


def segmentation_classes_remapped_by_name() -> Callable:
    """The detection pattern of docs/guides/your_project.md on a segmentation config: ADE20K's type given two of its
    150 classes."""
    from mmseg.datasets import ADE20KDataset
    dataset = ADE20KDataset(data_root='data/ade', data_prefix=dict(img_path='i', seg_map_path='a'), lazy_init=True,
                            metainfo=dict(classes=('floor', 'wall')))
    return lambda: check_classes({'train': dataset}, torch.nn.Module())


def coco_categories_dropped(tmp: Path) -> Callable:
    categories = [{'id': i, 'name': n} for i, n in enumerate(('circle', 'square', 'hexagon'), 1)]
    (tmp / 'ann.json').write_text(json.dumps({'categories': categories}))
    dataset = SimpleNamespace(metainfo=dict(classes=('circle', 'square')), ann_file=str(tmp / 'ann.json'),
                              cat_ids=[1, 2])
    return lambda: check_classes({'train': dataset}, torch.nn.Module())


def truncated_image_in_a_class_folder(tmp: Path) -> Callable:
    """PIL decodes lazily: without the shared reader the error came later, without the file's name."""
    import numpy as np
    from PIL import Image

    from mmwf.datasets import ClassFolderImages
    (tmp / 'cls' / 'circle').mkdir(parents=True)
    path = tmp / 'cls' / 'circle' / 'a.jpg'
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path, quality=95)
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    return lambda: ClassFolderImages(str(tmp / 'cls'), 32)[0]


def annotations(**results) -> Callable:
    return lambda: CheckAnnotations(num_classes=4)(dict(img_path='a.jpg', seg_map_path='a.png', **results))


def label_beyond_classes(tmp: Path) -> Callable:
    """An ADE20K-layout folder whose second label map holds 10 (9 after reduce_zero_label) for 4 classes, read by
    the runner's data loader in a worker process, as training reads it."""
    import cv2
    import numpy as np
    from mmengine.registry import init_default_scope

    from mmwf.datasets import write_ade
    write_ade(str(tmp), 'training', 2, 32, np.random.default_rng(0))
    label = tmp / 'annotations' / 'training' / '00001.png'
    cv2.imwrite(str(label), np.full((32, 32), 10, np.uint8))
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'), dict(type='CheckAnnotations'),
                dict(type='PackSegInputs')]
    dataset = dict(type='BaseSegDataset', data_root=str(tmp), img_suffix='.jpg', seg_map_suffix='.png',
                   reduce_zero_label=True, metainfo=dict(classes=('background', 'circle', 'square', 'triangle')),
                   data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
                   pipeline=pipeline)

    def read():
        init_default_scope('mmseg')
        loader = Runner.build_dataloader(dict(dataset=dataset, batch_size=2, num_workers=1,
                                              sampler=dict(type='DefaultSampler', shuffle=False)))
        configure_annotation_checks(loader.dataset)  # as DatasetCheckHook does before the workers start
        next(iter(loader))
    return read


def global_batch_over_three_processes() -> None:
    from mmwf.engine.world import scale_to_world
    scale_to_world(Config.fromfile(str(ROOT / 'configs/generation/dit_s_2_in256.py')), 3)


def generation_metric_missing_samples(tmp: Path) -> Callable:
    """A metric told of 10 samples that saw 9 (a sampler that drops or repeats samples)."""
    import numpy as np

    from mmwf.evaluation import GenerationMetric
    np.savez(tmp / 'ref.npz', mu=np.zeros(3), sigma=np.eye(3))
    metric = GenerationMetric(str(tmp / 'ref.npz'), extractor=lambda x: (x.float().mean((2, 3)),) * 2)
    metric.dataset_meta = dict(num_samples=10)
    metric.process({}, [dict(fake_img=torch.full((3, 2, 2), i, dtype=torch.uint8), index=i) for i in range(9)])
    return lambda: metric.evaluate(10)


def unreachable_url(tmp: Path) -> Callable:
    def load():
        os.environ['TORCH_HOME'] = str(tmp)
        try:
            load_state_dict_file('http://127.0.0.1:9/deit_tiny.pth')  # port 9: nothing listens
        finally:
            del os.environ['TORCH_HOME']
    return load


# (id, build the failing call from a temporary folder, error type, words the message must contain)
CASES = [
    # images
    ('image without batch dimension', lambda t: lambda: WeightFormer(TINY_WF)(torch.randn(3, 64, 64)),
     ValueError, ['WeightFormer needs images (B, 3, H, W)', '(3, 64, 64)', 'Add the batch dimension']),
    ('grayscale image', lambda t: lambda: DeiT(TINY_DEIT)(torch.randn(1, 1, 64, 64)),
     ValueError, ['DeiT needs images (B, 3, H, W)', 'convert the images to 3 channels']),
    ('image smaller than 2 x 2 patches', lambda t: lambda: WeightFormer(TINY_WF)(torch.randn(1, 3, 16, 64)),
     ValueError, ['H, W >= 32', '(1, 3, 16, 64)', 'Resize or pad']),
    ('uint8 image', lambda t: lambda: WeightFormer(TINY_WF)(torch.zeros(1, 3, 64, 64, dtype=torch.uint8)),
     ValueError, ['torch.float32 weights', 'torch.uint8 images', 'Normalise the images']),
    ('fp16 image into an fp32 model', lambda t: lambda: DeiT(TINY_DEIT)(torch.randn(1, 3, 32, 32).half()),
     ValueError, ['torch.float16 images', 'mixed precision', 'AmpOptimWrapper']),
    # configs
    ('unknown arch', lambda t: lambda: WeightFormer('xl'), ValueError,
     ["unknown WeightFormer arch 'xl'", "['b', 's', 't', 't18']"]),
    ('custom arch without depth', lambda t: lambda: DeiT(dict(embed_dims=64, num_heads=2, mlp_ratio=4)), ValueError,
     ['custom DeiT arch', "lacks ['depth']", 'embed_dims, mlp_ratio, num_heads']),
    ('out_indices past the last block', lambda t: lambda: WeightFormer('t', out_indices=(17,)), ValueError,
     ['out_indices [17] out of range', '17 blocks', '0..16']),
    ('dynamic_blocks without every', lambda t: lambda: WeightFormer(TINY_WF, dynamic_blocks=dict(offset=1)), ValueError,
     ["dynamic_blocks={'offset': 1}", 'dict(every=k, offset=o) with k >= 1', 'every=3, offset=1']),
    ('dynamic_mlp typo', lambda t: lambda: WeightFormer(TINY_WF, dynamic_mlp='frist'), ValueError,
     ["'first', 'second', 'both' or 'none'", "'frist'"]),
    ('pyramid scale not supported', lambda t: lambda: SimpleFeaturePyramid(32, scale_factors=(4.0, 2.0, 3.0, 0.5)),
     ValueError,
     ['scale factor 3.0 is not supported', '(4, 2, 1, 0.5)']),
    ('layer decay counted for DeiT on WeightFormer-T', lambda t: layer_decay(WeightFormer('t'), num_layers=12,
                                                                            decay_rate=0.7),
     ValueError, ['num_layers=12', 'has 17 blocks', 'last 5 blocks', '4.2x the base lr', 'Set num_layers=17']),
    ('layer decay key of another constructor', lambda t: layer_decay(WeightFormer(TINY_WF), decay_rate=0.7,
                                                                     layer_decay_rate=0.9),
     ValueError, ["['layer_decay_rate'] are not implemented", 'num_layers, decay_rate, reference_depth, no_decay']),
    ('unknown weight-decay rule', lambda t: layer_decay(WeightFormer(TINY_WF), decay_rate=0.7, no_decay='all'),
     ValueError, ["no_decay='all' is not a rule", "'beit', 'norms', 'vitdet'"]),
    ('cascade stage resampling', lambda t: cascade_head_with_resampling, ValueError,
     ['train_cfg.rcnn[2].sampler is RandomSampler', "sampler=dict(type='PseudoSampler')"]),
    ('unknown transfer recipe', lambda t: lambda: transfer_softmax_weights(DeiT(TINY_DEIT), str(softmax_deit(t)),
                                                                           'copy_all'),
     ValueError, ["unknown transfer recipe 'copy_all'", "'full_copy'", 'init_cfg=None']),
    # checkpoints
    ('missing weights', lambda t: pretrained(t / 'weightformer_t.safetensors'), FileNotFoundError,
     ['checkpoint not found', 'weightformer_t.safetensors', 'RuizeHe/weightformer', 'init_cfg=None']),
    ('empty checkpoint', lambda t: pretrained(empty(t)), CheckpointError,
     ['empty.pth', 'the file is empty (0 bytes)', 'Download or copy the file again']),
    ('truncated checkpoint', lambda t: pretrained(truncated(t)), CheckpointError,
     ['half.pth', 'zip archive is truncated or damaged', 'resume from an earlier checkpoint']),
    ('text file as checkpoint', lambda t: pretrained(text_file(t)), CheckpointError,
     ['notes.pth', 'not a PyTorch or safetensors checkpoint', "b'weights are '", 'points at the weights file']),
    ('corrupt safetensors', lambda t: lambda: load_state_dict_file(str(corrupt_safetensors(t))), CheckpointError,
     ['bad.safetensors', 'safetensors header is corrupt', 'Download or copy the file again']),
    ('not a state dict', lambda t: pretrained(not_a_state_dict(t)), CheckpointError,
     ['meta.pth', 'not a state dict', 'epoch, lr']),
    ('pickled Python object', lambda t: pretrained(unsafe(t)), UnsafeCheckpointError,
     ['train.pth', 'weights-only loading refuses', 'argparse.Namespace', 'clean_checkpoint.py', '--trust-source']),
    ('checkpoint of another size', lambda t: pretrained(other_size(t)), ValueError,
     ['wf_s.pth', 'does not match WeightFormer', 'shape mismatches',
      'blocks.0.dwc.weight: checkpoint (48, 1, 3, 3) vs model (32, 1, 3, 3)']),
    ('truncated teacher / transfer checkpoint', lambda t: lambda: transfer_softmax_weights(
        DeiT(TINY_DEIT), str(truncated(t)), 'copy'), CheckpointError, ['half.pth', 'truncated or damaged']),
    # checkpoints of another model, at test / load_from and resume
    ('test checkpoint of another model', lambda t: toy_load(t, ToyModel(3)), CheckpointMismatchError,
     ['iter_3.pth', 'does not match the model of this config (ToyModel); the run stops before the first batch',
      'shape mismatches (2)', 'linear.weight: checkpoint (1, 4) vs model (3, 4)',
      'Use the checkpoint this config trained', 'partial_load=True', '--cfg-options partial_load=True']),
    ('resume with a checkpoint of another model', lambda t: toy_load(t, ToyModel(3), resume=True),
     CheckpointMismatchError, ['iter_3.pth', 'the run stops', 'linear.bias: checkpoint (1,) vs model (3,)']),
    ('resume with another optimizer layout', lambda t: toy_load(t, resume=True, optim_wrapper=dict(
        optimizer=dict(type='AdamW', lr=0.01), paramwise_cfg=dict(bias_lr_mult=2.0))), CheckpointMismatchError,
     ["cannot resume from", 'iter_3.pth', 'its optimizer state does not fit the parameters of this config',
      '1 parameter groups in the checkpoint vs 2 here', 'load_from=PATH (no --resume)']),
    ('resume from a weights-only checkpoint', lambda t: toy_load(t, checkpoint=saved(
        t, {'linear.weight': torch.ones(1, 4), 'linear.bias': torch.ones(1)}, 'weights.pth'), resume=True),
     CheckpointError, ['weights.pth', 'it is not a resume point: it lacks the optimizer, message hub state',
                       'best checkpoint', 'iter_N.pth', 'load_from=PATH (no --resume)']),
    ('explicit resume of a damaged checkpoint', lambda t: toy_load(t, checkpoint=truncated(t), resume=True),
     CheckpointError, ['half.pth', 'zip archive is truncated or damaged']),
    ('distiller checkpoint as a test checkpoint', lambda t: toy_load(t, checkpoint=saved(
        t, {'student.linear.weight': torch.ones(1, 4), 'teacher.w': torch.ones(1)}, 'distill.pth')),
     CheckpointMismatchError, ['distill.pth', 'unexpected keys (2): student.linear.weight, teacher.w',
                               'It is a distiller checkpoint', 'extract_student.py']),
    ('released backbone weights as a test checkpoint', lambda t: toy_load(t, WithBackbone(), released(t)),
     CheckpointMismatchError, ['backbone.safetensors', 'It is a backbone checkpoint',
                               "model.backbone.init_cfg=dict(type='Pretrained', checkpoint=PATH)"]),
    ('test checkpoint trained on other classes', toy_test_with_other_classes, ValueError,
     ["checkpoint '", 'iter_3.pth', 'the classes it was trained on: 1', 'only in checkpoint', 'sum',
      'only in the test dataset: product', "give the dataset the checkpoint's classes"]),
    ('not a distiller checkpoint to extract', lambda t: lambda: student_checkpoint(
        {'state_dict': {'backbone.w': torch.ones(1)}}, 'det.pth'), CheckpointError,
     ["'det.pth' is not a distiller checkpoint", "no 'student.' keys", 'backbone.*']),
    ('unreachable checkpoint URL', unreachable_url, FileNotFoundError,
     ["cannot download checkpoint 'http://127.0.0.1:9/deit_tiny.pth'", 'download the file yourself']),
    ('unknown torchvision checkpoint', lambda t: lambda: load_state_dict_file('torchvision://resnet5O'),
     KeyError, ['torchvision://resnet5O is not a checkpoint mmengine knows', 'did you mean resnet50 or']),
    # datasets
    ('COCO not downloaded', lambda t: missing_dataset('configs/cascade_wf_t_coco.py'), FileNotFoundError,
     ['data/coco/', 'cocodataset.org', 'data_root=PATH', 'generate_demo_data.py']),
    ('ADE20K not downloaded', lambda t: missing_dataset('configs/upernet_wf_t_ade20k.py'), FileNotFoundError,
     ['ADEChallengeData2016', 'MIT Scene Parsing Benchmark', 'configs/demo/']),
    ('ImageNet not downloaded', lambda t: missing_dataset('configs/imagenet/weightformer_t_in1k.py'),
     FileNotFoundError, ['data/imagenet', 'ILSVRC2012', 'image-net.org', 'data_root=PATH']),
    ('truncated COCO annotation file', truncated_coco, ValueError,
     ["cannot read annotation file '", "ann.json' (60 bytes): Unterminated string", 'at line 1, column 57',
      'download or copy it again']),
    ('COCO annotation of a category the file does not list', coco_annotation_of_an_unknown_category, ValueError,
     ["ann.json': annotation 7 has category_id 5, which is not among its categories (1 listed)",
      'Add the missing entry']),
    ('label map of another size than its image', lambda t: annotations(
        ori_shape=(64, 64), gt_seg_map=torch.zeros(64, 48, dtype=torch.uint8).numpy()), ValueError,
     ["label map 'a.png' is 48 x 64 (W x H) but its image 'a.jpg' is 64 x 64", 'export it again at that size']),
    ('label values beyond the classes, in a loader worker', label_beyond_classes, ValueError,
     ["00001.png' holds class values [10] ([9] after reduce_zero_label", '4 classes (values 0..3, 255 ignored)']),
    ('image of another size than its annotation', lambda t: annotations(ori_shape=(64, 64), height=64, width=128),
     ValueError, ["image 'a.jpg' is 64 x 64 (W x H) but its annotation file gives 128 x 64", 'Fix the width / height']),
    ('class folder in one split only', one_split_with_an_extra_folder, ValueError,
     ['the train dataset', 'train: 3) and the val dataset', 'val: 2) differ', 'only in the train dataset: hexagon',
      'an empty folder is a class too']),
    ('more classes than the head', lambda t: more_classes_than_the_head, ValueError,
     ['the train dataset (data/ade/images/training) has 4 classes (a, b, c, d) but decode_head has num_classes=3',
      'Set num_classes=4 on every head']),
    ('truncated image in a class folder', truncated_image_in_a_class_folder, ValueError,
     ['cannot read image', 'a.jpg', 'image file is truncated', 'replace it with a whole copy']),
    ('float images where uint8 images are read', lambda t: lambda: check_image_array(
        np.full((2, 8, 8, 3), 0.5, np.float32), "arr_0 of 'samples.npz'"), ValueError,
     ["arr_0 of 'samples.npz' is float32 in [0.5, 0.5], not uint8 in [0, 255]",
      'np.clip(np.round(x * 255), 0, 255).astype(np.uint8)']),
    ('segmentation classes remapped by name', lambda t: segmentation_classes_remapped_by_name(), ValueError,
     ['would change the labels its files hold', 'ADE20KDataset (data/ade', '150 built-in classes',
      "maps its files' labels by name to the 2 given", '0 (wall) -> 1 (wall)', '1 (building) -> ignored',
      '3 (floor) -> 0 (floor)', "type='BaseSegDataset'", 'remap_classes=True']),
    ('COCO categories dropped by the class list', coco_categories_dropped, ValueError,
     ["drops the annotations of the file's categories that are not among its 2 classes: hexagon",
      'every category of the file in metainfo=dict(classes=(...))', '--cfg-options remap_classes=True']),
    ('COCO class missing from its annotation file', coco_class_not_in_file, ValueError,
     ["ann.json' has no category named square (1 of the dataset's 2 classes)", 'its categories are circle, box',
      "metainfo=dict(classes=(...)) to the file's category names"]),
    ('classifier head without classes', lambda t: lambda: WeightFormer(TINY_WF, out_type='logits'), ValueError,
     ["out_type='logits' needs num_classes > 0"]),
    ('end-to-end export of another detector', lambda t: lambda: CascadeMaskRCNNGraph(MaskRCNN()), ValueError,
     ["MaskRCNN has roi_head NoneType: the end-to-end graph is the ViTDet Cascade Mask R-CNN's",
      'without --end2end']),
    # packaged configs and pictures
    ('misspelt config name', lambda t: lambda: config_file('upernet_wf_t_ade'), ValueError,
     ["no mmwf config named 'upernet_wf_t_ade'", 'did you mean upernet_wf_t_ade20k', 'python -m mmwf.configs --list']),
    ('config export into a file', lambda t: lambda: export_config('cascade_wf_t_coco', empty(t)), NotADirectoryError,
     ['empty.pth is a file; give a folder']),
    ('no pictures asked for', lambda t: lambda: ShowPredictionsHook(str(t), max_images=0), ValueError,
     ['max_images=0', 'positive count, or None for all']),
    # several processes
    ('global batch the process count does not divide', lambda t: global_batch_over_three_processes, ValueError,
     ['the global batch 256 cannot be split over 3 processes x 1 accumulated iterations', 'divides it']),
    ('generation metric missing samples', generation_metric_missing_samples, ValueError,
     ['GenerationMetric counted 9 samples of 10', "DefaultSampler order", 'each sample once']),
    # precision
    ('NaN / inf loss', lambda t: nan_loss_iteration, FloatingPointError,
     ['iteration 42', 'loss=nan', 'loss_bbox=inf', 'loss_cls=0.7', 'clip_grad', '--resume']),
]


@pytest.mark.parametrize('make,error,words', [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clear_error(make, error, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative dataset paths of the configs do not exist here
    call = make(tmp_path)
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f'{missing} not in: {message}'


def test_case_names_are_unique():
    names = [c[0] for c in CASES]
    assert len(set(names)) == len(names), [n for n in names if names.count(n) > 1]
