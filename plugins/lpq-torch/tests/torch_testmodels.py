"""Small real models and the scikit-learn digits data shared by lpq-torch's tests and bench."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import lpq


def digits(split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1797 8x8 images) as float32 NCHW in [0, 1]; a fixed split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    labels = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    images, labels = images[order], labels[order]
    if split == "train":
        return images[:1400], labels[:1400]
    return images[1400:], labels[1400:]


class DigitsConvNet(nn.Module):
    """conv+bn+relu, conv+relu, maxpool, two linears: the x86 int8 recipe's main patterns."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TinyTransformer(nn.Module):
    """One pre-norm transformer block over the 8 rows of a digit (8 tokens of 8 pixels)."""

    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Linear(8, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.reshape(x.shape[0], 8, 8))
        b, t, d = tokens.shape
        q, k, v = self.qkv(self.norm1(tokens)).chunk(3, dim=-1)

        def split(z: torch.Tensor) -> torch.Tensor:
            return z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(q), split(k), split(v)
        scores = torch.matmul(q, k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        attn = torch.matmul(scores.softmax(dim=-1), v).transpose(1, 2).reshape(b, t, d)
        tokens = tokens + self.proj(attn)
        tokens = tokens + self.mlp(self.norm2(tokens))
        return self.head(tokens.mean(dim=1))


def train(model: nn.Module, epochs: int = 12, lr: float = 3e-3, seed: int = 0) -> nn.Module:
    """Train on the digits train split (a few seconds on CPU); returns the model in eval mode."""
    torch.manual_seed(seed)
    images, labels = digits("train")
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(y))
        for start in range(0, len(y), 64):
            idx = perm[start : start + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def eval_loader(batch: int = 50) -> lpq.ArrayLoader:
    images, labels = digits("test")
    return lpq.ArrayLoader(images, labels, batch_size=batch)


def calib_loader(batch: int = 50) -> lpq.ArrayLoader:
    images, labels = digits("train")
    return lpq.ArrayLoader(images[:200], labels[:200], batch_size=batch)
