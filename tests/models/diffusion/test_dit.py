"""DiT and WeightFormer-DiT: the release's / DiT's state-dict layout, WF-DiT's forward against a functional
reference (tests/reference.py), the fixed embeddings against their formulas, adaLN-Zero at init,
guidance, and clear errors."""
import math
import re

import pytest
import torch

from mmwf.models.diffusion import DiT, WeightFormerDiT, sincos_pos_embed_2d, timestep_embedding
from mmwf.models.layers import PatchEmbed
from tests.reference import randomised, wf_dit_forward

SMALL_WF = dict(hidden_size=32, depth=4)


def block_keys(prefix, dynamic):
    mixer = ['w', 'b', 'wfm.0.weight', 'wfm.0.bias', 'wfm.2.weight'] if dynamic else ['weight', 'bias']
    linear1 = ['w', 'b', 'wfm.weight', 'wfm.bias', 'w1', 'w2'] if dynamic else ['weight', 'bias']
    return ({f'{prefix}.adaLN_modulation.1.{k}' for k in ('weight', 'bias')} | {f'{prefix}.dwc.{k}' for k in mixer}
            | {f'{prefix}.linear1.{k}' for k in linear1} | {f'{prefix}.linear2.{k}' for k in ('weight', 'bias')})


STEM = {'x_embedder.proj.weight', 'x_embedder.proj.bias', 'pos_embed', 't_embedder.mlp.0.weight',
        't_embedder.mlp.0.bias', 't_embedder.mlp.2.weight', 't_embedder.mlp.2.bias',
        'y_embedder.embedding_table.weight',
        'final_layer.linear.weight', 'final_layer.linear.bias', 'final_layer.adaLN_modulation.1.weight',
        'final_layer.adaLN_modulation.1.bias'}


def test_state_dict_layouts_are_the_releases_and_dits():
    wf = WeightFormerDiT('S', patch_size=2)
    assert isinstance(wf.x_embedder, PatchEmbed)  # the backbones' patch embedding, under DiT's key
    assert set(wf.state_dict()) == STEM | set().union(*(block_keys(f'blocks.{i}', (i + 2) % 3 == 0) for i in range(15)))
    assert sorted(wf.dynamic_ids) == [1, 4, 7, 10, 13]
    assert wf.state_dict()['blocks.1.linear1.w1'].shape == (96, 384)  # Cin / 4 x Cin
    assert wf.state_dict()['blocks.1.linear1.wfm.weight'].shape == (96 + 384, 384)
    dit = DiT('B', patch_size=4)
    block = {f'{n}.{k}' for n in ('attn.qkv', 'attn.proj', 'mlp.fc1', 'mlp.fc2', 'adaLN_modulation.1')
             for k in ('weight', 'bias')}
    assert set(dit.state_dict()) == STEM | {f'blocks.{i}.{k}' for i in range(12) for k in block}
    assert dit.state_dict()['final_layer.linear.weight'].shape == (4 * 4 * 8, 768)


def test_weightformer_dit_is_the_releases_equations():
    model = WeightFormerDiT(SMALL_WF, patch_size=2, input_size=8, in_channels=3, num_classes=5)
    model = randomised(model, 0.05, around_init=True, seed=1).eval().double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    t, y = torch.tensor([3, 801]), torch.tensor([4, 5])  # 5: the dropped label
    ref = wf_dit_forward({k: v.double() for k, v in model.state_dict().items()}, x, t.double(), y, 2, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x, t, y), ref, rtol=1e-9, atol=1e-10)


def test_fixed_embeddings_are_their_formulas():
    table = sincos_pos_embed_2d(8, 3)  # dim 8: columns in [0:4], rows in [4:8], each [sin, sin, cos, cos]
    row, col = 2, 1
    w = [1.0, 10000 ** -0.5]
    expected = [math.sin(col * w[0]), math.sin(col * w[1]), math.cos(col * w[0]), math.cos(col * w[1]),
                math.sin(row * w[0]), math.sin(row * w[1]), math.cos(row * w[0]), math.cos(row * w[1])]
    torch.testing.assert_close(table[row * 3 + col], torch.tensor(expected))
    emb = timestep_embedding(torch.tensor([7.0]), 4)
    torch.testing.assert_close(emb[0], torch.tensor([math.cos(7), math.cos(7 * 0.01), math.sin(7), math.sin(7 * 0.01)]))
    assert torch.equal(WeightFormerDiT(SMALL_WF, input_size=8).pos_embed[0], sincos_pos_embed_2d(32, 4))


