"""`lpq deploy`: the command-line face of ``lpq.deploy`` (core/deployment.py)."""

from __future__ import annotations

from pathlib import Path

import click

from ..deployment import deploy
from ..errors import ConfigError


class _ListsBackends(click.Command):
    """``lpq deploy --help`` ends with the backend profiles installed here (read from the
    plugins when help is shown; no framework is imported)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        from ..plugins.manager import get_plugin_manager

        pm = get_plugin_manager()
        pm.load()
        rows = [
            (name, f"{profile.framework}: {profile.description}")
            for name, profile in sorted(pm.backend_profiles.items())
        ]
        with formatter.section("Installed backends"):
            formatter.write_dl(rows or [("none", "install an adaptor plugin")])


@click.command("deploy", cls=_ListsBackends)
@click.argument("model")
@click.option("--backend", required=True, help="Backend profile, e.g. tensorrt, snpe, vitis.")
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="Folder to write into."
)
@click.option("--calib", type=click.Path(dir_okay=False), help="Calibration data (.npz).")
@click.option(
    "--calib-size",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Calibration samples to use.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Batch size for reading the .npz data.",
)
@click.option("--opset", type=click.IntRange(min=13), default=17, show_default=True)
@click.option(
    "--force", is_flag=True, help="Write into --out even where that overwrites MODEL or --calib."
)
def deploy_command(
    model: str,
    backend: str,
    out: str,
    calib: str | None,
    calib_size: int,
    batch_size: int,
    opset: int,
    force: bool,
) -> None:
    """Quantize MODEL for a hardware backend and write what its tools consume.

    Writes OUT/model.onnx (QDQ: the exact quantization lpq simulated), the backend's
    parameter file(s) (TensorRT calibration cache, SNPE/QNN encodings, Vitis AI
    fixed-point positions, ...) and OUT/deploy.json listing them.
    """
    from rich.console import Console

    from ..config import PostTrainingQuantConfig
    from ..eval.data import load_npz

    if not Path(model).exists():
        raise ConfigError(f"model {model} does not exist", hint="check the path")
    if calib is None:
        raise ConfigError(
            "deploy quantizes MODEL for the backend and needs calibration data",
            hint="pass --calib calib.npz (one array per model input)",
        )
    from ..plugins.manager import get_plugin_manager
    from .checks import check_data_paths, check_names, check_out_folder, refuse_overwrite

    check_names(get_plugin_manager(), backend=backend)
    check_data_paths(calib)
    check_out_folder(out, "--out")
    # deploy writes OUT/model.onnx and the backend's files beside it
    refuse_overwrite(
        Path(out) / "model.onnx", {"the model": model, "the --calib data": calib}, force
    )
    conf = PostTrainingQuantConfig(calibration_sampling_size=calib_size)
    result = deploy(model, backend, out, load_npz(calib, batch_size), conf=conf, opset=opset)
    console = Console(highlight=False)
    console.print(f"deployed for [bold]{backend}[/] ({result.framework}) into {result.out_dir}:")
    for name, what in result.files.items():
        console.print(f"  {name:22} {what}")
