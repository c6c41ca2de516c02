"""Framework errors inside a stage become lpq errors that name the stage and keep torch's text.

torch and torchao raise bare ``IndexError``/``ValueError``/``RuntimeError`` from deep inside
their passes. Escaping raw, they read as lpq bugs; wrapped by a generic "check your data"
handler, they point the user the wrong way. Inside :func:`stage`, any non-lpq exception
becomes a :class:`lpq.ModelError` saying which stage failed (quantize/prepare, calibrate,
convert, inspect, compile, evaluate), on which op or construct when known, with the
framework's own message, and a hint that is about that stage, never about the data.

A leaf of the package (it imports nothing of lpq_torch): every stage may use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lpq import LpqError, ModelError

#: What to do when a stage fails inside the framework (not the user's data or config).
HINTS = {
    "prepare": "torchao's x86 recipe could not annotate this graph; keep the named op in "
    "fp32 (op_name_dict={'<op>': 'fp32'}) and report the pattern to lpq-torch",
    "calibrate": "the observed model failed on a calibration batch; check that every batch "
    "has the shapes of the first (which the fp32 model accepted), or keep the op in fp32",
    "convert": "torchao could not convert the calibrated graph; keep the named op in fp32",
    "inspect": "per-op inspection failed; tuning can go on without it (op ranking is then "
    "by trial), or keep the named op in fp32",
    "compile": "torch.compile failed; run with LPQ_TORCH_COMPILE=0 to evaluate eagerly",
    "evaluate": "the quantized model failed on data the fp32 model accepts; keep the named "
    "op in fp32",
    "quantize": "torchao could not quantize this model; keep the named op in fp32",
}


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (torch's can run to pages)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip()[:300] if lines else type(exc).__name__


def framework_error(
    name: str, exc: BaseException, where: str = "", hint: str | None = None
) -> ModelError:
    """The lpq error for ``exc`` raised by torch/torchao during stage ``name``."""
    at = f" at {where}" if where else ""
    return ModelError(
        f"lpq-torch stage '{name}' failed{at}: {type(exc).__name__}: {first_line(exc)}",
        hint=hint or HINTS.get(name, "see the framework's message above"),
    )


@contextlib.contextmanager
def stage(name: str, where: str = "", hint: str | None = None) -> Iterator[None]:
    """Run a block as stage ``name``: lpq errors pass through, others are wrapped."""
    try:
        yield
    except LpqError:
        raise
    except Exception as exc:
        raise framework_error(name, exc, where, hint) from exc
