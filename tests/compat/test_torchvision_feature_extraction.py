"""torchvision's feature extraction runs on fxloom with only its import changed.

``tests/compat/clients.py`` loads torchvision's own ``feature_extraction.py`` with
``from torch import fx`` replaced by ``import fxloom as fx`` (and its private import from
``fxloom.graph_module``). On each model, in train and eval mode, against the same functions on
torch.fx: ``get_graph_node_names`` gives torch.fx's names, ``create_feature_extractor`` gives
torch.fx's features at every node, an extractor cut part-way keeps the parameters torch.fx's
keeps (dead code is pruned), and the extractor deep-copies, pickles and saves after a run.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from tests.compat.clients import fxloom_feature_extraction, import_torchvision

pytestmark = pytest.mark.slow

# model name -> input side (inception_v3 wants 299; the others take 224).
MODELS = {
    "resnet18": 224,
    "mobilenet_v3_small": 224,
    "efficientnet_b0": 224,
    "regnet_x_400mf": 224,
    "densenet121": 224,
    "convnext_tiny": 224,
    "vit_b_16": 224,
    "swin_t": 224,
    "maxvit_t": 224,
    "inception_v3": 299,
}
MODES = pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])


def build(name: str, train: bool) -> torch.nn.Module:
    import_torchvision()
    from torchvision import models

    torch.manual_seed(0)
    kwargs = {"aux_logits": True, "init_weights": False} if name == "inception_v3" else {}
    return getattr(models, name)(num_classes=10, **kwargs).train(train)


def example(name: str) -> torch.Tensor:
    side = MODELS[name]  # two images: batch norm in training needs more than one value
    return torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(1))


def both():
    """torchvision's feature extraction on torch.fx, and the same code on fxloom."""
    import_torchvision()
    from torchvision.models import feature_extraction

    return feature_extraction, fxloom_feature_extraction()


def run_seeded(module: torch.nn.Module, x: torch.Tensor) -> dict:
    torch.manual_seed(2)  # dropout and stochastic depth draw the same numbers on both
    with torch.no_grad():
        return module(x)


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def assert_same_features(expected: dict, got: dict) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        assert_same_value(value, got[name], name)


def assert_same_value(expected, got, name: str) -> None:
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=name)
    elif isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected), name
        for one, other in zip(expected, got, strict=True):
            assert_same_value(one, other, name)
    else:
        assert got == expected, name


@pytest.mark.parametrize("name", MODELS)
def test_get_graph_node_names_gives_torch_fx_names(name: str) -> None:
    torch_fx, ours = both()
    model = build(name, train=False)
    assert ours.get_graph_node_names(model) == torch_fx.get_graph_node_names(model)


@MODES
@pytest.mark.parametrize("name", MODELS)
def test_features_equal_torch_fx_at_every_node(name: str, train: bool) -> None:
    torch_fx, ours = both()
    model = build(name, train)
    train_nodes, eval_nodes = torch_fx.get_graph_node_names(model)
    nodes = train_nodes if train else eval_nodes
    kwargs = {"train_return_nodes": train_nodes, "eval_return_nodes": eval_nodes}
    expected = torch_fx.create_feature_extractor(model, **kwargs).train(train)
    extractor = ours.create_feature_extractor(model, **kwargs).train(train)
    features = run_seeded(extractor, example(name))
    assert list(features) == nodes
    assert_same_features(run_seeded(expected, example(name)), features)


@MODES
@pytest.mark.parametrize("name", MODELS)
def test_an_extractor_cut_part_way_keeps_torch_fx_parameters(name: str, train: bool) -> None:
    torch_fx, ours = both()
    model = build(name, train)
    nodes = torch_fx.get_graph_node_names(model)[0 if train else 1]
    for cut in (nodes[len(nodes) // 4], nodes[len(nodes) // 2]):
        expected = torch_fx.create_feature_extractor(model, return_nodes=[cut])
        extractor = ours.create_feature_extractor(model, return_nodes=[cut])
        assert parameter_count(extractor) == parameter_count(expected), cut
        kept = {node.name for node in expected.graph.nodes}
        extra = [node for node in extractor.graph.nodes if node.name not in kept]
        assert all(_kept_on_purpose(node) for node in extra), extra
        if not extra:
            assert_same_features(
                run_seeded(expected.train(train), example(name)),
                run_seeded(extractor.train(train), example(name)),
            )


def _kept_on_purpose(node) -> bool:
    """What fxloom's dead-code elimination keeps beyond torch.fx's: an unpacking check of a
    value still read, and an in-place write (``ReLU(inplace=True)``) to a value the extractor
    returns, which eager's tensor holds too (docs/torch_fx_clients.md)."""
    from fxloom.guards import check_length

    if node.target is check_length or node.op == "get_attr":  # constants are numbered apart
        return True
    module = (
        node.graph.owning_module.get_submodule(node.target) if node.op == "call_module" else None
    )
    return getattr(module, "inplace", False) is True or node.kwargs.get("inplace") is True


@pytest.mark.parametrize("name", ["resnet18", "vit_b_16", "swin_t"])
def test_an_extractor_deep_copies_pickles_and_saves_after_a_run(name: str) -> None:
    _, ours = both()
    model = build(name, train=False)
    nodes = ours.get_graph_node_names(model)[1]
    extractor = ours.create_feature_extractor(model, return_nodes=nodes[-3:]).eval()
    expected = run_seeded(extractor, example(name))
    buffer = io.BytesIO()
    torch.save(extractor, buffer)
    copies = [
        copy.deepcopy(extractor),
        pickle.loads(pickle.dumps(extractor)),
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=False),
    ]
    for copied in copies:
        assert_same_features(expected, run_seeded(copied.eval(), example(name)))
        assert_same_features(expected, run_seeded(copied.train().eval(), example(name)))
