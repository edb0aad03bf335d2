"""A module record in a file is rebuilt as data: no module code runs, each name means one thing.

Each hostile file is a valid small model saved with ``fxloom.save`` and then edited
(``hostile``); loading it raises ``SerializationError`` naming the module and what is
wrong. For the files that would run code, ``hostile.no_code_runs`` shows that no
``forward`` (a module's, a generated one, a parametrization's) ran while loading, and a
registered marker function shows that a graph hidden in the file never ran. Saving runs
the same checks, so what would not load is never written. Also here: nn.LSTM/GRU/RNN
(canonical weight names) and quantized tensors (per-channel parameters, layouts); ONNX
Runtime regions are in test_onnx_region_files.py.
"""

from __future__ import annotations

import pytest
import torch
from hostile import edited, no_code_runs, record, saved, weights, with_weights
from torch import nn
from torch.nn.utils import parametrizations

import fxloom
from fxloom.serialize import module_members

# ------------------------------------------------------------------ helpers
MARKS: list[str] = []


def mark(x):
    """Registered with fxloom, so a graph in a file may call it: proves whether one ran."""
    MARKS.append("ran")
    return x


fxloom.register_serializable(mark)


class Marked(nn.Module):
    def forward(self, g, v):
        return mark(v)


def refused(data: bytes, *culprits: str) -> str:
    """Loading ``data`` raises SerializationError naming every culprit, and runs no code."""
    MARKS.clear()
    with no_code_runs() as called, pytest.raises(fxloom.SerializationError) as info:
        fxloom.load(data)
    assert called == [] and MARKS == []
    message = str(info.value)
    for culprit in culprits:
        assert culprit in message, message
    return message


def loads_without_running(data: bytes) -> fxloom.GraphModule:
    with no_code_runs() as called:
        loaded = fxloom.load(data)
    assert called == []
    return loaded


def refused_on_saving(gm: nn.Module, *culprits: str, tmp_path) -> None:
    """``fxloom.save`` refuses before writing anything: the path is not created."""
    path = tmp_path / "model.fxl"
    gm = gm if isinstance(gm, fxloom.GraphModule) else fxloom.symbolic_trace(gm)
    with pytest.raises(fxloom.SerializationError) as info:
        fxloom.save(gm, path)
    assert not path.exists()
    for culprit in culprits:
        assert culprit in str(info.value), str(info.value)


class Holds(nn.Module):
    """Calls one module: ``lin`` stays a leaf in the traced graph, with its whole state."""

    def __init__(self, lin: nn.Module):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return self.lin(x)


def weight_normed() -> bytes:
    return saved(Holds(parametrizations.weight_norm(nn.Linear(3, 2))))


# ------------------------------------------- loading runs no module code
@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_tiny", "transformer_tiny", "cnn_small"])
def test_loading_an_embedded_model_runs_none_of_its_code(name):
    from fxloom import zoo

    model, inputs = zoo.build(name)
    loaded = loads_without_running(saved(model))
    torch.testing.assert_close(loaded(*inputs), model(*inputs), rtol=0, atol=0)


PARAMETRIZED = {
    "weight_norm": lambda: parametrizations.weight_norm(nn.Linear(3, 4)),
    "weight_norm over all": lambda: parametrizations.weight_norm(nn.Linear(3, 4), dim=None),
    "spectral_norm": lambda: parametrizations.spectral_norm(nn.Conv2d(2, 3, 3)),
    "orthogonal": lambda: parametrizations.orthogonal(nn.Linear(3, 4)),
    "orthogonal cayley": lambda: parametrizations.orthogonal(nn.Linear(3, 3), "weight", "cayley"),
}


@pytest.mark.parametrize("make", PARAMETRIZED.values(), ids=PARAMETRIZED)
def test_torch_parametrizations_load_without_running_and_compute_the_same(make):
    torch.manual_seed(0)
    model = Holds(make()).eval()
    loaded = loads_without_running(saved(model))
    x = torch.randn(2, 2, 5, 5) if isinstance(model.lin, nn.Conv2d) else torch.randn(2, 3)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert type(loaded.lin).__name__ == type(model.lin).__name__


