"""FID / IS maths on inputs whose distances are known, the Inception loader's file handling, and the metric."""
import numpy as np
import pytest
import torch

from mmwf.evaluation import fid as ev


def random_rotation(d, rng):
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return q


def test_frechet_distance_of_gaussians_in_closed_form():
    rng = np.random.default_rng(0)
    d = 6
    q = random_rotation(d, rng)
    l1, l2 = rng.uniform(0.1, 3, d), rng.uniform(0.1, 3, d)
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    s1, s2 = q @ np.diag(l1) @ q.T, q @ np.diag(l2) @ q.T  # same eigenvectors: sqrt(S1 S2) has sqrt(l1 l2)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(l1) - np.sqrt(l2)) ** 2)
    assert ev.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-9)
    # any two covariances: tr(S1 + S2 - 2 (S1^1/2 S2 S1^1/2)^1/2) through eigendecompositions
    a, b = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    s1, s2 = a @ a.T, b @ b.T
    w, v = np.linalg.eigh(s1)
    r1 = v @ np.diag(np.sqrt(w)) @ v.T
    inner = np.linalg.eigvalsh(r1 @ s2 @ r1)
    expected = np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.sum(np.sqrt(np.clip(inner, 0, None)))
    assert ev.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-8)
    assert ev.frechet_distance(mu1, s1, mu1, s1) == pytest.approx(0, abs=1e-8)


def test_pytorch_fids_semantics_on_ill_conditioned_statistics():
    """Where the covariance product is near singular: an imaginary part above 1e-3 on the diagonal of its square root
    is an error (pytorch-fid, ADM), and a square root that is finite is used as it is, real part taken (no 1e-6
    offset on a mere warning)."""
    from scipy import linalg
    rng = np.random.default_rng(4)

    def stats(n, d, scale):
        f = rng.normal(size=(n, d)) * scale
        return f.mean(0), np.cov(f, rowvar=False)
    mu1, s1 = stats(12, 64, 1e3)
    mu2, s2 = stats(12, 64, 1e3)
    root = linalg.sqrtm(s1 @ s2)
    assert np.isfinite(root).all() and np.abs(np.diagonal(root).imag).max() > 1e-3  # the case, seen by scipy here
    with pytest.raises(ValueError, match='no Fréchet distance: the square root .* imaginary .* fewer samples than '
                                         'the 64 feature dimensions'):
        ev.frechet_distance(mu1, s1, mu2, s2)
    mu1, s1 = stats(3, 64, 1.0)
    mu2, s2 = stats(3, 64, 1.0)
    root = linalg.sqrtm(s1 @ s2)
    assert np.isfinite(root).all() and np.allclose(np.diagonal(root).imag, 0, atol=1e-3)
    expected = np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(root.real)
    assert ev.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match='statistics of different sizes'):
        ev.frechet_distance(mu1, s1, mu2[:3], s2[:3, :3])


def adm_inception_score(logits, split_size):
    """ADM's evaluator (guided-diffusion evaluations/evaluator.py, compute_inception_score) in numpy: softmax, then
    exp(mean KL(p(y|x) || p(y))) on consecutive parts of split_size, averaged."""
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    scores = []
    for i in range(0, len(p), split_size):
        part = p[i:i + split_size]
        scores.append(np.exp(np.mean(np.sum(part * (np.log(part) - np.log(part.mean(0, keepdims=True))), 1))))
    return float(np.mean(scores)), float(np.std(scores))


def test_statistics_and_inception_score():
    rng = np.random.default_rng(1)
    f = rng.normal(size=(500, 4))
    mu, sigma = ev.feature_statistics(f)
    np.testing.assert_allclose(mu, f.mean(0))
    np.testing.assert_allclose(sigma, (f - mu).T @ (f - mu) / 499)
    assert ev.inception_score(np.zeros((40, 7)), split_size=10)[0] == pytest.approx(1.0)
    confident = np.full((60, 5), -50.0)
    confident[np.arange(60), np.arange(60) % 5] = 50.0  # certain, classes equally often: IS = K
    assert ev.inception_score(confident, split_size=20) == pytest.approx((5.0, 0.0), abs=1e-9)
    logits = rng.normal(size=(23, 6)) * 3
    for split_size in (5000, 10, 4):  # one part; 10 + 10 + 3; the last part shorter
        assert ev.inception_score(logits, split_size) == pytest.approx(adm_inception_score(logits, split_size),
                                                                       rel=1e-12)


