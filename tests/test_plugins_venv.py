"""A third-party plugin as a real distribution in a fresh virtual environment.

The plugin ``lpq-acme`` is written to a temporary directory with its own
``pyproject.toml`` (entry point ``acme`` in group ``lpq``), built into a wheel together
with lpq-core, and both are installed with pip into a new virtual environment. Then the
``lpq`` script of that environment lists it and a script there calls its hooks through
lpq's facade, exactly as a user who ran ``pip install lpq-core lpq-acme`` would.

Offline and fast: wheels are built with ``--no-build-isolation`` from this environment's
setuptools, installed with ``--no-index --no-deps``, and lpq-core's own dependencies
(pluggy, pyyaml, jsonschema, numpy, click, rich, ...) are made visible to the new
environment through a ``.pth`` file pointing at a folder that links *only* those
distributions, so no other plugin installed here leaks into it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from core_testutil import REPO

ACME_PYPROJECT = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "lpq-acme"
version = "0.3.1"
description = "A third-party lpq adaptor for the Acme toy framework"
requires-python = ">=3.10"
dependencies = ["lpq-core>=0.2,<0.3"]

[project.entry-points.lpq]
acme = "lpq_acme.plugin"

[tool.setuptools]
packages = ["lpq_acme"]

[tool.setuptools.package-data]
lpq_acme = ["*.yaml"]
"""

ACME_CAPABILITY = """\
- version:
    name: default
  precisions: [int8, fp32]
  ops:
    int8: [Dense]
    fp32: ['*']
  capabilities:
    int8:
      static:
        Dense:
          weight: {dtype: [int8], scheme: [sym]}
          activation: {dtype: [uint8], scheme: [asym]}
"""

#: An "Acme model" is a JSON file ``{"ops": [[name, type], ...], "scale": s}`` computing
#: ``x * scale``; quantizing rounds the scale to one decimal, so results are checkable.
ACME_PLUGIN = '''\
"""Acme adaptor: framework-free registration, per-framework hooks for "acme" only."""

import json
from pathlib import Path

import numpy as np

import lpq

HERE = Path(__file__).parent


def _load(model):
    return model if isinstance(model, dict) else json.loads(Path(model).read_text())


@lpq.hookimpl
def lpq_register_adaptors(register):
    register(lpq.AdaptorInfo("acme", "acme-runtime", [HERE / "acme.yaml"], "Acme toys"))


@lpq.hookimpl
def lpq_detect_framework(model):
    if isinstance(model, dict) and "scale" in model:
        return "acme"
    return "acme" if str(model).endswith(".acme") else None


@lpq.hookimpl
def lpq_query_fw_capability(framework, model, dataloader, options):
    if framework != "acme":
        return None
    spec = lpq.load_capability([HERE / "acme.yaml"], "acme", None)
    return spec.build([tuple(op) for op in _load(model)["ops"]], None)


@lpq.hookimpl
def lpq_quantize(framework, model, tune_cfg, calib_dataloader, train_func):
    if framework != "acme":
        return None
    source = _load(model)
    return {**source, "scale": round(source["scale"], 1), "int8": len(tune_cfg.quantized_ops())}


@lpq.hookimpl
def lpq_evaluate(framework, model, dataloader, postprocess, metrics, measurer, iteration):
    if framework != "acme":
        return None
    model = _load(model)
    for metric in metrics:
        metric.reset()
    batches = samples = 0
    for item in dataloader:
        inputs, labels = lpq.split_batch(item)
        preds = np.asarray(inputs) * model["scale"]
        for metric in metrics:
            metric.update(preds, labels)
        batches += 1
        samples += len(inputs)
    return lpq.EvalResult({m.name: m.result() for m in metrics}, batches=batches,
                          samples=samples)
'''

FACADE_SCRIPT = """\
import json, sys
import numpy as np
import lpq

model = sys.argv[1]
pm = lpq.get_plugin_manager()
framework = pm.detect_framework(model)
cap = pm.query_capability(framework, model)
cfg = lpq.TuneConfig(ops={key: cap.default_op_config(key) for key in cap.opwise})
qmodel = pm.quantize(framework, model, cfg, None)
x = np.arange(8, dtype=np.float32).reshape(4, 2)
data = lpq.ArrayLoader(x, x * 2.0, batch_size=2)
fp32 = pm.evaluate(framework, model, data, [pm.create_metric("mse")])
int8 = pm.evaluate(framework, qmodel, data, [pm.create_metric("mse")])
print(json.dumps({
    "framework": framework,
    "opwise": [list(key) for key in cap.opwise],
    "default": cfg.ops[("fc1", "Dense")].to_json(),
    "quantized": qmodel["int8"],
    "fp32_mse": fp32.metrics["mse"],
    "int8_mse": int8.metrics["mse"],
    "batches": int8.batches,
    "lpq_file": lpq.__file__,
}))
"""


