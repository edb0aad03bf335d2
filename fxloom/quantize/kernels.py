"""The kernel table: which kernel computes each of fxloom's quantized operators on this CPU.

The scheme decides *what* is computed (``quantize.ops``: each operator's reference); this
table decides *how fast*, per operator, by the call's shapes and dtypes and the CPU's
features. ``KERNELS[op]`` lists the candidates, fastest first; the first whose condition
holds runs, and the reference is the last resort. No kernel departs from its operator's
reference beyond float rounding, but for the weight-only rows that round fp32 activations to
bf16, whose text states their bound (``tests/quantize/test_kernels.py`` checks each row).

Seeded from the measurements of ``shared/design/quantize-plain-tensors.md`` (section 2, one
thread, AVX512-VNNI without AMX):

    op           kernel                              condition
    linear_int8  onednn.qlinear_pointwise            static activations (uint8, per tensor)
    linear_int8  onednn.qlinear_pointwise            dynamic per-tensor activations (uint8,
                 (dynamic per tensor)                affine, choose_qparams in the call)
    linear_int8  onednn.qconv_pointwise              without VNNI, narrow weights (at most
                 (rows as pixels)                    64), any activation form: the rows as
                                                     pixels of a 1x1 convolution
    linear_int8  onednn.qconv_pointwise              without VNNI, 8-bit weights: each code
                 (codes split in halves)             as two halves of at most 128, the rows
                                                     as pixels of a 1x1 convolution
    linear_int8  aten._int_mm (per-token int8)       dynamic per-token activations, K and N
                                                     multiples of 8 (else the reference)
    linear_w8    onednn.qconv_pointwise              without VNNI, fp32 or bf16 activations
                 (activations in two int8 levels)    as two levels of int8 codes, one 1x1
                                                     convolution for both (|error| <= max|x|
                                                     / 16384 per element); up to 256 rows
    linear_w8    aten._weight_int8pack_mm            bf16 activations, AVX2 or AVX512
    linear_w8    aten._weight_int8pack_mm            fp32 activations likewise: cast to bf16
                 (fp32 cast to bf16)                 around the call (fed fp32 it is 10-30x
                                                     slower); up to 128 rows (AVX2: 64)
    linear_w4    aten._weight_int4pack_mm_for_cpu    bf16 activations, AVX2 or AVX512, K a
                                                     multiple of 32, N of 16
    linear_w4    aten._weight_int4pack_mm_for_cpu    fp32 activations likewise, cast to bf16
                 (fp32 cast to bf16)                 (fed fp32: 20x slower); up to 256 rows
                                                     (AVX2: 128)
    conv2d_int8  onednn.qconv_pointwise              2-d, zero padding (the weight packed
                                                     for the input shape; the output left
                                                     channels-last, ``layouts``); without
                                                     VNNI, narrow weights only
    conv2d_int8  float32 convolution of the codes    without VNNI, 8-bit weights: the codes
                                                     summed in float32, the weight scaled
                                                     once (also the fused add's row)
    add_int8     onednn.qconv2d_pointwise.binary     4-d uint8 operands of one shape, uint8
                 (identity, sum)                     out: a depthwise identity convolution
                                                     of a, b added by the "sum" post-op
    conv2d_add_  onednn.qconv2d_pointwise.binary     2-d, uint8 activations and ``other`` of
    int8         (sum)                               the output's shape, uint8 out: the
                                                     convolution with the "sum" post-op
                                                     adding ``other`` (packed as conv2d_int8;
                                                     without VNNI, narrow weights only)
    anything else: the reference

The oneDNN rows that take whole uint8 codes require VNNI (or AMX) or narrow weights: without
VNNI oneDNN sums pairs of uint8 x int8 products in int16, which saturates on 8-bit weights
(``_whole_codes_fit``; weights within +-``NARROW_WEIGHT`` never do, and
``QuantSpec.narrow_weights`` gives them by default on such CPUs), and 8-bit weights there
get the split or float32 rows instead, the same numbers within float rounding.

Kernels that want the weight in their own layout (onednn's prepacked weights, int4 tiles)
get it on first use, cached by the identity and version of the weight and of the scales and
zero points it was packed from (``PACKED``, ``PACK_READS``): an in-place change of any of
them packs again, and the packed form is never saved, so a file written on one CPU runs on
another. Inference tensors (made inside ``torch.inference_mode()``) have no version, so a
layer whose weight or scales are ones runs the reference, with a warning; ``convert`` and
``fxloom.load`` make ordinary tensors even inside the mode. Which row a call gets, and its packed weight, is
looked up once per layer (``PLANS``, by the weight's identity and version and what the rows'
conditions read: dtypes, ranks, the last dimension, the non-tensor arguments), so a model's
forward pays a dictionary lookup per layer, not the table's conditions.
``explain(op, ...)`` says which kernel a layer gets and
why, for ``report()``::

    >>> from fxloom.quantize import kernels
    >>> kernels.explain("max_pool2d_int8").split(" (")[0]
    'window maximum, rows then columns'

Depends on: torch, ``ops`` (the references).
"""

from __future__ import annotations

import functools
import math
import struct
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxloom.quantize import ops

__all__ = [
    "KERNELS", "NARROW_WEIGHT", "PACKED", "PLANS", "Kernel", "cpu_features", "explain",
    "kernel_for", "kernel_name", "narrow", "reach", "run", "vnni",
]  # fmt: skip


@functools.cache
def cpu_features() -> frozenset[str]:
    """The CPU features the table's conditions read: ``vnni``, ``avx512_bf16``, ``amx``,
    ``avx2`` / ``avx512`` (ATen's kernels run their AVX2 or AVX512 code; avx512 implies
    avx2), ``onednn`` (torch built with oneDNN)."""
    probes = {
        "vnni": torch.cpu._is_vnni_supported,
        "avx512_bf16": torch.cpu._is_avx512_bf16_supported,
        "amx": torch.cpu._is_amx_tile_supported,
        # ATen's vector level (the kernels' compiled path; ATEN_CPU_CAPABILITY may lower it)
        "avx2": lambda: torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"),
        "avx512": lambda: torch.backends.cpu.get_cpu_capability() == "AVX512",
        "onednn": torch.backends.mkldnn.is_available,
    }
    return frozenset(name for name, probe in probes.items() if probe())


@dataclass(frozen=True)
class Kernel:
    """One row: ``fits(args, features)`` says "" when it can run the call, else why not;
    ``compute(args, packed)`` computes it; ``pack(args)`` (optional) makes the weight's
    layout once per weight version; ``why``: for the report."""

    name: str
    # reads only what ``_plan_key`` keys on (dtypes, ranks, last dims, non-tensor arguments,
    # the weight's values: the key holds its identity and version): the decision is reused
    # for every call of a layer that agrees on those
    fits: Callable[[tuple, frozenset[str]], str]
    compute: Callable[[tuple, Any], torch.Tensor]
    why: str
    pack: Callable[[tuple], Any] | None = None
    weight: int = 3  # the position of the weight among the operator's arguments
    # its packed weight depends on the input's shape (oneDNN's convolution picks the weight
    # layout for it: packed without the shape, some shapes run 10-80x slower): packed again
    # per input shape, at most SHAPES_PER_LAYER of them kept per weight
    shaped: bool = False
    # computes the call writing its result into an argument the caller gives up
    # (``run(..., reuse=True)``: ``ops.conv2d_add_int8_into_other``); None: ``compute``
    reusing: Callable[[tuple, Any], torch.Tensor] | None = None


# ---------------------------------------------------------------- packed weights
# (kernel name, id(weight), weight._version[, input shape]) -> (weak reference to the
# weight, packed form, the identities and versions of the other tensors it was packed from,
# weak references to them); the input shape only for ``Kernel.shaped`` rows
PACKED: dict[tuple, tuple] = {}
# how many input shapes a layer keeps packed (and planned): a model fed ever new image sizes
# packs again per size but holds at most this many packs per weight
SHAPES_PER_LAYER = 8


def _packed(kernel: Kernel, args: tuple, reads: tuple[int, ...] = ()) -> Any:
    """``kernel``'s packed form of the call's weight, made once per version of the weight
    and of the tensors at ``reads`` (its scales, zero points: ``PACK_READS``)."""
    weight = args[kernel.weight]
    key = (kernel.name, id(weight), weight._version)
    if kernel.shaped:
        key = (*key, tuple(args[0].shape))
    state = _states(args, reads)
    found = PACKED.get(key)
    if found is not None and found[0]() is weight and found[2] == state:
        return found[1]
    packed = kernel.pack(args)
    weight_ref, *read_refs = _held(PACKED, key, args, (kernel.weight, *reads))
    PACKED[key] = (weight_ref, packed, state, *read_refs)
    if kernel.shaped:
        _keep_newest(PACKED, key[:3], 4)
    return packed


