"""Small real models and the scikit-learn digits data shared by lpq-torch's tests and bench."""

from __future__ import annotations

from typing import Any

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


# --------------------------------------------------------------------------------------
# Small models shaped like published ones (the cases lpq-torch's model preparation handles)


class TinyBertModel(nn.Module):
    """Shaped like a Hugging Face ``AutoModel`` BERT (MiniLM): returns the last hidden state
    *and* a pooler output (dense + tanh on the first token), like ``BertModel``."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embeddings = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.attn_out = nn.Linear(dim, dim)
        self.intermediate = nn.Linear(dim, 2 * dim)
        self.output = nn.Linear(2 * dim, dim)
        self.pooler = nn.Sequential(nn.Linear(dim, dim), nn.Tanh())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, Any]:
        h = self.norm(self.embeddings(input_ids))
        b, t, d = h.shape

        def split(z: torch.Tensor) -> torch.Tensor:
            return z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
        scores = torch.matmul(q, k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        scores = scores + (1.0 - attention_mask[:, None, None, :].float()) * -1e4
        ctx = torch.matmul(scores.softmax(-1), v).transpose(1, 2).reshape(b, t, d)
        h = h + self.attn_out(ctx)
        h = h + self.output(nn.functional.gelu(self.intermediate(h)))
        return {"last_hidden_state": h, "pooler_output": self.pooler(h[:, 0])}


class MeanPooledEmbedder(nn.Module):
    """What sentence-transformers does with an AutoModel: mean of the last hidden state.
    The pooler's output is never used, so its dense + tanh are dead code in the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.model = TinyBertModel()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids, attention_mask)["last_hidden_state"]
        mask = attention_mask[..., None].float()
        return (hidden * mask).sum(1) / mask.sum(1)


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock, verbatim in structure: ``self.relu`` is called twice."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class TinyResNet(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU())
        self.layer1 = nn.Sequential(BasicBlock(width), BasicBlock(width))
        self.fc = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layer1(self.stem(x)).mean((2, 3)))


class Conv1dNet(nn.Module):
    """Silero-VAD-shaped front end: conv1d + ``F.relu`` (functional, no ReLU module) and a
    final conv1d alone, on 1-D signals (here a digit's 64 pixels as 1 x 64)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        self.final_conv = nn.Conv1d(width, 10, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], 1, -1)
        x = nn.functional.relu(self.conv1(x))
        x = nn.functional.relu(self.conv2(x))
        return self.final_conv(x).mean(-1)


class StreamingVAD(nn.Module):
    """Like Silero VAD's TorchScript ``forward(x, sr)``: streaming state reset in a branch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Conv1dNet()
        self.state = torch.zeros(1)
        self.last_sr = 0

    def forward(self, x: torch.Tensor, sr: int) -> torch.Tensor:
        if sr != self.last_sr:
            self.state = torch.zeros(1)
            self.last_sr = sr
        return self.net(x) + self.state


def token_loader(batches: int = 4, batch: int = 8, seq: int = 12) -> list[Any]:
    """Random token ids with padding masks, as a tokenizer would give (keyword inputs)."""
    gen = torch.Generator().manual_seed(0)
    items = []
    for _ in range(batches):
        ids = torch.randint(1, 50, (batch, seq), generator=gen)
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        items.append({"input_ids": ids * mask, "attention_mask": mask})
    return items
