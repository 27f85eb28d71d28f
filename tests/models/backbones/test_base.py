"""The plain-backbone skeleton shared by WeightFormer and DeiT."""
import pytest
import torch

import mmwf  # noqa: F401
from mmwf.models.backbones import DeiT, WeightFormer

TINY_WF = dict(embed_dims=32, depth=4, mlp_ratio=2)
TINY_DEIT = dict(embed_dims=32, depth=3, num_heads=2, mlp_ratio=2)


@pytest.mark.parametrize('grad', [False, True], ids=['inference', 'training'])
@pytest.mark.parametrize('build', [lambda: WeightFormer(TINY_WF, dynamic_blocks=[0, 2]), lambda: DeiT(TINY_DEIT)],
                         ids=['weightformer', 'deit'])
def test_forward_hooks_see_final_tensors(build, grad):
    """No module's output is changed in place after its forward hooks have seen it."""
    model = build().eval()
    seen = []
    for module in model.modules():
        module.register_forward_hook(
            lambda m, i, o: seen.append((o, o.detach().clone())) if isinstance(o, torch.Tensor) else None)
    with torch.set_grad_enabled(grad):
        model(torch.randn(2, 3, 64, 48))
    assert len(seen) > 20
    changed = [i for i, (out, copy) in enumerate(seen) if not torch.equal(out.detach(), copy)]
    assert not changed


def test_in_place_inference_without_hooks_matches_out_of_place():
    model = WeightFormer(TINY_WF, dynamic_blocks=[0, 2]).eval()
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        fast = model(x)[0]  # no hooks: GELU and residual adds in place
    model.blocks[0].register_forward_hook(lambda m, i, o: None)
    with torch.no_grad():
        hooked = model(x)[0]
    torch.testing.assert_close(fast, hooked, rtol=0, atol=0)


@pytest.mark.parametrize('build', [lambda: WeightFormer(TINY_WF, num_classes=5, with_cp=True),
                                   lambda: DeiT(TINY_DEIT, num_classes=5, with_cp=True)], ids=['weightformer', 'deit'])
def test_classifier_path_checkpoints_blocks_too(build, monkeypatch):
    import torch.utils.checkpoint as cp
    calls = []
    original = cp.checkpoint
    monkeypatch.setattr(cp, 'checkpoint', lambda *a, **k: calls.append(1) or original(*a, **k))
    model = build().train()
    model.forward_classifier(torch.randn(2, 3, 32, 32)).sum().backward()
    assert len(calls) == model.depth


@pytest.mark.parametrize('init_cfg', [dict(type='Pretrained'), [dict(type='Pretrained')]], ids=['dict', 'list'])
def test_pretrained_init_is_strict_as_a_dict_or_in_a_list(init_cfg, tmp_path):
    """mmengine's own Pretrained would skip what does not match; ours refuses, however init_cfg is given."""
    path = tmp_path / 'other_size.pth'
    torch.save(WeightFormer(dict(TINY_WF, embed_dims=48)).state_dict(), path)
    cfg = ([dict(c, checkpoint=str(path)) for c in init_cfg] if isinstance(init_cfg, list)
           else dict(init_cfg, checkpoint=str(path)))
    model = WeightFormer(TINY_WF, init_cfg=cfg)
    with pytest.raises(ValueError, match='does not match WeightFormer'):
        model.init_weights()
    good = tmp_path / 'same.pth'
    torch.save({'state_dict': WeightFormer(TINY_WF, num_classes=10).state_dict()}, good)  # head skipped
    WeightFormer(TINY_WF, init_cfg=[dict(type='Pretrained', checkpoint=str(good))]).init_weights()


