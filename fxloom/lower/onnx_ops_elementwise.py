"""ONNX translations of elementwise operators: unary functions, activations, arithmetic, compares.

Each family is a table (the name of one operator, and its ONNX node) registered in a loop under
the operator's key (``fxloom.ops.identity``), which its torch function, ``F`` function, Tensor
method, Python operator and ATen overloads share. Python numbers become constants of the dtype torch computes in (read from
the node's ``tensor_meta``), so ``x + 1`` on an int64 tensor adds an int64 1.

Depends on: ``onnx_ops`` (the table and helpers).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from fxloom.lower.onnx_ops import (
    UnsupportedArgument,
    argument,
    cast_to,
    int_list,
    onnx_dtype,
    register,
    result_dtype,
)
from fxloom.node import Node
from fxloom.ops.identity import op_key

aten = torch.ops.aten


# ---- unary: one ONNX node on the input, in the result's dtype ------------------------------

UNARY_OPS = {
    "relu": "Relu",
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "abs": "Abs",
    "neg": "Neg",
    "sin": "Sin",
    "cos": "Cos",
    "erf": "Erf",
    "floor": "Floor",
    "ceil": "Ceil",
    "reciprocal": "Reciprocal",
    "sign": "Sign",
    "selu": "Selu",  # ONNX's default alpha and gamma are torch's constants
    "logical_not": "Not",
    "bitwise_not": "Not",
}


def unary(op_type: str) -> Any:
    def translate_unary(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
        return ctx.node(op_type, [cast_to(ctx, args[0], ctx.dtype_of(node))])

    return translate_unary


for _name, _op_type in UNARY_OPS.items():
    register(_name)(unary(_op_type))
register("rsqrt")(
    lambda ctx, node, args, kwargs: ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.name(args[0])])])
)


# ---- activations made of a few nodes -------------------------------------------------------


@register("gelu")
def translate_gelu(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    x = ctx.name(args[0])
    approximate = argument(args, kwargs, 1, "approximate", "none")
    if ctx.opset >= 20:
        return ctx.node("Gelu", [x], approximate=approximate)
    dtype = ctx.dtype_of(node)
    half_x = ctx.node("Mul", [x, ctx.constant(0.5, dtype=dtype)])
    if approximate == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = ctx.node("Mul", [ctx.node("Mul", [x, x]), x])
        inner = ctx.node("Add", [x, ctx.node("Mul", [cube, ctx.constant(0.044715, dtype=dtype)])])
        scaled = ctx.node("Mul", [inner, ctx.constant(math.sqrt(2 / math.pi), dtype=dtype)])
        curve = ctx.node("Tanh", [scaled])
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        curve = ctx.node("Erf", [ctx.node("Mul", [x, ctx.constant(1 / math.sqrt(2), dtype=dtype)])])
    return ctx.node("Mul", [half_x, ctx.node("Add", [curve, ctx.constant(1.0, dtype=dtype)])])


@register("silu")
def translate_silu(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    x = ctx.name(args[0])
    return ctx.node("Mul", [x, ctx.node("Sigmoid", [x])])


@register("mish")
def translate_mish(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    x = ctx.name(args[0])
    return ctx.node("Mul", [x, ctx.node("Tanh", [ctx.node("Softplus", [x])])])


@register("softplus")
def translate_softplus(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    beta = argument(args, kwargs, 1, "beta", 1.0)
    if beta != 1:
        raise UnsupportedArgument(f"softplus with beta={beta} (only beta=1 is translated)")
    return ctx.node("Softplus", [ctx.name(args[0])])


@register("hardswish")
def translate_hardswish(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return ctx.node("HardSwish", [ctx.name(args[0])])


@register("hardsigmoid")
def translate_hardsigmoid(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return ctx.node("HardSigmoid", [ctx.name(args[0])], alpha=1 / 6, beta=0.5)


@register("leaky_relu")
def translate_leaky_relu(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    slope = argument(args, kwargs, 1, "negative_slope", 0.01)
    return ctx.node("LeakyRelu", [ctx.name(args[0])], alpha=float(slope))


@register("elu")
def translate_elu(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    alpha = argument(args, kwargs, 1, "alpha", 1.0)
    return ctx.node("Elu", [ctx.name(args[0])], alpha=float(alpha))


def clip(ctx: Any, node: Any, x: Any, low: Any, high: Any) -> str:
    """``Clip`` of ``x`` to [low, high], either bound ``None``, in the result's dtype."""
    dtype = ctx.dtype_of(node)
    bounds = ["" if b is None else cast_to(ctx, b, dtype) for b in (low, high)]
    return ctx.node("Clip", [cast_to(ctx, x, dtype), *bounds])


