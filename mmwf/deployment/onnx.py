"""ONNX export of mmwf models with PyTorch's dynamo exporter, checked against PyTorch with ONNX Runtime.

The exported graph takes the normalised image batch (B, 3, H, W) and returns what the model's
``forward(x, mode='tensor')`` computes: a classifier's logits, the level maps of a detector's backbone + neck, a
segmentor's segmentation logits. Dynamic axes: batch and image size, where the architecture allows them
(:func:`dynamic_shapes` says which).
"""
from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn as nn

TASKS = {'mmpretrain': 'classifier', 'mmdet': 'backbone+neck', 'mmseg': 'segmentor'}  # by the config's scope
OPSET = 20  # GELU as one op (ONNX Runtime runs it fused; a function op, expanded where a runtime lacks it)


class ExportWrapper(nn.Module):
    """A task model as images -> tensors: ``classifier`` logits, ``backbone+neck`` maps, or ``segmentor`` logits.

    Args:
        model (nn.Module): an mmpretrain classifier, mmdet detector or mmseg segmentor (eval mode).
        kind (str): ``'classifier'``, ``'backbone+neck'`` or ``'segmentor'``.
    """

    KINDS = ('classifier', 'backbone+neck', 'segmentor')

    def __init__(self, model: nn.Module, kind: str) -> None:
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f'kind must be one of {self.KINDS}, got {kind!r}')
        self.model, self.kind = model, kind
        self.training = model.training  # the wrapper's mode is the model's (no recursion: the model keeps its own)

    def forward(self, x: torch.Tensor):
        if self.kind == 'backbone+neck':
            return tuple(self.model.extract_feat(x))
        return self.model(x, mode='tensor')


def exportable_model(config: str, checkpoint: str | None = None) -> tuple[ExportWrapper, dict]:
    """The config's model (random weights, or ``checkpoint`` loaded strictly) wrapped for export, and facts the
    export needs: ``kind``, ``stride`` (the input size must be a multiple of it), ``min_size`` (smallest side) and
    ``config`` (the Config, whose facts :func:`export_onnx` writes into the file)."""
    from mmwf.configs import build_task_model, task_model_config
    from mmwf.utils.checkpoint import load_state_dict_file, load_strict
    cfg, model_cfg = task_model_config(config)
    model = build_task_model(cfg.default_scope, model_cfg).eval()
    if checkpoint:
        load_strict(model, load_state_dict_file(checkpoint), checkpoint)
    kind = TASKS[cfg.default_scope]
    return ExportWrapper(model, kind), dict(export_facts(model.backbone, kind), config=cfg)


def export_facts(backbone: nn.Module, kind: str) -> dict:
    """What exporting a model of ``backbone`` needs: ``kind``, ``stride`` (the input size must be a multiple of it)
    and ``min_size`` (the smallest side)."""
    patch = backbone.patch_size
    stride = patch if kind == 'classifier' else 2 * patch  # the pyramids' 1/32 level halves the grid once more
    # export specialises a size of 1: every pooled grid (WeightFormer's 2 x 2 pooling, the pyramids' 1/32 level)
    # and every count of windows must stay above 1 for the graph to serve all sizes
    min_grid = max(4, *((getattr(b, 'window_size', 0) or 0) + 1 for b in getattr(backbone, 'blocks', [])))
    min_size = (min_grid * patch + stride - 1) // stride * stride
    return dict(kind=kind, stride=stride, min_size=min_size)


