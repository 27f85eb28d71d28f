"""tools/model_converters/extract_student.py: the student of a distiller checkpoint as a checkpoint of its own."""
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from mmwf.utils.checkpoint import CheckpointMismatchError
from tests.tolerance import assert_same_computation
from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_student_model_and_backbone_come_out_and_load_strictly(tmp_path):
    from mmengine.registry import MODELS, init_default_scope

    from mmwf.utils import load_strict
    cfg = Config.fromfile(str(ROOT / 'configs/demo/deit_relu_distill_cls_demo.py'))
    init_default_scope(cfg.default_scope)
    student_cfg = cfg.model.student
    student_cfg.backbone.init_cfg = None
    distiller = MODELS.build(dict(cfg.model, student=student_cfg, teacher=dict(cfg.model.teacher, init_cfg=None)))
    with torch.no_grad():
        for p in distiller.teacher.parameters():
            p.add_(1.0)  # teacher and student differ everywhere
    meta = {'iter': 300, 'dataset_meta': {'classes': ('circle', 'square', 'triangle')}}
    torch.save({'state_dict': distiller.state_dict(), 'meta': meta, 'message_hub': {}}, tmp_path / 'iter_300.pth')

    def extract(*extra):
        return run_tool('tools/model_converters/extract_student.py', tmp_path / 'iter_300.pth', *extra).stdout

    assert 'of the student model to' in extract(tmp_path / 'student.pth')
    out = torch.load(tmp_path / 'student.pth', weights_only=True)
    assert out['meta']['dataset_meta'] == meta['dataset_meta']
    student = MODELS.build(student_cfg).eval()
    with pytest.raises(CheckpointMismatchError, match=r"'iter_300.pth' is an AttentionDistiller checkpoint .*"
                                                      r'extract_student.py iter_300.pth student.pth'):
        load_strict(student, distiller.state_dict(), 'iter_300.pth')  # the run's file where the student's is wanted
    load_strict(student, out['state_dict'], 'student.pth')
    image = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert_same_computation(student.extract_feat(image)[0], distiller.eval().student.extract_feat(image)[0])

    extract(tmp_path / 'backbone.pth', '--backbone')
    backbone = MODELS.build(dict(student_cfg.backbone, init_cfg=dict(type='Pretrained',
                                                                      checkpoint=str(tmp_path / 'backbone.pth'))))
    backbone.init_weights()
    assert all(torch.equal(v, distiller.student.backbone.state_dict()[k]) for k, v in backbone.state_dict().items())