@register(["clamp", "clamp_min", "clamp_max"])  # and clip, its alias
def translate_clamp(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    if op_key(node.target).name == "clamp_max":
        return clip(ctx, node, args[0], None, argument(args, kwargs, 1, "max"))
    low = argument(args, kwargs, 1, "min")
    return clip(ctx, node, args[0], low, argument(args, kwargs, 2, "max"))


@register("hardtanh")
def translate_hardtanh(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    low = argument(args, kwargs, 1, "min_val", -1.0)
    return clip(ctx, node, args[0], low, argument(args, kwargs, 2, "max_val", 1.0))


@register("relu6")
def translate_relu6(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return clip(ctx, node, args[0], 0.0, 6.0)


# ---- binary: operands cast to the dtype torch computes in ----------------------------------

ARITHMETIC_OPS = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "pow": "Pow",
    "maximum": "Max",
    "minimum": "Min",
    "remainder": "Mod",
    "bitwise_and": "And",
    "bitwise_or": "Or",
    "logical_and": "And",
    "logical_or": "Or",
}

COMPARISON_OPS = {
    "eq": "Equal",
    "lt": "Less",
    "gt": "Greater",
    "le": "LessOrEqual",
    "ge": "GreaterOrEqual",
}


def arithmetic(op_type: str) -> Any:
    def translate_arithmetic(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
        a, b = args[0], argument(args, kwargs, 1, "other")
        if op_type == "Add" and issubclass(node.meta.get("type", object), tuple):
            # size + (n,): joining sizes computed in the graph (a dynamic batch)
            return ctx.node("Concat", [int_list(ctx, a), int_list(ctx, b)], axis=0)
        dtype = ctx.dtype_of(node)
        alpha = kwargs.get("alpha", 1)
        if alpha != 1:  # torch.add(a, b, alpha=2) is a + 2 b
            b = ctx.node("Mul", [cast_to(ctx, b, dtype), ctx.constant(alpha, dtype=dtype)])
            return ctx.node(op_type, [cast_to(ctx, a, dtype), b])
        if op_type == "Mod" and dtype.is_floating_point:
            return ctx.node("Mod", [cast_to(ctx, a, dtype), cast_to(ctx, b, dtype)], fmod=0)
        return ctx.node(op_type, [cast_to(ctx, a, dtype), cast_to(ctx, b, dtype)])

    return translate_arithmetic


def comparison(op_type: str, negate: bool = False) -> Any:
    def translate_comparison(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
        a, b = args[0], argument(args, kwargs, 1, "other")
        dtype = result_dtype(ctx, a, b)
        compared = ctx.node(op_type, [cast_to(ctx, a, dtype), cast_to(ctx, b, dtype)])
        return ctx.node("Not", [compared]) if negate else compared

    return translate_comparison


for _name, _op_type in ARITHMETIC_OPS.items():  # and each one's Python operator
    register(_name)(arithmetic(_op_type))
# In-place operators (``x += y``) compute what their out-of-place form does; translating them
# so is right as long as nothing reads the overwritten tensor afterwards (refused otherwise).
IN_PLACE_OPS = {
    operator.iadd: "Add",
    operator.isub: "Sub",
    operator.imul: "Mul",
    operator.itruediv: "Div",
}


def read_after_overwrite(node: Any, module: Any) -> str | None:
    """Why an in-place node cannot be translated: a later node reads the tensor it overwrote."""
    target = node.args[0]
    if any(user > node for user in getattr(target, "users", ())):  # nodes order as in the graph
        return f"an in-place update of %{target.name}, which a later node reads"
    return None


for _python_op, _op_type in IN_PLACE_OPS.items():
    register(_python_op, refuses=read_after_overwrite)(arithmetic(_op_type))
for _name, _op_type in COMPARISON_OPS.items():
    register(_name)(comparison(_op_type))
register("ne")(comparison("Equal", negate=True))


@register("div")  # and operator.truediv, torch.true_divide, torch.divide
def translate_div(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    mode = kwargs.get("rounding_mode")
    dtype = ctx.dtype_of(node)
    quotient = arithmetic("Div")(ctx, node, args, {})
    if mode is None or (mode == "trunc" and not dtype.is_floating_point):
        return quotient
    if mode == "floor":
        return (
            ctx.node("Floor", [quotient]) if dtype.is_floating_point else _floored(ctx, node, args)
        )
    raise UnsupportedArgument(f"division with rounding_mode={mode!r} on {dtype}")


@register("floor_divide")  # and operator.floordiv
def translate_floordiv(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    if ctx.dtype_of(node).is_floating_point:
        return ctx.node("Floor", [arithmetic("Div")(ctx, node, args, {})])
    return _floored(ctx, node, args)


def _floored(ctx: Any, node: Any, args: tuple) -> str:
    """Integer floor division. ONNX's integer Div truncates toward zero (-7 // 2 would be -3,
    not -4), so it is computed in double precision (exact below 2**53) and floored."""
    a, b = (cast_to(ctx, value, torch.float64) for value in (args[0], args[1]))
    floored = ctx.node("Floor", [ctx.node("Div", [a, b])])
    return ctx.node("Cast", [floored], to=onnx_dtype(ctx.dtype_of(node)))


@register("where")
def translate_where(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    condition, a, b = (
        args[0],
        argument(args, kwargs, 1, "input"),
        argument(args, kwargs, 2, "other"),
    )
    dtype = ctx.dtype_of(node)
    bool_condition = cast_to(ctx, condition, torch.bool)
    return ctx.node("Where", [bool_condition, cast_to(ctx, a, dtype), cast_to(ctx, b, dtype)])


@register("masked_fill")
def translate_masked_fill(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    x, mask, value = args[0], argument(args, kwargs, 1, "mask"), argument(args, kwargs, 2, "value")
    dtype = ctx.dtype_of(node)
    bool_mask = cast_to(ctx, mask, torch.bool)
    return ctx.node("Where", [bool_mask, cast_to(ctx, value, dtype), cast_to(ctx, x, dtype)])


# ---- torch.min / torch.max of two tensors (the reductions are refused) -----------------------


def two_tensors_only(node: Any, module: Any) -> str | None:
    """torch.min(x, y) is elementwise; torch.min(x) and torch.min(x, dim) are reductions."""
    other = node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
    value_type = other.meta.get("type") if isinstance(other, Node) else None
    if value_type is not None and issubclass(value_type, torch.Tensor):
        return None
    return (
        f"{op_key(node.target).name} over a dimension or a whole tensor (only the elementwise "
        "form of two tensors has a translation)"
    )


register("min", refuses=two_tensors_only)(arithmetic("Min"))
register("max", refuses=two_tensors_only)(arithmetic("Max"))
