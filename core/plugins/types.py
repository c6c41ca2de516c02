"""What plugins hand to lpq: the objects of the registration hooks, and the result a
quantization may return."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..plan.backend import QuantScheme


@dataclass(frozen=True)
class AdaptorInfo:
    """Describes a framework adaptor; registered through ``lpq_register_adaptors``.

    ``framework`` is the name every per-framework hook is dispatched with (``onnxrt``,
    ``torch``). ``framework_distribution`` is the pip distribution whose installed version
    selects the capability YAML's version block, read from metadata so that listing
    plugins never imports the framework. ``capability_files`` are the adaptor's YAML files.
    """

    framework: str
    framework_distribution: str
    capability_files: Sequence[Path]
    description: str = ""
    #: File suffixes of models this adaptor reads (``.onnx``), for error messages and the CLI.
    model_suffixes: Sequence[str] = ()
    #: Pip requirement that installs this adaptor, for "no plugin recognises this" hints.
    install_hint: str = ""
    #: The global option keys the adaptor reads (``--option KEY=VALUE``; recipes included).
    #: When given, an unknown key is an error before any work, listing these; when empty,
    #: keys are not checked (lpq cannot know what the adaptor reads).
    known_options: Sequence[str] = ()


@dataclass(frozen=True)
class BackendProfile:
    """A named set of adaptor settings for one kind of hardware or runtime.

    Registered through ``lpq_register_backend_profiles`` and selected with the config's
    ``backend`` option. ``options`` are merged into every tune_cfg's global options (for
    example an execution provider); ``capability_file`` optionally replaces the adaptor's
    capability YAML, narrowing what the strategy may choose on that backend.

    ``scheme`` is the backend's quantization scheme as plain data (a mapping in the form
    of :meth:`lpq.plan.backend.QuantScheme.to_json`, or a ``QuantScheme``): it narrows
    the capability further (capability ∩ backend) and reaches the adaptor as
    ``tune_cfg.options["backend_scheme"]``. ``writer`` names the function that writes the
    backend's parameter files at deploy (``"package.module:function"``, imported only
    then; see docs/adding-a-backend.md).
    """

    name: str
    framework: str
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    capability_file: Path | None = None
    scheme: Any = None
    writer: str | None = None

    def __post_init__(self) -> None:
        if self.scheme is not None:
            from ..plan.backend import QuantScheme

            object.__setattr__(self, "scheme", QuantScheme.from_json(self.scheme))

    @property
    def quant_scheme(self) -> QuantScheme | None:
        """The parsed scheme (``None``: the profile only sets options)."""
        scheme: QuantScheme | None = self.scheme
        return scheme


@dataclass(frozen=True)
class Example:
    """A ready-to-run tuning example shipped inside a plugin (``lpq tune --example NAME``).

    ``calib`` and ``eval`` are ``.npz`` files in the CLI data format; ``eval`` carries a
    ``labels`` array so that ``metric`` measures real accuracy.
    """

    name: str
    framework: str
    model: Path
    calib: Path
    eval: Path
    metric: str = "top1"
    description: str = ""


#: ``register`` callbacks handed to the registration hooks.
RegisterAdaptor = Callable[[AdaptorInfo], None]
RegisterStrategy = Callable[[str, Callable[..., Any]], None]
RegisterMetric = Callable[[str, Callable[..., Any]], None]
RegisterBackendProfile = Callable[[BackendProfile], None]
RegisterExample = Callable[[Example], None]
RegisterExecutor = Callable[[str, Callable[..., Any]], None]


@dataclass(frozen=True)
class QuantizeResult:
    """What an adaptor's ``lpq_quantize`` may return instead of the bare model: the model
    and what the adaptor already knows about it, so a trial needs no further hook call to
    learn it (one quantize, one evaluate).

    ``quantized_ops``: fp32 op name -> precision read from the converted model (as
    ``lpq_quantized_ops`` answers). ``tune_cfg``: the configuration the model really is,
    when the adaptor resolved choices the requested one left open (as
    ``lpq_resolved_config``). ``size_bytes``: the serialized size. A field left ``None``
    is asked through its hook, as for a bare model.
    """

    model: Any
    quantized_ops: Mapping[str, str] | None = None
    tune_cfg: Any = None
    size_bytes: int | None = None
