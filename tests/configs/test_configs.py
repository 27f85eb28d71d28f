"""Every config builds; each real config runs one training and one test iteration on tiny inputs;
parameter and FLOP counts and the recipe settings match the dense-prediction protocol (docs/protocol.md)."""
import json
import re
from glob import glob
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmengine.structures import PixelData

import mmwf  # noqa: F401
from mmwf.configs import follow_image_size
from mmwf.utils import adapt_to_device

ROOT = Path(__file__).resolve().parents[2]
REAL = sorted(glob(str(ROOT / 'configs/*.py')))
DEMO = sorted(p for p in glob(str(ROOT / 'configs/demo/*.py')) if not p.endswith('_gen_demo.py'))  # dense, cls
VARIANTS = sorted(glob(str(ROOT / 'configs/whole_image/*.py')))
LINEAR = sorted(glob(str(ROOT / 'configs/linear_attention/*.py')))
DENSE_LINEAR = [p for p in LINEAR if not Path(p).name.startswith('cls_')]  # classification: test_imagenet_configs


def task_model(cfg_or_model):
    """The detector / segmentor, inside an AttentionDistiller or not."""
    if isinstance(cfg_or_model, torch.nn.Module):
        return getattr(cfg_or_model, 'student', cfg_or_model)
    return cfg_or_model.get('student', cfg_or_model)


def build(path, tiny=None):
    """The config's model; ``tiny``: for images of that side (the config's own rule where it declares one, its
    ``image_size``: else Cascade's 1024 pad would stay), with proposal and RoI counts to match (a detector keeps its
    thousands of proposals and 512 RoIs a stage, which cost the CPU seconds and test nothing more)."""
    cfg = Config.fromfile(path)
    adapt_to_device(cfg)  # CPU: AMP -> fp32, SyncBN -> BN
    if tiny and cfg.get('image_size_fields'):
        cfg.image_size = tiny
        follow_image_size(cfg)
    if tiny:
        task = task_model(cfg.model)
        if cfg.default_scope == 'mmdet':
            if task.data_preprocessor.get('batch_augments'):
                task.data_preprocessor.batch_augments[0].size = (tiny, tiny)
            task.train_cfg.rpn_proposal.update(nms_pre=200, max_per_img=100)
            rcnn = task.train_cfg.rcnn
            for stage in rcnn if isinstance(rcnn, list) else [rcnn]:
                stage.sampler.num = 64
            task.test_cfg.rpn.update(nms_pre=200, max_per_img=100)
            task.test_cfg.rcnn.max_per_img = 20
        else:
            task.data_preprocessor.size = (tiny, tiny)
            task.test_cfg = dict(mode='slide', crop_size=(tiny, tiny), stride=(tiny * 2 // 3,) * 2)
    init_default_scope(cfg.default_scope)
    registry = import_module(f'{cfg.default_scope}.registry').MODELS
    return cfg, registry.build(cfg.model)


def test_the_six_paper_configs_exist():
    names = {Path(p).stem for p in REAL}
    assert names == {'cascade_wf_t_coco', 'cascade_deit_t_coco', 'upernet_wf_t_ade20k', 'upernet_wf_s_ade20k',
                     'upernet_deit_t_ade20k', 'upernet_deit_s_ade20k'}


@pytest.mark.parametrize('path', REAL + DEMO + VARIANTS, ids=lambda p: Path(p).stem)
def test_config_builds(path):
    cfg, model = build(path)
    assert type(task_model(model).backbone).__name__ == task_model(cfg.model).backbone.type
    cascade = task_model(cfg.model).get('roi_head', {}).get('type') == 'ViTDetCascadeRoIHead'
    assert cfg.custom_imports == dict(imports=['mmwf'] + ['mmwf.models.roi_heads'] * cascade,
                                      allow_failed_imports=False)


OTHERS = sorted(glob(str(ROOT / 'configs/imagenet/*.py')) + glob(str(ROOT / 'configs/generation/*.py')) +
                glob(str(ROOT / 'configs/demo/*_gen_demo.py')))


@pytest.mark.parametrize('path', REAL + DEMO + LINEAR + VARIANTS + OTHERS, ids=lambda p: Path(p).stem)
def test_every_config_runs_with_mmwfs_hooks_under_any_runner(path):
    """The checks are hooks (so FlexibleRunner and other projects' tools keep them), not a runner of ours."""
    cfg = Config.fromfile(path)
    mmwf_hooks = Config.fromfile(str(ROOT / 'configs/_base_/mmwf_runtime.py')).mmwf_hooks
    # (a hook that replaces one of mmdet's or mmpretrain's default hooks keeps that base's `_scope_` tag)
    assert all({k: v for k, v in (cfg.default_hooks.get(name) or {}).items() if k != '_scope_'} == hook
               for name, hook in mmwf_hooks.items()), cfg.default_hooks
    # mmengine's runners (FSDP: FlexibleRunner); where the image size has fields that follow it, mmengine's Runner
    # that first applies it (for other projects' tools; the refusal of an unfollowed size is a hook, as the checks)
    if cfg.get('image_size_fields'):
        assert cfg.runner_type == 'ImageSizeRunner'
    else:
        assert cfg.get('runner_type') in (None, 'FlexibleRunner')
    # the several-GPU recipe of its reference (docs/protocol.md): per-rank seed, TF32 switch, reference batch
    assert {cfg.default_hooks.world_size.type, cfg.default_hooks.tf32.type} == {'WorldSizeHook', 'TF32Hook'}
    assert cfg.auto_scale_lr.base_batch_size > 0 and not cfg.get('randomness', {}).get('diff_rank_seed')
    if '/generation/' not in path and '_gen_demo' not in path:
        assert dict(type='NonFiniteLossHook') in cfg.custom_hooks


def det_batch(model, size, train):
    from mmdet.testing import demo_mm_inputs
    packed = demo_mm_inputs(batch_size=2, image_shapes=[(3, size, size - 32), (3, size - 16, size)],
                            num_items=[3, 2], num_classes=80, with_mask=True)
    return model.data_preprocessor(packed, train)


def seg_batch(model, size, train):
    from mmseg.structures import SegDataSample
    samples = []
    for h, w in ((size, size - 32),) * 2:  # mmseg's test-time batching needs one size
        s = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, h, w)))
        samples.append(s)
    images = [torch.randint(0, 255, (3, *s.img_shape), dtype=torch.uint8) for s in samples]
    return model.data_preprocessor(dict(inputs=images, data_samples=samples), train)