@pytest.mark.slow
def test_backbones_and_neck_compile():
    """torch.compile, as benchmark.py --compile and mmengine's compile option use it. WeightFormer (its dynamic
    layers) with the pyramid: inductor's outputs are eager's, and traced for training (dynamo and AOT autograd,
    eager kernels: inductor's C++ build of the backward takes a minute of CPU) its gradients too; DeiT traces."""
    from mmwf.models.necks import SimpleFeaturePyramid
    x = torch.randn(2, 3, 64, 80)
    backbone = WeightFormer(TINY_WF, dynamic_blocks=[1, 3])
    model = torch.nn.Sequential(backbone, SimpleFeaturePyramid(32, 16))
    with torch.no_grad():
        for a, b in zip(model.eval()(x), torch.compile(model)(x), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    outs, grads = [model.train()(x), torch.compile(model, backend='aot_eager')(x)], []
    for out in outs:
        model.zero_grad()
        sum(o.square().mean() for o in out).backward()
        grads.append(backbone.patch_embed.proj.weight.grad.clone())
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-3, atol=1e-6)
    deit = DeiT(TINY_DEIT, with_cls_token=False).eval()
    with torch.no_grad():
        for a, b in zip(deit(x), torch.compile(deit, backend='aot_eager')(x), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('build,stem', [
    (lambda f: WeightFormer(TINY_WF, frozen_stages=f), ('patch_embed', 'init_norm')),
    (lambda f: DeiT(TINY_DEIT, frozen_stages=f, in_channels=1), ('patch_embed', 'pos_embed', 'cls_token'))],
    ids=['weightformer', 'deit'])
@pytest.mark.parametrize('frozen', [-1, 0, 2])
def test_frozen_stages_freeze_the_stem_and_the_first_blocks_and_stay_frozen_in_train_mode(build, stem, frozen):
    model = build(frozen).train()
    frozen_names = {n for n, p in model.named_parameters() if not p.requires_grad}
    expected = set()
    if frozen >= 0:
        prefixes = (*stem, *(f'blocks.{i}.' for i in range(frozen)))
        expected = {n for n, _ in model.named_parameters() if n.startswith(prefixes)}
        assert expected
    assert frozen_names == expected
    blocks_in_eval = [i for i, b in enumerate(model.blocks) if not b.training]
    assert blocks_in_eval == list(range(max(frozen, 0)))
    assert model.patch_embed.training == (frozen < 0)


BLOCKS = {
    'weightformer': lambda: WeightFormer(TINY_WF, dynamic_blocks=[0, 2]).blocks[1],
    'deit': lambda: DeiT(TINY_DEIT).blocks[0],
}


@pytest.mark.parametrize('make', BLOCKS.values(), ids=BLOCKS.keys())
def test_training_blocks_keep_the_mlp_hidden_tensor_once(make):
    """The blocks' memory rule (layers.gelu_linear): in training the GELU MLP keeps its hidden tensor once (GELU
    recomputed in backward), one hidden tensor less than the module-by-module evaluation a forward hook gets; the
    loss and the gradients are the same computation."""
    from tests.cost import saved_bytes
    from tests.tolerance import assert_same_computation
    block, x, hw = make().train(), torch.randn(2, 12, 32, requires_grad=True), (3, 4)
    hidden = 2 * 12 * 64 * 4  # B N (2 C) fp32
    runs = []
    for hooked in (False, True):
        handle = block.register_forward_hook(lambda m, i, o: None) if hooked else None
        saved = saved_bytes(lambda: block(x, hw))
        out = block(x, hw)
        grads = torch.autograd.grad(out.square().sum(), (x, *block.parameters()))
        runs.append((saved, out, grads))
        if handle:
            handle.remove()
    (fused, out, grads), (unfused, ref_out, ref_grads) = runs
    assert unfused - fused == hidden
    assert_same_computation(out, ref_out)
    for g, r in zip(grads, ref_grads):
        assert_same_computation(g, r)


def test_a_load_that_gives_a_backbone_none_of_its_tensors_is_refused():
    """Whatever the strictness, a load that leaves the backbone untouched is an error; one that gives it its tensors
    (all, or some where the loader is lenient on purpose) is not."""
    import torch.nn as nn

    from mmwf.utils import CheckpointMismatchError
    torch.manual_seed(0)
    model = nn.Module()
    model.backbone = WeightFormer(dict(embed_dims=16, depth=2, mlp_ratio=2))
    own = model.backbone.state_dict()
    for state, hint in (({}, False), ({'head.fc.weight': torch.ones(1)}, False), (dict(own), True)):
        with pytest.raises(CheckpointMismatchError, match='was given none of its') as err:
            model.load_state_dict(state, strict=False)
        assert ('load_strict(model.backbone' in str(err.value)) == hint
    model.load_state_dict({f'backbone.{k}': v for k, v in own.items()})
    partial = {f'backbone.{k}': v for k, v in list(own.items())[1:]}
    assert model.load_state_dict(partial, strict=False).missing_keys == [f'backbone.{next(iter(own))}']
    WeightFormer(dict(embed_dims=16, depth=2, mlp_ratio=2)).load_state_dict(own)  # the backbone itself
    model.backbone.partial_load = True  # a run's partial_load=True (StrictLoadHook sets it): the opt-out holds
    assert len(model.load_state_dict({}, strict=False).missing_keys) == len(own)
    model.backbone.partial_load = False
    from mmwf.utils import load_strict
    with pytest.raises(CheckpointMismatchError, match=r'missing keys \(\d+'):  # mmwf's own load lists the keys
        load_strict(model, {}, 'nothing.pth')
