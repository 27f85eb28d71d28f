"""The ImageNet stage (mmpretrain): configs build with the paper's counts, train and test through their own pipeline,
released checkpoints load with their head, and classifier checkpoints initialise the dense backbones."""
from glob import glob
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from safetensors.torch import save_file

import mmwf  # noqa: F401
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.utils import adapt_to_device
from tests.tolerance import assert_same_computation

ROOT = Path(__file__).resolve().parents[2]
IMAGENET = sorted(glob(str(ROOT / 'configs/imagenet/*.py')))
TRANSFER = sorted(glob(str(ROOT / 'configs/linear_attention/cls_*.py')))
DEMO = [str(ROOT / 'configs/demo/weightformer_t_cls_demo.py'), str(ROOT / 'configs/demo/deit_relu_distill_cls_demo.py')]


def build(cfg: Config):
    import mmpretrain.registry
    adapt_to_device(cfg)
    init_default_scope('mmpretrain')
    model_cfg = dict(cfg.model)
    model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)  # as mmengine's Runner does
    return mmpretrain.registry.MODELS.build(model_cfg)


@pytest.mark.parametrize('path', IMAGENET + DEMO, ids=lambda p: Path(p).stem)
def test_imagenet_config_builds_its_classifier(path):
    """The structure only, on the meta device (no weights allocated or initialised): what the config builds."""
    cfg = Config.fromfile(path)
    assert cfg.default_scope == 'mmpretrain' and dict(type='NonFiniteLossHook') in cfg.custom_hooks
    with torch.device('meta'):
        model = build(cfg)
    assert all(p.is_meta for p in model.parameters())
    student = getattr(model, 'student', model)
    assert type(student).__name__ == 'ImageClassifier' and student.backbone.out_type == 'logits'
    name = Path(path).stem
    if name.startswith('weightformer_t_'):  # the strategy-space variants of Tables 2 and 6
        ids = student.backbone.dynamic_ids
        expected = {'static': set(), 'dynamic-17': set(range(17)), 'dynamic-14': set(range(17)) - {0, 6, 12},
                    'dynamic-11': {i for i in range(17) if i % 3}, 'dynamic-8': set(range(1, 17, 2)),
                    'dynamic-4': {1, 5, 9, 13}}.get(name[len('weightformer_t_'):-len('_in1k')], set(range(1, 17, 3)))
        assert ids == expected


@pytest.fixture(scope='module')
def folder_data(tmp_path_factory):
    """An ImageNet-style folder (train/<class>/*.jpg, val/<class>/*.jpg) of realistic image sizes, 3 classes."""
    from mmwf.datasets import write_classification
    root = tmp_path_factory.mktemp('cls_data')
    rng = np.random.default_rng(0)
    write_classification(str(root), 'train', 6, (375, 500), rng)
    write_classification(str(root), 'val', 3, (500, 375), rng)
    return root


def use_folder(cfg: Config, root: Path) -> None:
    cfg.data_preprocessor.num_classes = 3
    model = cfg.model.get('student', cfg.model)
    model.backbone.num_classes = 3
    for split, loader in (('train', cfg.train_dataloader), ('val', cfg.val_dataloader)):
        loader.dataset = dict(type='CustomDataset', data_root=str(root), data_prefix=split,
                              pipeline=loader.dataset.pipeline)
    cfg.val_evaluator.topk = (1,)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['configs/imagenet/weightformer_t_in1k.py',
                                  'configs/linear_attention/cls_deit_b_ttt_copy_distill_in1k.py'])
