"""A fused residual add writes its sum into the shortcut's storage only where nothing else can see it.

``conv2d_add_int8`` runs oneDNN's "sum" post-op, which accumulates into a tensor holding
``other``: a copy of it per call, unless generated code calls
``ops.conv2d_add_int8_into_other`` instead, which may accumulate in ``other`` itself. The
code generator does so only where the graph says no one could see the difference
(``fxloom.liveness.reused_argument``): ``other`` dies at the call, the call reads it once, it
was made by a function returning new storage and every other reader is one too. The
decision is made on the graph the code is generated from, so an edited graph recompiled, or
a loaded file, gets it afresh; the Interpreter and anything watching calls run the
operator, which never writes ``other``.
"""

from __future__ import annotations

import operator

import pytest
import torch
from quantize_helpers import SeenOperators
from torch import nn

import fxloom
from fxloom.quantize import calibrate, convert, kernels, ops, prepare

pytestmark = pytest.mark.skipif(
    "onednn" not in kernels.cpu_features(), reason="torch is built without oneDNN"
)

REUSING = "conv2d_add_int8_into_other("


class IdentityBlocks(nn.Module):
    """A ResNet stem and two identity blocks: each block's input is its shortcut, read by
    the block's first convolution and, last, by the add fused into its second."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.blocks = nn.ModuleList(
            nn.ModuleList([nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)]) for _ in range(2)
        )

    def forward(self, x):
        h = self.pool(torch.relu(self.stem(x)))
        for first, second in self.blocks:
            h = torch.relu(second(torch.relu(first(h))) + h)
        return h


def _converted(model: nn.Module, shape=(1, 3, 12, 12)) -> tuple[fxloom.GraphModule, torch.Tensor]:
    torch.manual_seed(0)
    data = [torch.randn(*shape) for _ in range(4)]
    prepared = prepare(model.eval(), (data[0],))
    return convert(calibrate(prepared, data, progress=False)), data[0]


def _functional(gm: fxloom.GraphModule, x: torch.Tensor) -> torch.Tensor:
    """The graph run node by node: every fused add the operator, which copies ``other``."""
    return fxloom.Interpreter(gm).run(x)


def test_each_block_s_add_accumulates_in_its_shortcut_and_computes_the_same() -> None:
    int8, x = _converted(IdentityBlocks())
    assert int8.code.count(REUSING) == 2
    with torch.no_grad():
        assert torch.equal(int8(x), _functional(int8, x))


def test_an_add_whose_shortcut_is_also_its_input_copies_it() -> None:
    class SameValue(nn.Module):  # conv(y) + y: the call reads y twice
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.conv = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = torch.relu(self.stem(x))
            return torch.relu(self.conv(y) + y)

    int8, x = _converted(SameValue())
    assert "conv2d_add_int8(" in int8.code and REUSING not in int8.code
    with torch.no_grad():
        assert torch.equal(int8(x), _functional(int8, x))


def _fused(gm: fxloom.GraphModule) -> list[fxloom.Node]:
    return list(gm.graph.find_nodes(op="call_function", target=ops.conv2d_add_int8))


def test_a_graph_edited_to_read_the_shortcut_later_copies_it_again() -> None:
    int8, x = _converted(IdentityBlocks())
    shortcut = _fused(int8)[-1].args[10]
    # the edit: the graph returns the last block's shortcut beside its output
    output = next(iter(int8.graph.find_nodes(op="output")))
    output.args = ((output.args[0], shortcut),)
    int8.recompile()
    assert int8.code.count(REUSING) == 1  # the first block's add still may; the last not
    with torch.no_grad():
        out, kept = int8(x)
        expected_out, expected_kept = _functional(int8, x)
    assert torch.equal(out, expected_out) and torch.equal(kept, expected_kept)


def _graph_module(build) -> fxloom.GraphModule:
    """A hand-built graph over one int8 layer's constants (``self.w``, ``self.scale``)."""
    root = nn.Module()
    g = torch.Generator().manual_seed(0)
    root.register_buffer("w", torch.randint(-127, 128, (8, 8, 1, 1), generator=g, dtype=torch.int8))
    root.register_buffer("scale", torch.rand(8, generator=g) * 1e-2)
    graph = fxloom.Graph()
    w, scale = graph.get_attr("w"), graph.get_attr("scale")

    def conv(x, other=None):
        geometry = ([1, 1], [0, 0], [1, 1], 1)
        if other is None:
            return graph.call_function(
                ops.conv2d_int8, (x, 0.02, 3, w, scale, None, *geometry, 0.05, 2, True)
            )
        return graph.call_function(
            ops.conv2d_add_int8,
            (x, 0.02, 3, w, scale, None, *geometry, other, 0.05, 2, 0.06, 0, True),
        )

    graph.output(build(graph, conv))
    return fxloom.GraphModule(root, graph)