def test_a_graph_module_as_a_parametrization_is_refused_and_never_runs():
    hidden = record_of(Marked())

    def edit(program):
        record(program, "lin.parametrizations.weight")["children"]["0"] = hidden

    refused(edited(weight_normed(), edit), "lin.parametrizations.weight.0", "Marked cannot be")


def record_of(model: nn.Module) -> dict:
    """The module record ``model`` is saved as (to plant in another file)."""
    found = {}
    edited(saved(model), lambda program: found.update(program["module"]))
    return found


def test_a_plain_module_as_a_parametrization_is_refused():
    def edit(program):
        plist = record(program, "lin.parametrizations.weight")
        plist["children"]["0"] = record_of(nn.Sequential(nn.Identity()))["children"]["0"]

    refused(edited(weight_normed(), edit), "lin.parametrizations.weight.0", "Identity")


def test_a_parametrization_holding_a_module_is_refused():
    def edit(program):
        weight_norm = record(program, "lin.parametrizations.weight.0")
        weight_norm["children"]["hidden"] = record_of(Marked())

    refused(edited(weight_normed(), edit), "lin.parametrizations.weight.0", "holds no modules")


def test_a_parametrized_attribute_is_refused():
    # Making ``in_features`` a property would run the parametrization when shapes are checked.
    def edit(program):
        lin = record(program, "lin")
        lists = lin["children"]["parametrizations"]["children"]
        lists["in_features"] = lists.pop("weight")
        lin["parametrized"] = ["in_features"]

    refused(edited(weight_normed(), edit), "module.lin", "'in_features' cannot be a parametrized")


def test_originals_that_do_not_fit_the_parametrization_are_refused():
    def edit(program):
        plist = record(program, "lin.parametrizations.weight")
        plist["parameters"]["original0"] = plist["parameters"]["original1"]  # g shaped like v

    refused(edited(weight_normed(), edit), "lin.parametrizations.weight", "g has shape")


def test_a_parametrized_weight_is_checked_by_its_computed_shape():
    model = Holds(parametrizations.weight_norm(nn.Linear(3, 2)))

    def edit(program):
        record(program, "lin")["attributes"]["in_features"] = 5

    refused(edited(saved(model), edit), "module lin", "weight has shape [2, 3]", "[2, 5]")


def reads_weight_by_get_attr() -> fxloom.GraphModule:
    """``lin(x) + lin.weight.sum()``, ``lin`` weight-normed: the graph reads the parametrized
    weight with a ``get_attr`` node, which loading checks."""
    torch.manual_seed(0)
    gm = fxloom.symbolic_trace(Holds(parametrizations.weight_norm(nn.Linear(3, 2))))
    call = next(iter(gm.graph.find_nodes(op="call_module")))
    with gm.graph.inserting_after(call):
        weight = gm.graph.get_attr("lin.weight")
        total = gm.graph.call_function(torch.add, (call, gm.graph.call_method("sum", (weight,))))
    call.replace_all_uses_with(total, delete_user_cb=lambda user: user is not total)
    gm.recompile()
    return gm


def test_a_graph_module_parametrizing_a_weight_read_by_get_attr_never_runs():
    # Checking the get_attr target once read the weight, which ran the planted graph.
    hidden = record_of(Marked())

    def edit(program):
        record(program, "lin.parametrizations.weight")["children"]["0"] = hidden

    refused(edited(saved(reads_weight_by_get_attr()), edit), "Marked cannot be")


def test_get_attr_of_a_parametrized_weight_is_resolved_without_running_it():
    gm = reads_weight_by_get_attr()
    loaded = loads_without_running(saved(gm))
    held = module_members.held_at(loaded, "lin.weight")
    assert held == module_members.ParametrizedTensor((2, 3), torch.float32)
    x = torch.randn(4, 3)
    torch.testing.assert_close(loaded(x), gm(x), rtol=0, atol=0)


