"""What this CPU can do in int8: the features that decide which quantized formats are both
correct and fast here.

Why it matters: on x86 without VNNI, ONNX Runtime's (and oneDNN's) u8 x s8 kernels
multiply-add pairs into int16 with saturation (VPMADDUBSW), so a default U8S8 model can
read errors of a third of the output's range; 7-bit weights (``reduce_range``) or signed
activations avoid it. With VNNI (AVX-512 VNNI, AVX-VNNI) or AMX the sums are exact in int32.
On Arm, ``dotprod`` (SDOT/UDOT) and ``i8mm`` (SMMLA) play VNNI's part.

Features are read with archspec (Spack's CPU library: /proc/cpuinfo on Linux, sysctl on
macOS, cpuid on Windows). The environment variable ``LPQ_CPU_FLAGS`` replaces them, so a
test or a user can say which ISA to plan for (``LPQ_CPU_FLAGS=avx2`` plans as on an
AVX2-only CPU, whatever this one has). Every plan lpq makes from them is a *choice of
format*: kernels still run on the real CPU.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass

ENV_CPU_FLAGS = "LPQ_CPU_FLAGS"

#: The flags that matter for int8 inference, in the order lpq reports them.
INT8_FLAGS = (
    "avx2",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "amx_int8",
    "asimddp",  # Arm dotprod (Linux name)
    "i8mm",
)
_VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
_ARM_DOT_FLAGS = frozenset({"asimddp", "dotprod", "i8mm"})
_X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
_ARM = frozenset({"aarch64", "arm64"})


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's architecture and int8-relevant feature flags, and where they came from."""

    arch: str
    flags: frozenset[str]
    #: ``"archspec"`` when read from this machine, ``LPQ_CPU_FLAGS`` when given.
    source: str = "archspec"

    @property
    def is_x86(self) -> bool:
        return self.arch in _X86

    @property
    def int8_flags(self) -> tuple[str, ...]:
        """The int8-relevant flags present, in :data:`INT8_FLAGS` order."""
        return tuple(flag for flag in INT8_FLAGS if flag in self.flags)

    @property
    def has_vnni(self) -> bool:
        """Exact int32 u8 x s8 dot products on x86 (AVX-512 VNNI, AVX-VNNI or AMX)."""
        return self.is_x86 and bool(self.flags & _VNNI_FLAGS)

    @property
    def u8s8_saturates(self) -> bool:
        """Whether u8 x s8 int8 kernels can saturate here: x86 without VNNI or AMX."""
        return self.is_x86 and not self.has_vnni

    @property
    def isa(self) -> str:
        """A short name for the int8 ISA class, used in cache keys and reports."""
        if self.is_x86:
            if "amx_int8" in self.flags:
                return "x86-amx"
            if "avx512_vnni" in self.flags:
                return "x86-avx512-vnni"
            if "avx_vnni" in self.flags:
                return "x86-avx-vnni"
            if "avx512bw" in self.flags:
                return "x86-avx512"
            if "avx2" in self.flags:
                return "x86-avx2"
            return "x86"
        if self.arch in _ARM:
            if "i8mm" in self.flags:
                return "arm-i8mm"
            if self.flags & _ARM_DOT_FLAGS:
                return "arm-dotprod"
            return "arm"
        return self.arch or "unknown"

    def describe(self) -> str:
        """One line for ``lpq --version`` and reports: ISA class, flags, and source."""
        flags = " ".join(self.int8_flags) or "none"
        given = f" (from {ENV_CPU_FLAGS})" if self.source == ENV_CPU_FLAGS else ""
        return f"{self.isa} [{flags}]{given}"

    def as_dict(self) -> dict[str, object]:
        """What summaries, run keys and bench JSON record."""
        return {
            "arch": self.arch,
            "isa": self.isa,
            "int8_flags": list(self.int8_flags),
            "source": self.source,
        }


def features_from_flags(flags: Iterable[str] | str, arch: str = "x86_64") -> CpuFeatures:
    """CPU features from given flag names (comma- or space-separated when a string)."""
    if isinstance(flags, str):
        flags = flags.replace(",", " ").split()
    names = frozenset(flag.strip().lower() for flag in flags if flag.strip())
    return CpuFeatures(arch=arch, flags=names, source=ENV_CPU_FLAGS)


def cpu_features() -> CpuFeatures:
    """This machine's features, or those ``LPQ_CPU_FLAGS`` names (read on every call, so a
    test can set it; detection itself is cached)."""
    given = os.environ.get(ENV_CPU_FLAGS)
    if given is not None and given.strip():
        return features_from_flags(given, _machine())
    return detected_features()


def _machine() -> str:
    return platform.machine().lower()


@functools.cache
def detected_features() -> CpuFeatures:
    """This machine's features as archspec reads them, whatever ``LPQ_CPU_FLAGS`` says."""
    try:
        from archspec.cpu.detect import detected_info

        flags = frozenset(detected_info().features)
    except Exception:  # an unknown platform: plan conservatively, as with no int8 features
        flags = frozenset()
    return CpuFeatures(arch=_machine(), flags=flags, source="archspec")