def dynamic_shapes(facts: dict, max_size: int = 4096, max_batch: int = 1024) -> dict:
    """torch.export dims for a batch and an image size that is a multiple of the model's stride, from ``min_size``
    (only the batch with ``facts['fixed_size']``)."""
    from torch.export import Dim
    if facts.get('fixed_size'):
        return {'x': {0: Dim('batch', min=1, max=max_batch)}}
    s = facts['stride']
    h = Dim('h', min=facts['min_size'] // s, max=max_size // s)
    w = Dim('w', min=facts['min_size'] // s, max=max_size // s)
    return {'x': {0: Dim('batch', min=1, max=max_batch), 2: s * h, 3: s * w}}


def export_onnx(module: nn.Module, shape: tuple[int, int], out: str, facts: dict, dynamic: bool = False,
                opset: int = OPSET) -> str:
    """Export ``module`` (in eval mode) at input (1, 3, H, W) (batch 2 when dynamic; on the device and in the dtype
    of its weights) with the dynamo exporter to ``out``, with :func:`graph_metadata` where ``facts`` hold the
    config."""
    if module.training:
        raise ValueError(f'{type(module).__name__} is in training mode: call .eval() before exporting (dropout, drop '
                         'path and batch statistics are training-only)')
    weight = next(module.parameters())
    x = torch.randn(2 if dynamic else 1, 3, *shape, dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        program = torch.onnx.export(module, (x,), dynamo=True, opset_version=opset, verbose=False,
                                    dynamic_shapes=dynamic_shapes(facts) if dynamic else None)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    program.save(out)
    if facts.get('config') is not None:
        write_metadata(out, graph_metadata(facts['config'], facts['kind'], shape))
    return out


def check_onnx(path: str, module: nn.Module, shapes: list[tuple[int, int, int, int]]) -> list[float]:
    """The largest absolute difference between ONNX Runtime and PyTorch over all outputs, per input shape."""
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    name = session.get_inputs()[0].name
    diffs = []
    for shape in shapes:
        x = torch.randn(*shape)
        with torch.no_grad():
            ref = module(x)
        ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        outs = session.run(None, {name: x.numpy()})
        if len(outs) != len(ref):
            raise RuntimeError(f'{path}: {len(outs)} outputs where PyTorch gives {len(ref)}')
        diffs.append(max(float(np.abs(o - r.numpy()).max()) for o, r in zip(outs, ref)))
    return diffs


# what each kind of graph returns, written into the file (``mmwf.outputs``)
OUTPUTS = {
    'classifier': 'logits (B, classes)',
    'backbone+neck': "the neck's level maps (B, C, H / s, W / s), finest first",
    'segmentor': "the decode head's logits (B, classes, H / 4, W / 4), before resizing to the image",
    'detector': 'boxes (n, 4) x1 y1 x2 y2 in the padded input\'s pixels, scores (n,), labels (n,) int64 indices of '
                'mmwf.classes, masks (n, 28, 28) mask probabilities of each box\'s class',
}


def config_classes(cfg) -> list[str]:
    """The classes a config's model predicts: its test dataset's ``metainfo`` classes, else its dataset type's."""
    from mmengine.registry import DATASETS, DefaultScope
    dataset = (cfg.get('test_dataloader') or cfg.get('val_dataloader') or {}).get('dataset', {})
    while 'dataset' in dataset:  # wrappers
        dataset = dataset['dataset']
    classes = (dataset.get('metainfo') or {}).get('classes')
    if classes:
        return [str(c) for c in classes]
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmengine')):
        kind = DATASETS.get(dataset.get('type', '')) if dataset.get('type') else None
    return [str(c) for c in (getattr(kind, 'METAINFO', {}) or {}).get('classes', ())]


def graph_metadata(cfg, task: str, size: tuple[int, int]) -> dict[str, str]:
    """What a deployed graph needs beside its weights, as ONNX metadata (strings): the task, the classes, the data
    preprocessor's mean and std, the export input size, what the outputs are, and the whole config (its test
    pipeline and test settings), so that the file is used without the config."""
    import json

    from mmwf.version import __version__
    pre = cfg.model.get('data_preprocessor') or cfg.get('data_preprocessor') or {}
    return {'mmwf.task': task, 'mmwf.classes': json.dumps(config_classes(cfg)),
            'mmwf.mean': json.dumps(list(pre.get('mean', []))), 'mmwf.std': json.dumps(list(pre.get('std', []))),
            'mmwf.input_size': f'{size[0]} {size[1]}', 'mmwf.outputs': OUTPUTS[task],
            'mmwf.config': cfg.pretty_text, 'mmwf.version': __version__}


def write_metadata(path: str, metadata: dict[str, str]) -> None:
    """Add ``metadata`` to the ONNX file's ``metadata_props`` (written again whole)."""
    import onnx

    from mmwf.utils.checkpoint import atomic_write
    model = onnx.load(path)
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, **metadata})
    atomic_write(path, lambda f: f.write(model.SerializeToString()))


def preprocessing(cfg, scope: str) -> tuple:
    """The config's test pipeline (without its annotations) and data preprocessor, built under ``scope`` for that
    moment only (the process's current scope is left as it was)."""
    from mmengine.dataset import Compose
    from mmengine.registry import MODELS, DefaultScope
    with DefaultScope.overwrite_default_scope(scope):
        return (Compose([t for t in cfg.test_pipeline if t['type'] != 'LoadAnnotations']),
                MODELS.build(cfg.model.data_preprocessor))


def preprocess(pipeline, preprocessor, image: str) -> tuple[torch.Tensor, dict]:
    """The preprocessed (1, 3, H, W) batch of one image file and its metainfo."""
    data = pipeline(dict(img_path=image, img_id=0))
    data = preprocessor(dict(inputs=[data['inputs']], data_samples=[data['data_samples']]), False)
    return data['inputs'], data['data_samples'][0].metainfo


def preprocessed_sizes(cfg, scope: str, image_sizes: tuple[tuple[int, int], ...] = ((480, 640), (640, 427))
                       ) -> set[tuple[int, int]]:
    """The input sizes the config's test preprocessing gives images of ``image_sizes`` (H, W): one size where it pads
    to a fixed size, several where the size follows the image."""
    import tempfile

    from PIL import Image
    pipeline, preprocessor = preprocessing(cfg, scope)
    sizes = set()
    with tempfile.TemporaryDirectory() as folder:
        for h, w in image_sizes:
            path = os.path.join(folder, f'{h}x{w}.png')
            Image.new('RGB', (w, h)).save(path)
            sizes.add(tuple(preprocess(pipeline, preprocessor, path)[0].shape[2:]))
    return sizes


class ImageSession:
    """An exported graph run by ONNX Runtime on image files, after the config's test pipeline (without its
    annotations) and data preprocessor; the config is the one the export wrote into the file (``mmwf.config``),
    or ``config``. A graph of another task is refused.

    Args:
        path (str): the ONNX file.
        config (str, optional): the model's config. Defaults to None (the file's own).
        providers (list[str], optional): ONNX Runtime execution providers. Defaults to the CPU's.
    """

    SCOPE = ''  # the config's codebase (its registry of models): set by each subclass
    TASK = ''  # the graph's task (``mmwf.task``): set by each subclass

    def __init__(self, path: str, config: str | None = None, providers: list[str] | None = None) -> None:
        import onnxruntime as ort
        from mmengine.config import Config
        self.path = path
        self.session = ort.InferenceSession(path, providers=providers or ['CPUExecutionProvider'])
        self.metadata = dict(self.session.get_modelmeta().custom_metadata_map)
        task = self.metadata.get('mmwf.task')
        if task is not None and task != self.TASK:
            raise ValueError(f'{path} is a {task} graph (its mmwf.task); {type(self).__name__} runs a {self.TASK}')
        if config is None and 'mmwf.config' not in self.metadata:
            raise ValueError(f'{path} holds no config (exported before mmwf wrote its metadata): give the config it '
                             'was exported from')
        self.cfg = (Config.fromfile(config) if config is not None
                    else Config.fromstring(self.metadata['mmwf.config'], '.py'))
        self.pipeline, self.preprocessor = preprocessing(self.cfg, self.SCOPE)

    def inputs(self, image: str) -> tuple[torch.Tensor, dict]:
        """The preprocessed (1, 3, H, W) batch of one image file and its metainfo (an unreadable file is an error
        naming it)."""
        from mmwf.utils.arrays import read_image
        read_image(image)
        return preprocess(self.pipeline, self.preprocessor, image)

    def check_size(self, inputs: torch.Tensor, what: str) -> None:
        """Refuse ``inputs`` (B, 3, H, W) whose size a static graph does not take (its input's fixed dims), naming
        ``what`` (the image), both sizes and the fix, before ONNX Runtime would fail on them in its own words."""
        graph = self.session.get_inputs()[0].shape[2:]
        size = tuple(inputs.shape[2:])
        if any(isinstance(g, int) and g != s for g, s in zip(graph, size)):
            fixed = ' x '.join(str(g) if isinstance(g, int) else 'any' for g in graph)
            raise ValueError(f'{what}: the graph {self.path} takes {fixed} inputs (exported at that size), the '
                             f'config\'s test preprocessing gives {size[0]} x {size[1]}: export it at this size '
                             '(tools/deployment/pytorch2onnx.py --shape H W), with --dynamic where the task allows, '
                             'or give the config it was exported with')

    def predict(self, inputs: torch.Tensor, meta: dict):
        """The prediction for one preprocessed image (``inputs`` and ``meta`` from :meth:`inputs`)."""
        raise NotImplementedError

    def __call__(self, image: str):
        """:meth:`predict` of one image file."""
        return self.predict(*self.inputs(image))