def test_a_get_attr_of_what_the_module_does_not_hold_is_refused():
    def edit(program):
        for node in program["module"]["graph"]["nodes"]:
            if node["op"] == "call_module":
                node["op"], node["target"], node["args"] = "get_attr", "lin.forward", []

    refused(edited(weight_normed(), edit), "get_attr", "'lin.forward'")


def test_hooks_cannot_be_set_by_a_file():
    def edit(program):
        record(program, "lin")["attributes"]["_forward_hooks"] = {"dict": []}

    refused(edited(saved(Holds(nn.Linear(3, 2))), edit), "module.lin", "_forward_hooks")


def test_saving_a_custom_parametrization_is_refused_before_writing(tmp_path):
    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w

    lin = nn.Linear(3, 2)
    nn.utils.parametrize.register_parametrization(lin, "weight", Doubled())
    refused_on_saving(Holds(lin), "Doubled cannot be a parametrization", tmp_path=tmp_path)


# ----------------------------------------------------- one name, one meaning
def test_a_tensor_shadowing_a_parameter_is_refused():
    def edit(program):
        lin = record(program, "lin")
        lin["tensors"] = {"weight": lin["parameters"]["bias"]}

    message = refused(edited(saved(Holds(nn.Linear(3, 2))), edit), "module.lin", "'weight'")
    assert "both its parameters and its tensors" in message


def test_an_attribute_shadowing_a_child_is_refused():
    def edit(program):
        program["module"]["attributes"]["lin"] = 3

    refused(edited(saved(Holds(nn.Linear(3, 2))), edit), "'lin'", "children and its attributes")


@pytest.mark.parametrize("name", ["forward", "train", "lin.weight", "__class__"])
def test_a_parameter_named_like_a_method_or_a_path_is_refused(name):
    def edit(program):
        lin = record(program, "lin")
        lin["parameters"][name] = lin["parameters"]["weight"]

    refused(edited(saved(Holds(nn.Linear(3, 2))), edit), "module.lin", "parameter")


def test_saving_a_tensor_attribute_that_shadows_a_parameter_is_refused(tmp_path):
    model = Holds(nn.Linear(3, 2))
    model.lin.__dict__["weight"] = torch.zeros(2, 3)  # forward would use this one
    refused_on_saving(model, "lin", "'weight'", tmp_path=tmp_path)


def test_saving_a_weight_disagreeing_with_its_features_is_refused(tmp_path):
    model = Holds(nn.Linear(3, 2))
    model.lin.weight = nn.Parameter(torch.randn(2, 4))
    refused_on_saving(model, "lin (Linear)", "in_features", tmp_path=tmp_path)


def test_a_weight_disagreeing_with_its_features_is_refused_on_loading():
    def edit(program):
        record(program, "lin")["attributes"]["in_features"] = 4

    refused(edited(saved(Holds(nn.Linear(3, 2))), edit), "module lin", "in_features=4")


# ---------------------------------------------------------- LSTM, GRU, RNN
class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 6, num_layers=2, batch_first=True, bidirectional=True, proj_size=4)
        self.gru = nn.GRU(8, 5, batch_first=True, bidirectional=True)
        self.rnn = nn.RNN(10, 4, nonlinearity="relu", bias=False, batch_first=True)

    def forward(self, x):
        y, _ = self.lstm(x)
        z, _ = self.gru(y)
        return self.rnn(z)[0]


def recurrent() -> tuple[Recurrent, bytes]:
    torch.manual_seed(0)
    model = Recurrent().eval()
    return model, saved(model)


@pytest.mark.parametrize("batch, steps", [(2, 5), (3, 9), (1, 1)])
def test_lstm_gru_and_rnn_round_trip_with_the_same_numerics(batch, steps):
    model, data = recurrent()
    loaded = loads_without_running(data)
    x = torch.randn(batch, steps, 3)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert list(loaded.lstm.state_dict()) == list(model.lstm.state_dict())


