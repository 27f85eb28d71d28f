"""The generation demo's measures (tools/demo.py --tasks gen): a small CNN classifier trained on the real
demo images with their colour channels shuffled per image (colour then tells nothing and the classifier must read
the shape), the share of samples it assigns to their conditioning class
with its 95 % (Wilson) interval, the Fréchet distance between samples and real images in its feature space where
there are at least twice as many samples as features (a demo measure, not FID), and a grid of samples as a PNG."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_class_folder(root: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of ``root/<class>/`` centre-cropped to ``size``: uint8 (N, 3, size, size) and labels (N,)."""
    from mmwf.datasets import ClassFolderImages
    data = ClassFolderImages(root, size, flip=False)
    items = [data[i] for i in range(len(data))]
    return torch.stack([d['inputs'] for d in items]), torch.tensor([d['labels'] for d in items])


class DemoClassifier(nn.Module):
    """The demo's judge: a small CNN classifying uint8 images (four 3 x 3 convs of 32, 64, 64, 64 channels with GELU,
    2 x 2 max pooling after the second, global max pooling, a linear ``head``); :meth:`features` are the 64 pooled
    activations that enter the head. A convolutional judge is right on the demo's real images where a WeightFormer of
    the same budget, trained from scratch on 640 images, is not."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GELU(), nn.Conv2d(32, 64, 3, padding=1), nn.GELU(),
                                  nn.MaxPool2d(2), nn.Conv2d(64, 64, 3, padding=1), nn.GELU(),
                                  nn.Conv2d(64, 64, 3, padding=1), nn.GELU(), nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.head = nn.Linear(64, num_classes)

    @staticmethod
    def normalise(images: torch.Tensor) -> torch.Tensor:
        return images.float() / 127.5 - 1

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(self.normalise(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


def shuffle_colours(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """uint8 images (N, 3, H, W), each with its three colour channels in a random order."""
    order = torch.stack([torch.randperm(3, generator=generator) for _ in range(len(images))])
    return images[torch.arange(len(images))[:, None], order]


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial share (95 % for the default z)."""
    p, z2 = successes / n, z * z
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), z / (1 + z2 / n) * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return float(centre - half), float(centre + half)


def train_classifier(images: torch.Tensor, labels: torch.Tensor, num_classes: int, steps: int = 1000,
                     seed: int = 0) -> DemoClassifier:
    """:class:`DemoClassifier` trained from scratch (AdamW 1e-3, batch 32, random flips, colour channels shuffled
    per image: :func:`shuffle_colours`), eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # the initial weights from ``seed``, torch's own generator left as it was
        torch.manual_seed(seed)
        model = DemoClassifier(num_classes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(images), (32,), generator=generator)
        x = images[idx]
        flip = torch.rand(len(idx), generator=generator) < 0.5
        x = shuffle_colours(torch.where(flip[:, None, None, None], x.flip(-1), x), generator)
        loss = F.cross_entropy(model(x), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def classifier_measures(classifier: DemoClassifier, samples: torch.Tensor, sample_labels: torch.Tensor,
                        real: torch.Tensor, real_labels: torch.Tensor, reference: torch.Tensor) -> dict:
    """``samples_correct``: the share of samples classified as their conditioning class, ``samples_interval`` its
    95 % interval; ``real_correct``: the share of the real images ``real`` classified as ``real_labels``;
    ``frechet``: the Fréchet distance of samples and the real images ``reference`` in the classifier's features, None
    unless both sets hold at least twice as many images as features."""
    from mmwf.evaluation import feature_statistics, frechet_distance
    fake_f, real_f, ref_f = (classifier.features(x) for x in (samples, real, reference))
    correct = int((classifier.head(fake_f).argmax(1) == sample_labels).sum())
    enough = min(len(fake_f), len(ref_f)) >= 2 * fake_f.shape[1]
    return dict(
        samples_correct=correct / len(samples), samples_interval=wilson_interval(correct, len(samples)),
        real_correct=(classifier.head(real_f).argmax(1) == real_labels).float().mean().item(),
        frechet=frechet_distance(*feature_statistics(fake_f.numpy()), *feature_statistics(ref_f.numpy()))
        if enough else None)


def save_grid(rows: list[torch.Tensor], path: str, titles: list[str] | None = None, scale: int = 3) -> None:
    """Rows of uint8 images (n, 3, h, w), one row per class, as one PNG (each image scaled ``scale`` times)."""
    from PIL import Image
    grid = torch.cat([torch.cat(list(r), dim=2) for r in rows], dim=1)  # (3, rows*h, n*w)
    image = Image.fromarray(grid.permute(1, 2, 0).numpy().astype(np.uint8))
    image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    if titles:
        from PIL import ImageDraw
        canvas = Image.new('RGB', (image.width + 90, image.height), 'white')
        canvas.paste(image, (90, 0))
        draw = ImageDraw.Draw(canvas)
        step = image.height // len(titles)
        for i, title in enumerate(titles):
            draw.text((4, i * step + step // 2 - 5), title, fill='black')
        image = canvas
    image.save(path)
