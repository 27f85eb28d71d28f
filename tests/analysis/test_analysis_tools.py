"""Analysis: effective receptive field, dynamic strength, benchmark memory, classifier FLOPs; the tools' CLIs."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmwf.analysis import dynamic_strength, effective_receptive_field, outside_fraction
from mmwf.models.backbones import WeightFormer
from mmwf.models.layers import AdaptiveDynamicDWConv, BilateralDynamicLinear
from tests.tool_runner import run_tool
from tests.triton_device import TRITON_DEVICE, full_fp32

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(embed_dims=32, depth=2, mlp_ratio=2)


def run(*args):
    return run_tool(*args).stdout


@pytest.fixture(scope='module')
def images_dir(demo_data):
    return demo_data / 'coco' / 'val'


def test_erf_of_a_static_cnn_is_local_and_of_a_dynamic_block_global():
    """Two static blocks (3x3 depthwise convs on 16-px patches) see +-2 patches around the centre patch; with
    a dynamic block (weights predicted from the whole image) every pixel contributes."""
    images = torch.randn(2, 3, 160, 160)
    static = WeightFormer(SMALL, dynamic_blocks=[]).eval()
    dynamic = WeightFormer(SMALL, dynamic_blocks=[1]).eval()
    local = effective_receptive_field(static, images)
    wide = effective_receptive_field(dynamic, images)
    assert local.shape == (160, 160)
    assert outside_fraction(local, 48) == 0.0 and local[80, 80] > 0
    assert outside_fraction(wide, 48) > 0.01
    assert (wide[:16, :16] > 0).all()


def test_effective_updates_are_what_the_layers_add():
    x, hw = torch.randn(2, 6 * 5, 32), (6, 5)
    linear = BilateralDynamicLinear(32, 64)
    weight = linear.w + linear.effective_delta(x, hw)
    torch.testing.assert_close(linear(x, hw), x.unsqueeze(2).matmul(weight.unsqueeze(1)).squeeze(2) + linear.b,
                               rtol=1e-4, atol=1e-5)
    conv = AdaptiveDynamicDWConv(32)
    kernel = conv.w + conv.effective_delta(x, hw).unsqueeze(2)
    maps = x.transpose(1, 2).reshape(2, 32, *hw)
    ref = torch.cat([F.conv2d(maps[i:i + 1], kernel[i], conv.b, padding=1, groups=32) for i in range(2)])
    torch.testing.assert_close(conv(x, hw), ref.flatten(2).transpose(1, 2), rtol=1e-4, atol=1e-5)


def test_dynamic_strength_per_layer_and_image():
    model = WeightFormer('t').eval()
    ratios = dynamic_strength(model, torch.randn(3, 3, 64, 96), batch_size=2)
    assert list(ratios) == [f'blocks.{i}.{m}' for i in (1, 4, 7, 10, 13, 16) for m in ('dwc', 'linear1')]
    assert all(len(r) == 3 and all(v > 0 for v in r) for r in ratios.values())
    with pytest.raises(ValueError, match='no dynamic layers'):
        dynamic_strength(WeightFormer(SMALL, dynamic_blocks=[]), torch.randn(1, 3, 32, 32))


@pytest.mark.slow
def test_erf_tool_before_and_after_a_checkpoint(images_dir, tmp_path):
    torch.save(WeightFormer('t').state_dict(), tmp_path / 'wf.pth')
    out = run('tools/analysis/erf.py', 'weightformer_t', '--images', str(images_dir), '--num-images', '2', '--size',
              '64', '--checkpoint', str(tmp_path / 'wf.pth'), '--out', str(tmp_path / 'erf.png'))
    rows = [r for r in out.splitlines() if r.startswith('| random init') or r.startswith('| wf.pth')]
    assert len(rows) == 2 and 'erf: image 2/2' in out
    assert (tmp_path / 'erf.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.slow
def test_dynamic_strength_tool(images_dir, tmp_path):
    out = run('tools/analysis/dynamic_strength.py', 'configs/upernet_wf_t_ade20k.py', '--images', str(images_dir),
              '--num-images', '3', '--size', '64', '--out', str(tmp_path / 'r.png'))
    assert out.count('| blocks.') == 12 and 'all 12 dynamic layers, 3 images' in out
    assert (tmp_path / 'r.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.slow
def test_benchmark_tool_with_memory_and_plot(tmp_path):
    out = run('tools/analysis/benchmark.py', 'inference', '--sizes', '32', '--models', 'weightformer_t_static',
              'deit_tiny_patch16_224',
              '--rounds', '1', '--iters', '1', '--plot', str(tmp_path / 'bench.png'))
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith('| model |'))
    columns = [c.strip() for c in header.split('|')[1:-1]]
    rows = [dict(zip(columns, (c.strip() for c in r.split('|')[1:-1]))) for r in lines
            if r.startswith(('| weightformer_t_static', '| deit'))]
    assert len(rows) == 2 and lines[0].startswith('commit ') and 'fp32 (TF32 off), eager' in lines[1]
    for row in rows:
        peak, act = float(row['peak MB']), float(row['activations MB'])
        assert float(row['img/s']) > 0 and peak > 100 and 0 <= act <= peak
        assert float(row['FLOP ceiling'].rstrip('x')) > 0 and row['GPU busy'] == row['compile s'] == '-'
    assert (tmp_path / 'bench.png').read_bytes()[:4] == b'\x89PNG'


def test_classifier_names():
    from mmwf.analysis import classifier_config, imagenet_model_name
    assert classifier_config('deit_b_ttt') == dict(type='DeiT', arch='b', num_classes=1000,
                                                   attn_cfg=dict(type='TTTAttention'))
    assert classifier_config('weightformer_t_static') == dict(type='WeightFormer', arch='t18', num_classes=1000,
                                                              dynamic_blocks=[])
    # the names of the ImageNet configs, one each
    configs = sorted(p.stem for p in (ROOT / 'configs/imagenet').glob('*_in1k.py'))
    assert [imagenet_model_name(n.removesuffix('_in1k').replace('-', '_')) for n in configs] == configs
    assert all(classifier_config(n.removesuffix('_in1k').replace('-', '_')) for n in configs)
    for bad in ('wf-t', 'static-t', 'deit-t', 'weightformer_x', 'deit_tiny_patch16_224'):
        with pytest.raises(ValueError, match='not a classifier name'):
            classifier_config(bad)


@pytest.mark.slow
def test_workload_benchmark_compares_config_pairs(tmp_path):
    """benchmark.py workload: a training step of the UperNet pair and whole-image segmentation in both test modes,
    side by side (the modes share one code path: one training mode here). The paper's configs at 128 x 128 crops
    (sliding windows of 128, stride 85) and an image just above one crop, so that sliding takes two windows."""
    configs = []
    for name in ('upernet_wf_t_ade20k', 'upernet_deit_t_ade20k'):
        configs.append(tmp_path / f'{name}.py')
        configs[-1].write_text(f"""_base_ = '{ROOT}/configs/{name}.py'