# one representative per task and operator; test_linear_attention_configs_match_their_names checks every one of the 34
LINEAR_STEP = ['mask_rcnn_deit_b_relu_copy_distill_coco', 'upernet_deit_b_ttt_fullcopy_ade20k']


@pytest.mark.parametrize('path', [str(ROOT / f'configs/linear_attention/{n}.py') for n in LINEAR_STEP],
                         ids=lambda p: Path(p).stem)
@pytest.mark.slow
def test_one_train_and_test_iteration(path):
    cfg, model = build(path, tiny=128)
    batch = det_batch if cfg.default_scope == 'mmdet' else seg_batch
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    model.train()
    backbone = task_model(model).backbone
    before = backbone.blocks[0].norm2.weight.detach().clone()
    losses = model(**batch(model, 128, True), mode='loss')
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss) and 'loss_distill' not in log_vars  # distilled at the ImageNet stage
    optim.update_params(loss)
    assert not torch.equal(before, backbone.blocks[0].norm2.weight)
    model.eval()
    with torch.no_grad():
        results = model(**batch(model, 128, False), mode='predict')
    assert len(results) == 2
    if cfg.default_scope == 'mmdet':
        assert 'masks' in results[0].pred_instances
    else:
        assert results[0].pred_sem_seg.data.shape[-2:] == results[0].ori_shape


