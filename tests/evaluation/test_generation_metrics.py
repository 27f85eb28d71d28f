"""FID / IS maths on inputs whose distances are known, the Inception loader's file handling, and the metric."""
import numpy as np
import pytest
import torch

from mmwf.evaluation import generation as ev


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


def test_statistics_and_inception_score():
    rng = np.random.default_rng(1)
    f = rng.normal(size=(500, 4))
    mu, sigma = ev.feature_statistics(f)
    np.testing.assert_allclose(mu, f.mean(0))
    np.testing.assert_allclose(sigma, (f - mu).T @ (f - mu) / 499)
    assert ev.inception_score(np.zeros((40, 7)), splits=4)[0] == pytest.approx(1.0)
    confident = np.full((60, 5), -50.0)
    confident[np.arange(60), np.arange(60) % 5] = 50.0  # certain, classes equally often: IS = K
    assert ev.inception_score(confident, splits=3) == pytest.approx((5.0, 0.0), abs=1e-9)


def test_inception_loader_names_the_missing_file_and_loads_a_state_dict(tmp_path):
    with pytest.raises(FileNotFoundError, match='pt_inception-2015-12-05-6726825d.pth once from https://github.com/'
                                                'mseitzer/pytorch-fid'):
        ev.FIDInception(str(tmp_path / 'missing.pth'))
    net = ev.FIDInception()
    torch.save(net.net.state_dict(), tmp_path / 'inception.pth')
    loaded = ev.FIDInception(str(tmp_path / 'inception.pth'))
    images = torch.randint(0, 256, (2, 3, 40, 56), dtype=torch.uint8)
    features, logits = loaded(images)
    assert features.shape == (2, 2048) and logits.shape == (2, 1008)
    torch.testing.assert_close(features, net(images)[0])


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
    metric = ev.GenerationMetric(str(tmp_path / 'ref.npz'), extractor=extractor, is_splits=2)
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
