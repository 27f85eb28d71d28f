"""The generation demo's measures (tools/demo.py --tasks gen): a small WeightFormer classifier trained on the real
demo images, the share of samples it assigns to their conditioning class, and the Fréchet distance between samples
and real images in its feature space (a demo measure, not FID: not Inception features, a few dozen images), and
a grid of samples per class as a PNG."""
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
    """A WeightFormer (width 64, 4 blocks, dynamic blocks 1 and 3, 4-pixel patches) classifying uint8 images;
    :meth:`features` are the pooled, normalised tokens that enter its head."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        from mmwf.models.backbones import WeightFormer
        self.backbone = WeightFormer(dict(embed_dims=64, depth=4, mlp_ratio=4), patch_size=4,
                                     dynamic_blocks=[1, 3], num_classes=num_classes)

    @staticmethod
    def normalise(images: torch.Tensor) -> torch.Tensor:
        return images.float() / 127.5 - 1

    def features(self, images: torch.Tensor) -> torch.Tensor:
        seen = []
        handle = self.backbone.head.register_forward_hook(lambda m, i, o: seen.append(i[0]))
        try:
            self.backbone.forward_classifier(self.normalise(images))
        finally:
            handle.remove()
        return seen[0]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone.forward_classifier(self.normalise(images))


def train_classifier(images: torch.Tensor, labels: torch.Tensor, num_classes: int, steps: int = 300,
                     seed: int = 0) -> DemoClassifier:
    """:class:`DemoClassifier` trained from scratch (AdamW 1e-3, batch 32, random flips), eval mode."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = DemoClassifier(num_classes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(images), (32,), generator=generator)
        x = images[idx]
        flip = torch.rand(len(idx), generator=generator) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        loss = F.cross_entropy(model(x), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def classifier_measures(classifier: DemoClassifier, samples: torch.Tensor, sample_labels: torch.Tensor,
                        real: torch.Tensor, real_labels: torch.Tensor) -> dict[str, float]:
    """``samples_correct``: the share of samples classified as their conditioning class; ``real_correct``: the same
    on real images; ``frechet``: the Fréchet distance of samples and real images in the classifier's features."""
    from mmwf.evaluation import feature_statistics, frechet_distance
    fake_f, real_f = classifier.features(samples), classifier.features(real)
    return dict(
        samples_correct=(classifier.backbone.head(fake_f).argmax(1) == sample_labels).float().mean().item(),
        real_correct=(classifier.backbone.head(real_f).argmax(1) == real_labels).float().mean().item(),
        frechet=frechet_distance(*feature_statistics(fake_f.numpy()), *feature_statistics(real_f.numpy())))


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
