"""What lpq knows about the PyTorch adaptor before torch is imported.

A leaf module: the framework name, the distribution, the capability file, the sniffing
that recognises a torch model, and the names of the attributes lpq-torch stores on the
models it makes. It imports nothing of ``lpq_torch`` and never imports torch, so
registration and detection (``lpq plugins list``, ``lpq_detect_framework``) stay cheap;
every other module may import it.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any

FRAMEWORK = "torch"
#: The distribution whose installed version is the framework version lpq reports.
DISTRIBUTION = "torch"
#: Suffix of the files lpq-torch saves and loads (a ``torch.export`` archive).
MODEL_SUFFIX = ".pt2"
_ZIP_MAGIC = b"PK\x03\x04"  # a .pt2 archive is a zip file

# Attributes lpq-torch sets on the models it returns. Several jobs read them (evaluation,
# inspection, save/load, editing), so they are named here, below all of those jobs.

#: Example inputs of a model lpq produced (to re-export it on save, without data).
EXAMPLE_ATTR = "_lpq_example_inputs"
#: The tune_cfg (JSON) a model was quantized with; its presence marks a model lpq made.
TUNE_CFG_ATTR = "_lpq_tune_cfg"
#: The calibrated (min, max) of each float output (for integer outputs).
OUTPUT_RANGES_ATTR = "_lpq_output_ranges"
#: Scale/zero point of each integer input/output (``quantize_input``; saved in the .pt2).
IO_ATTR = "_lpq_io"
#: Marks a model from torchao's dynamic int8 path (value: every op name of its tune_cfg).
DYNAMIC_ATTR = "_lpq_torchao_dynamic"
#: Marks a model from the weight-only pass (value: its ``WeightOnlyReport``).
WEIGHT_ONLY_ATTR = "_lpq_weight_only"


def capability_files() -> list[Path]:
    """The capability YAML shipped in this package."""
    return [Path(str(resources.files("lpq_torch").joinpath("capabilities", "torch.yaml")))]


def is_saved_model(path: Path) -> bool:
    """A ``.pt2`` zip archive (what ``torch.export.save`` and lpq's save write)."""
    try:
        if path.suffix != MODEL_SUFFIX or not path.is_file():
            return False
        with path.open("rb") as handle:
            return handle.read(4) == _ZIP_MAGIC
    except OSError:
        return False


def detect(model: Any) -> bool:
    """Whether ``model`` is a torch ``nn.Module`` or a ``.pt2`` file. Never raises and never
    imports torch: detection is asked about every other framework's models too, and a torch
    model can only exist if torch is already imported."""
    try:
        if isinstance(model, str | Path):
            return is_saved_model(Path(model))
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(model, torch.nn.Module)
    except Exception:
        return False
