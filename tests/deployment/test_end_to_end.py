"""The detector and the segmentor deployed end to end: the ONNX graphs run by ONNX Runtime, with mmdet's / mmseg's
pre- and post-processing around them, give what the models' ``predict`` gives on images."""
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config

import mmwf  # noqa: F401
from mmwf.datasets.synthetic import write_ade, write_coco
from mmwf.deployment import export_onnx, exportable_model
from mmwf.deployment.detector import (
    CascadeMaskRCNNGraph,
    DetectorSession,
    compare_detections,
    export_detector,
    paste_masks,
    pytorch_detections,
)
from mmwf.deployment.segmentor import SegmentorSession, label_agreement, pytorch_label_map
from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]
TINY_WF = dict(_delete_=True, type='WeightFormer', arch=dict(embed_dims=32, depth=3, mlp_ratio=2), final_norm=False)


def tiny_config(tmp: Path, base: str, name: str, **model) -> str:
    """``base`` with a 3-block WeightFormer of width 32, written to ``tmp / name``."""
    cfg = Config.fromfile(str(ROOT / base))
    cfg.merge_from_dict(dict(model=model))
    path = tmp / name
    cfg.dump(str(path))
    return str(path)


@pytest.fixture(scope='module')
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp('images')
    write_coco(str(root), 'val', 3, 128, np.random.default_rng(0))
    write_ade(str(root), 'val', 2, (160, 224), np.random.default_rng(1))
    return sorted(map(str, (root / 'val').glob('*.jpg'))), sorted(map(str, (root / 'images/val').glob('*.jpg')))


@pytest.fixture(scope='module')
def detector(tmp_path_factory):
    """The demo Cascade Mask R-CNN with a tiny backbone and 64-channel heads. Random weights: near-uniform class
    scores, so that every RoI passes the score threshold and NMS decides which of about 300 boxes remain; the mask
    logits scaled up, so that masks are not probabilities of 0.5 give or take rounding."""
    tmp = tmp_path_factory.mktemp('detector')
    cfg = Config.fromfile(str(ROOT / 'configs/demo/cascade_wf_t_demo.py'))
    heads = cfg.model.roi_head
    for head in heads.bbox_head:
        head.update(in_channels=64, conv_out_channels=64, fc_out_channels=128)
    cfg.merge_from_dict(dict(model=dict(
        backbone=dict(TINY_WF, out_indices=(2,)), neck=dict(in_channels=32, out_channels=64),
        rpn_head=dict(in_channels=64, feat_channels=64),
        roi_head=dict(bbox_roi_extractor=dict(out_channels=64), mask_roi_extractor=dict(out_channels=64),
                      mask_head=dict(in_channels=64, conv_out_channels=64)))))
    config = str(tmp / 'det.py')
    cfg.dump(config)
    torch.manual_seed(0)
    module, facts = exportable_model(config)
    with torch.no_grad():
        module.model.roi_head.mask_head.conv_logits.weight.mul_(30)
    return config, module.model


def test_the_graph_is_the_detectors_predict_in_pytorch(detector, images):
    """Eager, the graph gives mmdet's predictions bit for bit: boxes, scores, labels and the pasted masks."""
    config, model = detector
    graph = CascadeMaskRCNNGraph(model)
    for image in images[0][:2]:
        inputs, meta = preprocess(config, image)
        ref = pytorch_detections(model, inputs, meta)
        assert len(ref['bboxes']) == 100 and len(ref['labels'].unique()) > 1  # max_per_img reached, classes
        with torch.no_grad():
            boxes, scores, labels, masks = graph(inputs, torch.tensor(meta['img_shape'], dtype=torch.float32))
        boxes = boxes / torch.tensor(meta['scale_factor']).repeat(2).float()
        assert torch.equal(boxes, ref['bboxes']) and torch.equal(scores, ref['scores'])
        assert torch.equal(labels, ref['labels'])
        assert torch.equal(paste_masks(masks, boxes, meta['ori_shape'][:2], 0.5), ref['masks'])


def preprocess(config: str, image: str) -> tuple[torch.Tensor, dict]:
    """The config's test pipeline and data preprocessor on one image file."""
    from mmdet.registry import MODELS
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(config)
    init_default_scope('mmdet')
    data = Compose([t for t in cfg.test_pipeline if t['type'] != 'LoadAnnotations'])(dict(img_path=image, img_id=0))
    data = MODELS.build(cfg.model.data_preprocessor)(dict(inputs=[data['inputs']],
                                                          data_samples=[data['data_samples']]), False)
    return data['inputs'], data['data_samples'][0].metainfo


