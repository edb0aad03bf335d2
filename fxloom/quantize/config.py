"""What to quantize and how: ``QuantSpec`` (one setting) and ``QuantConfig`` (who gets which).

A ``QuantSpec`` says how an operator is quantized: the observer for its activations, the
observer for its weights (per-channel or per-tensor, symmetric or affine). ``None`` in its
place means "leave it in float". ``QuantConfig`` chooses a spec for each node, the most
specific setting winning::

    module path  >  module type  >  operator  >  global

A module path applies to the module and everything called inside it (``"decoder"`` covers
``"decoder.0"``); the longest matching path wins. A module type applies to modules of exactly
that class and to what runs inside them. An operator is the function a ``call_function``
node calls (``torch.add``, ``operator.add``, ``F.relu``) or a method name (``"relu"``)::

    >>> import torch
    >>> from fxloom.quantize import QuantConfig
    >>> config = QuantConfig(engine="x86")
    >>> config = config.set_module_path("decoder", None)          # decoder stays in float
    >>> config = config.set_module_type(torch.nn.Conv2d, config.global_spec.with_(per_channel=False))
    >>> config.engine, config.mode
    ('x86', 'static')

``mode="dynamic"`` quantizes weights ahead of time and activations at run time (per batch, no
calibration): Linear, LSTM and GRU layers only, for models whose time goes there.

Engines: ``"x86"`` and ``"fbgemm"`` (server CPUs: per-channel weights) and ``"qnnpack"``
(ARM/mobile: per-tensor weights). Activations use all 8 bits. fxloom's plain kernels (the
default) compute a file's numbers exactly on every CPU (``kernels``). On a CPU without VNNI,
layers of int8 activations get 7-bit weights (-64..63, ``narrow_weights``) by default, so
that oneDNN's int8 kernels take whole 8-bit activation codes there without saturating (a
file with 8-bit weights still runs exact there, on slower rows); set ``narrow_weights`` to
convert the same weights on every CPU. With ``kernels="torch.ao"`` activations use 7 bits
where FBGEMM's kernels could overflow on this CPU (``saturates_8_bit_activations``): FBGEMM
without AVX-512 VNNI sums pairs of products in 16 bits, so there activations get 7 bits
(``reduce_range``, torch.ao's x86 default everywhere). A torch.ao model converted on a VNNI
CPU keeps its 8-bit scales: to deploy it on an older x86 CPU, set ``reduce_range=True``.
``reduce_range=False`` with torch.ao's kernels on a CPU without VNNI is obeyed (for a model
to deploy on VNNI CPUs) with a ``SaturationWarning``: run there, its int8 layers saturate
(cnn_small: relative error 0.27, against 0.009 with 7 bits).

Depends on: torch, ``observers``, ``errors``, ``kernels`` (whether this CPU has VNNI).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom.quantize.errors import SaturationWarning
from fxloom.quantize.kernels import vnni
from fxloom.quantize.observers import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    Observer,
    PerChannelMinMaxObserver,
)
from fxloom.quantize.schemes import QuantScheme, scheme_named
from fxloom.quantize.table import is_table_key

__all__ = [
    "ACTIVATION_OBSERVERS",
    "ENGINES",
    "QuantConfig",
    "QuantSpec",
    "saturates_8_bit_activations",
]

ENGINES = ("x86", "fbgemm", "qnnpack")
MODES = ("static", "dynamic")  # the names ``mode=`` takes (schemes of the same name)
# kernels= : "plain" (fxloom's operators on plain integer tensors, torch.ops.fxloom_q) or
# "torch.ao" (torch's deprecated quantized tensors and modules, kept for one release)
KERNELS = ("plain", "torch.ao")

# name -> observer class for activations (QuantSpec.activation); add your own.
ACTIVATION_OBSERVERS: dict[str, Callable[..., Observer]] = {
    "minmax": MinMaxObserver,
    "moving_average": MovingAverageMinMaxObserver,
    "histogram_mse": lambda **kw: HistogramObserver(method="mse", **kw),
    "histogram_percentile": lambda **kw: HistogramObserver(method="percentile", **kw),
}


@dataclass(frozen=True)
class QuantSpec:
    """How one operator is quantized.

    activation: a name of ``ACTIVATION_OBSERVERS`` (``"histogram_mse"`` by default, as torch's
        x86 default uses a histogram).
    symmetric: activations centred on zero (weights are always symmetric, as the int8
        kernels require).
    per_channel: one weight scale per output channel (``False``: one per tensor); ``None``:
        as the engine prefers (x86/FBGEMM per channel, QNNPACK per tensor).
    reduce_range: activations in 7 bits; ``None``: where the engine needs it on this CPU
        (``saturates_8_bit_activations``). ``False`` where it needs them warns
        (``SaturationWarning``).
    narrow_weights: int8 weights in 7 bits (-64..63) for layers with int8 activations, so
        that oneDNN's int8 kernels run exact on whole 8-bit activation codes on CPUs
        without VNNI (``kernels.NARROW_WEIGHT``; ONNX Runtime's ``reduce_range`` does the
        same); ``None``: where this CPU lacks VNNI, with the plain kernels. Weight-only
        schemes keep 8 bits (their kernels sum in float).
    """

    activation: str = "histogram_mse"
    symmetric: bool = False
    per_channel: bool | None = None
    reduce_range: bool | None = None
    narrow_weights: bool | None = None

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATION_OBSERVERS:
            raise ValueError(
                f"QuantSpec(activation={self.activation!r}): choose one of "
                f"{', '.join(ACTIVATION_OBSERVERS)} (or add yours to ACTIVATION_OBSERVERS)"
            )

    def with_(self, **changes: Any) -> QuantSpec:
        """A copy with ``changes`` (``spec.with_(per_channel=False)``)."""
        return dataclasses.replace(self, **changes)

    def activation_observer(self, engine: str, kernels: str = "plain") -> Observer:
        """The observer of an activation for ``engine`` and ``kernels``: 7 bits by default
        only where torch.ao's kernels would saturate 8 (fxloom's plain kernels never do)."""
        saturates = kernels == "torch.ao" and saturates_8_bit_activations(engine)
        reduce_range = self.reduce_range
        if reduce_range is None:
            reduce_range = saturates
        elif not reduce_range and saturates:
            _warn_8_bits_saturate(engine)
        return ACTIVATION_OBSERVERS[self.activation](
            dtype=torch.quint8, symmetric=self.symmetric, reduce_range=reduce_range
        )

    def weight_observer(
        self, engine: str, ch_axis: int = 0, kernels: str = "plain", int8_activations: bool = True
    ) -> Observer:
        """The observer of a weight for ``engine`` and ``kernels``, for a layer whose
        activations are int8 (``int8_activations``) or stay float (weight-only): 7 bits by
        default only where the plain int8 kernels need them to run fast on this CPU."""
        narrow = self.narrow_weights
        if narrow is None:
            narrow = int8_activations and kernels == "plain" and not vnni()
        per_channel = self.per_channel
        if per_channel is None:
            per_channel = engine != "qnnpack"
        if per_channel:
            return PerChannelMinMaxObserver(ch_axis=ch_axis, reduce_range=narrow)
        return MinMaxObserver(dtype=torch.qint8, symmetric=True, reduce_range=narrow)


# FBGEMM's own setting FBGEMM_ENABLE_INSTRUCTIONS, which it obeys over what the CPU has:
# value -> whether its kernels sum in 16 bits (no VNNI); other values leave the CPU's choice
FBGEMM_INSTRUCTIONS_SATURATE = {
    "AVX2": True,
    "AVX512": True,
    "AVX512_256": True,
    "AVX512_E1": False,
    "AVX512_E1_256": False,
}


def saturates_8_bit_activations(engine: str) -> bool:
    """Whether ``engine``'s int8 kernels can overflow on 8-bit activations on this CPU.

    FBGEMM (engines ``x86`` and ``fbgemm``) multiplies uint8 activations by int8 weights with
    AVX2/AVX-512 instructions that add pairs of products into 16 bits, saturating
    (255 * 127 * 2 > 32767); with AVX-512 VNNI (``vpdpbusd``) it sums in 32 bits. QNNPACK sums
    in 32 bits everywhere.

    >>> saturates_8_bit_activations("qnnpack")
    False
    """
    if engine not in ("x86", "fbgemm"):
        return False
    chosen = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper()
    if chosen in FBGEMM_INSTRUCTIONS_SATURATE:
        return FBGEMM_INSTRUCTIONS_SATURATE[chosen]
    return not torch.cpu._is_vnni_supported()


def _warn_8_bits_saturate(engine: str) -> None:
    # stacklevel 5: here <- activation_observer <- _insert_observers <- prepare(_qat) <- caller
    warnings.warn(
        SaturationWarning(
            f"QuantSpec(reduce_range=False): 8-bit activations, but engine {engine!r} on this "
            "CPU (AVX-512 VNNI not in use) adds pairs of uint8*int8 products in 16 bits, which "
            "saturate: the converted model is far off when run here (cnn_small: relative "
            "error 0.27, 0.009 with 7 bits). Leave reduce_range=None (7 bits where needed, as "
            "torch.ao's x86 default), or keep 8 bits only for a model to deploy on CPUs with "
            "AVX-512 VNNI"
        ),
        stacklevel=5,
    )


@dataclass(frozen=True)
class QuantConfig:
    """Which nodes are quantized, with which ``QuantSpec`` (``None``: left in float).

    Each ``set_*`` returns a new config (the config is a value, safe to share).
    """

    engine: str = "x86"
    mode: str = "static"
    global_spec: QuantSpec | None = field(default_factory=QuantSpec)
    module_paths: dict[str, QuantSpec | None] = field(default_factory=dict)
    module_types: dict[type, QuantSpec | None] = field(default_factory=dict)
    operators: dict[Any, QuantSpec | None] = field(default_factory=dict)
    scheme: QuantScheme | str | None = None  # None: the scheme named by ``mode``
    kernels: str = "plain"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"QuantConfig(engine={self.engine!r}): choose one of {ENGINES}")
        if self.kernels not in KERNELS:
            raise ValueError(f"QuantConfig(kernels={self.kernels!r}): choose one of {KERNELS}")
        if self.scheme is None and self.mode not in MODES:
            raise ValueError(f"QuantConfig(mode={self.mode!r}): choose one of {MODES}")
        scheme = self.scheme if self.scheme is not None else self.mode
        if isinstance(scheme, str):
            scheme = scheme_named(scheme)
        # a frozen value: the scheme record and its mode are settled here, once
        object.__setattr__(self, "scheme", scheme)
        object.__setattr__(self, "mode", scheme.mode)

    def set_global(self, spec: QuantSpec | None) -> QuantConfig:
        return dataclasses.replace(self, global_spec=spec)

    def set_module_path(self, path: str, spec: QuantSpec | None) -> QuantConfig:
        return dataclasses.replace(self, module_paths={**self.module_paths, path: spec})

    def set_module_type(self, module_type: type, spec: QuantSpec | None) -> QuantConfig:
        return dataclasses.replace(self, module_types={**self.module_types, module_type: spec})

    def set_operator(self, operator: Any, spec: QuantSpec | None) -> QuantConfig:
        return dataclasses.replace(self, operators={**self.operators, operator: spec})

    def choose(
        self, paths: list[str], types: list[type], operator: Any
    ) -> tuple[QuantSpec | None, str]:
        """The spec for a node and which setting gave it.

        ``paths``/``types``: the modules the node runs in, outermost first, its own last.
        """
        best = _longest_matching_path(self.module_paths, paths)
        if best is not None:
            return self.module_paths[best], f"module path {best!r}"
        for module_type in reversed(types):
            if module_type in self.module_types:
                return self.module_types[module_type], f"module type {module_type.__name__}"
        if operator is not None and is_table_key(operator) and operator in self.operators:
            return self.operators[operator], f"operator {_name(operator)}"
        return self.global_spec, "global"


def _longest_matching_path(settings: dict[str, Any], paths: list[str]) -> str | None:
    matches = [
        setting
        for setting in settings
        for path in paths
        if path == setting or path.startswith(setting + ".") or setting == ""
    ]
    return max(matches, key=len) if matches else None


def _name(operator: Any) -> str:
    return operator if isinstance(operator, str) else getattr(operator, "__name__", repr(operator))