def initialize_weights_rules(names, family):
    """The rule each tensor gets from DiT's ``initialize_weights`` (facebookresearch/DiT ``models.py``) and, for
    WF-DiT, the release's (``model/wfm_dit.py``: the same function after its dynamic layers' own init), by name."""
    rules = {'x_embedder.proj.weight': 'xavier', 'x_embedder.proj.bias': 'zero', 'pos_embed': 'sincos',
             'y_embedder.embedding_table.weight': 'normal', 't_embedder.mlp.0.weight': 'normal',
             't_embedder.mlp.0.bias': 'zero', 't_embedder.mlp.2.weight': 'normal', 't_embedder.mlp.2.bias': 'zero',
             'final_layer.linear.weight': 'zero', 'final_layer.linear.bias': 'zero',
             'final_layer.adaLN_modulation.1.weight': 'zero', 'final_layer.adaLN_modulation.1.bias': 'zero'}
    for name in names:
        block = re.match(r'blocks\.\d+\.(.*)', name)
        if block is None:
            continue
        key = block[1]
        if key.startswith('adaLN_modulation.1.'):
            rules[name] = 'zero'  # adaLN-Zero
        elif family == 'dit':  # timm's Attention and Mlp: nn.Linear everywhere
            rules[name] = 'xavier' if key.endswith('weight') else 'zero'
        elif key in ('linear1.weight', 'linear1.wfm.weight', 'linear2.weight'):  # nn.Linear in the release
            rules[name] = 'xavier'
        elif key in ('linear1.bias', 'linear1.wfm.bias', 'linear2.bias'):
            rules[name] = 'zero'
        elif key in ('linear1.w', 'linear1.b', 'linear1.w1', 'linear1.w2', 'dwc.w', 'dwc.b'):
            rules[name] = 'trunc_normal'  # DynLinear / DynCnn: trunc_normal_(std=0.02), untouched after
        else:  # dwc.weight / dwc.bias, dwc.wfm.*: nn.Conv2d, left at PyTorch's default
            rules[name] = 'conv_default'
    return rules


def mae_sincos_table(dim, grid):
    """MAE's get_2d_sincos_pos_embed in numpy: [emb(columns), emb(rows)], emb(p) = [sin(p w), cos(p w)]."""
    import numpy as np
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4))
    cols, rows = np.meshgrid(np.arange(grid, dtype=np.float32), np.arange(grid, dtype=np.float32))

    def emb(pos):
        out = np.einsum('m,d->md', pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)
    return torch.from_numpy(np.concatenate([emb(cols), emb(rows)], axis=1)).float()


@pytest.mark.parametrize('family', ['dit', 'wf-dit'])
def test_initialisation_is_dits_initialize_weights(family):
    """Every tensor as DiT's (and the release's) initialize_weights leaves it, checked by its distribution, which
    holds for any seed: zeros, Xavier-uniform (|w| <= sqrt(6 / (fan_in + fan_out)), std = that bound / sqrt(3)),
    normal / truncated normal with std 0.02 (within four standard errors), PyTorch's conv default
    (|w| <= 1 / sqrt(fan_in)), the sin-cos table."""
    torch.manual_seed(3)
    model = (DiT(dict(hidden_size=64, depth=2, num_heads=2), input_size=8) if family == 'dit'
             else WeightFormerDiT(dict(hidden_size=64, depth=3), input_size=8))
    state = model.state_dict()
    rules = initialize_weights_rules(state, family)
    assert set(rules) == set(state)
    for name, tensor in state.items():
        rule, flat = rules[name], tensor.reshape(tensor.shape[0], -1) if tensor.dim() > 1 else tensor
        if rule == 'zero':
            assert torch.count_nonzero(tensor) == 0, name
        elif rule == 'xavier':
            bound = math.sqrt(6 / (flat.shape[0] + flat.shape[1]))
            assert flat.abs().max() <= bound and flat.abs().max() > 0.9 * bound, name
            assert flat.std().item() == pytest.approx(bound / math.sqrt(3), rel=2 / tensor.numel() ** 0.5), name
        elif rule in ('normal', 'trunc_normal'):  # within four standard errors
            assert tensor.std().item() == pytest.approx(0.02, rel=3 / tensor.numel() ** 0.5), name
            assert tensor.mean().abs() < 0.08 / tensor.numel() ** 0.5, name
        elif rule == 'conv_default':  # kaiming_uniform(a=sqrt(5)) and its bias: both within 1 / sqrt(fan_in)
            fan_in = state[name.replace('.bias', '.weight')][0].numel()
            assert tensor.abs().max() <= 1 / math.sqrt(fan_in) and tensor.std() > 0.3 / math.sqrt(fan_in), name
        else:
            assert torch.equal(tensor[0], mae_sincos_table(64, 4)), name


@pytest.mark.parametrize('build', [lambda: WeightFormerDiT(SMALL_WF, input_size=8),
                                   lambda: DiT(dict(hidden_size=32, depth=2, num_heads=2), input_size=8)],
                         ids=['wf-dit', 'dit'])
