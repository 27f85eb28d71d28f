"""diffusers with our denoisers: DDPMScheduler configured as IDDPM samples what our sampler samples, DDIM and
DPM-Solver as options, and WF-DiT / DiT as the transformer of diffusers' DiTPipeline (the same images as our sampler
from the same noise) with save_pretrained / from_pretrained."""
import pytest
import torch

from mmwf.models.diffusion import LatentDiffusion, space_timesteps
from tests.reference import randomised
from tests.tolerance import assert_same_computation
from tests.tool_runner import run_tool

IDDPM = dict(type='DDPMScheduler', variance_type='learned_range', clip_sample=False)


def small(family='WeightFormerDiT', **kwargs):
    arch = dict(hidden_size=32, depth=3) if family == 'WeightFormerDiT' else dict(hidden_size=32, depth=2, num_heads=2)
    return dict(type=family, arch=arch, **dict(dict(input_size=8, in_channels=3, num_classes=3), **kwargs))


@pytest.mark.parametrize('cfg_scale', [1.0, 2.5])
def test_ddpm_scheduler_as_iddpm_samples_what_our_sampler_samples(cfg_scale):
    """The same weights, steps and per-sample noise: diffusers' step in its float32 schedule against IDDPM's in
    float64 agree to 2e-5 of the samples' range after 50 steps (measured: 5e-6; a random denoiser's x_0 estimate
    grows to hundreds, and a larger random perturbation amplifies the rounding further); the learned variance is read
    by both."""
    ours = LatentDiffusion(small(), sampling_steps='50', cfg_scale=cfg_scale)
    randomised(ours.denoiser, 0.005, around_init=True, seed=1).eval()
    theirs = LatentDiffusion(small(), sampling_steps='50', cfg_scale=cfg_scale, scheduler=IDDPM)
    theirs.denoiser.load_state_dict(ours.denoiser.state_dict())
    labels = torch.tensor([0, 1, 2, 1])
    a = ours.sample(labels, ours.sample_generators(torch.arange(4), 'cpu'))
    b = theirs.sample(labels, theirs.sample_generators(torch.arange(4), 'cpu'))
    assert a.abs().max() > 0.5
    torch.testing.assert_close(b, a, rtol=0, atol=2e-5 * a.abs().max().item())
    # the step noise is used: another sample seed moves both alike
    theirs.sample_seed = 1
    c = theirs.sample(labels, theirs.sample_generators(torch.arange(4), 'cpu'))
    assert (c - b).abs().max() > 0.1


def test_diffusers_linspace_spacing_is_iddpms_for_the_usual_step_counts():
    from diffusers import DDPMScheduler
    for n in (25, 50, 100, 250):
        scheduler = DDPMScheduler(timestep_spacing='linspace')
        scheduler.set_timesteps(n)
        assert sorted(scheduler.timesteps.tolist()) == space_timesteps(1000, n), n


def test_fast_schedulers_are_options_and_bad_ones_are_named():
    labels = torch.tensor([0, 2])
    base = LatentDiffusion(small(), sampling_steps='10')
    randomised(base.denoiser, 0.02, around_init=True, seed=1).eval()
    for scheduler in (dict(type='DDIMScheduler'), dict(type='DPMSolverMultistepScheduler')):
        model = LatentDiffusion(small(), sampling_steps='10', scheduler=scheduler)
        model.denoiser.load_state_dict(base.denoiser.state_dict())
        x = model.sample(labels, model.sample_generators(torch.arange(2), 'cpu'))
        again = model.sample(labels, model.sample_generators(torch.arange(2), 'cpu'))
        assert x.shape == (2, 3, 8, 8) and torch.isfinite(x).all() and torch.equal(x, again)
        assert len(model.scheduler.timesteps) == 10
    with pytest.raises(ValueError, match="scheduler type 'Nope' is not a diffusers scheduler"):
        LatentDiffusion(small(), scheduler=dict(type='Nope'))
    with pytest.raises(ValueError, match=r"\['beta_end', 'num_train_timesteps'\] come from the model"):
        LatentDiffusion(small(), scheduler=dict(type='DDIMScheduler', num_train_timesteps=500, beta_end=0.01))


@pytest.fixture(scope='module')
def vae_dir(tmp_path_factory):
    """A tiny diffusers AutoencoderKL (8x down, 4 latent channels), saved as a folder."""
    from diffusers import AutoencoderKL
    root = tmp_path_factory.mktemp('vae')
    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(8, 8, 8, 8), down_block_types=('DownEncoderBlock2D',) * 4,
                  up_block_types=('UpDecoderBlock2D',) * 4, layers_per_block=1, latent_channels=4,
                  norm_num_groups=4, sample_size=32).save_pretrained(root)
    return root


