"""Wall time of ``lpq plugins list`` against ``python -c pass``, in one run, interleaved.

``lpq plugins list`` imports lpq, reads the ``lpq`` entry points from metadata, imports
every plugin module and runs its registration hooks — and must import no framework, so it
should cost little more than starting Python. Goal: well under 0.5 s.

Every plugin of this repo (``plugins/*/pyproject.toml`` with an ``lpq`` entry point) is
made visible: the installed ones as installed, any other from its source folder with
temporary metadata, so the number always covers them all. Each repetition runs every
variant once, in a fresh process, in rotating order; the table reports medians and the
overhead over a bare interpreter. Timings on a shared machine are noisy: read the
overhead and the ratio, not the absolute numbers.

Run:  .venv/bin/python bench/bench_plugins_list.py [--repeat 15]
Writes bench/results/plugins_list.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "plugins_list.json"
BIN = Path(sys.executable).parent

VARIANTS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import lpq'": [sys.executable, "-c", "import lpq"],
    "lpq --help": [str(BIN / "lpq"), "--help"],
    "lpq plugins list": [str(BIN / "lpq"), "plugins", "list"],
    "lpq plugins list --json": [str(BIN / "lpq"), "plugins", "list", "--json"],
    "python -m lpq plugins list": [sys.executable, "-m", "lpq", "plugins", "list"],
}


def _read_pyproject(text: str) -> tuple[str, dict[str, str]]:
    """The project name and the ``lpq`` entry points of a ``pyproject.toml``."""
    data = tomllib.loads(text)
    project = data["project"]
    return project["name"], project.get("entry-points", {}).get("lpq", {})


def repo_plugins() -> list[tuple[str, str, str, Path]]:
    """(distribution, plugin name, entry point, folder) of every plugin in ``plugins/``."""
    found = []
    for pyproject in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        dist, entry_points = _read_pyproject(pyproject.read_text())
        for name, value in entry_points.items():
            found.append((dist, name, value, pyproject.parent))
    return found


def environment(site: Path) -> tuple[dict[str, str], list[str]]:
    """An environment where every repo plugin is visible; returns it and the names of
    plugins that needed temporary metadata."""
    paths, faked = [str(site)], []
    for dist, name, value, folder in repo_plugins():
        try:
            eps = metadata.distribution(dist).entry_points
            if any(ep.group == "lpq" and ep.name == name for ep in eps):
                continue
        except metadata.PackageNotFoundError:
            pass
        info = site / f"{dist.replace('-', '_')}-0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0\n")
        (info / "entry_points.txt").write_text(f"[lpq]\n{name} = {value}\n")
        paths.append(str(folder))
        faked.append(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LPQ_")}
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["LPQ_PLUGINS_STRICT"] = "1"  # a plugin that fails to load fails the benchmark
    env["COLUMNS"] = "160"
    return env, faked


def time_once(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="runs of each variant")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        env, faked = environment(Path(tmp))
        listing = subprocess.run(
            VARIANTS["lpq plugins list --json"], env=env, capture_output=True, text=True
        )
        if listing.returncode != 0:
            raise SystemExit(listing.stderr)
        plugins = {row["name"]: row["status"] for row in json.loads(listing.stdout)}
        for cmd in VARIANTS.values():  # warm the file cache and .pyc files
            time_once(cmd, env)
        samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
        names = list(VARIANTS)
        for rep in range(args.repeat):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(time_once(VARIANTS[name], env))

    base = statistics.median(samples["python -c pass"])
    rows = []
    for name, values in samples.items():
        median = statistics.median(values)
        rows.append(
            {
                "variant": name,
                "median_s": round(median, 4),
                "min_s": round(min(values), 4),
                "max_s": round(max(values), 4),
                "overhead_s": round(median - base, 4),
                "ratio_to_python": round(median / base, 2),
            }
        )

    print(f"plugins visible: {plugins}" + (f" (from source: {faked})" if faked else ""))
    print(f"{args.repeat} interleaved runs each, fresh process per run\n")
    header = f"{'variant':<28} {'median':>8} {'min':>8} {'max':>8} {'overhead':>9} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['variant']:<28} {row['median_s']:>7.3f}s {row['min_s']:>7.3f}s "
            f"{row['max_s']:>7.3f}s {row['overhead_s']:>+8.3f}s {row['ratio_to_python']:>5.2f}x"
        )
    listed = next(r for r in rows if r["variant"] == "lpq plugins list")
    verdict = "meets" if listed["median_s"] < 0.5 else "MISSES"
    print(f"\nlpq plugins list: {listed['median_s']:.3f} s median — {verdict} the 0.5 s goal")

    sys.path.insert(0, str(ROOT))
    import lpq

    lpq.write_json(
        RESULTS,
        {
            "benchmark": "plugins_list",
            "repeat": args.repeat,
            "plugins": plugins,
            "plugins_from_source": faked,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "goal_s": 0.5,
            "rows": rows,
        },
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
