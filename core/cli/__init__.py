"""The ``lpq`` command.

User mistakes surface as :class:`lpq.LpqError`; :func:`main` prints them as one message
with a hint and exits 2, never with a traceback. Heavy imports (rich, jsonschema, the
tuner) happen inside the commands, so ``lpq --help`` stays fast and framework-free.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import click

from .._version import __version__
from ..errors import LpqError, LpqWarning


def _version_text() -> str:
    from ..hardware import cpu_features
    from ..plugins.manager import get_plugin_manager

    lines = [f"lpq-core {__version__}", f"CPU int8 features: {cpu_features().describe()}"]
    for record in get_plugin_manager().records():
        lines.append(
            f"{record.distribution} {record.version} (plugin {record.name!r}, "
            f"{record.status.value})"
        )
    return "\n".join(lines)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_text())
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the versions of lpq-core and every plugin, and the CPU's int8 features.",
)
def cli() -> None:
    """lpq: accuracy-aware low-precision quantization.

    Quantize a model to int8/int4 with the framework's own kernels and keep its accuracy
    within the tolerance you set. Framework adaptors are plugins: `lpq plugins list`.
    """


# --------------------------------------------------------------------------- plugins


@cli.group()
def plugins() -> None:
    """Inspect installed plugins."""


@plugins.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Also list each plugin's hooks and what it registers (strategies, metrics, "
    "executors, backend profiles, examples), and the CPU's int8 features.",
)
def plugins_list(as_json: bool, verbose: bool) -> None:
    """List plugins with their status, framework and hooks.

    Statuses: ok, disabled (LPQ_LOAD_PLUGINS / LPQ_DISABLE_PLUGINS), incompatible
    (needs another lpq-core), error (failed to import or validate; see the message).
    """
    from ..plugins.manager import get_plugin_manager

    records = get_plugin_manager().records()
    if as_json:
        click.echo(json.dumps([r.to_json() for r in records], indent=2))
        return
    from .console import make_console, print_table, table

    console = make_console()
    if not records:
        console.print("No lpq plugins installed. Try: pip install lpq-onnxrt")
        return
    listing = table(
        "lpq plugins", ["name", "distribution", "version", "status", "framework", "hooks"]
    )
    colors = {"ok": "green", "disabled": "dim", "incompatible": "yellow", "error": "red"}
    for record in records:
        frameworks = ", ".join(
            f"{fw['framework']} ({fw['distribution']} {fw['installed'] or 'not installed'})"
            for fw in record.frameworks
        )
        status = f"[{colors.get(record.status.value, 'white')}]{_status_text(record)}[/]"
        listing.add_row(
            record.name,
            record.distribution,
            record.version,
            status,
            frameworks or "-",
            _short_hooks(record.hooks),
        )
    print_table(console, listing)
    if verbose:
        from rich.markup import escape

        from ..hardware import cpu_features

        console.print(f"CPU int8 features: {escape(cpu_features().describe())}")
        builtin = get_plugin_manager().builtin_registered()
        console.print(f"[bold]lpq-core[/] (built in) registers: {_registered_text(builtin)}")
        for record in records:
            hooks = ", ".join(h.removeprefix("lpq_") for h in record.hooks) or "none"
            console.print(f"[bold]{record.name}[/] hooks: {hooks}")
            if record.registered:
                console.print(f"  registers: {_registered_text(record.registered)}")
    for record in records:
        if record.message and record.status.value != "disabled":
            console.print(f"[bold]{record.name}[/]: {record.message.splitlines()[0]}")
            if record.hint:
                console.print(f"  hint: {record.hint}")


def _registered_text(registered: dict[str, list[str]]) -> str:
    """``strategy: a, b; metric: c`` — what a plugin registered, per kind."""
    return "; ".join(f"{kind}: {', '.join(names)}" for kind, names in registered.items()) or "-"


def _status_text(record: Any) -> str:
    """A plugin's status as a user reads it: "ok" alone would claim a plugin whose framework
    is not installed can quantize; say what it can do instead."""
    status: str = record.status.value
    missing = [fw["framework"] for fw in record.frameworks if not fw["installed"]]
    if status == "ok" and missing:
        return f"ok ({', '.join(missing)} not installed: cannot quantize)"
    return status


_SHORT_HOOK_NAMES = {
    "lpq_detect_framework": "detect",
    "lpq_query_fw_capability": "capability",
    "lpq_query_fused_patterns": "patterns",
    "lpq_quantize": "quantize",
    "lpq_evaluate": "evaluate",
    "lpq_convert_bf16": "bf16",
    "lpq_inspect_tensor": "inspect",
    "lpq_save_model": "save",
    "lpq_load_model": "load",
}


def _short_hooks(hooks: list[str]) -> str:
    """Hook names short enough for a table cell; registrations listed after a '+'."""
    calls = [
        _SHORT_HOOK_NAMES.get(h, h.removeprefix("lpq_"))
        for h in hooks
        if not h.startswith("lpq_register_")
    ]
    registers = [h.removeprefix("lpq_register_") for h in hooks if h.startswith("lpq_register_")]
    text = ", ".join(calls)
    if registers:
        text += ("; " if text else "") + "registers " + ", ".join(registers)
    return text or "-"


# --------------------------------------------------------------------------- capability


@cli.group()
def capability() -> None:
    """Validate and show capability YAML files."""


@capability.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def capability_validate(files: tuple[str, ...]) -> None:
    """Validate capability YAML FILES against lpq's schema."""
    from ..plan.capability_loader import validate_capability_file

    failed = 0
    for file in files:
        try:
            blocks = validate_capability_file(file)
        except LpqError as exc:
            failed += 1
            click.echo(f"FAIL {exc}", err=True)
        else:
            click.echo(f"ok   {file} ({blocks} version block{'s' if blocks != 1 else ''})")
    if failed:
        raise SystemExit(2)  # like every user error