@pytest.fixture(scope='module')
def paper_data(tmp_path_factory):
    """COCO-format and ADE20K-layout data of realistic image sizes: 2 training and 2 validation images each."""
    from mmwf.datasets import write_ade, write_coco
    root = tmp_path_factory.mktemp('paper_data')
    rng = np.random.default_rng(0)
    write_coco(str(root / 'coco'), 'train', 2, (480, 640), rng)
    write_coco(str(root / 'coco'), 'val', 2, (640, 427), rng)
    from mmdet.datasets import CocoDataset
    for ann in (root / 'coco/annotations').glob('*.json'):  # COCO's 80 categories; the shapes are the first 3
        coco = json.loads(ann.read_text())
        coco['categories'] = [dict(id=i + 1, name=n) for i, n in enumerate(CocoDataset.METAINFO['classes'])]
        ann.write_text(json.dumps(coco))
    write_ade(str(root / 'ade'), 'training', 2, (512, 683), rng)
    write_ade(str(root / 'ade'), 'validation', 2, (512, 683), rng)
    return root


def use_paper_data(cfg: Config, root: Path) -> None:
    """Point the config's datasets and evaluator at :func:`paper_data`; everything else stays as configured."""
    if cfg.default_scope == 'mmdet':
        for split, loader in (('train', cfg.train_dataloader), ('val', cfg.val_dataloader)):
            loader.dataset.update(data_root=str(root / 'coco') + '/', ann_file=f'annotations/instances_{split}.json',
                                  data_prefix=dict(img=f'{split}/'))
        cfg.val_evaluator.ann_file = str(root / 'coco/annotations/instances_val.json')
        cfg.model.test_cfg.rcnn.score_thr = 0.0  # random heads score every class near 1/81: keep detections
    else:
        for loader in (cfg.train_dataloader, cfg.val_dataloader):
            loader.dataset.data_root = str(root / 'ade')


# one Cascade (the six configs share two bases) and the two tiny UperNets at full size
FULL_SIZE = [str(ROOT / f'configs/{n}.py')
             for n in ('cascade_wf_t_coco', 'upernet_wf_t_ade20k', 'upernet_deit_t_ade20k')]


@pytest.mark.slow
@pytest.mark.parametrize('path', FULL_SIZE, ids=lambda p: Path(p).stem)
def test_paper_config_trains_and_tests_at_its_input_size(path, paper_data):
    """One training iteration through the config's own pipeline, batch preprocessing, model and optimizer at the
    real input size (LSJ 1024 x 1024 / 512 x 512 crops), then the test pipeline and the config's metric."""
    from mmengine.dataset import pseudo_collate
    from mmengine.evaluator import Evaluator
    np.random.seed(0)  # the data pipelines draw from numpy's global generator
    cfg = Config.fromfile(path)
    adapt_to_device(cfg)
    use_paper_data(cfg, paper_data)
    if cfg.default_scope == 'mmdet':  # the test half scores 100 proposals and keeps 20 boxes: the config's 1000 and
        # 100 cost the CPU its three box heads and the mask head, 9 of the test's 40 s, and run the same code
        cfg.model.test_cfg.rpn.max_per_img, cfg.model.test_cfg.rcnn.max_per_img = 100, 20
    init_default_scope(cfg.default_scope)
    registry = import_module(f'{cfg.default_scope}.registry')
    model = registry.MODELS.build(cfg.model)
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    train_set = registry.DATASETS.build(cfg.train_dataloader.dataset)
    model.train()
    # one 1024 x 1024 image for the detector; two crops for UperNet (batch norm after the 1 x 1 pyramid pooling)
    samples = 1 if cfg.default_scope == 'mmdet' else 2
    data = model.data_preprocessor(pseudo_collate([train_set[i] for i in range(samples)]), True)
    size = (1024, 1024) if cfg.default_scope == 'mmdet' else (512, 512)
    assert data['inputs'].shape == (samples, 3, *size)
    loss, log_vars = model.parse_losses(model(**data, mode='loss'))
    assert all(torch.isfinite(torch.as_tensor(v).detach()).all() for v in log_vars.values()), log_vars
    optim.backward(loss)
    stem = model.backbone.patch_embed.proj.weight.grad
    assert stem is not None and stem.abs().sum() > 0 and torch.isfinite(stem).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    optim.step()

    model.eval()
    val_set = registry.DATASETS.build(cfg.val_dataloader.dataset)
    evaluator = Evaluator(cfg.val_evaluator)
    evaluator.dataset_meta = val_set.metainfo
    batch = pseudo_collate([val_set[0]])  # one image through the test pipeline, the model and the metric
    with torch.no_grad():  # as mmengine's ValLoop
        evaluator.process(model.val_step(batch), batch)
    metrics = evaluator.evaluate(1)
    if cfg.default_scope == 'mmdet':
        assert {'coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP'} <= metrics.keys()
    else:
        assert {'mIoU', 'aAcc'} <= metrics.keys() and 0 <= metrics['aAcc'] <= 100


