"""ONNX translations of operators that move data without computing: views, joins, splits, indexing.

reshape/view/flatten, permute/transpose/t, unsqueeze/squeeze, expand, cat/stack,
split/chunk, indexing (``x[:, 0]``, ``x[..., None]``), sizes (``x.size(0)``, ``x.shape``: only
reached when they change with a dynamic batch; otherwise they are folded), casts (``to``,
``type_as``, ``float()``...) and identities (``contiguous``, ``clone``, ``dropout``).
Keys cover the torch function, the Tensor method and, where the signature matches, the ATen
packet; ``onnx_ops_aten`` adds the ATen spellings that differ.

Depends on: ``onnx_ops``.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch

from fxloom.lower.onnx_ops import (
    CONTAINER,
    UnsupportedArgument,
    argument,
    cast_to,
    dims_list,
    int_list,
    normalized_dim,
    onnx_dtype,
    register,
)
from fxloom.node import Node
from fxloom.ops.identity import op_key

aten = torch.ops.aten

INT64_MAX = 2**63 - 1


def sizes_argument(args: tuple, kwargs: dict, name: str = "size") -> Any:
    """A size given as varargs (``x.view(2, 3)``) or as one sequence (``x.view((2, 3))``)."""
    rest = args[1:]
    if not rest:
        return kwargs[name]
    if isinstance(rest[0], (list, tuple, torch.Size)):
        return rest[0]  # x.view((2, 3)), aten.view(x, [2, 3]), aten.expand(x, [2, 3], False)
    if len(rest) == 1 and isinstance(rest[0], Node):
        return rest[0]  # a whole size computed in the graph
    return list(rest)


def rank_of(ctx: Any, value: Any) -> int:
    return len(ctx.shape_of(value))


# ---- reshapes --------------------------------------------------------------------------------


@register(["view", "reshape", "_unsafe_view"])
def translate_reshape(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    shape = sizes_argument(args, kwargs, "shape" if "shape" in kwargs else "size")
    if isinstance(shape, torch.dtype):
        raise UnsupportedArgument(f"view as another dtype ({shape})")
    return ctx.node("Reshape", [ctx.name(args[0]), int_list(ctx, shape)])


@register(["view_as", "reshape_as"])
def translate_view_as(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return ctx.node("Reshape", [ctx.name(args[0]), ctx.node("Shape", [ctx.name(args[1])])])


@register("flatten")
def translate_flatten(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    rank = rank_of(ctx, args[0])
    start = normalized_dim(argument(args, kwargs, 1, "start_dim", 0), rank)
    end = normalized_dim(argument(args, kwargs, 2, "end_dim", -1), rank)
    return flatten(ctx, ctx.name(args[0]), ctx.shape_of(args[0]), start, end)


def flatten(ctx: Any, x: str, shape: tuple[int, ...], start: int, end: int) -> str:
    """Reshape merging dims start..end: 0 (copy) before them, so a dynamic batch survives."""
    if start == 1 and end == len(shape) - 1:
        return ctx.node("Flatten", [x], axis=1)
    target = [0] * start + [-1] + list(shape[end + 1 :])
    return ctx.node("Reshape", [x, int_list(ctx, target)])


@register("unflatten")
def translate_unflatten(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    rank = rank_of(ctx, args[0])
    dim = normalized_dim(argument(args, kwargs, 1, "dim"), rank)
    sizes = list(argument(args, kwargs, 2, "sizes"))
    target = [0] * dim + sizes + list(ctx.shape_of(args[0])[dim + 1 :])
    return ctx.node("Reshape", [ctx.name(args[0]), int_list(ctx, target)])


# ---- transposes ------------------------------------------------------------------------------


@register("permute")
def translate_permute(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    rank = rank_of(ctx, args[0])
    dims = sizes_argument(args, kwargs, "dims")
    return ctx.node("Transpose", [ctx.name(args[0])], perm=[normalized_dim(d, rank) for d in dims])


@register("transpose")  # and swapaxes, swapdims
def translate_transpose(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    rank = rank_of(ctx, args[0])
    a = normalized_dim(argument(args, kwargs, 1, "dim0"), rank)
    b = normalized_dim(argument(args, kwargs, 2, "dim1"), rank)
    return transpose(ctx, ctx.name(args[0]), rank, a, b)


def transpose(ctx: Any, x: str, rank: int, a: int, b: int) -> str:
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.node("Transpose", [x], perm=perm)


@register("t")
def translate_t(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    rank = rank_of(ctx, args[0])
    if rank < 2:
        return ctx.node("Identity", [ctx.name(args[0])])
    return transpose(ctx, ctx.name(args[0]), rank, 0, 1)


# ---- adding and removing dims ----------------------------------------------------------------


@register("unsqueeze")
def translate_unsqueeze(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    dim = normalized_dim(argument(args, kwargs, 1, "dim"), rank_of(ctx, args[0]) + 1)
    return ctx.node("Unsqueeze", [ctx.name(args[0]), ctx.constant([dim])])


@register("squeeze")
def translate_squeeze(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    shape = ctx.shape_of(args[0])
    dims = argument(args, kwargs, 1, "dim")
    axes = range(len(shape)) if dims is None else dims_list(dims)
    # torch leaves a dim that is not 1 alone; ONNX would refuse it.
    kept = [normalized_dim(d, len(shape)) for d in axes]
    kept = [d for d in kept if shape[d] == 1]
    if not kept:
        return ctx.node("Identity", [ctx.name(args[0])])
    return ctx.node("Squeeze", [ctx.name(args[0]), ctx.constant(kept)])


@register("expand")
def translate_expand(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    sizes = sizes_argument(args, kwargs, "size")
    if not isinstance(sizes, Node):
        # -1 keeps a dim; Expand broadcasts, so 1 does the same.
        sizes = [1 if isinstance(s, int) and s == -1 else s for s in sizes]
    return ctx.node("Expand", [ctx.name(args[0]), int_list(ctx, sizes)])


@register("expand_as")
def translate_expand_as(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return ctx.node("Expand", [ctx.name(args[0]), ctx.node("Shape", [ctx.name(args[1])])])


@register("repeat")
def translate_repeat(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    repeats = list(sizes_argument(args, kwargs, "repeats"))
    x = ctx.name(args[0])
    extra = len(repeats) - rank_of(ctx, args[0])
    if extra > 0:  # torch prepends dims of size 1 first
        x = ctx.node("Unsqueeze", [x, ctx.constant(list(range(extra)))])
    return ctx.node("Tile", [x, int_list(ctx, repeats)])


# ---- joins and splits ------------------------------------------------------------------------


@register("cat")  # and concat, concatenate
def translate_cat(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    tensors = [t for t in argument(args, kwargs, 0, "tensors") if _non_empty(ctx, t)]
    dim = normalized_dim(
        argument(args, kwargs, 1, "dim", kwargs.get("axis", 0)), len(ctx.shape_of(node))
    )
    dtype = ctx.dtype_of(node)
    return ctx.node("Concat", [cast_to(ctx, t, dtype) for t in tensors], axis=dim)


def _non_empty(ctx: Any, tensor: Any) -> bool:
    # torch.cat skips 1-D empty tensors of any length; ONNX Concat would refuse them. A
    # folded one arrives as the tensor itself (a new cache layer's ``torch.tensor([])``).
    return not (isinstance(tensor, (Node, torch.Tensor)) and ctx.shape_of(tensor) == (0,))


@register("stack")
def translate_stack(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    tensors = argument(args, kwargs, 0, "tensors")
    dim = normalized_dim(
        argument(args, kwargs, 1, "dim", kwargs.get("axis", 0)), len(ctx.shape_of(node))
    )
    axis = ctx.constant([dim])
    parts = [ctx.node("Unsqueeze", [cast_to(ctx, t, ctx.dtype_of(node)), axis]) for t in tensors]
    return ctx.node("Concat", parts, axis=dim)


@register(["split", "split_with_sizes"])
def translate_split(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple[str, ...]:
    shape = ctx.shape_of(args[0])
    size = argument(args, kwargs, 1, "split_size_or_sections", kwargs.get("split_size"))
    size = kwargs.get("split_sizes", size)
    dim = normalized_dim(argument(args, kwargs, 2, "dim", 0), len(shape))
    if isinstance(size, int):
        sizes = [min(size, shape[dim] - start) for start in range(0, shape[dim], size)]
    else:
        sizes = list(size)
    return split(ctx, ctx.name(args[0]), sizes, dim)


def split(ctx: Any, x: str, sizes: list[int], dim: int) -> tuple[str, ...]:
    parts = ctx.node("Split", [x, ctx.constant(sizes)], outputs=len(sizes), axis=dim)
    return parts if isinstance(parts, tuple) else (parts,)


@register("chunk")
def translate_chunk(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple[str, ...]:
    shape = ctx.shape_of(args[0])
    chunks = argument(args, kwargs, 1, "chunks")
    dim = normalized_dim(argument(args, kwargs, 2, "dim", 0), len(shape))
    step = -(-shape[dim] // chunks)  # torch.chunk: ceil-sized pieces, the last one smaller
    sizes = [min(step, shape[dim] - start) for start in range(0, shape[dim], step)]
    return split(ctx, ctx.name(args[0]), sizes, dim)


@register("unbind")
def translate_unbind(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple[str, ...]:
    shape = ctx.shape_of(args[0])
    dim = normalized_dim(argument(args, kwargs, 1, "dim", 0), len(shape))
    axis = ctx.constant([dim])
    parts = split(ctx, ctx.name(args[0]), [1] * shape[dim], dim)
    return tuple(ctx.node("Squeeze", [part, axis]) for part in parts)


# ---- indexing --------------------------------------------------------------------------------


def slice_axis(ctx: Any, x: str, axis: int, start: Any, stop: Any, step: Any) -> str:
    """``x`` sliced along one axis, Python's bounds (``None`` for the default)."""
    step = 1 if step is None else step
    start = 0 if start is None else start
    stop = INT64_MAX if stop is None else min(stop, INT64_MAX) if isinstance(stop, int) else stop
    bounds = [int_list(ctx, [start]), int_list(ctx, [stop]), ctx.constant([axis])]
    return ctx.node("Slice", [x, *bounds, int_list(ctx, [step])])