def test_models_the_graph_does_not_compute_are_refused(detector):
    config, model = detector
    with pytest.raises(ValueError, match='ViTDetCascadeRoIHead with a mask head'):
        CascadeMaskRCNNGraph(torch.nn.Linear(2, 2))
    nms = model.roi_head.test_cfg.nms
    model.roi_head.test_cfg.nms = dict(type='soft_nms', iou_threshold=0.5)
    try:
        with pytest.raises(ValueError, match=r'differs in: test_cfg\.rcnn\.nms'):
            CascadeMaskRCNNGraph(model)
    finally:
        model.roi_head.test_cfg.nms = nms
    model.train()
    try:
        with pytest.raises(ValueError, match=r'training mode: call \.eval\(\)'):
            CascadeMaskRCNNGraph(model)
    finally:
        model.eval()


@pytest.mark.slow
def test_onnx_runtime_gives_the_detectors_predictions(detector, images, tmp_path):
    """Exported and run by ONNX Runtime (NonMaxSuppression, RoiAlign), the detections are PyTorch's: the same
    count and labels, boxes within 1e-3 relative, masks of IoU above 0.99; and with no box above the threshold, no
    detections (no operator fails on empty inputs)."""
    from mmengine.registry import DefaultScope
    config, model = detector
    path = export_detector(model, (128, 128), str(tmp_path / 'det.onnx'))
    with DefaultScope.overwrite_default_scope('mmengine'):  # another library's scope is current
        session = DetectorSession(path, config)
        assert DefaultScope.get_current_instance().scope_name == 'mmengine'  # the config's only while it builds
    for image in images[0]:
        inputs, meta = session.inputs(image)
        ref, got = pytorch_detections(model, inputs, meta), session(image)
        d = compare_detections(ref, got)
        assert d['count'] == (100, 100) and d['paired'] == 100, d
        assert d['box_rel'] < 1e-3 and d['score_abs'] < 1e-5 and d['mask_iou'] > 0.99, d
        assert ref['masks'].sum() > 1000  # masks that cover something
    # the measures see a 2-pixel shift, another label, a mask eroded by a pixel
    assert compare_detections(ref, dict(got, bboxes=got['bboxes'] + 2.0))['box_rel'] > 2e-3
    assert compare_detections(ref, dict(got, labels=got['labels'].roll(1)))['paired'] < 100
    eroded = got['masks'] & got['masks'].roll(1, 1) & got['masks'].roll(1, 2)
    assert compare_detections(ref, dict(got, masks=eroded))['mask_iou'] < 0.99

    threshold = model.roi_head.test_cfg.score_thr
    model.roi_head.test_cfg.score_thr = 1.0
    try:
        path = export_detector(model, (128, 128), str(tmp_path / 'none.onnx'))
    finally:
        model.roi_head.test_cfg.score_thr = threshold
    got = DetectorSession(path, config)(images[0][0])
    assert got['bboxes'].shape == (0, 4) and got['masks'].shape == (0, 128, 128) and got['labels'].shape == (0,)


@pytest.mark.slow
def test_segmentor_label_maps_with_a_sliding_window(images, tmp_path):
    """UperNet's graph in mmseg's sliding-window inference (6 overlapping 64 x 64 windows over 91 x 128 inputs,
    from images of another size and aspect): logits equal to ``EncoderDecoder.inference`` and the label maps of
    ``predict`` in the original size."""
    config = tiny_config(tmp_path, 'configs/demo/upernet_wf_t_demo.py', 'seg.py',
                         backbone=dict(TINY_WF, arch=dict(TINY_WF['arch'], depth=4), out_indices=(0, 1, 2, 3)),
                         neck=dict(embed_dim=32),
                         decode_head=dict(in_channels=[32] * 4, channels=32), auxiliary_head=dict(in_channels=32),
                         test_cfg=dict(mode='slide', crop_size=(64, 64), stride=(32, 48)))
    module, facts = exportable_model(config)
    path = export_onnx(module, (64, 64), str(tmp_path / 'seg.onnx'), dict(facts, fixed_size=True))
    session = SegmentorSession(path, config)
    for image in images[1]:
        inputs, meta = session.inputs(image)
        assert tuple(inputs.shape[2:]) == (91, 128)  # 160 x 224 resized to fit 128 x 128
        with torch.no_grad():
            expected = module.model.inference(inputs, [dict(meta)])
        torch.testing.assert_close(session.logits(inputs, meta), expected, atol=1e-4, rtol=1e-4)
        ref, got = pytorch_label_map(module.model, inputs, meta), session(image)
        assert got.shape == (160, 224) and len(ref.unique()) > 1
        assert label_agreement(ref, got) > 0.999
    session.test_cfg = dict(mode='whole')  # the whole 91 x 128 image into the static 64 x 64 graph
    with pytest.raises(ValueError, match=r'the image: the graph .*seg.onnx takes 64 x 64 inputs .* gives 91 x 128: '
                                         r'export it at this size'):
        session(images[1][0])