def cfg_of(name: str) -> Config:
    return Config.fromfile(str(ROOT / f'configs/{name}.py'))


@pytest.mark.parametrize('name', ['cascade_wf_t_coco', 'cascade_deit_t_coco'])
def test_cascade_configs_follow_vitdet(name):
    """The rows of docs/protocol.md that a config value decides (detectron2 projects/ViTDet)."""
    cfg = cfg_of(name)
    model = cfg.model
    assert model.backbone.final_norm is False and model.backbone.drop_path_rate == 0.1
    assert model.data_preprocessor.pad_size_divisor == 1024 and 'batch_augments' not in model.data_preprocessor
    assert [t.type for t in cfg.test_pipeline] == ['LoadImageFromFile', 'Resize', 'LoadAnnotations', 'PackDetInputs']
    assert cfg.train_pipeline[1].poly2mask is False
    assert model.rpn_head.num_convs == 2 and model.rpn_head.loss_bbox == dict(type='L1Loss', loss_weight=1.0)
    assert model.train_cfg.rpn.allowed_border == -1 and model.train_cfg.rpn.assigner.min_pos_iou == 0.0
    assert model.train_cfg.rpn_proposal.nms_pre == 2000 and model.train_cfg.rpn_proposal.max_per_img == 1000
    assert model.test_cfg.rpn.nms_pre == 1000 and model.test_cfg.rpn.max_per_img == 1000
    roi = model.roi_head
    assert roi.type == 'ViTDetCascadeRoIHead' and roi.stage_loss_weights == [1.0, 1.0, 1.0]
    assert [h.loss_bbox.type for h in roi.bbox_head] == ['L1Loss'] * 3
    assert all(h.reg_class_agnostic and h.norm_cfg.eps == 1e-6 for h in roi.bbox_head)
    assert isinstance(roi.mask_head, dict) and roi.mask_head.norm_cfg.type == 'LayerNorm2d'
    assert [r.sampler.type for r in model.train_cfg.rcnn] == ['RandomSampler', 'PseudoSampler', 'PseudoSampler']
    sampler = model.train_cfg.rcnn[0].sampler
    assert (sampler.num, sampler.pos_fraction, sampler.add_gt_as_proposals) == (512, 0.25, True)
    weights = [(10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15)]  # detectron2's Box2BoxTransform weights
    assert [h.bbox_coder.target_stds for h in roi.bbox_head] == [[1 / w for w in ws] for ws in weights]
    assert (model.test_cfg.rcnn.score_thr, model.test_cfg.rcnn.nms.iou_threshold,
            model.test_cfg.rcnn.max_per_img) == (0.05, 0.5, 100)
    assert [t.type for t in cfg.train_pipeline[2:5]] == ['RandomFlip', 'RandomResize', 'RandomCrop']
    assert cfg.train_pipeline[3].ratio_range == (0.1, 2.0) and cfg.train_pipeline[4].recompute_bbox
    assert (cfg.train_pipeline[3].backend, cfg.train_pipeline[3].interpolation) == ('pillow', 'bilinear')
    assert cfg.train_pipeline[5].keep_empty is False and cfg.train_pipeline[5].min_gt_bbox_wh == (1e-5, 1e-5)
    assert cfg.train_dataloader.dataset.filter_cfg == dict(filter_empty_gt=True)
    assert cfg.train_dataloader.batch_size * 16 == 64
    assert [r.assigner.pos_iou_thr for r in model.train_cfg.rcnn] == [0.5, 0.6, 0.7]
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper' and 'clip_grad' not in cfg.optim_wrapper
    # ViTDet's AdamW, by torch's fused kernel (the same update)
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', fused=True, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1)
    paramwise = cfg.optim_wrapper.paramwise_cfg
    assert paramwise.no_decay == 'vitdet'
    # ViTDet's 0.7 for 12 blocks, depth-matched (num_layers from the backbone: 17 for WF-T, 12 for DeiT-T)
    assert 'num_layers' not in paramwise and (paramwise.decay_rate, paramwise.reference_depth) == (0.7, 12)


