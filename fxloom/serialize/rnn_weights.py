"""nn.RNN, nn.LSTM and nn.GRU in a file: their weights' names and shapes follow from attributes.

An RNN runs on ``_flat_weights``, a list its ``__init__`` builds in the order of
``_flat_weights_names``; ``state_dict`` shows ``_parameters``. A file that lists the
names in another order would compute with swapped matrices while showing the right
ones, so nothing of that list is read from a file: the names are the ones torch gives
for the module's attributes (``num_layers``, ``bidirectional``, ``bias``, ``proj_size``),
its parameters must be exactly those, in that order, and the flat lists are derived
from them on loading (``rebuild_flat_weights``), from ``_parameters``, never through
``getattr``. Attributes are read from the module's ``__dict__`` only.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from fxloom.serialize.errors import SerializationError

__all__ = ["DERIVED", "canonical_names", "rnn_shapes", "rebuild_flat_weights"]

# What RNNBase.__init__ derives from the attributes: never saved, rebuilt on loading.
DERIVED = frozenset({"_flat_weights", "_flat_weight_refs", "_flat_weights_names", "_all_weights"})
# Gates per layer, by ``mode`` (an attribute; each class admits its own modes only).
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
_MODES: dict[type, tuple[str, ...]] = {
    nn.LSTM: ("LSTM",),
    nn.GRU: ("GRU",),
    nn.RNN: ("RNN_TANH", "RNN_RELU"),
}


def _attribute(module: nn.Module, name: str, kind: type) -> Any:
    value = vars(module).get(name)
    if type(value) is not kind or (kind is int and value < 0):
        raise SerializationError(f"its attribute {name} must be a {kind.__name__}, found {value!r}")
    return value


def _mode(module: nn.Module) -> str:
    mode = vars(module).get("mode")
    modes = next((m for cls, m in _MODES.items() if isinstance(module, cls)), tuple(_GATES))
    if mode not in modes:
        raise SerializationError(f"its mode must be one of {list(modes)}, found {mode!r}")
    return mode


def _projection(module: nn.Module, mode: str) -> int:
    proj_size = _attribute(module, "proj_size", int)
    if proj_size and (mode != "LSTM" or proj_size >= _attribute(module, "hidden_size", int)):
        raise SerializationError(f"proj_size={proj_size} needs an LSTM with a larger hidden_size")
    return proj_size


def canonical_names(module: nn.Module) -> list[list[str]]:
    """Per layer and direction, the names torch gives its weights, in torch's order."""
    layers = _attribute(module, "num_layers", int)
    directions = 2 if _attribute(module, "bidirectional", bool) else 1
    kinds = ["weight_ih", "weight_hh"]
    if _attribute(module, "bias", bool):
        kinds += ["bias_ih", "bias_hh"]
    if _projection(module, _mode(module)):
        kinds.append("weight_hr")
    suffixes = ["", "_reverse"][:directions]
    return [
        [f"{kind}_l{layer}{suffix}" for kind in kinds]
        for layer in range(layers)
        for suffix in suffixes
    ]


def rnn_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    """The shape of each weight; ``SerializationError`` if its parameters are not exactly the
    canonical names in the canonical order."""
    groups = canonical_names(module)
    names = [name for group in groups for name in group]
    if list(module._parameters) != names:
        raise SerializationError(
            f"its parameters must be {names} in this order (what its attributes give), "
            f"found {list(module._parameters)}"
        )
    hidden = _attribute(module, "hidden_size", int)
    projected = _projection(module, _mode(module)) or hidden
    gates = _GATES[_mode(module)] * hidden
    directions = 2 if module.__dict__["bidirectional"] else 1
    first_input = _attribute(module, "input_size", int)
    shapes = {}
    for name in names:
        kind, layer = name.split("_l")[0], int(name.split("_l")[1].split("_")[0])
        inputs = first_input if layer == 0 else projected * directions
        shapes[name] = {
            "weight_ih": (gates, inputs),
            "weight_hh": (gates, projected),
            "bias_ih": (gates,),
            "bias_hh": (gates,),
            "weight_hr": (projected, hidden),
        }[kind]
    return shapes


def rebuild_flat_weights(module: nn.Module) -> None:
    """What ``RNNBase.__init__`` derives from the weights, made from ``_parameters``."""
    groups = canonical_names(module)
    names = [name for group in groups for name in group]
    flat = [module._parameters.get(name) for name in names]
    state = module.__dict__
    state["_all_weights"] = groups
    state["_flat_weights_names"] = names
    state["_flat_weights"] = flat
    state["_flat_weight_refs"] = [None if w is None else weakref.ref(w) for w in flat]