def _codes(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (1, 8, 5, 5), generator=g, dtype=torch.uint8)


def test_a_shortcut_the_caller_passed_in_is_never_written() -> None:
    gm = _graph_module(
        lambda graph, conv: conv(graph.placeholder("x"), other=graph.placeholder("other"))
    )
    assert REUSING not in gm.code
    x, other = _codes(1), _codes(2)
    before = other.clone()
    gm(x, other)
    assert torch.equal(other, before)


@pytest.mark.parametrize(
    "alias", [pytest.param(torch.flatten, id="flatten"), pytest.param(operator.getitem, id="[0]")]
)
def test_a_shortcut_with_a_view_alive_is_never_written(alias) -> None:
    def build(graph, conv):
        x = graph.placeholder("x")
        shortcut = conv(x)
        args = (shortcut,) if alias is torch.flatten else (shortcut, 0)
        view = graph.call_function(alias, args)  # made before the add, read after it
        return (conv(x, other=shortcut), view)

    gm = _graph_module(build)
    assert REUSING not in gm.code
    x = _codes(3)
    with torch.no_grad():
        out, view = gm(x)
        expected_out, expected_view = fxloom.Interpreter(gm).run(x)
    assert torch.equal(out, expected_out) and torch.equal(view, expected_view)


def test_a_shortcut_made_and_dropped_in_the_graph_is_reused() -> None:
    gm = _graph_module(lambda graph, conv: conv(x := graph.placeholder("x"), other=conv(x)))
    assert REUSING in gm.code
    x = _codes(4)
    with torch.no_grad():
        assert torch.equal(gm(x), fxloom.Interpreter(gm).run(x))


def test_under_a_dispatch_mode_the_reusing_form_is_the_operator_and_writes_nothing() -> None:
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-127, 128, (8, 8, 1, 1), generator=g, dtype=torch.int8)
    scale = torch.rand(8, generator=g) * 1e-2
    other = _codes(6).contiguous(memory_format=torch.channels_last)
    before = other.clone()
    args = (_codes(7), 0.02, 3, w, scale, None, [1, 1], [0, 0], [1, 1], 1, other, 0.05, 2, 0.06, 0)
    with SeenOperators() as mode:
        out = ops.conv2d_add_int8_into_other(*args)
    assert torch.ops.fxloom_q.conv2d_add_int8.default in mode.seen
    assert torch.equal(other, before) and torch.equal(out, ops.conv2d_add_int8(*args))


def test_a_saved_model_reuses_the_shortcut_after_loading(tmp_path) -> None:
    int8, x = _converted(IdentityBlocks())
    fxloom.save(int8, tmp_path / "blocks.fxl")
    loaded = fxloom.load(tmp_path / "blocks.fxl")
    assert loaded.code.count(REUSING) == 2  # generated from the loaded graph, checked there
    with torch.no_grad():
        assert torch.equal(loaded(x), _functional(int8, x))