@pytest.mark.parametrize('name', ['upernet_wf_t_ade20k', 'upernet_wf_s_ade20k', 'upernet_deit_t_ade20k',
                                  'upernet_deit_s_ade20k'])
def test_upernet_configs_follow_vim(name):
    """The rows of docs/protocol.md that a config value decides (Vim seg/, mmseg 0.x)."""
    cfg = cfg_of(name)
    assert cfg.optim_wrapper.type == 'OptimWrapper'  # fp32 (use_fp16=False)
    # Vim's AdamW, by torch's fused kernel (the same update)
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', fused=True, lr=1e-4, betas=(0.9, 0.999),
                                               weight_decay=0.05)
    paramwise = cfg.optim_wrapper.paramwise_cfg
    assert paramwise.no_decay == 'beit'
    assert 'num_layers' not in paramwise and (paramwise.decay_rate, paramwise.reference_depth) == (0.92, 12)
    assert cfg.train_cfg.val_interval == 1000 and cfg.train_cfg.max_iters == 60000
    assert cfg.default_hooks.checkpoint.save_best == 'mIoU' and cfg.default_hooks.checkpoint.interval == 1000
    assert cfg.train_dataloader.batch_size == 8  # x 4 GPUs
    assert cfg.model.backbone.final_norm is False
    assert cfg.model.backbone.out_indices == ((4, 8, 12, 16) if '_wf_' in name else (3, 5, 7, 11))
    assert cfg.model.backbone.get('drop_path_rate', 0.0) == (0.1 if '_wf_' in name else 0.0)
    assert cfg.model.test_cfg == dict(mode='slide', crop_size=(512, 512), stride=(341, 341))
    dim = cfg.model.neck.embed_dim
    assert cfg.model.decode_head.channels == dim and cfg.model.auxiliary_head.channels == 256


def lr_curve(cfg: Config, iters: list[int]) -> list[float]:
    """The config's lr multiplier at ``iters``, from mmengine's schedulers stepped once per iteration."""
    from mmengine.registry import PARAM_SCHEDULERS
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedulers = [PARAM_SCHEDULERS.build(dict(s, optimizer=optimizer)) for s in cfg.param_scheduler]
    out = []
    for it in range(max(iters) + 1):
        if it in iters:
            out.append(optimizer.param_groups[0]['lr'])
        for scheduler in schedulers:
            scheduler.step()
    return out


def test_upernet_lr_is_mmcv_poly_with_linear_warmup():
    """mmcv 1.x (Vim): lr = (1 - t / 60000) x (1e-6 + (1 - 1e-6) t / 1500 while t < 1500)."""
    iters = [0, 1, 750, 1499, 1500, 1501, 30000, 59999]
    expected = [(1 - t / 60000) * (1e-6 + (1 - 1e-6) * t / 1500 if t < 1500 else 1.0) for t in iters]
    assert lr_curve(cfg_of('upernet_wf_t_ade20k'), iters) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_cascade_lr_is_detectron2_warmup_multistep():
    """detectron2 WarmupParamScheduler(MultiStep([1, 0.1, 0.01], [163889, 177546]), 250 iterations from 0.001)."""
    iters = [0, 125, 249, 250, 163888, 163889, 177545, 177546, 184374]
    expected = [(0.001 + 0.999 * t / 250 if t < 250 else 1.0) * (1.0 if t < 163889 else 0.1 if t < 177546 else 0.01)
                for t in iters]
    assert lr_curve(cfg_of('cascade_wf_t_coco'), iters) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize('path', [p for p in DENSE_LINEAR if 'mask_rcnn' in p][:2], ids=lambda p: Path(p).stem)
