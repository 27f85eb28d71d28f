"""Where a training run meets the number of processes it runs on: the reference's per-rank seed, and a word when
the global batch is not the reference's and nothing scaled the recipe, under any runner."""
from __future__ import annotations

from mmengine.hooks import Hook
from mmengine.runner import IterBasedTrainLoop
from mmengine.runner.utils import set_random_seed

from mmwf.engine.world import (
    SEED_RULES,
    SETTING_KEY,
    describe_setting,
    global_batch,
    rank_seed,
    run_setting,
    setting_mismatch,
)
from mmwf.registry import HOOKS

from .runner_state import accumulative_counts, auto_scale_lr, is_resuming, loaded_file


@HOOKS.register_module()
class WorldSizeHook(Hook):
    """mmengine seeds every rank with the run's seed (``randomness.seed``) before the model is built. Before the
    first training iteration (the weights initialised or loaded, equal on every rank), a rank whose seed under the
    reference's rule differs from it is seeded again (python, numpy, torch on all devices) with that seed: the
    model-side draws (drop path, Mixup / CutMix, diffusion timesteps and noise, label dropout) differ across ranks
    exactly where the reference's do, and a single process draws as mmengine seeded it. Data loader workers and the
    sampler keep mmengine's seeds (the sampler: the run's seed on every rank, as DistributedSampler needs).

    Then compares the run's global batch (world size x per-GPU batch x accumulative_counts) with its reference's
    (``auto_scale_lr.base_batch_size``) and warns when they differ and the recipe was not scaled by the reference's
    rule (``tools/train.py --auto-scale-lr``, :func:`mmwf.engine.world.scale_to_world`), or was scaled by mmengine's
    lr-only rule instead.

    Each checkpoint records the setting the run trains with (:func:`~mmwf.engine.world.run_setting`: processes,
    per-GPU batch, accumulation, the world size ``--auto-scale-lr`` scaled the recipe for). A resume under another
    setting is refused before the first iteration, naming both and the fix: the resumed schedulers, optimizer and
    iteration count hold positions and an lr derived for the old one, so it would train another recipe.

    Args:
        seed_rule (str): the reference's rule, a key of :data:`mmwf.engine.world.SEED_RULES`. Defaults to
            'seed + rank'.
    """

    priority = 'VERY_HIGH'

    def __init__(self, seed_rule: str = 'seed + rank') -> None:
        if seed_rule not in SEED_RULES:
            raise ValueError(f'WorldSizeHook: seed_rule {seed_rule!r} is not one of {sorted(SEED_RULES)}')
        self.seed_rule = seed_rule

    def before_train(self, runner) -> None:
        if runner.cfg.get('randomness', {}).get('diff_rank_seed'):
            raise ValueError("randomness.diff_rank_seed=True adds the rank to the seed, and WorldSizeHook applies the "
                             f"reference's rule ({self.seed_rule!r}) as well: remove diff_rank_seed")
        seed = rank_seed(self.seed_rule, runner.seed, runner.rank, runner.world_size)
        if seed != runner.seed:  # one process, and the ranks a rule leaves at the run's seed, keep mmengine's stream
            set_random_seed(seed)
        runner.logger.info(f'rank {runner.rank} of {runner.world_size}: seed {seed} ({self.seed_rule}, seed '
                           f'{runner.seed})')
        self._check_global_batch(runner)

    @staticmethod
    def _setting(runner) -> dict:
        loader = runner.train_dataloader
        per_gpu = loader['batch_size'] if isinstance(loader, dict) else loader.batch_size
        return run_setting(runner.world_size, per_gpu, accumulative_counts(runner), auto_scale_lr(runner))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})[SETTING_KEY] = self._setting(runner)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not is_resuming(runner):  # load_from starts a new schedule: any setting fits
            return
        recorded = (checkpoint.get('meta') or {}).get(SETTING_KEY)
        if recorded is None:
            now = describe_setting(self._setting(runner))
            runner.logger.warning('resume: the checkpoint does not record the setting its run trained with '
                                  '(processes, per-GPU batch, accumulation; written before mmwf recorded it), so '
                                  f"this start's ({now}) is not checked against it")
            return
        problem = setting_mismatch(recorded, self._setting(runner))
        if problem:
            raise ValueError(f'resume from {loaded_file(runner) or "the checkpoint"}: {problem}')

    def _check_global_batch(self, runner) -> None:
        scaling = auto_scale_lr(runner)
        if 'base_batch_size' not in scaling:
            return
        per_gpu, accumulated = runner.train_dataloader.batch_size, accumulative_counts(runner)
        batch, reference = global_batch(runner.world_size, per_gpu, accumulated), int(scaling['base_batch_size'])
        run = f'global batch {batch} ({runner.world_size} processes x {per_gpu} x {accumulated} accumulated)'
        max_iters = runner.train_loop.max_iters if isinstance(runner.train_loop, IterBasedTrainLoop) else None
        fewer_images = max_iters is not None and runner.world_size * per_gpu != reference
        if scaling.get('scaled_for') != runner.world_size and fewer_images:
            # an iteration-based loop whose iterations do not each see a reference step's images
            runner.logger.warning(
                f'{run}: {max_iters} iterations train {max_iters * runner.world_size * per_gpu} images in '
                f'{max_iters // accumulated} optimizer steps, where the reference trains {max_iters * reference} in '
                f'{max_iters}. tools/train.py --auto-scale-lr scales the iterations, intervals and schedule to the '
                "reference's images")
        if batch == reference and scaling.get('rule', 'linear') == 'global_batch':
            return
        if scaling.get('scaled_for') == runner.world_size:
            runner.logger.info(f"{run}: recipe scaled by the reference's {scaling.get('rule', 'linear')!r} rule "
                               f'for {runner.world_size} processes (reference batch {reference})')
        elif scaling.get('enable'):
            runner.logger.warning(
                f"{run}: mmengine's auto_scale_lr scaled the lr alone by {batch / reference:g} (ignoring "
                f"accumulative_counts and the schedulers' minimum lr); the reference's rule is "
                f"{scaling.get('rule', 'linear')!r}: use tools/train.py --auto-scale-lr")
        elif batch != reference:
            runner.logger.warning(
                f"{run} differs from the reference's {reference} and nothing scales the recipe: the lr is the "
                f"reference's for another batch. tools/train.py --auto-scale-lr applies the reference's rule "
                f"({scaling.get('rule', 'linear')!r}), or set the batch so that the global batch is {reference}")