def select(ctx: Any, x: str, axis: int, index: Any) -> str:
    """``x`` at one index along ``axis``, the axis removed (``Gather`` with a scalar index)."""
    return ctx.node("Gather", [x, cast_to(ctx, index, torch.int64)], axis=axis)


def getitem_refusal(node: Any, module: Any) -> str | None:
    return index_refusal(_lists_as_tensors(node.args[1]))


def _lists_as_tensors(index: Any) -> Any:
    """``x[..., [0, 2]]``: a list of ints indexes like a tensor of them."""

    def convert(item: Any) -> Any:
        if isinstance(item, list) and all(isinstance(i, int) for i in item):
            return torch.tensor(item, dtype=torch.int64)
        return item

    return tuple(convert(i) for i in index) if isinstance(index, tuple) else convert(index)


@register(operator.getitem, refuses=getitem_refusal)
def translate_getitem(ctx: Any, node: Any, args: tuple, kwargs: dict) -> Any:
    source, index = args
    translated = ctx.env.get(source) if isinstance(source, Node) else None
    if isinstance(translated, (tuple, list)):  # an item of a multi-output node (split, ...)
        return translated[index]
    index = _lists_as_tensors(index)
    reason = index_refusal(index)
    if reason is not None:
        raise UnsupportedArgument(reason)
    indices = list(index) if isinstance(index, tuple) else [index]
    if any(_is_tensor_index(i) for i in indices):
        return gather_nd(ctx, ctx.name(source), indices)
    known = isinstance(source, torch.Tensor) or source.meta.get("tensor_meta") is not None
    rank = rank_of(ctx, source) if known else 1  # a folded tensor sliced at a dynamic size
    return index_tensor(ctx, ctx.name(source), rank, indices)