def test_linear_attention_mask_rcnn_has_l1_losses_and_1000_proposals(path):
    model = Config.fromfile(path).model
    model = model.get('student', model)
    assert model.rpn_head.loss_bbox.type == 'L1Loss' and model.roi_head.bbox_head.loss_bbox.type == 'L1Loss'
    assert model.train_cfg.rpn_proposal.max_per_img == 1000 and model.train_cfg.rpn.allowed_border == -1


@pytest.mark.parametrize('path', DENSE_LINEAR, ids=lambda p: Path(p).stem)
def test_linear_attention_configs_match_their_names(path):
    """{mask_rcnn,upernet}_deit_b_{relu,ttt}_{random,copy,mlpcopy,fullcopy}[_distill]_{coco,ade20k}: ViT-Adapter's
    plain-ViT baseline (docs/protocol.md) initialised from the ImageNet-1K stage run of the same name; and the softmax
    DeiT-B target of each task from the official weights."""
    name = Path(path).stem
    cfg = Config.fromfile(path)
    head, rest = name.split('_deit_b_')
    op, init = rest.split('_')[:2]
    backbone = cfg.model.backbone
    assert 'student' not in cfg.model  # distillation belongs to the ImageNet stage
    assert backbone.type == 'DeiT' and backbone.arch == 'b' and backbone.layer_scale
    assert backbone.out_indices == (2, 5, 8, 11) and not backbone.with_cls_token and not backbone.final_norm
    attn = backbone.get('attn_cfg', dict(type='SoftmaxAttention'))['type']
    assert attn == {'relu': 'ReLUAttention', 'ttt': 'TTTAttention', 'softmax': 'SoftmaxAttention'}[op]
    assert backbone.init_cfg.type == 'Pretrained'
    if op == 'softmax':
        assert backbone.init_cfg.checkpoint == 'checkpoints/deit_base_patch16_224-b5f2ef4d.pth'
    else:
        stage = f'cls_deit_b_{op}_{init}' + ('_distill' if '_distill_' in name else '') + '_in1k'
        assert backbone.init_cfg.checkpoint == f'work_dirs/{stage}/epoch_300.pth'
        assert (ROOT / 'configs/linear_attention' / f'{stage}.py').is_file()
    pyramid = cfg.model.neck[0] if head == 'mask_rcnn' else cfg.model.neck
    assert pyramid.type == 'ViTBaselinePyramid'
    if head == 'mask_rcnn':
        assert cfg.model.type == 'MaskRCNN' and cfg.train_cfg.max_epochs == 12
        assert backbone.window_size == 14 and backbone.window_block_indexes == (0, 1, 3, 4, 6, 7, 9, 10)
        assert cfg.model.neck[1].type == 'FPN' and cfg.optim_wrapper.type == 'OptimWrapper'
        assert 'clip_grad' not in cfg.optim_wrapper and cfg.optim_wrapper.optimizer.lr == 1e-4
    else:
        assert cfg.model.type == 'EncoderDecoder' and cfg.train_cfg.max_iters == 160000
        assert not backbone.get('window_block_indexes') and cfg.model.decode_head.channels == 512
        assert cfg.optim_wrapper.type == 'AmpOptimWrapper' and cfg.optim_wrapper.optimizer.lr == 6e-5
        assert cfg.optim_wrapper.paramwise_cfg.decay_rate == 0.95


