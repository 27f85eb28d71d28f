"""The documentation's examples: every code block of docs/ is either run here as it stands or names what it needs
that a test machine does not have (a dataset, GPUs, a download, a trained checkpoint) and the test that runs the
same path at a small size; a new block fails until it is one or the other."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mmengine.config import Config

from tests.tool_runner import run_python, typed_words

ROOT = Path(__file__).resolve().parents[1]
NEEDS_COCO = 'COCO (the demo data stands in: tests/tools/test_train_tools.py)'
# (page, the block's first line) -> 'run' or what it needs and where its path is tested small
EXAMPLES = {
    ('benchmarks.md', 'python tools/analysis/benchmark.py workload'): 'minutes of CPU (tests/analysis)',
    ('benchmarks.md', 'python tools/analysis/benchmark.py inference --models weightformer_t'): 'minutes of CPU '
    '(tests/analysis runs the tool small; tests/tools/test_cuda_check.py its compiled steps)',
    ('get_started.md', 'make demo'): 'the whole set-up and suite (CI runs it)',
    ('get_started.md', 'pip install --no-build-isolation .'): 'a pip install (tests/test_config_export.py builds '
                                                                'and installs the wheel, then trains with its tools)',
    ('gpu.md', 'bash tools/cuda_check.sh'): 'a GPU (tests/tools/test_cuda_check.py runs the dry run)',
    ('guides/coco_ade20k.md', 'bash tools/dist_train.sh'): f'GPUs and {NEEDS_COCO}',
    ('guides/deployment.md', 'python tools/deployment/pytorch2onnx.py configs/imagenet'): 'a trained checkpoint '
                                                                                        '(tests/deployment)',
    ('guides/deployment.md', 'python tools/deployment/pytorch2onnx.py configs/cascade'): 'a trained checkpoint '
                                                                                       '(tests/deployment)',
    ('guides/deployment.md', 'from mmwf.deployment import DetectorSession'): 'an exported graph (tests/deployment)',
    ('guides/distributed.md', 'bash tools/dist_train.sh'): 'GPUs or nodes (tests/engine: gloo processes)',
    ('guides/frontends.md', 'import mmwf, timm'): 'run (tests/models/frontends/test_timm.py: an offline hub cache)',
    ('guides/frontends.md', 'import mmwf.model_hub'): 'the hub (tests/test_model_hub.py: an offline cache)',
    ('guides/generation.md', 'from diffusers import'): 'run (tests/models/diffusion/test_diffusers.py)',
    ('guides/generation.md', 'import mmwf\nfrom diffusers'): 'run (tests/models/diffusion/test_diffusers.py)',
    ('guides/generation.md', 'huggingface-cli download'): 'ImageNet and downloads '
                                                          '(tests/tools/test_generation_tools.py)',
    ('guides/generation.md', "# pytorch-fid's port"): 'downloads (tests/tools/test_generation_tools.py)',
    ('guides/imagenet.md', 'python tools/test.py'): 'ImageNet (tests/configs/test_imagenet_configs.py)',
    ('guides/linear_attention_vits.md', "_base_ = './my_mask_rcnn_deit_b_relu.py'"): 'a config of the reader\'s '
                                                                                  '(tests/configs/test_configs.py)',
    ('kernel_choice.md', 'import torch\nfrom mmengine.config import Config'): 'run (tests/test_docs.py)',
    ('kernel_choice.md', 'adaptive_pool: auto -> tokens'): 'the output of the block above (tests/test_docs.py)',
    ('guides/your_project.md', 'python -m mmwf.configs --list'): 'run',
    ('guides/your_project.md', '# configs/my_det.py'): 'run (tests/test_config_export.py)',
    ('guides/your_project.md', 'python tools/train.py configs/cascade_wf_t_coco.py'): NEEDS_COCO,
    ('guides/your_project.md', '# configs/small.py'): 'run',
    ('guides/your_project.md', 'from mmdet.apis import DetInferencer'): 'run',
    ('guides/your_project.md', '# configs/mask_rcnn_wf_t.py'): 'run',
    ('guides/your_project.md', '# configs/upernet_wf_t.py'): 'run',
    ('guides/your_project.md', '# configs/my_seg.py'): 'run (tests/test_config_export.py)',
    ('guides/your_project.md', '# configs/my_cls.py'): 'run (tests/test_config_export.py)',
}


def blocks() -> list[tuple[str, str, str]]:
    """(page, language, text) of every fenced code block of the documentation's pages."""
    found = []
    for page in sorted((ROOT / 'docs').rglob('*.md')):
        for language, text in re.findall(r'^```(\w+)\n(.*?)^```', page.read_text(), flags=re.S | re.M):
            found.append((str(page.relative_to(ROOT / 'docs')), language, text))
    return found