@pytest.mark.parametrize('family', ['WeightFormerDiT', 'DiT'])
def test_dit_pipeline_with_our_transformer_draws_our_samples(vae_dir, tmp_path, family):
    """diffusers' DiTPipeline with our denoiser (as MMWFTransformer2DModel), the VAE and the DDIM scheduler of our
    model draws, from the same per-sample noise, the images our sampler draws; the transformer and the whole
    pipeline go through save_pretrained / from_pretrained unchanged."""
    from diffusers import DiTPipeline

    from mmwf.models.diffusion.diffusers_model import MMWFTransformer2DModel
    ours = LatentDiffusion(small(family, input_size=4, in_channels=4, num_classes=1000), vae_path=str(vae_dir),
                           sampling_steps='10', scheduler=dict(type='DDIMScheduler'))
    randomised(ours.denoiser, 0.05, around_init=True, seed=1).eval()
    transformer = MMWFTransformer2DModel.from_denoiser(ours.denoiser)
    pipe = DiTPipeline(transformer, ours.vae.vae, ours.scheduler)
    pipe.set_progress_bar_config(disable=True)
    labels = [3, 999]  # 1000 is the unconditional label DiTPipeline uses

    def draw(pipeline):
        return pipeline(class_labels=labels, guidance_scale=1.0, num_inference_steps=10, output_type='pt',
                        generator=ours.sample_generators(torch.arange(2), 'cpu')).images
    images = draw(pipe)
    latents = ours.sample(torch.tensor(labels), ours.sample_generators(torch.arange(2), 'cpu'))
    expected = (ours.vae.decode(latents) / 2 + 0.5).clamp(0, 1)
    assert images.shape == (2, 3, 32, 32) and expected.std() > 1e-3
    torch.testing.assert_close(images, expected, rtol=0, atol=1e-5)

    transformer.save_pretrained(tmp_path / 'transformer')
    loaded = MMWFTransformer2DModel.from_pretrained(tmp_path / 'transformer')
    assert type(loaded.denoiser).__name__ == family and loaded.config.out_channels == 8
    x, t, y = torch.randn(2, 4, 4, 4), torch.tensor([5, 700]), torch.tensor([1, 2])
    assert_same_computation(loaded(x, t, y).sample, transformer(x, t, y).sample)
    pipe.save_pretrained(tmp_path / 'pipeline')
    again = DiTPipeline.from_pretrained(tmp_path / 'pipeline')
    again.set_progress_bar_config(disable=True)
    assert isinstance(again.transformer, MMWFTransformer2DModel)
    assert_same_computation(draw(again), images)
    with pytest.raises(ValueError, match='out_channels 4 does not fit in_channels 4 with learn_sigma=True'):
        MMWFTransformer2DModel(arch=dict(hidden_size=32, depth=3), out_channels=4)


def test_pipeline_labels_are_the_models_classes_and_its_unconditional_label(vae_dir):
    """A 3-class model in DiTPipeline: the pipeline's unconditional label (1000) reaches the denoiser as the model's
    own (3), so guidance works; a label past the classes is refused by name (it would have sampled unconditionally,
    and 1000 under guidance was an IndexError)."""
    from diffusers import DiTPipeline

    from mmwf.models.diffusion.diffusers_model import MMWFTransformer2DModel
    ours = LatentDiffusion(small(input_size=4, in_channels=4, num_classes=3), vae_path=str(vae_dir),
                           sampling_steps='4', scheduler=dict(type='DDIMScheduler'))
    transformer = MMWFTransformer2DModel.from_denoiser(ours.denoiser)
    seen = []
    transformer.denoiser.register_forward_pre_hook(lambda m, args: seen.append(args[2].tolist()))
    pipe = DiTPipeline(transformer, ours.vae.vae, ours.scheduler)
    pipe.set_progress_bar_config(disable=True)
    images = pipe(class_labels=[0, 2], guidance_scale=4.0, num_inference_steps=4, output_type='pt').images
    assert images.shape == (2, 3, 32, 32) and torch.isfinite(images).all()
    assert seen and all(labels == [0, 2, 3, 3] for labels in seen)
    with pytest.raises(ValueError, match=r'class labels \[3\] are not classes of this model \(3: 0 to 2\); 1000 is '
                                         r"DiTPipeline's unconditional label"):
        pipe(class_labels=[3], guidance_scale=1.0, num_inference_steps=4, output_type='pt')


