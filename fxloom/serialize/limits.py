"""How much work a file may ask of the loader: every limit of fxloom's decoders, in one place.

A file given to ``fxloom.load``, ``fxloom.export.load`` or ``fxloom.parse_graph``
may be hostile; its cost to read must grow with its size, never faster. Each
limit below is checked while reading (before the work it bounds is done), and
exceeding one raises ``SerializationError`` (``GraphParseError`` for graph text)
naming what was exceeded, how big it was and the limit (``exceeded``).

Every number is generous for real programs: the comment beside it gives the
largest value measured on files fxloom saves (the ``fxloom.zoo`` models,
ResNet-50, and Hugging Face models from tiny configs, exported with dynamic
batch and sequence) and why the limit is safe.

Depends on nothing but ``errors``.
"""

from __future__ import annotations

from fxloom.serialize.errors import SerializationError

__all__ = ["exceeded", "check_json_values"]

# ------------------------------------------------------------------ archive members
# program.json of the largest model measured (t5, exported) is 1 MiB; a model a hundred
# times that size stays below. Past the limit, parsing alone costs seconds and gigabytes.
MAX_JSON_BYTES = 256 * 2**20
# format.json holds a few version strings (under 200 bytes).
MAX_FORMAT_BYTES = 2**20
# The weights member is the model's tensors, stored as they are in memory; a 64 GiB limit
# only stops a claimed size far beyond any file worth loading on one machine.
MAX_WEIGHTS_BYTES = 64 * 2**30
# Decompressed bytes per compressed byte of one member. Deflate's ceiling is about 1030;
# measured program.json files compress 8 to 35 times (repeated meta). Zip bombs sit at the
# ceiling. The first 8 MiB of a member are exempt: that much costs little whatever its
# ratio, and small members (format.json, a model's short program) never trip it.
MAX_COMPRESSION_RATIO = 200
COMPRESSION_EXEMPT_BYTES = 8 * 2**20
# Members are decompressed this much at a time, and the limits checked after each piece.
READ_CHUNK_BYTES = 2**20
# JSON values (objects, arrays, strings, numbers) in one document, bounded before parsing
# from its commas and brackets. Each value costs 50-100 bytes of Python objects, so this
# bounds a parse's memory to a few hundred MiB. Measured: t5's 1 MiB program.json holds
# 26,000 objects, arrays and strings.
MAX_JSON_VALUES = 2**22

# ------------------------------------------------------------------ safetensors weights
# Tensors in the weights' header: a model has a few per layer (ResNet-50: 321); the
# largest mixture-of-experts models have tens of thousands. Each costs an allocation.
MAX_TENSORS = 2**17
# The JSON header describing them (about 70 bytes a tensor; ResNet-50: 22 KB).
MAX_SAFETENSORS_HEADER_BYTES = 32 * 2**20
# Dimensions of one tensor (real ones: under ten); bounds the work of checking a shape.
MAX_TENSOR_DIMENSIONS = 64

# ------------------------------------------------------------------ symbolic sizes
# Nodes over all expressions of one file (ShapeEnv, sizes of every node's meta, range
# constraints). Measured with dynamic batch and sequence: 500 (bert) to 1,800 (xlnet) for
# two layers, so about 900 a layer: a hundred layers stay below. A node costs 5-40 microseconds.
# A Max/Min/And/Or/Piecewise node is charged its argument count times its arguments' nodes
# besides: evaluating it (the example's values are computed on loading) compares them pairwise.
MAX_EXPRESSION_NODES = 2**17
# How deep one expression nests (real ones: under ten). Decoding recurses per level.
MAX_EXPRESSION_DEPTH = 64
# Arguments of one node, by class: sympy compares the arguments of Max/Min, And/Or and the
# conditions of Piecewise pairwise when it evaluates them (quadratic), so those stay short;
# sums and products of sizes have a term per symbol (real: under ten).
MAX_EXPRESSION_ARGUMENTS = {"Max": 16, "Min": 16, "And": 16, "Or": 16, "Piecewise": 16}
MAX_OTHER_EXPRESSION_ARGUMENTS = 64
# Exponents in powers (measured: only 2; a division gives -1).
MAX_EXPONENT = 64
# Integers written in an expression, and symbols' example values: sizes fit in 64 bits.
MAX_INTEGER = 2**64
# Bits the value of an expression may need, estimated from its structure (a product adds
# its factors' bits, a power multiplies them): evaluating it at the example sizes must stay
# cheap. A real size is below 2**64; the product of eight 64-bit sizes is 512 bits.
MAX_EXPRESSION_BITS = 4096

# ------------------------------------------------------------------ graph arguments, graph text
# How deep the arguments of a node may nest, in containers (``((1,),)`` is 2), in a file and
# in graph text alike. Real graphs stay under ten; code generation and printing recurse a few
# frames per level and must not run out of stack on a loaded graph.
MAX_ARGUMENT_DEPTH = 64
# Graph text given to ``parse_graph``: the printed graph of the largest model measured is
# well under 1 MiB; each line is tokenized once, in linear time.
MAX_GRAPH_TEXT_BYTES = 64 * 2**20
# Nodes of one parsed graph (a large transformer has tens of thousands).
MAX_GRAPH_NODES = 2**20

# ------------------------------------------------------------------ native kernels
# A convolution's kernel size, stride, dilation, padding and output padding, each. Torch's
# quantized kernels compute sizes in 32-bit integers: a stride of 2**32 wraps to 0 and
# FBGEMM and QNNPACK die of SIGFPE; FBGEMM runs a padding of 2**62 as if it were small.
# Real convolutions stay far below (ResNet-50's largest: a 7x7 kernel, stride 2, padding 3;
# WaveNet's dilations reach 512); the product of two stays below 2**31.
MAX_CONV_PARAMETER = 2**15


def exceeded(
    what: str,
    limit: int,
    found: int | str,
    error: type = SerializationError,
    problem: str = "is too large",
) -> SerializationError:
    """The error for ``what`` being ``found`` where the limit is ``limit`` (to raise)::

        the arguments of one Max is too large: 256, over the limit of 16; refused

    ``found`` is a number, or text such as ``"over 1,048,576"`` where reading stopped at
    the limit instead of measuring the whole.
    """
    size = f"{found:,}" if isinstance(found, int) else found
    return error(f"{what} {problem}: {size}, over the limit of {limit:,}; refused")


def check_json_values(data: bytes, what: str) -> None:
    """Refuse the JSON document ``data`` before parsing it if it may hold more than
    ``MAX_JSON_VALUES`` values: each value past the first of a container follows a comma,
    and each container opens with a bracket, so their count bounds the values (in linear
    time, without building anything)."""
    found = data.count(b",") + data.count(b"[") + data.count(b"{")
    if found > MAX_JSON_VALUES:
        raise exceeded(f"the values of {what} (commas and brackets)", MAX_JSON_VALUES, found)
