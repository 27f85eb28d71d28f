"""The generation demo's measures: the Wilson interval against scipy's, colour shuffling that keeps each image's
pixels and leaves colour uninformative, and the distance reported only where the sample count supports it."""
import pytest
import torch

from mmwf.analysis.generation_measures import DemoClassifier, classifier_measures, shuffle_colours, wilson_interval


@pytest.mark.parametrize('k, n', [(0, 20), (17, 20), (120, 150), (150, 150)])
def test_wilson_interval_is_scipys(k, n):
    from scipy.stats import binomtest
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method='wilson')
    assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-6)


def test_shuffled_colours_are_a_permutation_of_each_images_channels():
    images = torch.randint(0, 256, (300, 3, 4, 4), dtype=torch.uint8)
    out = shuffle_colours(images, torch.Generator().manual_seed(0))
    orders = set()
    for a, b in zip(images, out):
        order = tuple(next(j for j in range(3) if torch.equal(b[i], a[j])) for i in range(3))
        assert sorted(order) == [0, 1, 2]
        orders.add(order)
    assert len(orders) == 6  # every order occurs: a class's colour says nothing


def test_distance_only_with_twice_as_many_images_as_features():
    torch.manual_seed(0)
    classifier = DemoClassifier(3).eval()  # 64 features
    few, many = (torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8) for n in (100, 130))
    labels = torch.zeros(130, dtype=torch.long)
    m = classifier_measures(classifier, many, labels, few, labels[:100], many)
    assert m['frechet'] is not None and m['frechet'] == pytest.approx(0, abs=1e-6)  # a set against itself
    assert m['samples_interval'][0] <= m['samples_correct'] <= m['samples_interval'][1]
    assert classifier_measures(classifier, many, labels, few, labels[:100], few)['frechet'] is None