def test_every_example_is_run_or_says_what_it_needs():
    keys = [(page, next((k for p, k in EXAMPLES if p == page and text.startswith(k)), None)) for page, _, text in
            blocks()]
    assert [key for key in keys if key[1] is None] == []
    assert set(keys) == set(EXAMPLES)


def block(page: str, first: str) -> str:
    return next(text for p, _, text in blocks() if p == page and text.startswith(first))


def test_the_config_examples_of_your_project_run(tmp_path):
    """The guide's commands and configs as written, in a project folder: the export, then each config read by
    mmengine and loaded as mmwf's tools load it (the small recipe at its size; the config with our modules built)."""
    for line in block('guides/your_project.md', 'python -m mmwf.configs --list').splitlines():
        words = typed_words(line, tmp_path)  # as typed; the python command run with the venv's python
        assert words[0] == 'python', line
        res = run_python(words[1:], cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
    from mmwf.configs import follow_image_size
    for first, name in (('# configs/my_det.py', 'my_det.py'), ('# configs/small.py', 'small.py')):
        (tmp_path / 'configs' / name).write_text(block('guides/your_project.md', first))
    det = Config.fromfile(str(tmp_path / 'configs/my_det.py'))
    assert det.train_dataloader.dataset.metainfo.classes == ('circle', 'square', 'triangle')
    assert [h.num_classes for h in det.model.roi_head.bbox_head] == [3, 3, 3]
    small = Config.fromfile(str(tmp_path / 'configs/small.py'))
    follow_image_size(small)
    assert small.model.data_preprocessor.pad_size_divisor == 256
    assert small.train_dataloader.dataset.pipeline[4].crop_size == (256, 256)


def test_our_backbone_in_mmdets_own_config_trains_a_step(tmp_path):
    """The guide's config on mmdet's Mask R-CNN config, as printed: our backbone and pyramid replace ResNet and FPN
    (the merge keeps none of their keys), the detector and the layer-decay optimizer build in mmdet's scope, and one
    training step on mmdet's demo inputs gives finite losses."""
    import torch
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    from mmdet.utils import register_all_modules
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    text = block('guides/your_project.md', '# configs/mask_rcnn_wf_t.py')
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs/mask_rcnn_wf_t.py').write_text(text)
    cfg = Config.fromfile(str(tmp_path / 'configs/mask_rcnn_wf_t.py'))
    assert set(cfg.model.backbone) == {'type', 'arch', 'out_indices', 'drop_path_rate', 'init_cfg'}
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-4, weight_decay=0.1)
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(dict(cfg.model, backbone=dict(cfg.model.backbone, init_cfg=None)))
        optim = build_optim_wrapper(model, cfg.optim_wrapper)
    assert type(model.backbone).__name__ == 'WeightFormer' and type(model.neck).__name__ == 'SimpleFeaturePyramid'
    torch.manual_seed(0)
    packed = demo_mm_inputs(2, [[3, 128, 96]] * 2, num_classes=80, with_mask=True)
    losses = model.train_step(dict(inputs=[p for p in packed['inputs']], data_samples=packed['data_samples']), optim)
    assert losses and all(torch.isfinite(v).all() for v in losses.values())


@pytest.mark.slow
def test_the_inferencer_example_runs_on_our_configs(demo_data, tmp_path):
    """mmdet's DetInferencer and mmseg's MMSegInferencer on the demo configs and checkpoints of them (random weights
    here) and the demo's data, the guide's lines as written in a project folder: each draws its image."""
    import torch

    from mmwf.configs import build_task_model, task_model_config
    (tmp_path / 'configs').symlink_to(ROOT / 'configs')
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'demo').symlink_to(demo_data)
    for name, scope, iters in (('cascade_wf_t_demo', 'mmdet', 450), ('upernet_wf_t_demo', 'mmseg', 600)):
        _, model_cfg = task_model_config(str(ROOT / f'configs/demo/{name}.py'))
        weights = tmp_path / f'work_dirs/{name}/iter_{iters}.pth'
        weights.parent.mkdir(parents=True)
        torch.save({'state_dict': build_task_model(scope, model_cfg).state_dict(), 'meta': {}}, weights)
    code = block('guides/your_project.md', 'from mmdet.apis import DetInferencer')
    res = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS='1'), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for task in ('det', 'seg'):
        drawn = tmp_path / f'outputs/{task}/vis/00000.jpg'
        assert drawn.stat().st_size > 1000, task


def test_the_model_zoo_page_carries_the_metafiles_weight_links():
    """The site's model zoo page (:func:`mmwf.model_zoo.model_zoo_tables`, through the site's hooks) links each
    config's released weights as its metafile gives them, and nothing where the metafile has none."""
    from mmwf.configs import metafile_models
    from mmwf.model_zoo import model_zoo_tables
    rows = {line.split('|')[1].strip(' `'): line for line in model_zoo_tables().splitlines()
            if line.startswith('| `')}
    models = metafile_models().values()
    assert len(rows) == len(models)
    for model in models:
        weights = model.get('Weights')
        assert rows[model['Config']].endswith(f'| [released]({weights}) |' if weights else '| - |'), model['Name']
    assert sum(bool(m.get('Weights')) for m in models) >= 3