def test_adaln_zero_init_outputs_zero_and_guidance_combines_the_halves(build):
    model = build().eval()
    x, t = torch.randn(2, 4, 8, 8), torch.tensor([10, 10])
    assert torch.equal(model(x, t, torch.tensor([1, 2])), torch.zeros(2, 8, 8, 8))
    model = randomised(model, 0.05, around_init=True, seed=1).eval()
    both = torch.cat([x[:1], x[:1]])
    labels = torch.tensor([3, model.num_classes])
    with torch.no_grad():
        out, guided = model(both, t, labels), model.forward_with_cfg(both, t, labels, 4.0)
    cond, uncond = out[0], out[1]
    torch.testing.assert_close(guided[0, :3], uncond[:3] + 4.0 * (cond[:3] - uncond[:3]))
    torch.testing.assert_close(guided[1, :3], guided[0, :3])
    torch.testing.assert_close(guided[:, 3:], out[:, 3:])


def test_label_dropout_in_training_only():
    model = WeightFormerDiT(SMALL_WF, input_size=8, num_classes=5, class_dropout_prob=1.0)
    table = model.y_embedder.embedding_table.weight
    y = torch.tensor([0, 1, 2])
    assert torch.equal(model.y_embedder(y, train=True), table[[5, 5, 5]])
    assert torch.equal(model.y_embedder(y, train=False), table[[0, 1, 2]])


def test_clear_errors():
    with pytest.raises(ValueError, match=re.escape("unknown WeightFormerDiT arch 'XL'; choose from ['B', 'S']")):
        WeightFormerDiT('XL')
    with pytest.raises(ValueError, match=re.escape("lacks ['num_heads']; a custom arch needs exactly depth, "
                                                   'hidden_size, num_heads')):
        DiT(dict(hidden_size=32, depth=2))
    with pytest.raises(ValueError, match='not a multiple of patch_size'):
        DiT('S', patch_size=3)
    with pytest.raises(ValueError, match='built for 8 x 8 inputs'):
        WeightFormerDiT(SMALL_WF, input_size=8)(torch.randn(1, 4, 16, 16), torch.tensor([1]), torch.tensor([0]))


@pytest.mark.parametrize('build', [
    lambda cp: WeightFormerDiT(SMALL_WF, input_size=8, with_cp=cp),
    lambda cp: DiT(dict(hidden_size=32, depth=2, num_heads=2), input_size=8, with_cp=cp)], ids=['wf-dit', 'dit'])
def test_activation_checkpointing_keeps_the_gradients_and_saves_no_block_activation(build):
    """with_cp: the same loss and gradients; what autograd keeps for backward shrinks by exactly what each block
    saves when run on its own, less its inputs (tokens and conditioning), which checkpointing keeps."""
    from tests.cost import saved_bytes
    g = torch.Generator().manual_seed(0)
    x, t, y = torch.randn(3, 4, 8, 8, generator=g), torch.tensor([1, 500, 999]), torch.tensor([0, 3, 7])
    runs = []
    for with_cp in (False, True):
        torch.manual_seed(0)
        model = randomised(build(with_cp), 0.05, around_init=True, seed=1).train()
        out = {}

        def forward(model=model, out=out):
            torch.manual_seed(0)  # the same label dropout
            out['loss'] = model(x, t, y).square().mean()
            return out['loss']
        saved = saved_bytes(forward)
        out['loss'].backward()
        runs.append((out['loss'].detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}, saved))
    (loss, grads, saved), (cp_loss, cp_grads, cp_saved) = runs
    torch.testing.assert_close(cp_loss, loss, rtol=0, atol=0)
    assert grads.keys() == cp_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(cp_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    with torch.no_grad():  # each block's inputs in the plain run, as tensors that need gradients
        tokens = model.x_embedder(x).flatten(2).transpose(1, 2) + model.pos_embed
        c = (model.t_embedder(t) + model.y_embedder(y, False)).requires_grad_()
    per_block, hw = [], (model.grid, model.grid)
    for block in model.blocks:
        inputs = (tokens.numel() + c.numel()) * 4
        per_block.append(saved_bytes(lambda block=block, tokens=tokens: block(tokens.requires_grad_(), c, hw)) - inputs)
        with torch.no_grad():
            tokens = block(tokens, c, hw)
    assert cp_saved < saved
    assert saved - cp_saved == sum(per_block)


@pytest.mark.parametrize('build', [
    lambda: WeightFormerDiT(SMALL_WF, input_size=8), lambda: DiT(dict(hidden_size=32, depth=2, num_heads=2),
                                                                  input_size=8)], ids=['wf-dit', 'dit'])
def test_sampling_runs_in_place_with_the_same_result(build):
    """At inference (sampling) the gated residuals and the GELU write into the branches' fresh outputs: the same
    values, bit for bit, as the out-of-place evaluation a forward hook gets, and less memory."""
    model = randomised(build(), 0.05, around_init=True).eval()
    x, t, y = torch.randn(3, 4, 8, 8), torch.tensor([1, 500, 999]), torch.tensor([0, 3, 7])
    with torch.no_grad():
        fast = model(x, t, y)
        for block in model.blocks:
            block.register_forward_hook(lambda m, i, o: None)
        hooked = model(x, t, y)
    assert torch.equal(fast, hooked)
