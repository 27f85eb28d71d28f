"""One arch rule for the backbones and the denoisers: a known name (any case) or a dict with exactly the table's
keys; and the dynamic-block spec they share, beside the layers."""
import ast
import re
from pathlib import Path

import pytest

import mmwf.models.diffusion as diffusion
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.models.diffusion import DiT, WeightFormerDiT
from mmwf.models.diffusion.dit import ARCHS as DIT_ARCHS
from mmwf.models.diffusion.wf_dit import ARCHS as WF_DIT_ARCHS
from mmwf.models.layers import dynamic_block_ids, resolve_arch

TABLES = {'WeightFormer': WeightFormer.ARCH_SETTINGS, 'DeiT': DeiT.ARCH_SETTINGS, 'DiT': DIT_ARCHS,
          'WeightFormerDiT': WF_DIT_ARCHS}


@pytest.mark.parametrize('family', TABLES)
def test_every_named_arch_of_a_family_has_the_same_keys(family):
    """The required keys of a custom arch are those of the table's entries: every entry must have them all."""
    keys = [sorted(entry) for entry in TABLES[family].values()]
    assert all(k == keys[0] for k in keys)


@pytest.mark.parametrize('build,words', [
    (lambda: WeightFormer(dict(embed_dims=32, depth=2, mlp_ratio=2, num_head=2)),
     ["custom WeightFormer arch", "has unknown keys ['num_head']", 'needs exactly depth, embed_dims, mlp_ratio']),
    (lambda: DeiT(dict(embed_dims=32, depth=2, num_heads=2, mlp_ration=2)),
     ["custom DeiT arch", "lacks ['mlp_ratio'] and has unknown keys ['mlp_ration']",
      'needs exactly depth, embed_dims, mlp_ratio, num_heads']),
    (lambda: WeightFormerDiT(dict(hidden_size=32, depth=2, num_heads=2), input_size=8),
     ["custom WeightFormerDiT arch", "has unknown keys ['num_heads']", 'needs exactly depth, hidden_size']),
    (lambda: DiT(dict(hidden_size=32, depth=2), input_size=8),
     ["custom DiT arch", "lacks ['num_heads']", 'needs exactly depth, hidden_size, num_heads']),
], ids=['weightformer typo', 'deit typo', 'wf-dit extra key', 'dit missing key'])
def test_a_custom_arch_dict_needs_exactly_the_tables_keys(build, words):
    """A backbone's arch dict with a typo'd key was built with the typo silently ignored; now, in every family, a
    missing or an unknown key is an error naming it and the required set."""
    with pytest.raises(ValueError) as info:
        build()
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize('build,words', [
    (lambda: WeightFormer('xl'), ["unknown WeightFormer arch 'xl'", "choose from ['b', 's', 't', 't18']"]),
    (lambda: WeightFormerDiT('XL'), ["unknown WeightFormerDiT arch 'XL'", "choose from ['B', 'S']",
                                     'a dict with depth, hidden_size']),
], ids=['backbone', 'denoiser'])
def test_an_unknown_arch_name_lists_the_valid_names(build, words):
    with pytest.raises(ValueError) as info:
        build()
    assert all(w in str(info.value) for w in words), str(info.value)


def test_names_match_in_any_case_and_the_result_is_a_copy():
    assert resolve_arch('s', DIT_ARCHS, 'DiT') == DIT_ARCHS['S']
    assert WeightFormer(dict(embed_dims=32, depth=2, mlp_ratio=2)).arch == dict(embed_dims=32, depth=2, mlp_ratio=2)
    assert WeightFormer('T').arch == WeightFormer.ARCH_SETTINGS['t']
    resolve_arch('t', WeightFormer.ARCH_SETTINGS, 'WeightFormer')['depth'] = 1
    assert WeightFormer.ARCH_SETTINGS['t']['depth'] == 17


def test_dynamic_block_ids():
    assert dynamic_block_ids(dict(every=3, offset=1), 17) == {1, 4, 7, 10, 13, 16}
    assert dynamic_block_ids([0, -1], 5) == {0, 4}
    with pytest.raises(ValueError, match=re.escape('dynamic_blocks [5] out of range for depth 5')):
        dynamic_block_ids([5], 5)
    with pytest.raises(ValueError, match=re.escape("dynamic_blocks={'every': 0}")):
        dynamic_block_ids(dict(every=0), 5)


def test_the_denoisers_import_no_backbone_module():
    """Diffusion builds on the layers, not on a backbone family's module."""
    imported = []
    for path in Path(diffusion.__file__).parent.glob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                imported.append(('.' * node.level) + (node.module or ''))
            elif isinstance(node, ast.Import):
                imported += [alias.name for alias in node.names]
    assert imported and not [m for m in imported if 'backbones' in m]