def test_dense_backbone_loads_an_imagenet_stage_distiller_checkpoint(tmp_path):
    """The chain of the transfer study: an ImageNet-stage AttentionDistiller checkpoint (student.backbone.* beside
    teacher.*) initialises the dense DeiT strictly: its class token and head dropped, layer scale at 1."""
    from mmpretrain.registry import MODELS as CLS_MODELS
    cls_cfg = Config.fromfile(str(ROOT / 'configs/linear_attention/cls_deit_b_ttt_copy_distill_in1k.py'))
    arch = dict(embed_dims=64, depth=4, num_heads=2, mlp_ratio=2)
    student = dict(cls_cfg.model.student, backbone=dict(cls_cfg.model.student.backbone, arch=arch, init_cfg=None))
    init_default_scope('mmpretrain')
    distiller = CLS_MODELS.build(dict(cls_cfg.model, student=student, teacher=dict(
        cls_cfg.model.teacher, arch=arch, out_indices=(3,), init_cfg=None)))
    torch.save({'state_dict': distiller.state_dict(), 'meta': {}}, tmp_path / 'epoch_300.pth')
    dense = Config.fromfile(str(ROOT / 'configs/linear_attention/upernet_deit_b_ttt_copy_distill_ade20k.py'))
    from mmwf.models.backbones import DeiT
    kwargs = {k: v for k, v in dense.model.backbone.items() if k != 'type'}
    backbone = DeiT(**dict(kwargs, arch=arch, out_indices=(0, 1, 2, 3), init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'epoch_300.pth'))))
    backbone.init_weights()
    trained = distiller.student.backbone.state_dict()
    for k, v in backbone.state_dict().items():
        assert torch.equal(v, torch.ones_like(v)) if '.gamma' in k else torch.equal(v, trained[k]), k


SIZED = {'cascade_wf_t_coco': 'det', 'cascade_deit_t_coco': 'det', 'upernet_wf_t_ade20k': 'seg',
         'upernet_deit_s_ade20k': 'seg', 'cascade_wf_t_demo': 'det', 'upernet_wf_t_demo': 'seg-demo',
         'cascade_deit_ttt_distill_demo': 'det', 'upernet_deit_relu_distill_demo': 'seg-demo'}


def sized_fields(cfg: Config) -> dict[str, object]:
    """Every value a detection / segmentation config derives from its image size, found by walking the config
    (independently of its declaration): the pad, the preprocessor's size, the sliding test's crop and stride, and each
    pipeline's resize scale and crop."""
    found = {}

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ('pad_size_divisor', 'size', 'crop_size', 'stride', 'scale') and not isinstance(value, dict):
                    found[f'{path}.{key}'.lstrip('.')] = value
                walk(value, f'{path}.{key}')
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f'{path}.{i}')
    walk(cfg.to_dict(), '')
    return {k: v for k, v in found.items() if not k.replace('model.student.', 'model.').startswith((
        'image_size_fields', 'model.rpn_head', 'model.roi_head', 'model.neck'))}


@pytest.mark.parametrize('name', SIZED)
def test_one_line_sets_the_image_size_and_all_that_follows_it(name):
    """``--cfg-options image_size=S`` (and a child config's ``image_size``): every field derived from the size
    follows it, by the rule of the config's family (detection: pad, resize and crop S; segmentation: crop S, resize
    (4 S, S), sliding stride 2/3 S; the demo: resize S), and no field keeps the old size."""
    from mmwf.configs import config_file
    cfg = Config.fromfile(str(config_file(name)))
    cfg.merge_from_dict({'image_size': 96})
    assert follow_image_size(cfg)
    expected = {'det': {'pad_size_divisor': 96, 'scale': (96, 96), 'crop_size': (96, 96)},
                'seg': {'size': (96, 96), 'crop_size': (96, 96), 'stride': (64, 64), 'scale': (384, 96)},
                'seg-demo': {'size': (96, 96), 'crop_size': (96, 96), 'scale': (96, 96)}}[SIZED[name]]
    fields = sized_fields(cfg)
    assert len(fields) >= 5
    for path, value in fields.items():
        assert value == expected[path.rsplit('.', 1)[-1]], path
    assert cfg.image_size == (96, 96)