def index_refusal(index: Any) -> str | None:
    """Why an index cannot be translated (reads only the index and its tensors' meta)."""
    indices = list(index) if isinstance(index, tuple) else [index]
    tensors = [i for i in indices if _is_tensor_index(i)]
    if tensors and len(tensors) != len(indices):
        return "indexing that mixes tensors with slices, ints or None"
    if any(_index_dtype(i) == torch.bool for i in tensors):
        return "a boolean mask index (its result size depends on the data)"
    if indices.count(Ellipsis) > 1:
        return "an index with more than one '...'"
    steps = [i.step for i in indices if isinstance(i, slice) and isinstance(i.step, int)]
    if any(step < 1 for step in steps):
        return "a slice with a step below 1"
    return None


def _is_tensor_index(index: Any) -> bool:
    if isinstance(index, torch.Tensor):
        return True
    return isinstance(index, Node) and index.meta.get("tensor_meta") is not None


def _index_dtype(index: Any) -> torch.dtype:
    return index.dtype if isinstance(index, torch.Tensor) else index.meta["tensor_meta"].dtype


def gather_nd(ctx: Any, x: str, indices: list[Any]) -> str:
    """``x[i, j]`` for integer tensors ``i, j`` indexing the leading dims (broadcast together)."""
    names = [cast_to(ctx, i, torch.int64) for i in indices]
    if len(names) == 1:
        return ctx.node("Gather", [x, names[0]], axis=0)
    total = names[0]
    for name in names[1:]:  # the broadcast shape of all the indices: the shape of their sum
        total = ctx.node("Add", [total, name])
    shape = ctx.node("Shape", [total])
    last = ctx.constant([-1])
    stacked = [ctx.node("Unsqueeze", [ctx.node("Expand", [n, shape]), last]) for n in names]
    return ctx.node("GatherND", [x, ctx.node("Concat", stacked, axis=-1)])