def _held(cache: dict, key: tuple, args: tuple, positions: tuple[int, ...]) -> list:
    """Weak references to the tensors at ``positions``, each dropping ``cache[key]`` when its
    tensor dies (a new tensor may take its identity)."""
    drop = functools.partial(cache.pop, key, None)
    return [weakref.ref(args[at], lambda _: drop()) for at in positions]


def _states(args: tuple, reads: tuple[int, ...]) -> tuple:
    """The identity and version of each tensor at ``reads`` (an in-place change, or another
    tensor in its place, makes another state)."""
    return tuple((id(args[at]), args[at]._version) for at in reads)


def _keep_newest(cache: dict, layer: tuple, length: int) -> None:
    """Drop the oldest of ``cache``'s keys of ``length`` that start with ``layer`` beyond
    ``SHAPES_PER_LAYER`` (a scan, paid only when a new shape is packed)."""
    keys = [key for key in cache if len(key) == length and key[: len(layer)] == layer]
    for key in keys[: max(0, len(keys) - SHAPES_PER_LAYER)]:
        cache.pop(key, None)


# ---------------------------------------------------------------- oneDNN's int8 and VNNI
# Without VNNI (AVX512-VNNI or AMX), oneDNN's x86 int8 kernels multiply uint8 activations by
# int8 weights with AVX2's pairwise multiply-add, which sums each two neighbouring products
# in int16 and saturates: 255 * 127 * 2 > 32767. Measured on an AMD EPYC (AVX2, no VNNI),
# torch 2.13: a 256-wide row of codes up to 255 against weights up to 127 came out 508 off
# (scaled by 0.01); codes up to 128, or weights up to 64, came out exact; convolutions and
# linear layers alike (fbgemm avoids it by quantizing activations to 7 bits on such CPUs,
# torch.ao's ``reduce_range``, which changes the numbers). So the rows that feed oneDNN
# whole uint8 codes require VNNI; other CPUs get the split rows (each code as two halves of
# at most 128, exact) or the reference.
WHOLE_CODES = frozenset({"vnni", "amx"})  # either multiplies uint8 by int8 into int32


def vnni() -> bool:
    """Whether this CPU's int8 kernels take whole uint8 codes (``WHOLE_CODES``: AVX512-VNNI
    or AMX) rather than summing product pairs in int16."""
    return bool(WHOLE_CODES & cpu_features())


# Weights within this bound keep every pair sum in int16 for any uint8 codes (255 * 64 * 2
# = 32640 <= 32767): oneDNN's int8 kernels are exact on them without VNNI too. 7-bit weights
# (-64..63, ``QuantSpec.narrow_weights``, the default where this CPU lacks VNNI) fit.
NARROW_WEIGHT = 64


def reach(weight: torch.Tensor) -> int:
    """The largest magnitude among int8 ``weight``'s codes (0 for an empty weight)."""
    if not weight.numel():
        return 0
    low, high = torch.aminmax(weight)
    return max(-int(low), int(high))


def narrow(weight: torch.Tensor) -> bool:
    """Whether int8 ``weight``'s codes all lie within +-``NARROW_WEIGHT``."""
    return reach(weight) <= NARROW_WEIGHT


def _vnni_fits(features: frozenset[str]) -> str:
    if "onednn" not in features:
        return "torch is built without oneDNN"
    if not WHOLE_CODES & features:
        return "no VNNI: oneDNN's int8 would saturate int16 pair sums"
    return ""


def _whole_codes_fit(weight: torch.Tensor, features: frozenset[str]) -> str:
    """Whether oneDNN can take whole uint8 codes against ``weight``: with VNNI, or narrow
    weights (read once per weight version: the plans key on its identity and version)."""
    if "onednn" not in features:
        return "torch is built without oneDNN"
    if not WHOLE_CODES & features and not narrow(weight):
        return "no VNNI and 8-bit weights: oneDNN's int8 would saturate int16 pair sums"
    return ""


# ---------------------------------------------------------------- linear_int8
def _static_onednn_fits(args: tuple, features: frozenset[str]) -> str:
    x, dynamic = args[0], args[9]
    if dynamic:
        return "dynamic activations"
    if x.dtype not in (torch.uint8, torch.float32):
        return f"activations of {x.dtype}"
    return _vnni_fits(features)


def _static_onednn(args: tuple, packed: Any) -> torch.Tensor:
    x, x_scale, x_zp, w, w_scale, bias, out_scale, out_zp, relu = args[:9]
    if x.is_floating_point():
        x = ops.reference_quantize(x, x_scale, x_zp, *ops.ACTIVATION_RANGE, torch.uint8)
    rows = x.reshape(-1, x.shape[-1])
    float_out = out_scale == 0.0
    out = torch.ops.onednn.qlinear_pointwise(
        rows, x_scale, x_zp, packed, w_scale, _zero_points(w_scale), _float(bias),
        1.0 if float_out else out_scale, 0 if float_out else out_zp,
        torch.float32 if float_out else None, "relu" if relu else "none", [], "",
    )  # fmt: skip
    return out.reshape(*x.shape[:-1], w.shape[0])


def _onednn_linear_pack(args: tuple) -> Any:
    return torch.ops.onednn.qlinear_prepack(args[3], None)


def _activations(args: tuple) -> str:
    """linear_int8's activation form: "static", or its dynamic ``activations``."""
    if not args[9]:
        return "static"
    return args[10] if len(args) > 10 else "per_token"


def _per_tensor_onednn_fits(args: tuple, features: frozenset[str]) -> str:
    x, form = args[0], _activations(args)
    if form != "per_tensor":
        return f"{form} activations"
    if x.dtype != torch.float32:
        return f"activations of {x.dtype}"
    return _vnni_fits(features)


