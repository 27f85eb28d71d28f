"""Generation datasets: ADM's centre crop, class folders, sampling labels, the latent cache's checks."""
import numpy as np
import pytest
from PIL import Image

from mmwf.datasets import ClassFolderImages, LatentCacheDataset, SamplingLabels, center_crop_arr


def test_centre_crop_halves_resizes_and_centres():
    """A 1100 x 600 image for 256: halved once (box) to 550 x 300, resized bicubically to 469 x 256, its centre
    256 x 256 taken: a white square at the centre of the original stays at the centre."""
    arr = np.zeros((600, 1100, 3), np.uint8)
    arr[250:350, 500:600] = 255
    out = center_crop_arr(Image.fromarray(arr), 256)
    assert out.shape == (256, 256, 3) and out.dtype == np.uint8
    ys, xs = np.nonzero(out[..., 0] > 128)
    assert abs(ys.mean() - 127.5) < 1 and abs(xs.mean() - 127.5) < 1
    assert 38 <= ys.max() - ys.min() + 1 <= 46  # 100 px * 256 / 600


def test_class_folder_and_sampling_labels(tmp_path):
    for c, n in (('b_dog', 2), ('a_cat', 1)):
        (tmp_path / c).mkdir()
        for i in range(n):
            Image.new('RGB', (40, 30), (i * 100, 0, 0)).save(tmp_path / c / f'{i}.png')
    data = ClassFolderImages(str(tmp_path), size=16, flip=False)
    assert data.metainfo['classes'] == ('a_cat', 'b_dog')
    assert [data[i]['labels'] for i in range(3)] == [0, 1, 1] and data[0]['inputs'].shape == (3, 16, 16)
    assert SamplingLabels(7, 3, balanced=True).labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    # random labels, as DiT's sample_ddp.py draws them: uniform over the classes, the same for one seed only
    a, b, c = (SamplingLabels(10_000, 10, seed=s) for s in (3, 3, 4))
    assert np.array_equal(a.labels, b.labels) and a.metainfo == dict(num_samples=10_000) and len(a) == 10_000
    assert np.mean(a.labels != c.labels) > 0.8  # another seed: another draw (9 in 10 differ for independent ones)
    assert [a[i] for i in (0, 9_999)] == [dict(labels=int(a.labels[0]), indices=0),
                                          dict(labels=int(a.labels[-1]), indices=9_999)]
    assert isinstance(a[0]['labels'], int)
    for labels in (a.labels, c.labels, a.labels[:5_000], a.labels[5_000:]):  # uniform overall and in each half
        assert labels.min() >= 0 and labels.max() <= 9
        counts = np.bincount(labels, minlength=10)
        expected = len(labels) / 10
        chi2 = np.sum((counts - expected) ** 2 / expected)
        assert chi2 < 27.9, counts  # chi-square, 9 degrees of freedom: P(chi2 > 27.9) = 0.001
    assert np.mean(a.labels[1:] == a.labels[:-1]) == pytest.approx(0.1, abs=0.02)  # independent draws, not runs
    with pytest.raises(FileNotFoundError, match='expected ROOT/<class>/<images>'):
        ClassFolderImages(str(tmp_path / 'missing'))


def test_latent_cache_of_the_wrong_shape_is_refused(tmp_path):
    np.save(tmp_path / 'latents.npy', np.zeros((3, 4, 4, 4), np.float16))
    np.save(tmp_path / 'labels.npy', np.zeros(3, np.int64))
    (tmp_path / 'classes.txt').write_text('a\n')
    with pytest.raises(ValueError, match=r'expected \(N, 2, C, h, w\)'):
        LatentCacheDataset(str(tmp_path))