def _requirement_names(dist: metadata.Distribution) -> list[str]:
    names = []
    for line in dist.requires or ():
        if "extra ==" in line:
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        if match:
            names.append(match.group(0))
    return names


def link_core_dependencies(target: Path) -> None:
    """Symlink lpq-core's dependency closure (never lpq-core itself) into ``target``."""
    target.mkdir()
    todo = _requirement_names(metadata.distribution("lpq-core"))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(name)
        todo.extend(_requirement_names(dist))
        top_levels = {Path(str(f)).parts[0] for f in dist.files or ()}
        site = Path(str(dist.locate_file("")))
        for top in top_levels:
            source = site / top
            if top in ("..", "bin") or not source.exists() or (target / top).exists():
                continue
            (target / top).symlink_to(source)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A new virtual environment with lpq-core and lpq-acme installed from wheels."""
    root = tmp_path_factory.mktemp("fresh")
    # lpq-core's sources, copied so that building leaves nothing in the repo.
    core = root / "lpq-core"
    core.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, core / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("core", "schemas"):
        shutil.copytree(REPO / folder, core / folder, ignore=ignore)
    # The third-party plugin.
    acme = root / "lpq-acme"
    (acme / "lpq_acme").mkdir(parents=True)
    (acme / "pyproject.toml").write_text(ACME_PYPROJECT)
    (acme / "lpq_acme" / "__init__.py").write_text('"""Acme adaptor for lpq."""\n')
    (acme / "lpq_acme" / "plugin.py").write_text(ACME_PLUGIN)
    (acme / "lpq_acme" / "acme.yaml").write_text(ACME_CAPABILITY)

    setuptools = tuple(int(p) for p in metadata.version("setuptools").split(".")[:2])
    assert setuptools >= (70, 1), (
        "building wheels offline needs setuptools>=70.1 (builds wheels without the 'wheel' "
        "package) in the test environment; scripts/setup.sh gets it with torch"
    )
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(wheels),
            str(core),
            str(acme),
        ]
    )
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).stdout.strip()
    )
    deps = root / "deps"
    link_core_dependencies(deps)
    (site / "lpq_core_deps.pth").write_text(f"{deps}\n")
    run(
        [
            *pip,
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            *map(str, sorted(wheels.glob("*.whl"))),
        ]
    )
    return venv, root


def venv_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LPQ_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    env["LPQ_PLUGINS_STRICT"] = "1"
    return env


def test_plugins_list_shows_the_third_party_plugin(fresh_venv: tuple[Path, Path]):
    venv, _ = fresh_venv
    result = run([str(venv / "bin" / "lpq"), "plugins", "list", "--json"], env=venv_env())
    rows = json.loads(result.stdout)
    assert [row["name"] for row in rows] == ["acme"], "only the freshly installed plugin"
    row = rows[0]
    assert row["status"] == "ok"
    assert (row["distribution"], row["version"]) == ("lpq-acme", "0.3.1")
    assert row["entry_point"] == "lpq_acme.plugin"
    assert row["requires_core"] == "<0.3,>=0.2"
    assert row["frameworks"] == [
        {"framework": "acme", "distribution": "acme-runtime", "installed": None}
    ]
    assert row["hooks"] == [
        "lpq_detect_framework",
        "lpq_evaluate",
        "lpq_quantize",
        "lpq_query_fw_capability",
        "lpq_register_adaptors",
    ]


def test_hooks_are_called_through_the_facade(fresh_venv: tuple[Path, Path]):
    venv, root = fresh_venv
    model = root / "tiny.acme"
    model.write_text(json.dumps({"ops": [["fc1", "Dense"], ["act", "Relu"]], "scale": 2.04}))
    result = run([str(venv / "bin" / "python"), "-c", FACADE_SCRIPT, str(model)], env=venv_env())
    out = json.loads(result.stdout)
    assert out["framework"] == "acme"
    assert out["opwise"] == [["fc1", "Dense"]], "Relu is not quantizable in acme.yaml"
    assert out["default"] == {
        "precision": "int8",
        "mode": "static",
        "weight": {
            "dtype": "int8",
            "scheme": "sym",
            "granularity": "per_tensor",
            "algorithm": "minmax",
        },
        "activation": {
            "dtype": "uint8",
            "scheme": "asym",
            "granularity": "per_tensor",
            "algorithm": "minmax",
        },
    }
    assert out["quantized"] == 1
    # x = 0..7, target 2x: fp32 scale 2.04 -> mse = mean((0.04 x)^2); int8 rounds to 2.0.
    expected = sum((0.04 * v) ** 2 for v in range(8)) / 8
    assert out["fp32_mse"] == pytest.approx(expected, rel=1e-5)
    assert out["int8_mse"] == pytest.approx(0.0, abs=1e-12)
    assert out["batches"] == 2
    assert str(venv) in out["lpq_file"], "lpq-core must come from the fresh environment"