def _float32(value: float) -> float:
    """``value`` rounded to float32: one float32 operation done in double and rounded once
    is the float32 result (double has over 2 * 24 + 2 bits), so the parameters below are
    the reference's, bit for bit, without a dozen one-element tensor operations."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _per_tensor_qparams(rows: torch.Tensor) -> tuple[float, int] | None:
    """``ops.reference_choose_qparams(rows, 0, 255, 1e-8, uint8)`` as numbers (None: the
    input holds NaN or infinity; the reference decides what that gives)."""
    low, high = (value.item() for value in torch.aminmax(rows))
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    low, high = min(low, 0.0), max(high, 0.0)
    scale = max(_float32(_float32(high - low) / 255.0), _float32(1e-8))
    return scale, min(max(-round(_float32(low / scale)), 0), 255)


# 1.5 * 2**23: a float32 in [2**23, 2**24) has no fraction bits, so adding it rounds a value
# of magnitude below 2**22 to an integer, half to even (its parity is even, it keeps ties
# where torch.round puts them), and leaves that integer in the low mantissa bits
_ROUNDING_OFFSET = 12582912.0


def _uint8_codes(
    rows: torch.Tensor, scale: float, zero_point: int, low: int = 0, high: int = 255
) -> torch.Tensor:
    """``clamp(round(rows / scale) + zero_point, low, high)`` as uint8 (``0 <= low <= high
    <= 255``; float32 ``rows`` of any shape and layout), bit for bit the
    reference's, in four passes where the reference's form takes five and its float -> uint8
    conversion alone costs two divisions: the division (the reference's own float32
    operation), the clamp (before rounding: the bounds are integers, so clamping commutes
    with round), the rounding add with the zero point in it (the integer lands in the low
    byte of the float's bits), an int32 -> uint8 narrowing of those bits (modular: the low
    byte; 2.5x faster than float -> uint8). An odd zero point would flip ties (the add
    rounds half to even): it goes in less one, and the one is added in uint8 after (exact:
    the result lies in 0..255; a negative zero point likewise, modulo 256)."""
    odd = zero_point % 2  # an even zero point rides in the rounding add (ties stay put)
    codes = torch.div(rows, scale).clamp_(low - zero_point, high - zero_point)
    codes = codes.add_(_ROUNDING_OFFSET + zero_point - odd).view(torch.int32).to(torch.uint8)
    return codes.add_(odd) if odd else codes


def _codes_fit(args: tuple, features: frozenset[str]) -> str:
    x, _, _, quant_min, quant_max, dtype = args
    if x.dtype != torch.float32:
        return f"{x.dtype} input"
    if dtype != torch.uint8 or not 0 <= quant_min <= quant_max <= 255:
        return "not uint8 codes"
    return ""


def _codes(args: tuple, packed: Any) -> torch.Tensor:
    x, scale, zero_point, quant_min, quant_max, _ = args
    return _uint8_codes(x, scale, zero_point, quant_min, quant_max)


def _per_tensor_onednn(args: tuple, packed: Any) -> torch.Tensor:
    x, _, _, w, w_scale, bias, out_scale, out_zp, relu = args[:9]
    rows = x.reshape(-1, x.shape[-1])
    qparams = _per_tensor_qparams(rows)
    if qparams is None:
        return ops.reference_linear_int8(*args)
    scale, zero_point = qparams
    codes = _uint8_codes(rows, scale, zero_point)
    weight, weight_zero_points = packed
    float_out = out_scale == 0.0
    out = torch.ops.onednn.qlinear_pointwise(
        codes, scale, zero_point, weight, w_scale, weight_zero_points, _float(bias),
        1.0 if float_out else out_scale, 0 if float_out else out_zp,
        torch.float32 if float_out else None, "relu" if relu else "none", [], "",
    )  # fmt: skip
    return out.reshape(*x.shape[:-1], w.shape[0])


def _onednn_dynamic_pack(args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    return _onednn_linear_pack(args), _zero_points(args[4])


def _per_token_int_mm_fits(args: tuple, features: frozenset[str]) -> str:
    x, w, form = args[0], args[3], _activations(args)
    if form != "per_token":
        return f"{form} activations"
    if not x.is_floating_point():
        return "integer activations"
    if x.shape[-1] % 8 or w.shape[0] % 8:
        return "K or N not a multiple of 8"
    return ""


def _per_token_int_mm(args: tuple, packed: Any) -> torch.Tensor:
    x, _, _, w, w_scale, bias, out_scale, out_zp, relu = args[:9]
    q, row_scale = ops.per_token_symmetric(x.reshape(-1, x.shape[-1]))
    accumulated = torch._int_mm(q, packed).float() * (row_scale * w_scale.float())
    if bias is not None:
        accumulated = accumulated + bias.float()
    out = ops._requantize(accumulated, out_scale, out_zp, relu)
    return out.reshape(*x.shape[:-1], w.shape[0])


def _transposed(args: tuple) -> torch.Tensor:
    return args[3].t().contiguous()  # [K, N], as _int_mm takes it


# ---------------------------------------------------------------- linear_int8 without VNNI
# Each uint8 code as two halves of at most 128 (``min(code, 128)`` and the rest), stacked as
# twice the rows: no pair of products can leave int16 (128 * 127 * 2 < 32767), so oneDNN's
# AVX2 int8 kernel is exact, and the two halves' results add up to the whole. The rows run
# as the pixels of a 1x1 convolution (oneDNN's int8 matmul took 2.0 ms for one row of
# 2048 -> 5632 here, the convolution 0.37 ms; fbgemm's dynamic linear 0.38). With zero point
# 0 in the kernel, the zero point comes off after: ``zp * sum_k w`` per output channel.
# Measured on an AMD EPYC (AVX2, no VNNI), one thread, us per call, against the reference
# and fbgemm's dynamic linear (which quantizes to 7 bits here): see RESULTS.md.
def _split_fits(args: tuple, features: frozenset[str]) -> str:
    x, form = args[0], _activations(args)
    if "onednn" not in features:
        return "torch is built without oneDNN"
    if WHOLE_CODES & features:
        return "VNNI: the whole-code rows run"
    if x.dtype != torch.float32 and not (form == "static" and x.dtype == torch.uint8):
        return f"activations of {x.dtype}"
    return ""


def _rows_fit(args: tuple, features: frozenset[str]) -> str:
    """The split row's condition, for narrow weights (each code goes in whole)."""
    why = _split_fits(args, features)
    if not why and not narrow(args[3]):
        return "8-bit weights: the codes are split"
    return why


def _one_by_one(w: torch.Tensor, w_scale: torch.Tensor) -> tuple:
    """An int8 weight ``[N, K]`` as a packed 1x1 convolution kernel (scale per channel, input
    scale 1 and zero point 0: run with another, oneDNN reorders the weight on every call,
    8.9 ms against 0.36 ms), its zero points, and ``w_scale * sum_k w`` (an input zero
    point's share of each output)."""
    packed = torch.ops.onednn.qconv_prepack(
        w.reshape(*w.shape, 1, 1), w_scale, 1.0, 0, [1, 1], [0, 0], [1, 1], 1, None
    )
    column_sums = w.sum(dim=1, dtype=torch.int32).float() * w_scale.float()
    return packed, _zero_points(w_scale), column_sums


def _through_one_by_one(
    codes: torch.Tensor, w_scale: torch.Tensor, packed: tuple, scale: float = 1.0,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``scale * w_scale * (codes @ w.T) + bias`` in float32 for uint8 ``codes [R, K]``
    (each at most 128 where the CPU lacks VNNI): the rows as the pixels of one 1 x R image,
    channels-last, so both the codes and the result are views. The input's ``scale`` costs
    nothing at run time (another zero point than the packed one would: oneDNN reorders the
    weight for it on every call)."""
    weight, zero_points, _ = packed
    image = codes.reshape(1, 1, *codes.shape).permute(0, 3, 1, 2)  # [1, K, 1, R]
    out = torch.ops.onednn.qconv_pointwise(
        image, scale, 0, weight, w_scale, zero_points, bias, [1, 1], [0, 0], [1, 1], 1, 1.0, 0,
        torch.float32, "none", [], None,
    )  # fmt: skip
    return out.permute(0, 2, 3, 1).reshape(codes.shape[0], -1)


def _pixels_pack(args: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _one_by_one(args[3], args[4])


# per-token int8 codes -128..127 ride in uint8 shifted by this zero point
_SIGNED_AS_UINT8 = 128


def _split_codes(args: tuple, rows: torch.Tensor) -> tuple:
    """The call's uint8 codes ``[M, K]``, their zero point and scale (a number, or one per
    row), as its activation form makes them, bit for bit the reference's."""
    form = _activations(args)
    if form == "static":
        x_scale, x_zp = args[1], args[2]
        codes = rows if rows.dtype == torch.uint8 else _uint8_codes(rows, x_scale, x_zp)
        return codes, x_zp, x_scale
    if form == "per_tensor":
        qparams = _per_tensor_qparams(rows)
        if qparams is None:
            return None
        scale, zero_point = qparams
        return _uint8_codes(rows, scale, zero_point), zero_point, scale
    row_scale = ops.per_token_scale(rows)
    low, high = (code + _SIGNED_AS_UINT8 for code in ops.TOKEN_RANGE)
    return _uint8_codes(rows, row_scale, _SIGNED_AS_UINT8, low, high), _SIGNED_AS_UINT8, row_scale


def _split(args: tuple, packed: Any) -> torch.Tensor:
    return _as_pixels(args, packed, halves=True)


def _whole_rows(args: tuple, packed: Any) -> torch.Tensor:
    return _as_pixels(args, packed, halves=False)


def _as_pixels(args: tuple, packed: Any, halves: bool) -> torch.Tensor:
    """linear_int8 through oneDNN's 1x1 convolution, the rows as pixels: each code split in
    ``halves`` (8-bit weights), or whole (narrow weights)."""
    x, _, _, w, _, bias, out_scale, out_zp, relu = args[:9]
    rows = x.reshape(-1, x.shape[-1])
    found = _split_codes(args, rows)
    if found is None:  # NaN or infinity in a dynamic input: the reference says what it gives
        return ops.reference_linear_int8(*args)
    codes, zero_point, scale = found
    count, w_scale = rows.shape[0], args[4]
    if isinstance(scale, torch.Tensor):  # a scale per row (per token): applied after
        if halves:
            low = codes.clamp(max=128)
            out = _through_one_by_one(torch.cat((low, codes - low)), w_scale, packed)
            accumulated = out[:count].add_(out[count:])
        else:
            accumulated = _through_one_by_one(codes, w_scale, packed)
        accumulated = accumulated.sub_(packed[2], alpha=zero_point).mul_(scale)
        if bias is not None:
            accumulated = accumulated.add_(bias)
    else:  # one scale: it rides in the kernel, the zero point's share in the bias
        shifted = _shifted_bias(_float(bias), packed[2], zero_point * scale)
        if halves:
            low = codes.clamp(max=128)
            out = _through_one_by_one(torch.cat((low, codes - low)), w_scale, packed, scale)
            accumulated = out[:count].add_(out[count:])
            if shifted is not None:
                accumulated = accumulated.add_(shifted)
        else:
            accumulated = _through_one_by_one(codes, w_scale, packed, scale, shifted)
    out = ops._requantize(accumulated, out_scale, out_zp, relu)
    return out.reshape(*x.shape[:-1], w.shape[0])


