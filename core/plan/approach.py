"""Whether the user's approach can be carried out at all, before any trial runs.

A static approach with no calibration data, or an approach the adaptor does not offer
for any op of the model, used to leave every op in fp32 and "succeed". Both are user
mistakes with an obvious fix, so they are errors that say so.
"""

from __future__ import annotations

from ..errors import ConfigError
from .capability import FrameworkCapability

#: Approaches that name one quantization mode of the capability YAML.
_SINGLE_MODE = ("static", "dynamic", "weight_only")


def check_approach(capability: FrameworkCapability, approach: str, has_calib_data: bool) -> None:
    """Raise :class:`ConfigError` when ``approach`` cannot quantize anything here."""
    framework = capability.framework
    modes = sorted({cap.mode for caps in capability.opwise.values() for cap in caps})
    if approach in _SINGLE_MODE and capability.opwise and approach not in modes:
        raise ConfigError(
            f"the {framework} adaptor offers no {approach} quantization for any op of this model",
            hint=f"approaches it offers here: {', '.join(modes)} (`lpq capability show "
            f"{framework}` lists them per op type)",
        )
    if has_calib_data:
        return
    if approach == "static":
        raise ConfigError(
            "static quantization needs calibration data, and none was given",
            hint="pass calibration data (calib_dataloader=..., CLI: --calib DATA.npz), or use "
            "the dynamic approach (--approach dynamic), which needs none",
        )
    if approach == "auto" and "static" in modes:
        others = [mode for mode in modes if mode != "static"]
        raise ConfigError(
            "the 'auto' approach tries static quantization, which needs calibration data, "
            "and none was given",
            hint="pass calibration data (calib_dataloader=..., CLI: --calib DATA.npz)"
            + (
                f", or choose an approach that needs none: {', '.join(others)} "
                f"(--approach {others[0]})"
                if others
                else ""
            ),
        )