def test_the_kernel_choice_page_shows_the_codes_table_costs_and_output(capsys, monkeypatch):
    """docs/kernel_choice.md: its table is ``kernel_table()``'s rendering of the code's; its example, run as printed
    from the repository root, prints the output the page shows; its costs are WF-T's first Bilateral update's (49
    pooled of 196 tokens) with the devices' charges for a weight formed per sample in training."""
    from mmwf.models.layers import BilateralDynamicLinear
    from mmwf.models.layers.implementation import ELEMENT_PASS_COST, ELEMENT_PASSES, kernel_table
    page = (ROOT / 'docs/kernel_choice.md').read_text()
    table = page.split('<!-- kernel_table() -->\n', 1)[1].split('<!-- end of kernel_table() -->', 1)[0]
    assert table == kernel_table()
    monkeypatch.chdir(ROOT)
    exec(compile(block('kernel_choice.md', 'import torch\n'), 'kernel_choice.md', 'exec'), {})
    assert capsys.readouterr().out == block('kernel_choice.md', 'adaptive_pool: ')
    rows = {line.split('|')[1].strip(' `'): [int(cell.replace(',', '')) for cell in line.split('|')[2:6]]
            for line in page.splitlines() if line.startswith(('| `factored` |', '| `materialized` |'))}
    costs = BilateralDynamicLinear(192, 768).costs(49, 196)
    charge = {device: ELEMENT_PASS_COST[device] * ELEMENT_PASSES[True] * 192 * 768 for device in ('cuda', 'cpu')}
    assert rows == {'factored': [costs['factored']['tokens'], costs['factored']['core'], 0, 0],
                    'materialized': [costs['materialized']['tokens'], costs['materialized']['core'], charge['cuda'],
                                     charge['cpu']]}


# paths the pages name that are other projects' (timm's test file, detectron2's configs), not this repository's
REFERENCE_PATHS = {'tests/test_models.py', 'configs/common/models/mask_rcnn_vitdet.py',
                   'configs/common/models/mask_rcnn_fpn.py'}


def test_every_file_the_pages_name_exists():
    """A file of this repository named in backquotes on a page (a test, a tool, a config, a module) exists: a page
    that points to a moved file fails here rather than sending a reader nowhere."""
    missing = []
    for page in [*(ROOT / 'docs').rglob('*.md'), ROOT / 'README.md']:
        if 'cuda_check' in page.parts:  # the GPU runs' own records, as they were written
            continue
        for path in re.findall(r'`((?:tests|tools|configs|mmwf|docs)/[\w./-]+)(?:::[^`]*)?`', page.read_text()):
            if path not in REFERENCE_PATHS and not (ROOT / path.rstrip('/')).exists():
                missing.append(f'{page.relative_to(ROOT)}: {path}')
    assert missing == []


def test_our_backbone_in_mmsegs_own_config_trains_a_step(tmp_path):
    """The guide's config on mmseg's UperNet config, as printed: our backbone replaces ResNet (none of its keys
    kept, its ImageNet checkpoint not put into our init_cfg), and UperNet trains a step on four maps of 192 channels
    (SyncBN as BN on this CPU, as mmwf's tools run it)."""
    import torch
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    from mmseg.utils import register_all_modules

    from mmwf.utils import adapt_to_device
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs/upernet_wf_t.py').write_text(block('guides/your_project.md', '# configs/upernet_wf_t.py'))
    cfg = Config.fromfile(str(tmp_path / 'configs/upernet_wf_t.py'))
    assert set(cfg.model.backbone) == {'type', 'arch', 'out_indices', 'drop_path_rate', 'init_cfg'}
    adapt_to_device(cfg)
    register_all_modules(init_default_scope=False)
    preprocessor = dict(cfg.model.data_preprocessor, size=(128, 96))  # the samples' size: no pad to 512 on a CPU
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(dict(cfg.model, backbone=dict(cfg.model.backbone, init_cfg=None),
                                  data_preprocessor=preprocessor))
        optim = build_optim_wrapper(model, cfg.optim_wrapper)
    assert type(model.backbone).__name__ == 'WeightFormer' and model.backbone.init_cfg is None
    torch.manual_seed(0)
    samples = []
    for _ in range(2):
        sample = SegDataSample(gt_sem_seg=PixelData(data=torch.randint(0, 150, (1, 128, 96))))
        sample.set_metainfo(dict(img_shape=(128, 96), ori_shape=(128, 96)))
        samples.append(sample)
    data = dict(inputs=[torch.randint(0, 256, (3, 128, 96), dtype=torch.uint8) for _ in range(2)], data_samples=samples)
    losses = model.train_step(data, optim)
    assert losses and all(torch.isfinite(v).all() for v in losses.values())