def _shifted_bias(
    bias: torch.Tensor | None, column_sums: torch.Tensor, shift: float
) -> torch.Tensor | None:
    """``bias - shift * column_sums`` (``column_sums``: ``w_scale * sum_k w``): what an input
    zero point of ``shift / scale`` takes off each output, with the bias (None: neither)."""
    if not shift:
        return bias
    if bias is None:
        return column_sums * -shift
    return torch.add(bias, column_sums, alpha=-shift)


# ---------------------------------------------------------------- linear_w8 / linear_w4
# Weight-only kernels, measured here (one thread, AVX512 without AVX512-BF16, K 2048,
# N 5632; ms per call at M rows, the reference dequantizes the whole weight each call):
#
#   M                                  1      8     32    128    512
#   w8 reference, fp32                43     49     52     65    149
#   w8 reference, bf16                11     17     36    112    395
#   _weight_int8pack_mm, bf16        0.8    3.6     13     66    176
#   _weight_int8pack_mm, fp32 fed    8.3     93    371   1504   6257   (the trap)
#   _weight_int8pack_mm, cast        0.8    3.5     14     58    197   (fp32 -> bf16 -> fp32)
#   w4 reference, fp32                92    100     99    119    165
#   _weight_int4pack_mm, fp32 fed     23    188    745   3194  11942   (the trap)
#   _weight_int4pack_mm, cast        0.7    2.8     10     49    169
#
# The same CPU with ATen held to its AVX2 code (ATEN_CPU_CAPABILITY=avx2), M 1 / 32 / 128:
# w8 reference fp32 51 / 62 / 77, cast kernel 2.2 / 22 / 101; w4 reference 120 / 122 / 134,
# cast kernel 1.9 / 19 / 77.
#
# So fp32 activations are cast to bf16 around the call and the result back, up to the rows
# where the cast kernel stops beating the reference (ROWS_CAST_PAYS, by ATen's vector level);
# past them the reference runs. Without AVX2 (other CPUs, ATen's scalar code) the kernels
# were not measured: the reference.
ROWS_CAST_PAYS = {
    ("linear_w8", "avx512"): 128, ("linear_w8", "avx2"): 64,
    ("linear_w4", "avx512"): 256, ("linear_w4", "avx2"): 128,
}  # fmt: skip


# the levels row's rows (measured up to 256, still 2.2x the reference there; above them the
# reference)
ROWS_LEVELS_PAY = 256


def _rows_cast_pays(op: str) -> int:
    return ROWS_CAST_PAYS[op, "avx512" if "avx512" in cpu_features() else "avx2"]


# The cast rows' departure from the fp32 reference: activations, scales and the result are
# rounded to bf16 (8 bits of mantissa: at most 2**-9 each) and the products summed in fp32,
# so |error| <= BF16_BOUND * sum_k |x_k| * |w_k| per output, w_k the dequantized weight (w4:
# |w_k| read as (|q_k - 8| + |8 - zp|) * scale, the kernel's scale-and-offset form).
BF16_BOUND = 2**-7
_BF16_WHY = (
    "fp32 activations cast to bf16 around the call (bf16 rounding: |error| <= 2**-7 * "
    "sum |x| * |w| per output against the fp32 reference; above {rows} rows the reference)"
)


def _weight_only_fits(args: tuple, features: frozenset[str], dtype: torch.dtype) -> str:
    x = args[0]
    if x.dtype != dtype:
        return f"{x.dtype} activations"
    if x.shape[-1] % 16:  # torch 2.13's kernel reads past the rows: K 5, 8, 24 and 40 crashed
        return "K not a multiple of 16"
    if "avx2" not in features:
        return "ATen runs no AVX2 or AVX512 code here (measured there only)"
    return ""


def _bf16_fits(args: tuple, features: frozenset[str]) -> str:
    return _weight_only_fits(args, features, torch.bfloat16)


def _fp32_fits(args: tuple, features: frozenset[str]) -> str:
    return _weight_only_fits(args, features, torch.float32)


def _with_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return out if bias is None else out + bias.to(out.dtype)