def index_tensor(ctx: Any, x: str, rank: int, indices: list[Any]) -> str:
    """Basic indexing: ints, slices, ``None`` and one ``...``, left to right."""
    consumed = sum(1 for i in indices if i is not None and i is not Ellipsis)
    axis = 0
    for item in indices:
        if item is Ellipsis:
            axis += rank - consumed
        elif item is None:
            x = ctx.node("Unsqueeze", [x, ctx.constant([axis])])
            axis += 1
            rank += 1
        elif isinstance(item, slice):
            if item != slice(None):
                x = slice_axis(ctx, x, axis, item.start, item.stop, item.step)
            axis += 1
        elif isinstance(item, (int, Node)):
            x = select(ctx, x, axis, item)
            rank -= 1
        else:
            raise UnsupportedArgument(f"an index of type {type(item).__name__}")
    return x


@register("slice")
def translate_aten_slice(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    rank = rank_of(ctx, args[0])
    dim = normalized_dim(argument(args, kwargs, 1, "dim", 0), rank)
    start, stop = argument(args, kwargs, 2, "start"), argument(args, kwargs, 3, "end")
    return slice_axis(ctx, ctx.name(args[0]), dim, start, stop, argument(args, kwargs, 4, "step"))


@register("select")
def translate_select(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    dim = normalized_dim(argument(args, kwargs, 1, "dim"), rank_of(ctx, args[0]))
    return select(ctx, ctx.name(args[0]), dim, argument(args, kwargs, 2, "index"))


@register("narrow")
def translate_narrow(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    dim = normalized_dim(argument(args, kwargs, 1, "dim"), rank_of(ctx, args[0]))
    start, length = argument(args, kwargs, 2, "start"), argument(args, kwargs, 3, "length")
    return slice_axis(ctx, ctx.name(args[0]), dim, start, start + length, 1)


# ---- sizes (only reached when a dynamic batch makes them vary) -------------------------------


@register(["size", "sym_size"])
def translate_size(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    shape = ctx.node("Shape", [ctx.name(args[0])])
    dim = argument(args, kwargs, 1, "dim")
    if dim is None:
        return shape
    return select(ctx, shape, 0, normalized_dim(dim, rank_of(ctx, args[0])))


@register(["numel", torch.numel])
def translate_numel(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    # A cache's ``keys.numel() == 0`` (is it empty?) computed from the dynamic past length.
    return ctx.node("Size", [ctx.name(args[0])])


@register(["dim", "ndimension"])
def translate_dim(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return ctx.constant(rank_of(ctx, args[0]))  # ranks are fixed, even with a dynamic batch


@register(builtins.getattr)
def translate_getattr(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    packed = ctx.env.get(args[0]) if isinstance(args[0], Node) else None
    if isinstance(packed, PackedValues):  # a field of a container built in the graph
        return packed[packed.fields.index(args[1])]
    fields = tuple_fields(args[0])
    if isinstance(packed, tuple) and args[1] in fields:  # torch.sort(x).values
        return packed[fields.index(args[1])]
    if args[1] == "shape":
        return ctx.node("Shape", [ctx.name(args[0])])
    if args[1] in ("T", "mT"):
        rank = rank_of(ctx, args[0])
        return transpose(ctx, ctx.name(args[0]), rank, rank - 2, rank - 1)
    raise UnsupportedArgument(f"the tensor attribute .{args[1]}")


def tuple_fields(source: Any) -> tuple[str, ...]:
    """The field names of a node whose value is a named tuple (``torch.return_types.sort``)."""
    value_type = source.meta.get("type") if isinstance(source, Node) else None
    return tuple(getattr(value_type, "__match_args__", ()))


def getattr_refusal(node: Any, module: Any) -> str | None:
    source = node.args[0]
    if isinstance(source, Node) and isinstance(source.target, type):
        return None  # a field of a container (see translate_container)
    if node.args[1] in tuple_fields(source):
        return None
    if node.args[1] in ("shape", "T", "mT"):
        return None
    return f"the tensor attribute .{node.args[1]}"


translate_getattr.refuses = getattr_refusal  # type: ignore[attr-defined]


# ---- containers built in the graph (named tuples, ModelOutput) -------------------------------


class PackedValues(tuple):
    """The ONNX names of a container's tensors in order, with the field each one fills."""

    fields: tuple[Any, ...] = ()


@register(CONTAINER)
def translate_container(ctx: Any, node: Any, args: tuple, kwargs: dict) -> PackedValues:
    """A container of tensors: its items (``None`` left out, as ModelOutput does)."""
    names, fields = [], []
    for field, value in [*enumerate(args), *kwargs.items()]:
        if value is None:
            continue
        if not isinstance(value, (Node, torch.Tensor)):
            raise UnsupportedArgument(f"a {type(value).__name__} in a container's field {field!r}")
        names.append(ctx.name(value))
        fields.append(field)
    packed = PackedValues(names)
    packed.fields = tuple(fields)
    return packed


@register("to_tuple")
def translate_to_tuple(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple:
    return tuple(ctx.name(args[0]))


# ---- casts and identities --------------------------------------------------------------------

CAST_METHODS = ["to", "type", "type_as", "float", "double", "half", "int", "long", "bool"]


@register([*CAST_METHODS, "_to_copy"])
def translate_cast(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    """Any conversion: a Cast to the result's dtype (devices and memory formats are dropped)."""
    dtype = ctx.dtype_of(node)
    x = ctx.name(args[0])
    if ctx.dtype_of(args[0]) == dtype:
        return ctx.node("Identity", [x])
    return ctx.node("Cast", [x], to=onnx_dtype(dtype))


IDENTITY_KEYS = ["contiguous", "clone", "detach", "alias", "lift_fresh_copy", "cpu", "cuda"]


@register(IDENTITY_KEYS)
def translate_identity(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return ctx.node("Identity", [ctx.name(args[0])])


def dropout_refusal(node: Any, module: Any) -> str | None:
    """Dropout that is on (F.dropout's ``training`` defaults to True) is random: refused."""
    p = argument(node.args, node.kwargs, 1, "p", 0.5)
    training = argument(node.args, node.kwargs, 2, "training", True)
    if training is False or p == 0:
        return None
    return "dropout with training=True (pass training=False, or call model.eval() first)"


@register(["dropout", "dropout1d", "dropout2d"], refuses=dropout_refusal)
def translate_dropout(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    p = argument(args, kwargs, 1, "p", 0.5)
    if argument(args, kwargs, 2, "training", True) and p != 0:
        raise UnsupportedArgument(dropout_refusal(node, None) or "dropout with training=True")
    return ctx.node("Identity", [ctx.name(args[0])])


# ---- tensor factories (only reached when a dynamic batch sets their size) --------------------


@register("arange")
def translate_arange(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    bounds = list(args) if args else [kwargs.get("start", 0), kwargs["end"]]
    start, end, step = ([0, *bounds, 1] if len(bounds) == 1 else [*bounds, 1])[:3]
    step = kwargs.get("step", step)
    dtype = ctx.dtype_of(node)
    return ctx.node("Range", [cast_to(ctx, v, dtype) for v in (start, end, step)])


def filled(fill: Any) -> Any:
    def translate_filled(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
        size = args[0] if len(args) == 1 or fill is None else list(args)
        if isinstance(size, (list, tuple)) and len(size) == 1 and isinstance(size[0], list):
            size = size[0]
        value = argument(args, kwargs, 1, "fill_value") if fill is None else fill
        scalar = ctx.constant(value, dtype=ctx.dtype_of(node))
        return ctx.node("Expand", [scalar, int_list(ctx, size)])

    return translate_filled


@register(["new_ones", "new_zeros", "new_full"])
def translate_new_filled(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    """x.new_ones(size): a tensor of the result's dtype, filled; x only lends its dtype."""
    fill = {"new_ones": 1, "new_zeros": 0}.get(op_key(node.target).name)
    rest = args[1:]
    if fill is None:  # new_full(size, fill_value)
        rest, fill = rest[:1], argument(args, kwargs, 2, "fill_value")
    size = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple, Node)) else list(rest)
    scalar = ctx.constant(fill, dtype=ctx.dtype_of(node))
    return ctx.node("Expand", [scalar, int_list(ctx, size)])


@register(["zeros_like", "ones_like", "full_like"])
def translate_filled_like(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    """torch.zeros_like(x): x lends its shape (computed in the graph) and, unless told, dtype."""
    fill = {"zeros_like": 0, "ones_like": 1}.get(op_key(node.target).name)
    if fill is None:  # full_like(x, fill_value)
        fill = argument(args, kwargs, 1, "fill_value")
    scalar = ctx.constant(fill, dtype=ctx.dtype_of(node))
    return ctx.node("Expand", [scalar, ctx.node("Shape", [ctx.name(args[0])])])


def computed_from_inputs(node: Any, module: Any) -> str | None:
    """torch.tensor([...]) of constants is folded; of values computed in the graph, refused."""
    if node.all_input_nodes:
        return "torch.tensor of values computed in the graph (ONNX has no list of tensors)"
    return None


@register("tensor", refuses=computed_from_inputs)
def translate_tensor(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    # Reached only when a run at other sizes changed its value, which constants never do.
    raise UnsupportedArgument("torch.tensor whose value changes with the dynamic sizes")


register("zeros")(filled(0))
register("full")(filled(None))


# ---- padding and gathering -------------------------------------------------------------------

PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


@register(["pad", "constant_pad_nd"])
def translate_pad(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    """torch lists (begin, end) pairs from the last dim back; ONNX all begins, then all ends."""
    rank = rank_of(ctx, args[0])
    pad = list(argument(args, kwargs, 1, "pad"))
    mode = argument(args, kwargs, 2, "mode", "constant")
    if node.target is aten.constant_pad_nd.default or node.target is aten.constant_pad_nd:
        mode, value = "constant", argument(args, kwargs, 2, "value", 0)
    else:
        value = argument(args, kwargs, 3, "value")
    if mode not in PAD_MODES:
        raise UnsupportedArgument(f"padding mode {mode!r}")
    pairs = len(pad) // 2
    begins = [pad[2 * (rank - 1 - a)] if rank - 1 - a < pairs else 0 for a in range(rank)]
    ends = [pad[2 * (rank - 1 - a) + 1] if rank - 1 - a < pairs else 0 for a in range(rank)]
    inputs = [ctx.name(args[0]), ctx.constant(begins + ends)]
    if mode == "constant" and value:
        inputs.append(ctx.constant(value, dtype=ctx.dtype_of(node)))
    return ctx.node("Pad", inputs, mode=PAD_MODES[mode])


@register("gather")
def translate_gather(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    dim = normalized_dim(argument(args, kwargs, 1, "dim"), rank_of(ctx, args[0]))
    index = cast_to(ctx, argument(args, kwargs, 2, "index"), torch.int64)
    return ctx.node("GatherElements", [ctx.name(args[0]), index], axis=dim)


@register("index_select")
def translate_index_select(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    dim = normalized_dim(argument(args, kwargs, 1, "dim"), rank_of(ctx, args[0]))
    index = cast_to(ctx, argument(args, kwargs, 2, "index"), torch.int64)
    return ctx.node("Gather", [ctx.name(args[0]), index], axis=dim)
