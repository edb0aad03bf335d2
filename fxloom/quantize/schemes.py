"""Quantization schemes as records: what a scheme quantizes, how, and what each decision means.

A ``QuantScheme`` says everything prepare, convert, the report and lowering ask of a
scheme; they read its fields and never compare its name. Adding a scheme is adding a record
(``QuantConfig(scheme=my_scheme)`` takes one that no table here lists)::

    >>> from fxloom.quantize.schemes import SCHEMES, scheme_named
    >>> sorted(SCHEMES)
    ['dynamic', 'dynamic_per_token', 'qat', 'static', 'w4', 'w4_g128', 'w4_g32', 'w4_g64', 'w8']
    >>> w4 = scheme_named("w4")
    >>> w4.weight_bits, w4.group_size, w4.calibrates, w4.activations
    (4, 128, False, None)
    >>> scheme_named("dynamic").activations, scheme_named("dynamic_per_token").activations
    ('per_tensor', 'per_token')

``Kind`` is the decision a plan makes for one node. Its members are strings (``"int8"``),
and each carries what the report prints and whether it counts as quantized.

Depends on: torch (``nn.Linear`` rows), nothing else of fxloom.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from torch import nn

__all__ = ["SCHEMES", "Kind", "QuantScheme", "scheme_named"]


class Kind(str, enum.Enum):
    """What happens to one node (the plan's decision). Compares equal to its value."""

    INT8 = "int8"  # an operator with an int8 kernel: inputs quantized, output observed
    DYNAMIC = "dynamic"  # a layer with int8 weights, activations quantized at run time
    WEIGHT_ONLY = "weight_only"  # a layer with int8/int4 weights, float activations
    FUSED = "fused"  # a ReLU computed by the int8 operator before it
    SHARED = "shared"  # computes on int8 with its input's scale (reshapes, max pooling)
    FLOAT = "float"
    IDENTITY = "identity"  # dropout, nn.Identity: erased by convert

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def quantized(self) -> bool:
        """Whether the node becomes a quantized layer (its float module is replaced)."""
        return self in (Kind.INT8, Kind.DYNAMIC, Kind.WEIGHT_ONLY)

    def __str__(self) -> str:
        return self.value


# kind -> what the report's column says
_LABELS = {
    Kind.INT8: "int8",
    Kind.DYNAMIC: "int8 dynamic",
    Kind.WEIGHT_ONLY: "int weights",
    Kind.FUSED: "int8 (fused)",
    Kind.SHARED: "int8 (shared)",
    Kind.FLOAT: "float",
    Kind.IDENTITY: "removed",
}


@dataclass(frozen=True)
class QuantScheme:
    """One quantization scheme.

    name: how configs and the report name it.
    mode: the family, as ``QuantConfig.mode`` reports it (``static``, ``dynamic``,
        ``weight_only``).
    plans: ``"graph"`` (every operator of the graph decided, observers on activations) or
        ``"layers"`` (only the layer classes of ``layers``, no observers).
    layer_kind: the decision its quantized layers get.
    calibrates: activations are observed (static and QAT): convert needs calibration.
    trains: prepare puts fake quantization in (QAT).
    activations: ``"static"`` (calibrated per tensor), ``"per_token"`` (symmetric, at run
        time), ``"per_tensor"`` (affine, at run time) or None (they stay float).
    weight_bits: 8 or 4.
    group_size: inputs per int4 scale (32, 64 or 128); None: one scale per output channel.
    layers: for ``plans="layers"``: the module classes it quantizes.
    why: the report's reason for a quantized layer.
    """

    name: str
    mode: str
    plans: str
    layer_kind: Kind
    calibrates: bool = False
    trains: bool = False
    activations: str | None = None
    weight_bits: int = 8
    group_size: int | None = None
    layers: tuple[type, ...] = ()
    why: str = ""

    @property
    def title(self) -> str:
        """The report's summary line starts with it: ``static int8``, ``w4 (group 128)``."""
        if self.group_size is not None:
            return f"{self.name} int{self.weight_bits} (group {self.group_size})"
        return f"{self.name} int{self.weight_bits}"

    def with_(self, **changes) -> QuantScheme:
        return dataclasses.replace(self, **changes)


STATIC = QuantScheme(
    "static", "static", "graph", Kind.INT8, calibrates=True, activations="static",
    why="int8 weights and activations, calibrated",
)  # fmt: skip
QAT = STATIC.with_(name="qat", trains=True)
# The default dynamic form is per tensor (uint8, affine, from each input's range): oneDNN
# runs it at 0.6-1.0x fbgemm's time per layer with about half fbgemm's error; per token
# (int8, symmetric, a scale per row; aten._int_mm) has a little less error but measures
# 1.3-2.5x fbgemm's time (RESULTS.md, "dynamic int8 on oneDNN").
DYNAMIC = QuantScheme(
    "dynamic", "dynamic", "layers", Kind.DYNAMIC, activations="per_tensor",
    layers=(nn.Linear, nn.LSTM, nn.GRU),
    why="int8 weights, activations per tensor at run time",
)  # fmt: skip
DYNAMIC_PER_TOKEN = DYNAMIC.with_(
    name="dynamic_per_token", activations="per_token",
    why="int8 weights, activations per token at run time",
)  # fmt: skip
W8 = QuantScheme(
    "w8", "weight_only", "layers", Kind.WEIGHT_ONLY, layers=(nn.Linear,),
    why="int8 weights (one scale per output channel), float activations",
)  # fmt: skip
W4 = W8.with_(
    name="w4", weight_bits=4, group_size=128,
    why="int4 weights (a scale and zero point per group), float activations",
)  # fmt: skip

SCHEMES: dict[str, QuantScheme] = {
    "static": STATIC,
    "qat": QAT,
    "dynamic": DYNAMIC,
    "dynamic_per_token": DYNAMIC_PER_TOKEN,
    "w8": W8,
    "w4": W4,
    **{f"w4_g{size}": W4.with_(group_size=size) for size in (32, 64, 128)},
}


def scheme_named(name: str) -> QuantScheme:
    if name not in SCHEMES:
        raise ValueError(
            f"no quantization scheme {name!r}: choose one of {', '.join(SCHEMES)}, or pass "
            "a QuantScheme record of your own"
        )
    return SCHEMES[name]
