"""ONNX export (dynamo) checked with ONNX Runtime; torch.export and torch.compile with dynamic shapes."""
from pathlib import Path

import numpy as np
import pytest
import torch

import mmwf  # noqa: F401
from mmwf.deployment import ExportWrapper, check_onnx, export_onnx
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.models.necks import SimpleFeaturePyramid
from tests.reference import randomised
from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]
TINY_WF = dict(embed_dims=32, depth=3, mlp_ratio=2)
TINY_DEIT = dict(embed_dims=32, depth=2, num_heads=2, mlp_ratio=2)


class MmpretrainForm(torch.nn.Module):
    """A classifier (a backbone with ``out_type='timm'``) called as mmpretrain's: ``model(x, mode='tensor')``."""

    def __init__(self, classifier):
        super().__init__()
        self.backbone = classifier

    def forward(self, x, mode='tensor'):
        return self.backbone(x)


@pytest.mark.slow
def test_tool_exports_a_classifier_config_with_dynamic_batch_and_size(tmp_path):
    """The tool's graph, run here with ONNX Runtime, gives the logits of the config's classifier built here (with the
    weights handed to the tool) for two batch sizes and two image sizes other than the export's."""
    import onnxruntime as ort
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    config = 'configs/imagenet/deit_t_softmax_in1k.py'
    model_cfg = Config.fromfile(str(ROOT / config)).model
    model_cfg.backbone.pop('init_cfg', None)
    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    # weights no initialiser gives: a graph of other weights cannot match
    model = randomised(MODELS.build(model_cfg).eval(), 0.02, around_init=True)
    torch.save(dict(state_dict=model.state_dict()), tmp_path / 'deit_t.pth')
    out = tmp_path / 'deit_t.onnx'
    res = run_tool('tools/deployment/pytorch2onnx.py', config, tmp_path / 'deit_t.pth', '--out', out, '--shape', '224',
                   '224', '--dynamic')
    assert 'dynamic batch and size' in res.stdout

    session = ort.InferenceSession(str(out), providers=['CPUExecutionProvider'])
    (graph_input,) = session.get_inputs()
    assert graph_input.shape[0] != 1 and not all(isinstance(d, int) for d in graph_input.shape[2:])  # symbolic
    g = torch.Generator().manual_seed(1)
    for shape in ((1, 3, 224, 224), (3, 3, 192, 288)):
        x = torch.randn(*shape, generator=g)
        with torch.no_grad():
            expected = model(x, mode='tensor')
        (logits,) = session.run(None, {graph_input.name: x.numpy()})
        assert logits.shape == (shape[0], 1000) and expected.shape == (shape[0], 1000)
        assert expected.std() > 1e-2  # logits that tell images and classes apart
        torch.testing.assert_close(torch.from_numpy(logits), expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(torch.from_numpy(logits[:1]), torch.from_numpy(logits[1:2]), atol=1e-3)


@pytest.mark.slow
def test_weightformer_classifier_exports_with_dynamic_batch_and_size(tmp_path):
    """Every dynamic layer of the release (Bilateral linear, adaptive DWConv with its 3 x 3 pooling) in one graph
    that serves other batch sizes and grids (the second grid, 7 x 5, is not divisible by 3)."""
    classifier = MmpretrainForm(WeightFormer(TINY_WF, num_classes=10, out_type='timm'))
    with pytest.raises(ValueError, match=r'training mode: call \.eval\(\)'):
        export_onnx(ExportWrapper(classifier, 'classifier'), (96, 128), str(tmp_path / 'never.onnx'), {})
    module = ExportWrapper(classifier.eval(), 'classifier')
    facts = dict(kind='classifier', stride=16, min_size=64)
    path = export_onnx(module, (96, 128), str(tmp_path / 'wf.onnx'), facts, dynamic=True)
    assert max(check_onnx(path, module, [(1, 3, 96, 128), (3, 3, 112, 80)])) < 1e-4


@pytest.mark.slow
def test_dynamic_depthwise_conv_graph_follows_the_batch_axis(tmp_path):
    """With a static batch each dynamic DWConv is one Conv whose kernel the graph computes (the per-sample kernels of
    the batch as groups); with a dynamic batch it is the taps: a Conv with constant one-hot kernels (9 maps per
    channel) and a MatMul with the computed taps. Both equal PyTorch."""
    import onnx
    from onnx import numpy_helper
    classifier = WeightFormer(TINY_WF, num_classes=10, dynamic_blocks=[1], out_type='timm')
    module = ExportWrapper(MmpretrainForm(classifier).eval(), 'classifier')
    facts = dict(kind='classifier', stride=16, min_size=64)
    for dynamic, shapes in ((False, [(1, 3, 64, 80)]), (True, [(1, 3, 64, 80), (3, 3, 96, 64)])):
        path = export_onnx(module, (64, 80), str(tmp_path / f'wf_{dynamic}.onnx'), facts, dynamic=dynamic)
        assert max(check_onnx(path, module, shapes)) < 1e-4
        graph = onnx.load(path).graph
        constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        convs = [n for n in graph.node if n.op_type == 'Conv']
        computed = [n for n in convs if n.input[1] not in constants]
        one_hot = [n for n in convs if n.input[1] in constants and constants[n.input[1]].shape[0] == 9 * 32
                   and set(np.unique(constants[n.input[1]])) == {0.0, 1.0}]
        assert (len(computed), len(one_hot)) == ((0, 1) if dynamic else (1, 0)), (len(computed), len(one_hot))


@pytest.mark.filterwarnings('ignore::DeprecationWarning', 'ignore::torch.jit.TracerWarning')
def test_torchscript_exporter_takes_weightformer_with_a_dynamic_batch(tmp_path):
    """The TorchScript exporter (mmdeploy's) exports every dynamic layer (no addcdiv, which it lacks) in a graph
    traced at batch 2 that serves batch 3 (the per-sample depthwise conv as the taps: no group count of the trace's
    batch)."""
    import onnxruntime as ort
    model = MmpretrainForm(WeightFormer(TINY_WF, num_classes=10, out_type='timm')).eval()
    x = torch.randn(2, 3, 64, 80)
    torch.onnx.export(model, (x,), str(tmp_path / 'ts.onnx'), dynamo=False, opset_version=17, input_names=['x'],
                      dynamic_axes={'x': {0: 'batch'}})
    session = ort.InferenceSession(str(tmp_path / 'ts.onnx'), providers=['CPUExecutionProvider'])
    x = torch.randn(3, 3, 64, 80)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(torch.from_numpy(session.run(None, {'x': x.numpy()})[0]), expected, atol=1e-4,
                               rtol=1e-4)


class Dense(torch.nn.Module):
    """A windowed DeiT (its windows do not divide the grid) and a SimpleFeaturePyramid, as the Cascade configs."""

    def __init__(self):
        super().__init__()
        self.backbone = DeiT(TINY_DEIT, with_cls_token=False, window_size=4, window_block_indexes=(0,),
                             out_indices=(1,))
        self.neck = SimpleFeaturePyramid(32, out_channels=16)

    def extract_feat(self, x):
        return self.neck(self.backbone(x))


@pytest.mark.slow
def test_windowed_backbone_and_pyramid_export_with_dynamic_batch_and_size(tmp_path):
    module = ExportWrapper(Dense().eval(), 'backbone+neck')
    facts = dict(kind='backbone+neck', stride=32, min_size=96)  # more than one 4-token window per side
    path = export_onnx(module, (160, 192), str(tmp_path / 'dense.onnx'), facts, dynamic=True)
    assert max(check_onnx(path, module, [(1, 3, 160, 192), (3, 3, 224, 96)])) < 1e-4


@pytest.mark.slow
def test_segmentor_exports_with_a_dynamic_batch(tmp_path):
    """UperNet: mmseg's pyramid pooling pools to fixed bins, so the size is fixed and the batch is dynamic."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    model = MODELS.build(dict(
        type='EncoderDecoder', data_preprocessor=dict(type='SegDataPreProcessor'),
        backbone=dict(type='WeightFormer', arch=dict(TINY_WF, depth=4), out_indices=(0, 1, 2, 3), final_norm=False),
        neck=dict(type='Feature2Pyramid', embed_dim=32, rescales=[4, 2, 1, 0.5], norm_cfg=dict(type='BN')),
        decode_head=dict(type='UPerHead', in_channels=[32] * 4, in_index=[0, 1, 2, 3], channels=16,
                         num_classes=5, norm_cfg=dict(type='BN')))).eval()
    module = ExportWrapper(model, 'segmentor')
    facts = dict(kind='segmentor', stride=32, min_size=32, fixed_size=True)
    path = export_onnx(module, (128, 128), str(tmp_path / 'seg.onnx'), facts, dynamic=True)
    assert max(check_onnx(path, module, [(1, 3, 128, 128), (3, 3, 128, 128)])) < 1e-4


@pytest.mark.parametrize('make,lo', [(lambda: WeightFormer(TINY_WF, out_indices=(0, 2)), 4),
                                     (lambda: DeiT(TINY_DEIT, with_cls_token=False, window_size=4,
                                                   window_block_indexes=(0,), out_indices=(0, 1)), 5)],
                         ids=['weightformer', 'deit-windows'])
def test_torch_export_with_dynamic_batch_and_size(make, lo):
    from torch.export import Dim, export
    model = make().eval()
    dims = {'x': {0: Dim('batch', min=1, max=32), 2: 16 * Dim('h', min=lo, max=64), 3: 16 * Dim('w', min=lo, max=64)}}
    program = export(model, (torch.randn(2, 3, 16 * 9, 16 * 7),), dynamic_shapes=dims).module()
    for shape in ((1, 3, 16 * lo, 16 * 13), (4, 3, 16 * 11, 16 * lo)):
        x = torch.randn(*shape)
        with torch.no_grad():
            for ours, ref in zip(program(x), model(x)):
                assert torch.allclose(ours, ref, atol=1e-5)


def test_compiled_backbone_does_not_recompile_for_a_new_batch_size():
    graphs = []

    def counting(gm, example_inputs):  # a torch.compile backend that records each compilation
        graphs.append(gm)
        return gm.forward
    model = WeightFormer(TINY_WF).eval()
    compiled = torch.compile(model, backend=counting, dynamic=True)
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 3, 64, 96)
            assert torch.allclose(compiled(x)[0], model(x)[0], atol=1e-5)
    assert len(graphs) == 1