crop_size = (128, 128)
model = dict(data_preprocessor=dict(size=crop_size), test_cfg=dict(crop_size=crop_size, stride=(85, 85)))
""")
    res = run_tool('tools/analysis/benchmark.py', 'workload', '--configs', *configs, '--rounds', '1', '--no-memory',
                   '--modes', 'train backbone+neck', '--image-sizes', '128x160')
    rows = [r for r in res.stdout.splitlines() if r.startswith('| upernet_wf_t_ade20k.py')]
    assert [r.split('|')[3].strip() for r in rows] == ['train backbone+neck', 'inference (whole)', 'inference (slide)']
    assert all(float(r.split('|')[7].strip().rstrip('x')) > 0 for r in rows)


def test_workload_refuses_a_classification_config():
    from mmwf.analysis import Workload
    with pytest.raises(ValueError, match='mmpretrain config; the workload benchmark takes mmdet / mmseg'):
        Workload(str(ROOT / 'configs/imagenet/weightformer_t_in1k.py'))


@pytest.mark.parametrize('part', ['classifier', 'backbone+pyramid'])
def test_train_step_trains(part):
    """The step the training-step benchmark times: forward, loss, backward and an AdamW step that moves the stem."""
    import torch

    from mmwf.analysis.train_step import train_step
    step, model = train_step('weightformer_t', part, 2, 64, 'cpu', amp=False)
    stem = next(model.parameters())
    before = stem.detach().clone()
    step()
    assert not torch.equal(before, stem)


# the release's model/wfm.py as the training-step benchmark reads it: a VisionTransformer class
REFERENCE_WFM = """import torch.nn as nn


class VisionTransformer(nn.Sequential):
    def __init__(self, img_size, patch_size, num_classes, embed_dim, depth):
        super().__init__(nn.Conv2d(3, embed_dim, patch_size, patch_size), nn.Flatten(2), nn.AdaptiveAvgPool1d(1),
                         nn.Flatten(1), nn.Linear(embed_dim, num_classes))
"""


def test_train_step_benchmark_takes_the_release_classifier_from_a_file(tmp_path):
    (tmp_path / 'wfm.py').write_text(REFERENCE_WFM)
    out = run('tools/analysis/benchmark.py', 'train', '--models', 'weightformer_t', 'deit_t_softmax', '--release-wfm',
              str(tmp_path / 'wfm.py'), '--batch', '2', '--size', '32', '--rounds', '1', '--iters', '1', '--device',
              'cpu')
    rows = {r.split('|')[1].strip(): r for r in out.splitlines() if r.startswith('| ')}
    assert {'weightformer_t', 'deit_t_softmax', 'weightformer_t (release)'} <= rows.keys()
    assert float(rows['weightformer_t (release)'].split('|')[2]) > 0


# a reference network file as the user gives one (a DiT_models table of constructors, forward(x, t, y))
REFERENCE_DIT = """import torch.nn as nn