def test_fid_inception_is_pytorch_fids_inception_feature_for_feature(tmp_path, monkeypatch):
    """pytorch-fid's InceptionV3 (pool3 block, its resize and normalisation) with the same random weights, which it
    finds in torch hub's cache under the name it downloads; the IS logits are pool3 times the classifier's weight."""
    from pytorch_fid.inception import InceptionV3
    torch.manual_seed(0)
    ours = ev.FIDInception()
    for m in ours.modules():  # batch-norm statistics that keep the activations in range
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_var.uniform_(0.5, 2.0)
            m.running_mean.normal_(0, 0.1)
    cache = tmp_path / 'hub' / 'checkpoints'
    cache.mkdir(parents=True)
    torch.save(ours.net.state_dict(), cache / ev.INCEPTION_FILE)
    monkeypatch.setenv('TORCH_HOME', str(tmp_path))
    theirs = InceptionV3([InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).eval()
    images = torch.randint(0, 256, (3, 3, 45, 70), dtype=torch.uint8)
    features, logits = ours(images)
    with torch.no_grad():
        expected = theirs(images.float() / 255)[0].flatten(1)
    assert expected.std() > 1e-3  # not a vanished signal
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, expected @ ours.net.fc.weight.T, rtol=1e-5, atol=1e-5)
    assert ours.net.fc.bias.abs().max() > 0  # the bias exists and is left out


def fid_by_formula(mu1, s1, mu2, s2):
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2)), written here (scipy's matrix square root)."""
    from scipy.linalg import sqrtm
    root = sqrtm(s1 @ s2)
    assert np.allclose(root @ root, s1 @ s2, atol=1e-9)  # a true square root
    return float(np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(root).real)


def test_metric_against_reference_statistics(tmp_path):
    """With an extractor of known features, FID is the Fréchet distance to the reference statistics and IS the
    exp-mean KL of the logits' softmax to its marginal, both computed here from their formulas."""
    rng = np.random.default_rng(2)
    ref = rng.normal(size=(300, 3))
    ref_mu = ref.sum(0) / len(ref)
    ref_sigma = (ref - ref_mu).T @ (ref - ref_mu) / (len(ref) - 1)
    np.savez(tmp_path / 'ref.npz', mu=ref_mu, sigma=ref_sigma)
    with pytest.raises(FileNotFoundError, match='fid_stats.py'):
        ev.load_statistics(str(tmp_path / 'none.npz'))
    np.savez(tmp_path / 'bad.npz', arr_0=np.zeros(3))
    with pytest.raises(ValueError, match=r"holds \['arr_0'\]"):  # what it holds instead of mu and sigma
        ev.load_statistics(str(tmp_path / 'bad.npz'))

    def extractor(images):  # features = the mean colour of each channel, logits from it
        f = images.float().mean((2, 3)) / 255
        return f, f * 10
    metric = ev.GenerationMetric(str(tmp_path / 'ref.npz'), extractor=extractor, is_split_size=5)
    metric.dataset_meta = dict(num_samples=10)
    colours = torch.randint(0, 256, (10, 3), generator=torch.Generator().manual_seed(0))
    images = colours[:, :, None, None].expand(10, 3, 4, 4).to(torch.uint8)  # one colour each: features = colour / 255
    order = [7, 2, 9, 0, 4, 1, 8, 3, 6, 5]  # the sums do not depend on the order the samples come in
    metric.process({}, [dict(fake_img=images[i], index=i) for i in order[:6]])
    metric.process({}, [dict(fake_img=images[i], index=i) for i in order[6:]])  # sums over batches
    result = {k.removeprefix('gen/'): v for k, v in metric.evaluate(10).items()}

    f = colours.double().numpy() / 255
    mu = f.sum(0) / 10
    sigma = (f - mu).T @ (f - mu) / 9
    expected = fid_by_formula(mu, sigma, ref_mu, ref_sigma)
    # the same value through the eigenvalues of S1^(1/2) S2 S1^(1/2), which has the eigenvalues of S1 S2
    w, v = np.linalg.eigh(sigma)
    r = v @ np.diag(np.sqrt(w)) @ v.T
    by_eig = (np.sum((mu - ref_mu) ** 2) + np.trace(sigma) + np.trace(ref_sigma)
              - 2 * np.sum(np.sqrt(np.clip(np.linalg.eigvalsh(r @ ref_sigma @ r), 0, None))))
    assert expected == pytest.approx(by_eig, rel=1e-9) and expected > 0.5
    assert result['FID'] == pytest.approx(expected, rel=1e-6) and result['samples'] == 10

    def score(logits):  # exp(mean_x KL(p(y|x) || p(y)))
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        return np.exp(np.mean(np.sum(p * (np.log(p) - np.log(p.mean(0))), 1)))
    parts = [score(f[:5] * 10), score(f[5:] * 10)]
    assert parts[0] != pytest.approx(parts[1])
    assert (result['IS'], result['IS_std']) == pytest.approx((np.mean(parts), abs(parts[0] - parts[1]) / 2),
                                                             rel=1e-5)
    metric.process({}, [dict(fake_img=images[i], index=i) for i in range(9)])
    with pytest.raises(ValueError, match='counted 9 samples of 10'):
        metric.evaluate(10)
    with pytest.raises(ValueError, match='not both'):
        ev.GenerationMetric(str(tmp_path / 'ref.npz'))