def test_imagenet_config_trains_and_tests_at_its_input_size(name, folder_data, tmp_path):
    """One training iteration through the config's own pipeline (224 RandomResizedCrop, RandAugment, erasing),
    batch augments (Mixup / CutMix), model and optimizer, then its test pipeline and the Accuracy metric."""
    from mmengine.dataset import pseudo_collate
    from mmengine.evaluator import Evaluator
    from mmpretrain.registry import DATASETS
    np.random.seed(0)
    cfg = Config.fromfile(str(ROOT / name))
    use_folder(cfg, folder_data)
    if cfg.model.type == 'AttentionDistiller':  # DeiT-B weights stand in for the official checkpoint
        softmax = tmp_path / 'deit_b.pth'
        torch.save(DeiT('b').state_dict(), softmax)
        cfg.model.student.backbone.init_cfg.checkpoint = str(softmax)
        cfg.model.teacher.init_cfg.checkpoint = str(softmax)
    model = build(cfg)
    model.init_weights()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    train_set = DATASETS.build(cfg.train_dataloader.dataset)
    model.train()
    data = model.data_preprocessor(pseudo_collate([train_set[0], train_set[1]]), True)
    assert data['inputs'].shape == (2, 3, 224, 224)
    assert data['data_samples'][0].gt_score.shape == (3,)  # one-hot targets mixed by Mixup / CutMix
    loss, log_vars = model.parse_losses(model(**data, mode='loss'))
    assert torch.isfinite(loss) and ('loss_distill' in log_vars) == (cfg.model.type == 'AttentionDistiller')
    optim.backward(loss)
    stem = getattr(model, 'student', model).backbone.patch_embed.proj.weight.grad
    assert stem is not None and stem.abs().sum() > 0
    optim.step()
    model.eval()
    val_set = DATASETS.build(cfg.val_dataloader.dataset)
    evaluator = Evaluator(cfg.val_evaluator)
    evaluator.dataset_meta = val_set.metainfo
    batch = pseudo_collate([val_set[i] for i in range(len(val_set))])
    with torch.no_grad():
        evaluator.process(model.val_step(batch), batch)
    assert 0 <= evaluator.evaluate(len(val_set))['accuracy/top1'] <= 100


@pytest.mark.parametrize('suffix', ['.safetensors', '.pth'])
def test_released_checkpoint_loads_with_its_head(suffix, tmp_path):
    """The Hugging Face safetensors and a cleaned training checkpoint ({'state_dict': ...}), raw release keys with
    the 1000-class head, load into the ImageNet classifier as they are; it predicts as the released classifier."""
    released = WeightFormer('t', num_classes=1000).eval()
    path = tmp_path / f'weightformer_t{suffix}'
    if suffix == '.safetensors':
        save_file(released.state_dict(), str(path))
    else:
        torch.save({'state_dict': released.state_dict(), 'meta': {}}, path)
    cfg = Config.fromfile(str(ROOT / 'configs/imagenet/weightformer_t_in1k.py'))
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=str(path))
    model = build(cfg)
    model.init_weights()
    model.eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x, mode='tensor'), released.forward_classifier(x))


@pytest.mark.parametrize('dense', ['configs/cascade_wf_t_coco.py', 'configs/upernet_wf_t_ade20k.py'])
def test_classifier_checkpoint_initialises_a_dense_backbone(dense, tmp_path):
    """mmpretrain checkpoint (backbone.* keys, head inside the backbone) -> the dense config's backbone init:
    identical backbone features."""
    cfg = Config.fromfile(str(ROOT / 'configs/imagenet/weightformer_t_in1k.py'))
    classifier = build(cfg).eval()
    path = tmp_path / 'epoch_300.pth'
    torch.save({'meta': {'epoch': 300}, 'state_dict': classifier.state_dict()}, path)
    dense_cfg = Config.fromfile(str(ROOT / dense))
    backbone_cfg = dict(dense_cfg.model.backbone, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    from mmwf.registry import MODELS
    backbone = MODELS.build(backbone_cfg)
    backbone.init_weights()
    backbone.eval()
    reference = MODELS.build(dict(backbone_cfg, init_cfg=None, num_classes=1000, out_type='featmap'))
    reference.load_state_dict(classifier.backbone.state_dict())
    x = torch.randn(1, 3, 128, 160)
    with torch.no_grad():
        for a, b in zip(backbone(x), reference.eval()(x), strict=True):
            assert_same_computation(a, b)


def test_transfer_configs_match_their_names():
    """cls_deit_b_{relu,ttt}_{random,copy,mlpcopy,fullcopy}[_distill]_in1k: 16 configs."""
    assert len(TRANSFER) == 16
    for path in TRANSFER:
        name = Path(path).stem
        op, init = name.split('_')[3:5]
        cfg = Config.fromfile(path)
        student = cfg.model.get('student', cfg.model)
        assert student.type == 'ImageClassifier' and cfg.train_cfg.max_epochs == 300
        assert student.backbone.attn_cfg.type == {'relu': 'ReLUAttention', 'ttt': 'TTTAttention'}[op]
        recipe = {'random': None, 'copy': 'copy', 'mlpcopy': 'mlp_copy', 'fullcopy': 'full_copy'}[init]
        assert (student.backbone.get('init_cfg') or {}).get('recipe') == recipe
        assert (cfg.model.type == 'AttentionDistiller') == name.endswith('_distill_in1k')
