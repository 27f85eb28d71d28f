"""Every config builds; each real config runs one training and one test iteration on tiny inputs;
parameter and FLOP counts match the dense-prediction protocol (dense_protocol.md)."""
from glob import glob
from importlib import import_module
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmengine.structures import PixelData

import mmwf  # noqa: F401
from mmwf.analysis import count_flops, released_order
from mmwf.utils import adapt_to_device

ROOT = Path(__file__).resolve().parents[2]
REAL = sorted(glob(str(ROOT / 'configs/*.py')))
DEMO = sorted(glob(str(ROOT / 'configs/demo/*.py')))
LINEAR = sorted(glob(str(ROOT / 'configs/linear_attention/*.py')))


def task_model(cfg_or_model):
    """The detector / segmentor, inside an AttentionDistiller or not."""
    if isinstance(cfg_or_model, torch.nn.Module):
        return getattr(cfg_or_model, 'student', cfg_or_model)
    return cfg_or_model.get('student', cfg_or_model)


def build(path, tiny=None):
    cfg = Config.fromfile(path)
    adapt_to_device(cfg)  # CPU: AMP -> fp32, SyncBN -> BN
    if tiny:
        task = task_model(cfg.model)
        if cfg.default_scope == 'mmdet':
            if task.data_preprocessor.get('batch_augments'):
                task.data_preprocessor.batch_augments[0].size = (tiny, tiny)
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


@pytest.mark.parametrize('path', REAL + DEMO, ids=lambda p: Path(p).stem)
def test_config_builds(path):
    cfg, model = build(path)
    assert type(task_model(model).backbone).__name__ == task_model(cfg.model).backbone.type
    assert cfg.custom_imports == dict(imports=['mmwf'], allow_failed_imports=False)


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


# one representative per task, operator and distillation; test_linear_attention_configs_match_their_names
# checks every one of the 32
LINEAR_STEP = ['mask_rcnn_deit_b_relu_copy_distill_coco', 'upernet_deit_b_ttt_fullcopy_ade20k']


@pytest.mark.parametrize('path', REAL + [str(ROOT / f'configs/linear_attention/{n}.py') for n in LINEAR_STEP],
                         ids=lambda p: Path(p).stem)
def test_one_train_and_test_iteration(path):
    cfg, model = build(path, tiny=128)
    batch = det_batch if cfg.default_scope == 'mmdet' else seg_batch
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    model.train()
    backbone = task_model(model).backbone
    before = backbone.blocks[0].norm2.weight.detach().clone()
    losses = model(**batch(model, 128, True), mode='loss')
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss)
    assert ('loss_distill' in log_vars) == ('distill' in Path(path).stem)
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


@pytest.mark.parametrize('path', LINEAR, ids=lambda p: Path(p).stem)
def test_linear_attention_configs_match_their_names(path):
    """{mask_rcnn,upernet}_deit_b_{relu,ttt}_{random,copy,mlpcopy,fullcopy}[_distill]_{coco,ade20k}."""
    name = Path(path).stem
    cfg = Config.fromfile(path)
    head = name.split('_deit_b_')[0]
    op, init = name.split('_deit_b_')[1].split('_')[:2]
    student = task_model(cfg.model)
    backbone = student.backbone
    assert backbone.type == 'DeiT' and backbone.arch == 'b'
    assert backbone.attn_cfg.type == {'relu': 'ReLUAttention', 'ttt': 'TTTAttention'}[op]
    assert backbone.with_cls_token == (op == 'relu')
    recipe = {'random': None, 'copy': 'copy', 'mlpcopy': 'mlp_copy', 'fullcopy': 'full_copy'}[init]
    if recipe is None:
        assert backbone.init_cfg is None
    else:
        assert backbone.init_cfg == dict(type='SoftmaxTransfer', recipe=recipe,
                                         checkpoint='checkpoints/deit_base_patch16_224-b5f2ef4d.pth')
    if name.endswith(('_distill_coco', '_distill_ade20k')):
        assert cfg.model.type == 'AttentionDistiller' and cfg.model.loss_weight == 50.0
        teacher = cfg.model.teacher  # softmax attention: DeiT's default attn_cfg
        assert teacher.type == 'DeiT' and teacher.arch == 'b' and 'attn_cfg' not in teacher
        assert teacher.init_cfg.type == 'Pretrained'
    else:
        assert 'student' not in cfg.model
    if head == 'mask_rcnn':
        assert student.type == 'MaskRCNN' and cfg.train_cfg.max_epochs == 12
    else:
        assert student.type == 'EncoderDecoder' and cfg.train_cfg.max_iters == 160000


class Features(torch.nn.Module):
    def __init__(self, model, whole):
        super().__init__()
        self.model, self.whole = model, whole

    def forward(self, x):
        feats = self.model.extract_feat(x)
        return self.model.decode_head(feats) if self.whole else feats


# dense_protocol.md: params, backbone (+ neck) and total GFLOPs at 512 x 512; paper numbers in Table 5
# (DeiT params are 0.98M below Vim's dump, which keeps an unused 1000-class head and a 64 x 64 position table)
UPERNET = {'upernet_wf_t_ade20k': (12.08, 6.8, 37.4), 'upernet_wf_s_ade20k': (46.83, 26.7, 148.2),
           'upernet_deit_t_ade20k': (11.66 - 0.98, 11.0, 42.0), 'upernet_deit_s_ade20k': (43.0 - 1.6, 35.0, 157.0)}


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(UPERNET))
def test_upernet_counts_match_protocol(name):
    _, model = build(str(ROOT / f'configs/{name}.py'))
    model.eval()
    params, backbone, total = UPERNET[name]
    x = torch.randn(1, 3, 512, 512)
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(params, rel=0.05)
    with released_order(model):  # the paper counts the released evaluation order
        assert count_flops(Features(model, False), x) / 1e9 == pytest.approx(backbone, rel=0.05)
        assert count_flops(Features(model, True), x) / 1e9 == pytest.approx(total, rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize('name,backbone', [('cascade_wf_t_coco', 77.0), ('cascade_deit_t_coco', 106.0)])
def test_cascade_backbone_counts_match_protocol(name, backbone):
    _, model = build(str(ROOT / f'configs/{name}.py'))
    model.eval()
    with released_order(model):
        flops = count_flops(Features(model, False), torch.randn(1, 3, 1024, 1024))
    assert flops / 1e9 == pytest.approx(backbone, rel=0.05)