class Tiny(nn.Module):
    def __init__(self, input_size=32, num_classes=1000):
        super().__init__()
        self.in_channels, self.learn_sigma = 4, True
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.y = nn.Embedding(num_classes + 1, 8)

    def forward(self, x, t, y):
        return self.conv(x) + self.y(y)[:, :, None, None]


DiT_models = {'DiT-S/2': Tiny}
"""


@pytest.mark.slow
def test_generation_benchmark_compares_wf_dit_with_dit_and_a_reference_file(tmp_path):
    (tmp_path / 'models.py').write_text(REFERENCE_DIT)
    out = run('tools/analysis/benchmark.py', 'generation', '--archs', 'S/2', '--sizes', '16', '--batch', '1',
              '--rounds', '1', '--no-memory', '--dit-models', str(tmp_path / 'models.py'))
    header = next(r for r in out.splitlines() if r.startswith('| arch'))
    assert [c.strip() for c in header.split('|')[4:9]] == ['WF-DiT s', 'DiT s', 'DiT (facebookresearch) s', 'vs DiT',
                                                           'vs DiT (facebookresearch)']
    rows = [[c.strip() for c in r.split('|')[1:-1]] for r in out.splitlines() if r.startswith('| S/2')]
    assert [r[2] for r in rows] == ['train', 'sample']
    for r in rows:
        assert float(r[3]) > 0 and float(r[4]) > 0 and float(r[5]) >= 0
        # the tiny reference (one conv) is the faster: its ratio against WF-DiT well below 1
        assert r[6].endswith('x') and float(r[7].rstrip('x')) < 0.5
    res = run_tool('tools/analysis/benchmark.py', 'generation', '--release-dit', tmp_path / 'none.py', ok=False)
    assert 'none.py: no such file' in res.stderr


@pytest.mark.slow
def test_onnx_benchmark_checks_and_times_both_exports(tmp_path):
    """Each model's static and dynamic graphs are checked against PyTorch (differences printed) and timed against
    eager PyTorch in one table, with the ratio of the two models."""
    out = run('tools/analysis/benchmark.py', 'onnx', '--models', 'weightformer_t', 'deit_t_softmax', '--sizes', '64',
              '--rounds', '1', '--work-dir', str(tmp_path))
    diffs = [float(line.rsplit('= ', 1)[1]) for line in out.splitlines() if 'largest |ONNX Runtime' in line]
    assert len(diffs) == 4 and max(diffs) < 1e-4
    assert sorted(p.name for p in tmp_path.glob('*.onnx')) == [
        f'{m}_64_{k}.onnx' for m in ('deit_t_softmax', 'weightformer_t') for k in ('dynamic', 'static')]
    rows = [[c.strip() for c in r.split('|')[1:-1]] for r in out.splitlines()
            if r.startswith(('| weightformer_t |', '| deit_t_softmax |'))]
    assert len(rows) == 2
    for _name, size, static, dynamic, eager, *ratios in rows:
        assert size == '64' and min(map(float, (static, dynamic, eager))) > 0
        assert all(r.endswith('x') and float(r[:-1]) > 0 for r in ratios)
    static = '| weightformer_t vs deit_t_softmax (ONNX Runtime, static) | 64 |'
    assert any(r.startswith(static) for r in out.splitlines())


def test_a_kernel_variant_name_sets_the_layers_choices():
    """'weightformer_t+triton' is WF-T whose depthwise convs (static ones too) and dynamic linears hold the Triton
    choices, and nothing else of it changes; a name the variant cannot apply to is refused."""
    from mmwf.analysis.models import build_classifier, classifier_config
    assert classifier_config('weightformer_t+triton') == classifier_config('weightformer_t')
    model = build_classifier('weightformer_t_dyn_linear1+triton')  # static DWConvs, one dynamic linear a block
    held = {(type(m).__name__, name, getattr(m, name)) for m in model.modules() for name in getattr(m, 'choices', ())
            if name in ('conv', 'form')}
    assert held == {('BilateralDynamicLinear', 'form', 'fused'), ('StaticDWConv', 'conv', 'triton')}
    reference = build_classifier('weightformer_t_dyn_linear1')
    reference.load_state_dict(model.state_dict())
    # the kernels run on the GPU where there is one (a compiled kernel cannot read CPU tensors), in IEEE fp32 there
    image = torch.randn(1, 3, 64, 48).to(TRITON_DEVICE)
    model, reference = model.to(TRITON_DEVICE), reference.to(TRITON_DEVICE)
    with torch.no_grad(), full_fp32():
        torch.testing.assert_close(model(image), reference(image), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match='no layer of this network takes the kernels'):
        build_classifier('deit_t_softmax+triton')
    with pytest.raises(ValueError, match=r'\+cuda is not a kernel variant'):
        classifier_config('weightformer_t+cuda')