@capability.command("show")
@click.argument("framework")
@click.option(
    "--framework-version", help="Pick the block for this version instead of the installed one."
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def capability_show(framework: str, framework_version: str | None, as_json: bool) -> None:
    """Show what FRAMEWORK's adaptor can quantize for the installed framework version."""
    from ..plan.capability_loader import load_capability
    from ..plugins.discovery import installed_version
    from ..plugins.manager import get_plugin_manager

    info = get_plugin_manager().adaptor(framework)
    version = framework_version or installed_version(info.framework_distribution)
    spec = load_capability(info.capability_files, framework, version)
    rows: list[dict[str, Any]] = [
        {
            "op_type": op_type,
            "precision": cap.precision,
            "mode": cap.mode,
            "weight": _options_text(cap.weight),
            "activation": _options_text(cap.activation),
            "fallback": list(spec.float_fallbacks(op_type)),
        }
        for op_type in spec.quantizable_op_types()
        for cap in spec.for_op_type(op_type)
    ]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "framework": framework,
                    "framework_version": version,
                    "version_block": spec.version_block,
                    "ops": rows,
                    "patterns": [" + ".join(p) for p in spec.patterns],
                },
                indent=2,
            )
        )
        return
    from .console import make_console, print_table, table

    shown = table(
        f"{framework} capability ({info.framework_distribution} "
        f"{version or 'not installed'}; block {spec.version_block})",
        ["op type", "precision", "mode", "weight", "activation", "fallback"],
    )
    for row in rows:
        shown.add_row(
            row["op_type"],
            row["precision"],
            row["mode"],
            row["weight"],
            row["activation"],
            ", ".join(row["fallback"]),
        )
    print_table(make_console(), shown)


def _options_text(options: Any) -> str:
    if options is None:
        return "-"
    parts = [
        "/".join(options.dtype),
        "/".join(options.scheme),
        "/".join(options.granularity),
        "/".join(options.algorithm),
    ]
    parts += [f"{key}={'/'.join(map(str, values))}" for key, values in options.extra.items()]
    return " ".join(parts)


def _register_tuning_commands() -> None:
    from .deploy import deploy_command
    from .diagnose import diagnose_command
    from .tuning import quantize_command, tune_command

    cli.add_command(quantize_command)
    cli.add_command(tune_command)
    cli.add_command(deploy_command)
    cli.add_command(diagnose_command)


def _show_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """lpq's own warnings as one ``warning: ...`` line; others as Python shows them."""
    if issubclass(category, LpqWarning):
        click.echo(f"warning: {message}", err=True)
    else:
        _python_show_warning(message, category, *args, **kwargs)


_python_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning lpq errors into a message and exit code 2."""
    _register_tuning_commands()
    warnings.showwarning = _show_warning
    try:
        cli.main(args=argv, prog_name="lpq", standalone_mode=False)
    except LpqError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