def _dense_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as contiguous rows ``[M, K]``: the weight-only ATen kernels refuse any other
    layout (a transposed or sliced input is a user's to pass)."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def _int8pack(args: tuple, packed: Any) -> torch.Tensor:
    x, w, _, bias = args
    rows = _dense_rows(x)
    out = torch.ops.aten._weight_int8pack_mm(rows, w, packed)
    return _with_bias(out.reshape(*x.shape[:-1], w.shape[0]), bias)


def _int8pack_cast(args: tuple, packed: Any) -> torch.Tensor:
    x, w, w_scale, bias = args
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > _rows_cast_pays("linear_w8"):
        return ops.reference_linear_w8(*args)
    rows = rows.to(torch.bfloat16, memory_format=torch.contiguous_format)
    out = torch.ops.aten._weight_int8pack_mm(rows, w, packed).float()
    return _with_bias(out.reshape(*x.shape[:-1], w.shape[0]), bias)


# Without VNNI, fp32 activations of a w8 layer as two int8 levels on oneDNN's 1x1
# convolution: each row rounded to ``n = round(x / s)`` steps of ``s = max|x| / 8192``
# (|n| <= 8192), written ``n = 128 * a + b`` with ``a`` and ``b`` in -64..64, so
# ``x = 128 * s * a + s * b + e`` with |e| <= s / 2 = max|x| / 16384 per element, and per
# output |kernel - fp32 reference| <= LEVELS_BOUND * max|x| * sum_k |w_k| (plus float
# rounding). ``a + 64`` and ``b + 64`` are codes 0..128: no int16 pair sum saturates
# (128 * 127 * 2 < 32767). Both levels are rows of one convolution: the weight is read once.
# The levels come from the bits of one float (``n + 8256`` rides in the low mantissa bits,
# as in ``_uint8_codes``): its bits shifted by 7 and masked by 127, a dozen tensor
# operations a call where the first form of this row took three dozen (each costs 5-15 us
# on a 2-core AMD EPYC, 0.35 ms a call, as much as the convolution at 2048 -> 2048).
# Measured there (AVX2), one thread, K 2048 -> N 5632, ms at 1 / 8 / 32 / 128 / 256
# rows (the first form): levels 1.43 / 4.4 / 11.6 / 46 / 92, the bf16 cast row 2.23 / 6.2 /
# 30 / 118 / 232, the fp32 reference 106 / 119 / 126 / 165 / 199 (fbgemm's dynamic int8
# 0.95 / 2.0 / 7.0 / 28 / 50, fp32 dense 3.8 / 15 / 26 / 66 / 91); RESULTS.md. bf16
# activations go in as float32 (exact) and the result is rounded back. Not measured with
# VNNI (there the bf16 rows, measured, run).
LEVEL_HALF = 64  # each level's codes -64..64, shifted into 0..128
_LEVEL_BITS = 7  # 128 = 2**7 fine steps make one coarse step
LEVEL_STEPS = LEVEL_HALF << _LEVEL_BITS  # max|x| / s: 8192
LEVELS_BOUND = 1 / (2 * LEVEL_STEPS)
# n + _LEVELS_SHIFT lies in 64..16448, so both levels' codes come out non-negative (8192 is
# a multiple of 128: the residue modulo 128 is b + 64)
_LEVELS_SHIFT = LEVEL_STEPS + LEVEL_HALF
_LEVELS_WHY = (
    "fp32 activations as two int8 levels (|error| <= max|x| / 16384 per element, 2**-14 * "
    "max|x| * sum |w| per output against the fp32 reference), one oneDNN 1x1 convolution for "
    "both (no int16 pair sum saturates); above {rows} rows the reference"
)


def _levels_fits(args: tuple, features: frozenset[str]) -> str:
    x = args[0]
    if x.dtype not in (torch.float32, torch.bfloat16):
        return f"{x.dtype} activations"
    if "onednn" not in features:
        return "torch is built without oneDNN"
    if WHOLE_CODES & features:
        return "VNNI: the int8pack rows (measured there) run"
    return ""


def _levels_pack(args: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 1x1 kernel, its zero points, and the bias that takes each level's code offset
    off: ``-64 * w_scale * sum_k w`` per output channel."""
    weight, zero_points, column_sums = _one_by_one(args[1], args[2])
    return weight, zero_points, column_sums * -LEVEL_HALF


# the shift and the mask as int32 tensors: a Python number costs a tensor per call
_COARSE_SHIFT = torch.tensor(_LEVEL_BITS, dtype=torch.int32)
_FINE_MASK = torch.tensor((1 << _LEVEL_BITS) - 1, dtype=torch.int32)


def _levels(args: tuple, packed: Any) -> torch.Tensor:
    x, w, w_scale, bias = args
    if x.dtype != torch.float32:  # bf16: exact in float32, the result rounded back
        out = _levels((x.float(), w, w_scale, None), packed).to(x.dtype)
        return _with_bias(out, bias)
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    if count > ROWS_LEVELS_PAY:
        return ops.reference_linear_w8(*args)
    step = rows.abs().amax(dim=-1, keepdim=True)  # max|x| per row (NaN stays NaN)
    if not math.isfinite(step.sum().item()):  # NaN or infinity: the reference's result
        return ops.reference_linear_w8(*args)
    step = step.div_(LEVEL_STEPS).clamp_(min=torch.finfo(torch.float32).tiny)
    bits = torch.div(rows, step).add_(_ROUNDING_OFFSET + _LEVELS_SHIFT).view(torch.int32)
    # int32 -> uint8 keeps the low byte: the coarse level's code, then the fine one's
    coarse, fine = bits >> _COARSE_SHIFT, torch.bitwise_and(bits, _FINE_MASK)
    codes = torch.cat((coarse, fine)).to(torch.uint8)
    # each level's rows come with its code offset taken off (the bias): 128 * coarse + fine
    out = _through_one_by_one(codes, w_scale, packed, bias=packed[2])
    steps = torch.add(out[count:], out[:count], alpha=1 << _LEVEL_BITS)
    total = steps.mul_(step) if bias is None else torch.addcmul(_float(bias), steps, step)
    return total.reshape(*x.shape[:-1], w.shape[0])


def _bf16_scales(args: tuple) -> torch.Tensor:
    return args[2].bfloat16()


def _int4pack_fits(args: tuple, features: frozenset[str], dtype: torch.dtype) -> str:
    w, group = args[1], args[4]
    if w.shape[1] * 2 % 32 or w.shape[0] % 16 or group not in (32, 64, 128, 256):
        return "K not a multiple of 32, N not of 16, or a group size it does not take"
    return _weight_only_fits(args, features, dtype)


def _int4_bf16_fits(args: tuple, features: frozenset[str]) -> str:
    return _int4pack_fits(args, features, torch.bfloat16)


def _int4_fp32_fits(args: tuple, features: frozenset[str]) -> str:
    return _int4pack_fits(args, features, torch.float32)


def _int4pack_pack(args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU tiles and the bf16 scale-and-offset table (both rows feed the kernel bf16)."""
    _, w, w_scale, w_zero_point, _, _ = args
    codes = ops.unpack_int4(w).to(torch.int32)
    tiles = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    # the kernel dequantizes (q - 8) * scale + zero: our (q - zp) * scale has zero (8 - zp) * scale
    zero = (8.0 - w_zero_point.float()) * w_scale.float()
    table = torch.stack((w_scale.float(), zero), dim=-1).transpose(0, 1).contiguous()
    return tiles, table.bfloat16()


def _int4pack_rows(rows: torch.Tensor, args: tuple, packed: Any) -> torch.Tensor:
    x, w, _, _, group, bias = args
    tiles, scale_and_zero = packed
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, tiles, group, scale_and_zero)
    return _with_bias(out.to(x.dtype).reshape(*x.shape[:-1], w.shape[0]), bias)


def _int4pack(args: tuple, packed: Any) -> torch.Tensor:
    return _int4pack_rows(_dense_rows(args[0]), args, packed)


def _int4pack_cast(args: tuple, packed: Any) -> torch.Tensor:
    x = args[0]
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > _rows_cast_pays("linear_w4"):
        return ops.reference_linear_w4(*args)
    rows = rows.to(torch.bfloat16, memory_format=torch.contiguous_format)
    return _int4pack_rows(rows, args, packed)


# ---------------------------------------------------------------- conv2d_int8
def _onednn_conv_fits(args: tuple, features: frozenset[str]) -> str:
    x = args[0]
    if x.dim() != 4 or x.dtype != torch.uint8:
        return "not a 2-d convolution of uint8 activations"
    return _whole_codes_fit(args[3], features)


def _onednn_conv_pack(args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight packed for this input shape (without it oneDNN picks a layout that sends
    some shapes to a slow path: 1x1 256->1024 at 14x14, one thread, 25.6 ms against 0.30 ms
    packed for the shape) and its zero points, made once per layer and shape."""
    x, x_scale, x_zp, w, w_scale, _, stride, padding, dilation, groups = args[:10]
    packed = torch.ops.onednn.qconv_prepack(
        w, w_scale, x_scale, x_zp, stride, padding, dilation, groups, list(x.shape)
    )
    return packed, _zero_points(w_scale)


def _onednn_conv(args: tuple, packed: Any) -> torch.Tensor:
    """oneDNN's convolution on channels-last input; its output stays channels-last (the
    same values: ``layouts`` gives a contiguous copy to the users that read the layout)."""
    x, x_scale, x_zp, _, w_scale, bias, stride, padding, dilation, groups = args[:10]
    out_scale, out_zp, relu = args[10:]
    weight, zero_points = packed
    float_out = out_scale == 0.0
    return torch.ops.onednn.qconv_pointwise(
        x.contiguous(memory_format=torch.channels_last), x_scale, x_zp, weight, w_scale,
        zero_points, _float(bias), stride, padding, dilation, groups,
        1.0 if float_out else out_scale, 0 if float_out else out_zp,
        torch.float32 if float_out else None, "relu" if relu else "none", [], None,
    )  # fmt: skip


# Without VNNI (``_vnni_fits``) the int8 convolutions sum the codes in float32, the weight's
# channel scales folded in once (``_float_conv_pack``): within float rounding of the
# reference's exact float64 sum, which ATen computes with its slow generic code. A 1x1
# convolution over channels-last codes is one matrix product of its pixels (ATen sends small
# 1x1 convolutions to a slow path); without padding the input's zero point comes off in
# the bias (``zp * sum(w)`` per channel), with padding from the input (padding reads code 0
# as the value ``-zp``). Splitting each code in halves, as the linear rows do, would double
# the int8 work: on AVX2 no faster than float32.
FLOAT_CONV = "float32 convolution of the codes"


def _float_conv_fits(args: tuple, features: frozenset[str]) -> str:
    x = args[0]
    if x.dim() != 4 or x.dtype != torch.uint8:
        return "not a 2-d convolution of uint8 activations"
    return ""


def _float_conv_pack(args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight in float32 times its channel scales, channels-last, and each output
    channel's sum of it."""
    w, w_scale = args[3], args[4]
    weight = w.float() * w_scale.float().reshape(-1, 1, 1, 1)
    weight = weight.contiguous(memory_format=torch.channels_last)
    return weight, weight.sum(dim=(1, 2, 3))


def _float_conv_sum(args: tuple, packed: Any) -> torch.Tensor:
    """The convolution's float result (the reference's ``value``, bias in) divided by the
    input scale, channels-last."""
    x, x_scale, x_zp, _, _, bias, stride, padding, dilation, groups = args[:10]
    weight, sums = packed
    images = x.contiguous(memory_format=torch.channels_last).to(torch.float32)
    shift = None if bias is None else bias.float() / x_scale
    if any(padding):
        if x_zp:
            images = images.sub_(x_zp)
    elif x_zp:
        shift = sums * -x_zp if shift is None else shift - sums * x_zp
    if weight.shape[2:] == (1, 1) and groups == 1 and not any(padding):
        if any(step != 1 for step in stride):
            images = images[:, :, :: stride[0], :: stride[1]]
        batch, _, height, width = images.shape
        pixels = images.permute(0, 2, 3, 1).reshape(-1, images.shape[1])
        matrix = weight.reshape(weight.shape[0], -1).t()
        out = torch.mm(pixels, matrix) if shift is None else torch.addmm(shift, pixels, matrix)
        return out.reshape(batch, height, width, -1).permute(0, 3, 1, 2)
    return torch.convolution(
        images, weight, shift, stride, padding, dilation, False, [0, 0], groups
    )


def _float_requantized(total: torch.Tensor, x_scale: float, out_scale: float, out_zp: int,
                       relu: bool) -> torch.Tensor:  # fmt: skip
    if out_scale == 0.0:
        value = total.mul_(x_scale)
        return value.relu_() if relu else value
    # ReLU then rounding is rounding with the zero point as the least code
    return _uint8_codes(total, out_scale / x_scale, out_zp, out_zp if relu else 0, 255)


def _float_conv(args: tuple, packed: Any) -> torch.Tensor:
    return _float_requantized(_float_conv_sum(args, packed), args[1], *args[10:13])


def _float_conv_add(args: tuple, packed: Any) -> torch.Tensor:
    other, other_scale, other_zp, out_scale, out_zp, relu = args[10:]
    x_scale = args[1]
    total = _float_conv_sum(args, packed)
    dequantized = other.to(torch.float32).sub_(other_zp)
    total = total.add_(dequantized, alpha=other_scale / x_scale)
    return _float_requantized(total, x_scale, out_scale, out_zp, relu)


# ---------------------------------------------------------------- add_int8
def _onednn_add_fits(args: tuple, features: frozenset[str]) -> str:
    a, b, out_scale = args[0], args[3], args[6]
    if "onednn" not in features:
        return "torch is built without oneDNN"
    if a.dim() != 4 or a.dtype != torch.uint8 or b.dtype != torch.uint8:
        return "not two 4-d uint8 tensors"
    if a.shape != b.shape:
        return "broadcasting"
    if out_scale == 0.0:
        return "float output"
    return ""


# (channels, input shape, a's scale and zero point) -> the identity weight packed for them
IDENTITY_WEIGHTS: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _identity_weight(a: torch.Tensor, scale: float, zero_point: int) -> tuple:
    """A depthwise 1x1 convolution of weight 1 (scale 1) per channel, packed for ``a``: it
    computes ``(a - zero_point) * scale``, the add's first operand, in oneDNN."""
    channels = a.shape[1]
    key = (channels, tuple(a.shape), scale, zero_point)
    found = IDENTITY_WEIGHTS.get(key)
    if found is None:
        ones = torch.ones(channels)
        packed = torch.ops.onednn.qconv_prepack(
            torch.ones(channels, 1, 1, 1, dtype=torch.int8), ones, scale, zero_point,
            [1, 1], [0, 0], [1, 1], channels, list(a.shape),
        )  # fmt: skip
        found = IDENTITY_WEIGHTS[key] = (packed, ones, torch.zeros(channels, dtype=torch.int64))
        if len(IDENTITY_WEIGHTS) > 64:  # bounded: a model has a few dozen residual shapes
            IDENTITY_WEIGHTS.pop(next(iter(IDENTITY_WEIGHTS)))
    return found


def _onednn_add(args: tuple, packed: Any) -> torch.Tensor:
    """``a + b`` requantized (ReLU'd) in one memory pass: oneDNN's depthwise identity
    convolution of ``a`` with the "sum" post-op adding ``b`` (dequantized with its own scale
    and zero point), 0.45 ms against the reference's 14 ms at 256x56x56, one thread."""
    a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, relu = args
    a = a.contiguous(memory_format=torch.channels_last)
    weight, ones, zero_points = _identity_weight(a, a_scale, a_zp)
    # the post-op writes its result into the accumulator: a copy, b is read elsewhere too
    accumulator = b.clone(memory_format=torch.channels_last)
    return torch.ops.onednn.qconv2d_pointwise.binary(
        a, a_scale, a_zp, weight, ones, zero_points, accumulator, None, [1, 1], [0, 0],
        [1, 1], a.shape[1], out_scale, out_zp, None, b_scale, b_zp, "sum", 1.0,
        "relu" if relu else None, [], "",
    )  # fmt: skip


# ---------------------------------------------------------------- conv2d_add_int8
def _onednn_conv_add_fits(args: tuple, features: frozenset[str]) -> str:
    why = _onednn_conv_fits(args, features)
    if why:
        return why
    other, out_scale = args[10], args[13]
    if other.dtype != torch.uint8:
        return f"other of {other.dtype}"
    if out_scale == 0.0:
        return "float output"
    if tuple(other.shape) != _conv_output_shape(args):
        return "other of another shape than the convolution's output (broadcasting)"
    return ""


def _conv_output_shape(args: tuple) -> tuple[int, ...]:
    x, w, stride, padding, dilation = args[0], args[3], *args[6:9]
    sizes = (
        (size + 2 * pad - dil * (k - 1) - 1) // step + 1
        for size, k, step, pad, dil in zip(x.shape[2:], w.shape[2:], stride, padding, dilation)
    )
    return (x.shape[0], w.shape[0], *sizes)


def _onednn_conv_add(args: tuple, packed: Any) -> torch.Tensor:
    """The convolution with oneDNN's "sum" post-op adding ``other`` (dequantized with its own
    scale and zero point) to the float result, ReLU, requantized once: the reference's
    arithmetic (equal on the tested cases), channels-last out like conv2d_int8's row."""
    # the post-op writes its result into the accumulator: a copy, ``other`` may be read again
    return _conv_add_into(args, packed, args[10].clone(memory_format=torch.channels_last))


def _onednn_conv_add_reusing(args: tuple, packed: Any) -> torch.Tensor:
    """The same, accumulating in ``other`` itself where it is channels-last already: the
    caller gives it up (``ops.conv2d_add_int8_into_other``), 16 copies fewer per ResNet-50
    forward."""
    other = args[10]
    if not other.is_contiguous(memory_format=torch.channels_last):
        other = other.contiguous(memory_format=torch.channels_last)  # a copy of its own
    return _conv_add_into(args, packed, other)


def _conv_add_into(args: tuple, packed: Any, accumulator: torch.Tensor) -> torch.Tensor:
    x, x_scale, x_zp, _, w_scale, bias, stride, padding, dilation, groups = args[:10]
    other_scale, other_zp, out_scale, out_zp, relu = args[11:]
    weight, zero_points = packed
    return torch.ops.onednn.qconv2d_pointwise.binary(
        x.contiguous(memory_format=torch.channels_last), x_scale, x_zp, weight, w_scale,
        zero_points, accumulator, _float(bias), stride, padding, dilation, groups, out_scale,
        out_zp, None, other_scale, other_zp, "sum", 1.0, "relu" if relu else None, [], "",
    )  # fmt: skip


# ---------------------------------------------------------------- max_pool2d_int8
def _window_max_fits(args: tuple, features: frozenset[str]) -> str:
    x, kernel, _, padding, _, ceil_mode = args
    if x.dim() != 4 or x.dtype not in (torch.uint8, torch.int8):
        return "not 4-d uint8/int8 codes"
    if ceil_mode:
        return "ceil_mode"
    if any(2 * pad > size for pad, size in zip(padding, kernel)):
        return "padding over half the window (torch's pooling refuses it)"
    geometry = zip(x.shape[2:], kernel, args[2], padding, args[4])
    if any(size + 2 * p - d * (k - 1) - 1 < 0 for size, k, _, p, d in geometry):
        return "a window larger than the padded input (torch's pooling refuses it)"
    return ""


def _window_max(args: tuple, packed: Any) -> torch.Tensor:
    """Max pooling as two passes of one dimension each (rows, then columns): padded with
    the dtype's least code, which no window's maximum can be unless the window holds it, and
    each pass the elementwise maximum of the window's ``k`` strided slices. 0.17 ms against
    the float copy's 0.76 ms at 1x64x112x112 (3x3, stride 2, one thread), channels-last in
    and out; the same codes."""
    x, kernel, stride, padding, dilation, _ = args
    if any(padding):
        pads = (padding[1], padding[1], padding[0], padding[0])
        x = torch.nn.functional.pad(x, pads, value=torch.iinfo(x.dtype).min)
    for dim in (2, 3):
        x = _strided_max(x, dim, kernel[dim - 2], stride[dim - 2], dilation[dim - 2])
    return x


def _strided_max(x: torch.Tensor, dim: int, k: int, step: int, dilation: int) -> torch.Tensor:
    """The maximum over ``k`` taps along ``dim``: output ``i`` reads ``x[i * step + j *
    dilation]`` for ``j < k``."""
    out = (x.shape[dim] - dilation * (k - 1) - 1) // step + 1
    span = (out - 1) * step + 1
    where = [slice(None)] * x.dim()
    taps = []
    for j in range(k):
        where[dim] = slice(j * dilation, j * dilation + span, step)
        taps.append(x[tuple(where)])
    if k == 1:
        return taps[0].clone()  # a new tensor, never a view of the input
    best = torch.maximum(taps[0], taps[1])
    for tap in taps[2:]:
        torch.maximum(best, tap, out=best)
    return best


def _zero_points(w_scale: torch.Tensor) -> torch.Tensor:
    return torch.zeros(w_scale.shape, dtype=torch.int64)


def _float(bias: torch.Tensor | None) -> torch.Tensor | None:
    # (``float()`` of a float32 tensor returns it, through the dispatcher: a microsecond a call)
    return bias if bias is None or bias.dtype == torch.float32 else bias.float()


KERNELS: dict[str, tuple[Kernel, ...]] = {
    "quantize": (
        Kernel(
            "uint8 codes in four passes", _codes_fit, _codes,
            "float32 to uint8: the reference's division, the clamp, a rounding add that leaves "
            "the code in the float's low byte, an int32 -> uint8 narrowing (1.8x the "
            "reference on a 224x224 image)",
        ),
    ),
    "linear_int8": (
        Kernel(
            "onednn.qlinear_pointwise", _static_onednn_fits, _static_onednn,
            "uint8 activations with calibrated parameters: oneDNN, ReLU and output "
            "requantization fused (8.2x fp32, half fbgemm's error)",
            pack=_onednn_linear_pack,
        ),
        Kernel(
            "onednn.qlinear_pointwise (dynamic per tensor)", _per_tensor_onednn_fits,
            _per_tensor_onednn,
            "uint8 activations, one scale and zero point from each input's range: oneDNN "
            "(0.6-1.0x fbgemm's time per layer, half its error)",
            pack=_onednn_dynamic_pack,
        ),
        Kernel(
            "onednn.qconv_pointwise (rows as pixels)", _rows_fit, _whole_rows,
            "without VNNI, narrow weights (at most 64): whole uint8 codes, no int16 pair sum "
            "saturates; the rows as pixels of oneDNN's 1x1 convolution, zero point taken off "
            "after (exact)",
            pack=_pixels_pack,
        ),
        Kernel(
            "onednn.qconv_pointwise (codes split in halves)", _split_fits, _split,
            "without VNNI: each uint8 code as two halves of at most 128, so no int16 pair sum "
            "saturates; the rows as pixels of oneDNN's 1x1 convolution, zero point taken "
            "off after (exact)",
            pack=_pixels_pack,
        ),
        Kernel(
            "aten._int_mm", _per_token_int_mm_fits, _per_token_int_mm,
            "per-token int8 activations: int8 x int8 -> int32 matmul, scaled after",
            pack=_transposed,
        ),
    ),
    "linear_w8": (
        Kernel(
            "onednn.qconv_pointwise (activations in two int8 levels)", _levels_fits, _levels,
            "int8 weights read once, " + _LEVELS_WHY.format(rows=ROWS_LEVELS_PAY),
            pack=_levels_pack, weight=1,
        ),
        Kernel(
            "aten._weight_int8pack_mm", _bf16_fits, _int8pack,
            "bf16 activations: int8 weights read once (15x the bf16 reference at one row)",
            pack=_bf16_scales, weight=1,
        ),
        Kernel(
            "aten._weight_int8pack_mm (fp32 cast to bf16)", _fp32_fits, _int8pack_cast,
            "int8 weights read once, " + _BF16_WHY.format(rows="128 (AVX2: 64)"),
            pack=_bf16_scales, weight=1,
        ),
    ),
    "linear_w4": (
        Kernel(
            "aten._weight_int4pack_mm_for_cpu", _int4_bf16_fits, _int4pack,
            "bf16 activations, int4 weights in CPU tiles: fbgemm's bandwidth at batch 1",
            pack=_int4pack_pack, weight=1,
        ),
        Kernel(
            "aten._weight_int4pack_mm_for_cpu (fp32 cast to bf16)", _int4_fp32_fits,
            _int4pack_cast,
            "int4 weights in CPU tiles, " + _BF16_WHY.format(rows="256 (AVX2: 128)"),
            pack=_int4pack_pack, weight=1,
        ),
    ),
    "conv2d_int8": (
        Kernel(
            "onednn.qconv_pointwise", _onednn_conv_fits, _onednn_conv,
            "oneDNN int8 convolution, ReLU and output requantization fused, the weight packed "
            "for the input shape (without VNNI: narrow weights)",
            pack=_onednn_conv_pack, shaped=True,
        ),
        Kernel(
            FLOAT_CONV, _float_conv_fits, _float_conv,
            "without VNNI, 8-bit weights: the codes summed in float32, the weight scaled once, "
            "1x1 as a matrix product (within float rounding of the reference's float64 sum)",
            pack=_float_conv_pack,
        ),
    ),
    "conv2d_add_int8": (
        Kernel(
            "onednn.qconv2d_pointwise.binary (sum)", _onednn_conv_add_fits, _onednn_conv_add,
            "oneDNN int8 convolution with the residual added by its 'sum' post-op, ReLU and "
            "one requantization fused: the block's add costs no pass of its own",
            pack=_onednn_conv_pack, shaped=True, reusing=_onednn_conv_add_reusing,
        ),
        Kernel(
            FLOAT_CONV, _float_conv_fits, _float_conv_add,
            "without VNNI: conv2d_int8's float32 row, ``other`` added before the one "
            "requantization",
            pack=_float_conv_pack,
        ),
    ),
    "max_pool2d_int8": (
        Kernel(
            "window maximum, rows then columns", _window_max_fits, _window_max,
            "the codes' own maximum over strided slices, two passes: no float copy (4.5x the "
            "reference)",
        ),
    ),
    "add_int8": (
        Kernel(
            "onednn.qconv2d_pointwise.binary (identity, sum)", _onednn_add_fits, _onednn_add,
            "oneDNN's depthwise identity convolution of one operand with the other added by "
            "its 'sum' post-op: dequantize, add, ReLU and requantize in one pass (30x the "
            "reference)",
        ),
    ),
}  # fmt: skip


def kernel_for(name: str, args: tuple) -> Kernel | None:
    """The first row of ``KERNELS[name]`` that can run ``args`` here (None: the reference)."""
    features = cpu_features()
    for kernel in KERNELS.get(name, ()):
        if not kernel.fits(args, features):
            return kernel
    return None


# ---------------------------------------------------------------- one decision per layer
# op -> the position of its weight: a layer is its weight (identity and version)
WEIGHT_AT = {
    "linear_int8": 3, "conv2d_int8": 3, "conv2d_add_int8": 3, "linear_w8": 1, "linear_w4": 1,
}  # fmt: skip
# op -> the positions of the layer's other tensors that packs read (scales, zero points):
# the plan and the packed form key on their identities and versions too, so a scale changed
# in place packs again
PACK_READS = {
    "linear_int8": (4,), "conv2d_int8": (4,), "conv2d_add_int8": (4,), "linear_w8": (2,),
    "linear_w4": (2, 3),
}  # fmt: skip
# plan key -> (weak reference to the weight, the row or None, the packed weight or None,
# weak references to the tensors at PACK_READS)
PLANS: dict[tuple, tuple] = {}
# ops whose rows pack per input shape (``Kernel.shaped``): their plans key on the whole
# input shape (the last element of the key), at most SHAPES_PER_LAYER kept per layer
SHAPE_KEYED = frozenset(name for name, rows in KERNELS.items() if any(r.shaped for r in rows))


def _described(value: Any) -> Any:
    """What a row's condition may read of one argument, hashable."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.dim(), value.shape[-1] if value.dim() else None)
    if isinstance(value, list):
        return tuple(value)
    return value if value is None or isinstance(value, (bool, int, float, str)) else id(value)


def _plan_key(name: str, args: tuple) -> tuple | None:
    at = WEIGHT_AT.get(name)
    if at is None or not isinstance(args[at], torch.Tensor):
        return None
    weight = args[at]
    special = PLAN_KEYS.get(name)
    if special is not None:
        return special(name, weight, args)
    return (name, id(weight), weight._version, *map(_described, args))


def _conv_plan_key(name: str, w: torch.Tensor, args: tuple) -> tuple:
    """conv2d_int8's plan key built directly (the generic one cost a ResNet-50 forward 1.1 ms
    of 28): what ``_described`` keeps of each argument, and the input's whole shape."""
    x, x_scale, x_zp, _, w_scale, bias, stride, padding, dilation, *rest = args
    bias_dtype = None if bias is None else bias.dtype
    return (
        name, id(w), w._version, id(w_scale), w_scale._version, x.dtype, x_scale, x_zp, w.dtype,
        w.dim(), w_scale.dtype, w_scale.dim(), bias_dtype, tuple(stride), tuple(padding),
        tuple(dilation), *rest, x.shape,
    )  # fmt: skip


