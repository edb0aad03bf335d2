"""The shapes a rebuilt torch.nn module's tensors must have, given its attributes.

A module is rebuilt from a file without its ``__init__``, so nothing checks
that ``Linear.weight`` is ``(out_features, in_features)``: a file could hold a
Linear that computes with a weight its attributes contradict. ``SHAPE_RULES``
says, per class (matched by its bases), which shapes its attributes imply;
``check_module_shapes`` refuses a module that disagrees. Only the module's
dictionaries are read (``vars``, ``_parameters``, ``_buffers``): no method,
property or parametrization of the module runs. A parametrized tensor's shape
is computed from its originals (``parametrized``); tensors that are None are
not checked. Saving runs the same checks, so what would not load is not written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from fxloom.serialize import parametrized, rnn_weights
from fxloom.serialize.errors import SerializationError

__all__ = ["SHAPE_RULES", "check_module_shapes"]

Shapes = dict[str, tuple[int, ...]]


def _int(module: nn.Module, name: str) -> int:
    value = vars(module).get(name)
    if type(value) is not int or value < 0:
        raise SerializationError(f"its attribute {name} must be a count, found {value!r}")
    return value


def _ints(module: nn.Module, name: str) -> tuple[int, ...]:
    value = vars(module).get(name)
    value = (value,) if type(value) is int else value
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and v >= 0 for v in value):
        raise SerializationError(f"its attribute {name} must be sizes, found {value!r}")
    return tuple(value)


def _linear(m: nn.Module) -> Shapes:
    out = _int(m, "out_features")
    return {"weight": (out, _int(m, "in_features")), "bias": (out,)}


def _bilinear(m: nn.Module) -> Shapes:
    out = _int(m, "out_features")
    return {"weight": (out, _int(m, "in1_features"), _int(m, "in2_features")), "bias": (out,)}


def _conv(m: nn.Module) -> Shapes:
    # weight: (out, in / groups, *kernel), or (in, out / groups, *kernel) when transposed.
    c_in, c_out, groups = _int(m, "in_channels"), _int(m, "out_channels"), _int(m, "groups")
    if groups == 0 or c_in % groups or c_out % groups:
        raise SerializationError(f"its groups={groups} do not divide its channels")
    kernel = _ints(m, "kernel_size")
    first, second = (c_in, c_out) if vars(m).get("transposed") is True else (c_out, c_in)
    return {"weight": (first, second // groups, *kernel), "bias": (c_out,)}


def _embedding(m: nn.Module) -> Shapes:
    return {"weight": (_int(m, "num_embeddings"), _int(m, "embedding_dim"))}


def _norm_over(attribute: str) -> Callable[[nn.Module], Shapes]:
    def shapes(m: nn.Module) -> Shapes:
        shape = _ints(m, attribute)
        return {"weight": shape, "bias": shape}

    return shapes


def _batch_norm(m: nn.Module) -> Shapes:
    n = _int(m, "num_features")
    return {"weight": (n,), "bias": (n,), "running_mean": (n,), "running_var": (n,)}


def _group_norm(m: nn.Module) -> Shapes:
    n = _int(m, "num_channels")
    return {"weight": (n,), "bias": (n,)}


# Classes (matched by their bases) whose parameters and buffers follow from their attributes.
SHAPE_RULES: dict[type, Callable[[nn.Module], Shapes]] = {
    nn.Linear: _linear,
    nn.Bilinear: _bilinear,
    nn.modules.conv._ConvNd: _conv,
    nn.Embedding: _embedding,
    nn.EmbeddingBag: _embedding,
    nn.LayerNorm: _norm_over("normalized_shape"),
    nn.RMSNorm: lambda m: {"weight": _ints(m, "normalized_shape")},
    nn.modules.batchnorm._NormBase: _batch_norm,
    nn.GroupNorm: _group_norm,
    nn.RNNBase: rnn_weights.rnn_shapes,
}


def check_module_shapes(module: nn.Module, where: str) -> None:
    """Refuse ``module`` if a parameter or buffer disagrees with the attributes that size it."""
    cls = parametrized.saved_class(module, type(module))
    rule = next((SHAPE_RULES[base] for base in cls.__mro__ if base in SHAPE_RULES), None)
    shapes = {name: tuple(t.shape) for name, t in _tensors(module) if t is not None}
    shapes.update(parametrized.parametrized_shapes(module, where))
    if rule is None:
        return
    try:
        expected = rule(module)
    except SerializationError as e:
        raise SerializationError(f"{where} ({cls.__qualname__}): {e}") from None
    for name, shape in expected.items():
        if name in shapes and shapes[name] != shape:
            raise SerializationError(
                f"{where} ({cls.__qualname__}): its {name} has shape {list(shapes[name])}, but "
                f"its attributes ({_attributes(module)}) make it {list(shape)}; refused"
            )


def _tensors(module: nn.Module) -> list[tuple[str, Any]]:
    return [*module._parameters.items(), *module._buffers.items()]


def _attributes(module: nn.Module) -> str:
    sizes = {k: v for k, v in vars(module).items() if type(v) in (int, tuple) and k[0] != "_"}
    return ", ".join(f"{k}={v!r}" for k, v in sizes.items())