def test_from_pretrained_is_strict(tmp_path):
    """diffusers warns of unexpected keys and leaves missing ones random; the transformer's from_pretrained refuses
    both, naming the keys, and strict=False is the explicit opt-out."""
    from safetensors.torch import load_file, save_file

    from mmwf.models.diffusion.diffusers_model import MMWFTransformer2DModel
    from mmwf.utils.checkpoint import CheckpointMismatchError
    model = MMWFTransformer2DModel.from_denoiser(LatentDiffusion(small(input_size=4, in_channels=4)).denoiser)
    model.save_pretrained(tmp_path / 'ok')
    MMWFTransformer2DModel.from_pretrained(tmp_path / 'ok')
    model.save_pretrained(tmp_path / 'bad')
    weights = tmp_path / 'bad' / 'diffusion_pytorch_model.safetensors'
    state = load_file(str(weights))
    state['denoiser.extra'] = state.pop('denoiser.final_layer.linear.bias')
    save_file(state, str(weights))
    with pytest.raises(CheckpointMismatchError, match=r'(?s)does not match MMWFTransformer2DModel.*missing keys \(1\): '
                                                      r'denoiser.final_layer.linear.bias.*unexpected keys \(1\)'):
        MMWFTransformer2DModel.from_pretrained(tmp_path / 'bad')
    loaded = MMWFTransformer2DModel.from_pretrained(tmp_path / 'bad', strict=False)
    assert torch.equal(loaded.denoiser.x_embedder.proj.weight, model.denoiser.x_embedder.proj.weight)


# mmengine's registries (built when mmdet and mmseg are imported) read the file of every imported module: that does
# not run the diffusers model's module
NO_DIFFUSERS_YET = "import mmwf, sys, mmdet.registry, mmseg.registry\nassert 'diffusers' not in sys.modules\n"


def test_diffusers_is_needed_only_by_the_diffusers_model():
    """diffusers is a requirement of generation only: without it mmwf, mmdet and mmseg import, and the diffusers model
    names what it misses at each use (not a half-imported module's 'cannot import name')."""
    res = run_tool('-c', '\n'.join([
        'import sys', "sys.modules['diffusers'] = None  # as if not installed",
        'import mmwf, mmdet.registry, mmseg.registry', 'for _ in range(2):', '    try:',
        '        from mmwf.models.diffusion.diffusers_model import MMWFTransformer2DModel',
        '    except ModuleNotFoundError as e:', '        print(e)']))
    assert res.stdout.splitlines() == ['import of diffusers halted; None in sys.modules'] * 2


def test_the_guides_pipeline_is_saved_and_loads_in_a_fresh_process_after_import_mmwf(vae_dir, tmp_path, monkeypatch):
    """The generation guide's two blocks as written, at a small size: a trained model's denoiser in DiTPipeline,
    sampled and saved; then, in a fresh process, ``import mmwf`` (which does not import diffusers) is all that
    DiTPipeline.from_pretrained needs (diffusers resolves a component's module only if the process imported it), and
    the pipeline read back draws the images the saved one draws."""
    import shutil

    from tests.test_docs import block
    model = LatentDiffusion(small(input_size=4, in_channels=4, num_classes=1000), vae_path=str(vae_dir))
    randomised(model.denoiser, 0.05, around_init=True, seed=1)
    shutil.copytree(vae_dir, tmp_path / 'checkpoints/sd-vae-ft-ema')
    monkeypatch.chdir(tmp_path)
    saved = dict(model=model)
    exec(block('guides/generation.md', 'from diffusers import'), saved)
    assert [image.size for image in saved['images']] == [(32, 32)] * 2
    draw = ("pipe.set_progress_bar_config(disable=True)\n"
            "images = pipe(class_labels=[3, 999], guidance_scale=1.0, num_inference_steps=4, output_type='pt', "
            "generator=[torch.Generator().manual_seed(s) for s in (0, 1)]).images")
    run_tool('-c', '\n'.join([
        block('guides/generation.md', 'import mmwf\nfrom diffusers import DiTPipeline'), 'import sys, torch',
        "assert type(pipe.transformer).__name__ == 'MMWFTransformer2DModel'", draw,
        "torch.save(images, 'images.pt')"]).replace('import mmwf\n', NO_DIFFUSERS_YET, 1), cwd=tmp_path)
    drawn = dict(pipe=saved['pipe'], torch=torch)
    exec(draw, drawn)
    assert drawn['images'].std() > 1e-3
    assert_same_computation(torch.load(tmp_path / 'images.pt'), drawn['images'])