def _conv_add_plan_key(name: str, w: torch.Tensor, args: tuple) -> tuple:
    """conv2d_add_int8's: the convolution's, with ``other`` described by its dtype and whole
    shape (the row reads both) and its parameters; the input's whole shape still last."""
    other, *rest = args[10:]
    key = _conv_plan_key(name, w, (*args[:10], *rest))
    return (*key[:-1], other.dtype, other.shape, key[-1])


# The linear operators' plan keys, built directly (the generic one: 5 us a call, as much as
# quantizing a one-row input; these: about 1): the input's dtype, rank and last dimension
# (what the rows' conditions read of it), the dtypes of the tensors that go with the weight
# and every non-tensor argument.
def _dtype(value: torch.Tensor | None) -> torch.dtype | None:
    return None if value is None else value.dtype


def _linear_int8_plan_key(name: str, w: torch.Tensor, args: tuple) -> tuple:
    x, x_scale, x_zp, _, w_scale, bias, *rest = args
    return (
        name, id(w), w._version, id(w_scale), w_scale._version, x.dtype, x.dim(), x.shape[-1],
        x_scale, x_zp, w_scale.dtype, _dtype(bias), *rest,
    )  # fmt: skip


def _linear_w8_plan_key(name: str, w: torch.Tensor, args: tuple) -> tuple:
    x, _, w_scale, bias = args
    return (
        name, id(w), w._version, id(w_scale), w_scale._version, x.dtype, x.dim(), x.shape[-1],
        w_scale.dtype, _dtype(bias),
    )  # fmt: skip


