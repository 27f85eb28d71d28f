"""AttentionDistiller around an mmseg segmentor and an mmdet detector with our DeiT backbone."""
import pytest
import torch
from mmengine.config import ConfigDict
from mmengine.registry import DefaultScope

from mmwf.models.distillers import AttentionDistiller
from mmwf.registry import MODELS

ARCH = dict(embed_dims=48, depth=2, num_heads=3, mlp_ratio=2)


def backbone(op='SoftmaxAttention', **kwargs):
    return dict(type='DeiT', arch=ARCH, pretrain_size=64, attn_cfg=dict(type=op),
                with_cls_token=MODELS.get(op).with_cls_token, out_indices=(1,), **kwargs)


def segmentor(op):
    return dict(type='EncoderDecoder',
                data_preprocessor=dict(type='SegDataPreProcessor', mean=[120.0] * 3, std=[60.0] * 3, size=(64, 64)),
                backbone=backbone(op),
                decode_head=dict(type='FCNHead', in_channels=48, channels=16, num_convs=1, num_classes=3,
                                 in_index=0, norm_cfg=dict(type='BN', requires_grad=True), align_corners=False,
                                 loss_decode=dict(type='CrossEntropyLoss', loss_weight=1.0)),
                train_cfg=dict(), test_cfg=ConfigDict(mode='whole'))


def seg_batch(n=2):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(n):
        s = SegDataSample(metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64), pad_shape=(64, 64)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, 3, (1, 64, 64), generator=g))
        samples.append(s)
    return dict(inputs=[torch.randint(0, 255, (3, 64, 64), generator=g, dtype=torch.uint8) for _ in range(n)],
                data_samples=samples)


@pytest.fixture
def teacher_file(tmp_path):
    from mmwf.models.backbones import DeiT
    path = tmp_path / 'teacher.pth'
    torch.save(DeiT(ARCH, pretrain_size=64).state_dict(), path)
    return str(path)


def distiller(op, teacher_file, recipe='full_copy', **kwargs):
    import mmseg.models  # noqa: F401  (registers mmseg's modules)
    student = segmentor(op)
    student['backbone']['init_cfg'] = dict(type='SoftmaxTransfer', checkpoint=teacher_file, recipe=recipe)
    teacher = backbone(init_cfg=dict(type='Pretrained', checkpoint=teacher_file))
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = AttentionDistiller(student, teacher, **kwargs)
    model.init_weights()
    return model.train()


def losses_of(model, batch):
    data = model.data_preprocessor(batch, True)
    return model(**data, mode='loss')


def test_softmax_student_copied_from_its_teacher_has_zero_distill_loss(teacher_file):
    model = distiller('SoftmaxAttention', teacher_file)
    losses = losses_of(model, seg_batch())
    assert losses['loss_distill'].item() == 0.0
    assert 'decode.loss_ce' in losses


@pytest.mark.parametrize('op', ['ReLUAttention', 'TTTAttention', 'MHLAttention'])
def test_linear_student_has_positive_distill_loss_that_training_lowers(teacher_file, op):
    model = distiller(op, teacher_file, recipe='copy')
    assert not any(p.requires_grad for p in model.teacher.parameters())
    batch = seg_batch()
    first = losses_of(model, batch)['loss_distill']
    assert first.item() > 0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    for _ in range(15):
        losses = losses_of(model, batch)
        opt.zero_grad()
        sum(losses.values()).backward()
        opt.step()
    assert model.teacher.training is False
    assert losses_of(model, batch)['loss_distill'].item() < 0.5 * first.item()


def test_prediction_is_the_students(teacher_file):
    model = distiller('ReLUAttention', teacher_file).eval()
    batch = seg_batch(1)
    data = model.data_preprocessor(batch, False)
    with torch.no_grad():
        ours = model(**data, mode='predict')[0].seg_logits.data
        student = model.student(**data, mode='predict')[0].seg_logits.data
    assert torch.equal(ours, student)


def test_mismatched_or_windowed_teachers_are_refused(teacher_file):
    import mmseg.models  # noqa: F401
    with DefaultScope.overwrite_default_scope('mmseg'):
        with pytest.raises(ValueError, match='blocks'):
            AttentionDistiller(segmentor('ReLUAttention'), dict(backbone(), arch=dict(ARCH, depth=3)))
        with pytest.raises(ValueError, match='window'):
            AttentionDistiller(segmentor('ReLUAttention'),
                               dict(backbone(), with_cls_token=False, window_size=2, window_block_indexes=(0,)))


def attention_outputs(backbone, inputs):
    """Each block's attention output, computed block by block without hooks: attn(norm1(x)) on the block's input."""
    x, hw, _ = backbone.embed(inputs, classify=False)
    outputs = []
    for block in backbone.blocks:
        outputs.append(block.attn(block.norm1(x), hw))
        x = block(x, hw)
    return outputs


@pytest.mark.parametrize('reduction', ['sum', 'mean'])
@pytest.mark.parametrize('op', ['ReLUAttention', 'MHLAttention'], ids=['same tokens', 'student without class token'])
def test_distill_loss_is_lambda_times_the_blocks_mse_computed_by_hand(teacher_file, op, reduction):
    model = distiller(op, teacher_file, recipe='copy', reduction=reduction, loss_weight=7.0)
    data = model.data_preprocessor(seg_batch(), True)
    loss = model(**data, mode='loss')['loss_distill']
    with torch.no_grad():
        student = attention_outputs(model.student.backbone, data['inputs'])
        teacher = attention_outputs(model.teacher, data['inputs'])
    per_block = []
    for s, t in zip(student, teacher):
        t = t[:, 1:] if t.shape[1] == s.shape[1] + 1 else t  # the teacher's class token has no student counterpart
        assert s.shape == t.shape
        per_block.append(((s - t) ** 2).sum() / s.numel())
    expected = 7.0 * (sum(per_block) if reduction == 'sum' else sum(per_block) / len(per_block))
    assert len(per_block) == 2 and expected > 0
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=0)