def test_reordered_lstm_weights_are_refused():
    def edit(program):
        parameters = record(program, "lstm")["parameters"]
        first, second = "weight_ih_l0", "weight_hh_l0"
        renamed = {first: second, second: first}
        swapped = {renamed.get(name, name): value for name, value in parameters.items()}
        record(program, "lstm")["parameters"] = swapped

    refused(edited(recurrent()[1], edit), "module lstm", "in this order")


def test_flat_weight_names_from_a_file_are_refused():
    def edit(program):
        record(program, "gru")["attributes"]["_flat_weights_names"] = ["weight_hh_l0"]

    refused(edited(recurrent()[1], edit), "module.gru", "_flat_weights_names", "derived")


@pytest.mark.parametrize(
    "name, value, culprit",
    [
        ("hidden_size", 7, "shape"),
        ("num_layers", 1, "in this order"),
        ("mode", "GRU", "mode"),
        ("proj_size", 9, "proj_size"),
    ],
)
def test_lstm_attributes_contradicting_its_weights_are_refused(name, value, culprit):
    def edit(program):
        record(program, "lstm")["attributes"][name] = value

    refused(edited(recurrent()[1], edit), "lstm", culprit)


# ------------------------------------------------------------ quantized tensors
class Quantized(nn.Module):
    """Holds quantized buffers in the layouts quantized conv weights have."""

    def __init__(self):
        super().__init__()
        w = torch.randn(8, 3, 2, 2).contiguous(memory_format=torch.channels_last)
        scales, zeros = torch.rand(8, dtype=torch.float64) + 0.1, torch.zeros(8, dtype=torch.long)
        per_channel = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
        self.register_buffer("per_channel", per_channel)
        self.register_buffer("per_tensor", torch.quantize_per_tensor(w, 0.1, 3, torch.quint8))

    def forward(self, x):
        return x + self.per_channel.dequantize().sum() + self.per_tensor.dequantize().sum()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_channels_last_quantized_tensors_round_trip():
    torch.manual_seed(0)
    model = Quantized()
    loaded = fxloom.load(saved(model))
    for name in ("per_channel", "per_tensor"):
        original, back = getattr(model, name), getattr(loaded, name)
        assert back.stride() == original.stride() and back.qscheme() == original.qscheme()
        assert torch.equal(back.int_repr(), original.int_repr())
        assert torch.equal(back.dequantize(), original.dequantize())


def buffer_key(data: bytes, name: str = "per_channel") -> str:
    found = []
    edited(data, lambda program: found.append(program["module"]["buffers"][name]["key"]))
    return found[0]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_one_scale_for_many_channels_is_refused():
    data = saved(Quantized())
    tensors = weights(data)
    key = buffer_key(data)
    tensors[f"{key}.scale"] = tensors[f"{key}.scale"][:1].clone()
    refused(with_weights(data, tensors), "per_channel", "1 scales", "8 channels")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("axis", [4, -1])
def test_a_quantization_axis_out_of_range_is_refused(axis):
    def edit(program):
        program["module"]["buffers"]["per_channel"]["affine"]["axis"] = axis

    refused(edited(saved(Quantized()), edit), "per_channel", f"axis {axis}")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_non_positive_scale_is_refused():
    data = saved(Quantized())
    tensors = weights(data)
    tensors[f"{buffer_key(data, 'per_tensor')}.scale"] = torch.tensor(-1.0, dtype=torch.float64)
    refused(with_weights(data, tensors), "per_tensor", "finite and positive")


def test_sparse_tensors_are_never_saved(tmp_path):
    model = Holds(nn.Linear(3, 2))
    model.lin.register_buffer("mask", torch.eye(2).to_sparse())
    refused_on_saving(model, "only dense tensors", tmp_path=tmp_path)


def test_the_watch_sees_a_forward_and_a_parametrization_run():
    loaded = fxloom.load(weight_normed())
    with no_code_runs() as called:
        loaded(torch.randn(1, 3))
    assert any(name.startswith("forward") for name in called)
    assert any(name.startswith("get_parametrized") for name in called)
