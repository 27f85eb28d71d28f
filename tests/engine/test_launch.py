"""mmwf.engine.launch: the runner a tool builds."""
import torch
from mmengine.config import Config

from mmwf.configs import FormattedOnceConfig, config_file
from mmwf.engine.launch import build_runner, restored_state


def test_a_short_run_formats_its_config_text_once(demo_data, tmp_path, monkeypatch):
    """Two iterations of the classification demo with a checkpoint each and a validation: the runner asks for its
    config's text for its log, the dumped config, the visualizer, the message hub and each checkpoint. yapf formats
    it once, and each of those holds mmengine's text of the config (a plain Config's, computed apart)."""
    import mmengine.config.config as mmengine_config
    root = demo_data / 'cls'
    cfg = Config.fromfile(str(config_file('weightformer_t_cls_demo')))
    cfg.merge_from_dict({'train_cfg.max_iters': 2, 'train_cfg.val_interval': 2, 'default_hooks.checkpoint.interval': 1,
                         'train_dataloader.batch_size': 2, 'val_dataloader.batch_size': 4,
                         'train_dataloader.dataset.data_root': str(root), 'val_dataloader.dataset.data_root': str(root),
                         'test_dataloader.dataset.data_root': str(root), 'work_dir': str(tmp_path),
                         'experiment_name': f'formatted_once_{tmp_path.name}', 'launcher': 'none'})
    calls = []
    format_code = mmengine_config.FormatCode
    monkeypatch.setattr(mmengine_config, 'FormatCode', lambda *a, **k: calls.append(1) or format_code(*a, **k))
    runner = build_runner(cfg, ('train', 'val'))
    with restored_state(runner):
        runner.train()
    assert type(runner.cfg) is FormattedOnceConfig and len(calls) == 1
    monkeypatch.undo()
    expected = Config(runner.cfg.to_dict(), filename=runner.cfg.filename).pretty_text
    assert runner.cfg.pretty_text == expected
    for name in ('iter_1.pth', 'iter_2.pth'):
        assert torch.load(tmp_path / name, weights_only=True)['meta']['cfg'] == expected
    assert (tmp_path / 'weightformer_t_cls_demo.py').read_text() == expected