def _linear_w4_plan_key(name: str, w: torch.Tensor, args: tuple) -> tuple:
    x, _, w_scale, w_zp, group, bias = args
    return (
        name, id(w), w._version, id(w_scale), w_scale._version, id(w_zp), w_zp._version,
        x.dtype, x.dim(), x.shape[-1], w_scale.dtype, w_zp.dtype, group, _dtype(bias),
    )  # fmt: skip


# op -> its own plan key (SHAPE_KEYED ops: the input's whole shape last)
PLAN_KEYS: dict[str, Callable[[str, torch.Tensor, tuple], tuple]] = {
    "conv2d_int8": _conv_plan_key,
    "conv2d_add_int8": _conv_add_plan_key,
    "linear_int8": _linear_int8_plan_key,
    "linear_w8": _linear_w8_plan_key,
    "linear_w4": _linear_w4_plan_key,
}


def run(name: str, reference: Callable[..., Any], args: tuple, reuse: bool = False) -> Any:
    """``name`` on ``args`` with the table's kernel for them, or the reference; ``reuse``:
    the caller gives up the argument the op's ``reuses`` row names (a row's ``reusing``
    computation may write its result there)."""
    try:
        key = _plan_key(name, args)
    except RuntimeError:
        if not _untracked(name, args):
            raise
        _warn_untracked(name)
        return reference(*args)
    found = PLANS.get(key) if key is not None else None
    if found is not None and found[0]() is args[WEIGHT_AT[name]]:
        kernel, packed = found[1], found[2]
    else:
        reads = PACK_READS.get(name, ())
        kernel = kernel_for(name, args)
        packed = _packed(kernel, args, reads) if kernel is not None and kernel.pack else None
        if key is not None:
            weight_ref, *read_refs = _held(PLANS, key, args, (WEIGHT_AT[name], *reads))
            PLANS[key] = (weight_ref, kernel, packed, *read_refs)
            if name in SHAPE_KEYED:
                _keep_newest(PLANS, key[:3], len(key))
    if kernel is None or not args[0].numel():  # oneDNN and the views here want one element
        return reference(*args)
    if reuse and kernel.reusing is not None:
        return kernel.reusing(args, packed)
    return kernel.compute(args, packed)