def test_a_two_line_child_config_is_a_small_recipe(tmp_path):
    """``_base_`` and ``image_size``: what mmwf's tools load is the paper's config at that size."""
    from mmwf.configs import config_file
    child = tmp_path / 'small.py'
    child.write_text(f"_base_ = '{config_file('upernet_wf_t_ade20k')}'\nimage_size = (256, 256)\n")
    cfg = Config.fromfile(str(child))
    follow_image_size(cfg)
    reference = Config.fromfile(str(config_file('upernet_wf_t_ade20k')))
    reference.merge_from_dict({'image_size': 256})
    follow_image_size(reference)
    assert cfg.to_dict() == reference.to_dict()
    assert cfg.model.test_cfg.stride == (170, 170) and cfg.train_dataloader.dataset.pipeline[2].scale == (1024, 256)


@pytest.mark.parametrize('name', SIZED)
def test_a_size_no_tool_followed_is_refused_before_the_first_batch(name):
    """Every family names the runner that follows the size for another project's tools; a tool that neither follows
    it nor builds that runner (a config naming FlexibleRunner, run by mmdet's train.py) is stopped by the runtime
    hook every config has, naming the fix, before its run trains at the old size."""
    from types import SimpleNamespace

    from mmwf.configs import config_file
    from mmwf.engine.hooks import DatasetCheckHook
    cfg = Config.fromfile(str(config_file(name)))
    assert cfg.runner_type == 'ImageSizeRunner' and cfg.default_hooks.dataset_check.type == 'DatasetCheckHook'
    cfg.merge_from_dict({'image_size': 96})
    written = tuple(cfg.image_size_fields.written_for)
    with pytest.raises(ValueError, match=re.escape(f"image_size=(96, 96), but the crops, pads and test scales of "
                                                   f"image_size_fields still hold {written}")):
        DatasetCheckHook().before_run(SimpleNamespace(cfg=cfg))
    follow_image_size(cfg)
    with pytest.raises(AttributeError, match="'model'"):  # past the size check: the stand-in runner has no model
        DatasetCheckHook().before_run(SimpleNamespace(cfg=cfg))


@pytest.mark.parametrize('name', ['wf_dit_s_2_in256', 'dit_gen_demo'])
def test_an_image_size_option_that_nothing_follows_is_refused(name, tmp_path):
    """The generation configs declare no image_size_fields (their image size sets the latent grid, the VAE's and
    the evaluation's; a size of its own is a config of its own): ``--cfg-options image_size=S`` would change nothing
    the run uses, so mmwf's tools refuse it before any work, naming the configs that follow it."""
    from mmwf.configs import config_file
    from tests.tool_runner import run_tool
    res = run_tool('tools/train.py', config_file(name), '--cfg-options', 'image_size=96', '--work-dir', tmp_path,
                   ok=False)
    assert re.search(rf'--cfg-options image_size=96: nothing in .*{name}.py follows it .*\(the Cascade and UperNet '
                     'configs, the ImageNet classifiers and their demos', res.stderr), res.stderr[-1500:]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize('name', ['weightformer_t_in1k', 'weightformer_b_in1k', 'deit_s_relu_in1k',
                                  'cls_deit_b_ttt_copy_distill_in1k', 'weightformer_t_cls_demo'])
def test_classification_configs_follow_their_image_size(name):
    """Every pipeline of a classification config follows its image size, as its recipe was written: the training
    crop is the size, the test resize 256 / 224 of it (rounded down) and the test crop the size; the configs that
    rewrite their pipelines (WF-B at 448, the demo at 128) say that those hold their size."""
    from mmwf.configs import config_file
    for size in (96, 384, 300):
        cfg = Config.fromfile(str(config_file(name)))
        assert follow_image_size(cfg) == []  # as written, nothing to change
        cfg.merge_from_dict({'image_size': size})
        follow_image_size(cfg)
        pipelines = [cfg.train_pipeline, cfg.test_pipeline, cfg.train_dataloader.dataset.pipeline,
                     cfg.val_dataloader.dataset.pipeline, cfg.test_dataloader.dataset.pipeline]
        values = {(t.type, str(t.get('scale', t.get('crop_size')))) for p in pipelines for t in p
                  if t.type in ('RandomResizedCrop', 'Resize', 'CenterCrop')}
        resize = size * 256 // 224
        assert values == {('RandomResizedCrop', str(size)), ('Resize', str((resize, resize))),
                          ('CenterCrop', str(size))}, values