@pytest.mark.slow
def test_tool_deploys_the_detector_and_checks_it_on_images(detector, images, tmp_path):
    config, model = detector
    torch.save(dict(state_dict=model.state_dict()), tmp_path / 'det.pth')
    cmd = ['tools/deployment/pytorch2onnx.py', config, tmp_path / 'det.pth', '--out', tmp_path / 'det.onnx',
           '--shape', '128', '128']
    res = run_tool(*cmd, '--end2end', '--images', *images[0][:2], '--latency', '1')
    lines = [line for line in res.stdout.splitlines() if 'detections in PyTorch' in line]
    assert len(lines) == 2 and all('100 detections in PyTorch, 100 deployed, 100 paired' in line for line in lines)
    assert re.search(r'latency on .*: deployed \(ONNX Runtime\) [0-9.]+ s, PyTorch predict [0-9.]+ s', res.stdout)
    res = run_tool(*cmd, '--images', images[0][0], ok=False)
    assert 'add --end2end' in res.stderr


@pytest.mark.slow
def test_the_graph_describes_itself_and_runs_without_its_config(detector, images, tmp_path):
    """The export writes the task, classes, mean / std, input size, what the outputs are and the config into the
    file; the session runs from the file alone as from the config, and a session of another task refuses it."""
    import json

    import onnxruntime as ort
    config, model = detector
    cfg = Config.fromfile(config)
    path = export_detector(model, (128, 128), str(tmp_path / 'det.onnx'), cfg=cfg)
    meta = ort.InferenceSession(path, providers=['CPUExecutionProvider']).get_modelmeta().custom_metadata_map
    assert meta['mmwf.task'] == 'detector' and meta['mmwf.input_size'] == '128 128'
    assert json.loads(meta['mmwf.classes']) == list(cfg.test_dataloader.dataset.metainfo.classes)
    assert json.loads(meta['mmwf.mean']) == list(cfg.model.data_preprocessor.mean)
    assert json.loads(meta['mmwf.std']) == list(cfg.model.data_preprocessor.std)
    assert 'labels (n,) int64 indices of mmwf.classes' in meta['mmwf.outputs']
    alone, with_config = DetectorSession(path)(images[0][0]), DetectorSession(path, config)(images[0][0])
    assert all(torch.equal(alone[k], with_config[k]) for k in alone)
    with pytest.raises(ValueError, match=r'det.onnx is a detector graph \(its mmwf.task\); SegmentorSession runs a '
                                         r'segmentor'):
        SegmentorSession(path)
    broken = tmp_path / 'broken.jpg'
    broken.write_bytes(Path(images[0][0]).read_bytes()[:300])
    with pytest.raises(ValueError, match=r"cannot read image '.*broken.jpg'"):
        DetectorSession(path)(str(broken))


@pytest.mark.slow
def test_tool_checks_its_arguments_before_exporting_and_refuses_a_check_of_nothing(detector, images, tmp_path):
    config, model = detector
    out = tmp_path / 'det.onnx'
    cmd = ['tools/deployment/pytorch2onnx.py', config, '--out', out, '--end2end']
    res = run_tool(*cmd, '--shape', '256', '256', ok=False)
    assert not out.exists()
    assert 'error: --shape 256 256' in res.stderr and 'preprocesses images to 128 128' in res.stderr
    res = run_tool(*cmd, '--shape', '128', '128', '--images', tmp_path / 'nope.jpg', ok=False)
    assert 'nope.jpg not found' in res.stderr and not out.exists()
    threshold = model.roi_head.test_cfg.score_thr
    model.roi_head.test_cfg.score_thr = 1.0  # a checkpoint that detects nothing
    try:
        torch.save(dict(state_dict=model.state_dict()), tmp_path / 'w.pth')
    finally:
        model.roi_head.test_cfg.score_thr = threshold
    cfg = Config.fromfile(config)
    cfg.model.test_cfg.rcnn.score_thr = 1.0
    cfg.dump(str(tmp_path / 'none.py'))
    res = run_tool('tools/deployment/pytorch2onnx.py', tmp_path / 'none.py', tmp_path / 'w.pth', '--out', out,
                   '--end2end', '--shape', '128', '128', '--images', *images[0][:2], ok=False)
    assert 'no detection on any image, in PyTorch or deployed' in res.stderr