def _untracked(name: str, args: tuple) -> bool:
    """Whether the layer's weight or a tensor its pack reads is an inference tensor (made
    inside ``torch.inference_mode()``): torch keeps no version of it, so an in-place change
    could not be seen and nothing packed from it can be kept."""
    at = WEIGHT_AT.get(name)
    positions = () if at is None else (at, *PACK_READS.get(name, ()))
    return any(
        isinstance(args[i], torch.Tensor) and args[i].is_inference() for i in positions
    )  # fmt: skip


_WARNED_UNTRACKED: set[str] = set()


def _warn_untracked(name: str) -> None:
    if name in _WARNED_UNTRACKED:
        return
    _WARNED_UNTRACKED.add(name)
    warnings.warn(
        f"fxloom_q.{name}: a layer's weight or scales are inference tensors (made inside "
        "torch.inference_mode()), whose in-place changes torch does not track, so no packed "
        "form of them can be kept: such layers run the reference, correct but slow. Convert "
        "or load the model outside torch.inference_mode(), or assign those tensors "
        "again there (running the model inside the mode is fine).",
        stacklevel=3,
    )


# ---------------------------------------------------------------- for the report
# op -> the arguments that decide a row, as the converted graph knows them
# (``reach``: the weight's largest code magnitude, which decides some rows without VNNI)
_EXAMPLES: dict[str, Callable[..., tuple]] = {
    "linear_int8": lambda dynamic=False, k=64, n=64, dtype=torch.float32, activations="per_token",
    reach=127: (
        torch.empty(1, k, dtype=dtype), 0.1, 0, torch.full((n, k), -reach, dtype=torch.int8),
        torch.empty(n), None, 0.0, 0, False, dynamic, activations,
    ),
    "linear_w8": lambda k=64, n=64, dtype=torch.float32, **_: (
        torch.empty(1, k, dtype=dtype), torch.empty(n, k, dtype=torch.int8), torch.empty(n), None,
    ),
    "linear_w4": lambda k=64, n=64, dtype=torch.float32, group=32, **_: (
        torch.empty(1, k, dtype=dtype), torch.empty(n, k // 2, dtype=torch.uint8),
        torch.empty(n, k // group), torch.empty(n, k // group), group, None,
    ),
    "add_int8": lambda **_: (
        torch.empty(1, 1, 1, 1, dtype=torch.uint8), 0.1, 0, torch.empty(1, 1, 1, 1, dtype=torch.uint8),
        0.1, 0, 0.1, 0, False,
    ),
    "conv2d_int8": lambda reach=127, **_: (
        torch.empty(1, 1, 1, 1, dtype=torch.uint8), 0.1, 0,
        torch.full((1, 1, 1, 1), -reach, dtype=torch.int8), torch.empty(1), None, [1, 1],
        [0, 0], [1, 1], 1, 0.0, 0, False,
    ),
    "max_pool2d_int8": lambda **_: (
        torch.empty(1, 1, 1, 1, dtype=torch.uint8), [1, 1], [1, 1], [0, 0], [1, 1], False,
    ),
    "conv2d_add_int8": lambda reach=127, **_: (
        torch.empty(1, 1, 1, 1, dtype=torch.uint8), 0.1, 0,
        torch.full((1, 1, 1, 1), -reach, dtype=torch.int8), torch.empty(1), None, [1, 1],
        [0, 0], [1, 1], 1,
        torch.empty(1, 1, 1, 1, dtype=torch.uint8), 0.1, 0, 0.1, 0, False,
    ),
}  # fmt: skip


def _example_kernel(name: str, call: dict) -> Kernel | None:
    example = _EXAMPLES.get(name)
    return kernel_for(name, example(**call)) if example is not None else None


def kernel_name(name: str, **call: Any) -> str:
    """The name of the kernel a call of ``name`` like ``call`` gets here ("reference": none)."""
    kernel = _example_kernel(name, call)
    return "reference" if kernel is None else kernel.name


def explain(name: str, **call: Any) -> str:
    """Which kernel a call of ``name`` like ``call`` gets on this CPU, and why."""
    example = _EXAMPLES.get(name)
    kernel = _example_kernel(name, call)
    if kernel is None:
        reasons = [
            f"{row.name}: {row.fits(example(**call), cpu_features())}"
            for row in KERNELS.get(name, ())
        ]
        return "reference" + (f" ({'; '.join(reasons)})" if reasons else "")
    return f"{kernel.name} ({kernel.why})"
