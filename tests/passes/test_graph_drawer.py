"""Drawing graphs with Graphviz: ``fxloom.passes.graph_drawer.FxGraphDrawer`` and ``fxloom draw``.

The DOT source is checked as text; whenever Graphviz's ``dot`` is installed the drawings are
also rendered, with any Graphviz warning turned into a failure, and the SVG's text is read
back to check that labels show exactly what they should (nasty strings included).
"""

from __future__ import annotations

import operator
import re
import shutil
import sys
import warnings
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

import fxloom
from fxloom import cli, zoo
from fxloom.passes import _dot
from fxloom.passes.graph_drawer import (
    NODE_COLORS,
    DotGraph,
    FxGraphDrawer,
    GraphvizError,
    GraphvizNotFoundError,
    GraphvizWarning,
)

requires_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' missing")


class Meta(NamedTuple):
    """Stands in for shape propagation's TensorMetadata: anything with .shape and .dtype."""

    shape: tuple[Any, ...]
    dtype: Any


# ------------------------------------------------------------------------------- helpers
def render_strictly(dot: DotGraph, format: str = "svg") -> bytes:
    """Render with ``dot``, failing on any warning Graphviz prints."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return dot.pipe(format)


def svg_texts(svg: bytes) -> list[str]:
    """Every line of text drawn in an SVG rendering."""
    root = ElementTree.fromstring(svg)
    return ["".join(e.itertext()) for e in root.iter() if e.tag.endswith("}text")]


def cluster_chains(source: str) -> dict[str, tuple[str, ...]]:
    """For each node drawn, the labels of the module boxes around it, outermost first."""
    chains, open_clusters = {}, []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("subgraph "):
            open_clusters.append(None)
        elif stripped.startswith("label=<") and open_clusters and open_clusters[-1] is None:
            open_clusters[-1] = stripped[len("label=<") : stripped.index(">;")]
        elif stripped == "}" and open_clusters:
            open_clusters.pop()
        elif match := re.match(r'"([^"]+)" \[label=', stripped):
            chains[match[1]] = tuple(open_clusters)
    return chains


def edge_labels(source: str) -> dict[tuple[str, str], str | None]:
    found = re.findall(r'^\s*"([^"]+)" -> "([^"]+)"(?: \[label=<(.*)>\])?$', source, re.M)
    return {(a, b): label or None for a, b, label in found}


def with_shapes(name: str) -> tuple[fxloom.GraphModule, tuple]:
    shape_prop = pytest.importorskip("fxloom.passes.shape_prop")
    model, inputs = zoo.build(name)
    gm = fxloom.symbolic_trace(model)
    with torch.no_grad():
        shape_prop.ShapeProp(gm).propagate(*inputs)
    return gm, inputs


@pytest.fixture(scope="module")
def resnet() -> fxloom.GraphModule:
    return with_shapes("resnet_tiny")[0]


@pytest.fixture(scope="module")
def transformer() -> fxloom.GraphModule:
    return with_shapes("transformer_tiny")[0]


class Clamped(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 5)

    def forward(self, x):
        return self.linear(x).clamp(min=0.0, max=1.0) + self.linear.bias


def clamped() -> fxloom.GraphModule:
    return fxloom.symbolic_trace(Clamped())


# --------------------------------------------------------------------- boxes and labels
def test_each_node_is_a_box_filled_with_its_opcodes_colour() -> None:
    gm = clamped()
    source = FxGraphDrawer(gm, "clamped").get_dot_graph().source
    for node in gm.graph.nodes:
        assert f'"{node.name}" [label=<' in source
        assert re.search(rf'"{node.name}" \[label=<.*fillcolor="{NODE_COLORS[node.op]}"', source)


def test_colors_can_be_overridden_per_opcode() -> None:
    source = FxGraphDrawer(clamped(), "c", colors={"call_method": "red"}).get_dot_graph().source
    assert re.search(r'"clamp" \[label=<.*fillcolor="red"', source)


def test_labels_show_name_opcode_target_and_constant_arguments() -> None:
    source = FxGraphDrawer(clamped(), "clamped").get_dot_graph().source
    clamp_line = next(line for line in source.splitlines() if line.strip().startswith('"clamp"'))
    assert "<B>clamp</B>" in clamp_line
    assert "call_method[target=clamp]" in clamp_line
    assert "kwargs: {min: 0.0, max: 1.0}" in clamp_line


def test_call_module_labels_show_the_module_type_and_settings() -> None:
    source = FxGraphDrawer(clamped(), "clamped").get_dot_graph().source
    assert "Linear(in_features=4, out_features=5, bias=True)" in source


def test_node_arguments_show_as_dots_and_rows_of_only_nodes_are_left_out() -> None:
    g = fxloom.Graph()
    x = g.placeholder("x")
    view = g.call_method("view", (x, 2, -1))
    total = g.call_function(operator.add, (view, x))
    g.output(total)
    gm = fxloom.GraphModule(torch.nn.Module(), g)
    source = FxGraphDrawer(gm, "g").get_dot_graph().source
    assert "args: (\N{MIDDLE DOT}, 2, -1)" in source
    assert "args: (\N{MIDDLE DOT}, \N{MIDDLE DOT})" not in source  # add's inputs are edges
    named = FxGraphDrawer(gm, "g", skip_node_names_in_args=False).get_dot_graph().source
    assert "args: (%x, 2, -1)" in named and "args: (%view, %x)" in named


def test_long_label_rows_are_cut_to_max_label_width() -> None:
    g = fxloom.Graph()
    g.output(g.call_function(torch.zeros, (tuple(range(40)),)))
    source = FxGraphDrawer(fxloom.GraphModule(torch.nn.Module(), g), "g", max_label_width=30)
    rows = re.findall(r'<TD ALIGN="LEFT">([^<]*)</TD>', source.get_dot_graph().source)
    assert max(len(row) for row in rows) <= 30
    assert any(row.endswith("...") for row in rows)


def test_parse_stack_trace_adds_the_users_file_and_line() -> None:
    tracer = fxloom.Tracer(record_stack_traces=True)
    gm = fxloom.GraphModule(Clamped(), tracer.trace(Clamped()))
    source = FxGraphDrawer(gm, "clamped", parse_stack_trace=True).get_dot_graph().source
    assert re.search(r"test_graph_drawer\.py:\d+ return self\.linear\(x\)\.clamp", source)


# ------------------------------------------------------------------------------ edges
def test_edges_carry_shapes_and_dtypes_from_shape_propagation(resnet) -> None:
    edges = edge_labels(FxGraphDrawer(resnet, "resnet_tiny").get_dot_graph().source)
    assert edges["x", "conv1"] == "f32[1, 3, 32, 32]"
    assert edges["conv1", "bn1"] == "f32[1, 8, 32, 32]"
    assert edges["flatten", "fc"].startswith("f32[1, ")


def test_edges_take_any_metadata_with_shape_and_dtype_and_nested_tuples() -> None:
    g = fxloom.Graph()
    x = g.placeholder("x")
    pair = g.call_function(torch.split, (x, 2))
    first = g.call_function(operator.getitem, (pair, 0))
    g.output((first, pair))
    x.meta["tensor_meta"] = Meta((4, "s0"), torch.float16)
    pair.meta["tensor_meta"] = (Meta((2, "s0"), torch.float16), Meta((2, "s0"), torch.int8))
    source = FxGraphDrawer(fxloom.GraphModule(torch.nn.Module(), g), "g").get_dot_graph().source
    edges = edge_labels(source)
    assert edges["x", "split"] == "f16[4, s0]"
    assert edges["split", "getitem"] == "f16[2, s0]"  # indexing edges show the element taken
    assert edges["split", "output"] == "(f16[2, s0], i8[2, s0])"


def test_edges_fall_back_to_meta_val_and_have_no_label_without_metadata() -> None:
    g = fxloom.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.output(g.call_function(operator.add, (x, y)))
    x.meta["val"] = torch.empty(3, dtype=torch.bool, device="meta")
    edges = edge_labels(
        FxGraphDrawer(fxloom.GraphModule(torch.nn.Module(), g), "g").get_dot_graph().source
    )
    assert edges["x", "add"] == "bool[3]"
    assert edges["y", "add"] is None


def test_show_shapes_false_leaves_edges_unlabelled(resnet) -> None:
    source = FxGraphDrawer(resnet, "r", show_shapes=False).get_dot_graph().source
    assert set(edge_labels(source).values()) == {None}


# --------------------------------------------------------------------------- clusters
def test_nodes_are_boxed_by_module_path_with_nested_boxes(resnet) -> None:
    chains = cluster_chains(FxGraphDrawer(resnet, "resnet_tiny").get_dot_graph().source)
    assert chains["layers_0_conv1"] == ("layers (Sequential)", "layers.0 (BasicBlock)")
    assert chains["add"] == ("layers (Sequential)", "layers.0 (BasicBlock)")  # the residual add
    assert chains["layers_1_downsample_0"] == (
        "layers (Sequential)",
        "layers.1 (BasicBlock)",
        "layers.1.downsample (Sequential)",
    )
    assert chains["conv1"] == () and chains["x"] == ()


def test_a_leaf_module_is_not_boxed_inside_itself(transformer) -> None:
    chains = cluster_chains(FxGraphDrawer(transformer, "t").get_dot_graph().source)
    assert chains["blocks_0_attention_qkv"] == (
        "blocks.0 (EncoderBlock)",
        "blocks.0.attention (SelfAttention)",
    )
    assert chains["blocks_0_attention_qkv.weight"] == chains["blocks_0_attention_qkv"]


def test_call_module_targets_give_boxes_when_nn_module_stack_is_missing() -> None:
    root = torch.nn.Module()
    root.layers = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU()))
    g = fxloom.Graph()
    g.output(g.call_module("layers.0.0", (g.placeholder("x"),)))
    gm = fxloom.GraphModule(root, g)  # copies only the path to layers.0.0, as plain Modules
    chains = cluster_chains(FxGraphDrawer(gm, "g").get_dot_graph().source)
    assert chains["layers_0_0"] == ("layers (Module)", "layers.0 (Module)")


def test_clusters_false_draws_every_node_at_the_top_level(resnet) -> None:
    source = FxGraphDrawer(resnet, "r", clusters=False).get_dot_graph().source
    assert "subgraph" not in source
    assert set(cluster_chains(source).values()) == {()}


# ----------------------------------------------------- parameters, get_attr, submodules
def test_leaf_modules_show_their_parameters_and_buffers_unless_ignored(resnet) -> None:
    source = FxGraphDrawer(resnet, "r").get_dot_graph().source
    assert '"bn1.running_mean" -> "bn1"' in source
    assert "buffer f32[8]" in source and "parameter f32[8, 3, 3, 3]" in source
    quiet = FxGraphDrawer(resnet, "r", ignore_parameters_and_buffers=True).get_dot_graph().source
    assert "bn1.running_mean" not in quiet and "parameter" not in quiet


def test_ignore_getattr_leaves_out_get_attr_nodes_and_their_edges() -> None:
    gm = clamped()
    assert any(node.op == "get_attr" for node in gm.graph.nodes)
    source = FxGraphDrawer(gm, "c", ignore_getattr=True).get_dot_graph().source
    assert "get_attr" not in source and '"linear_bias"' not in source


def test_called_graph_modules_get_drawings_of_their_own() -> None:
    inner = fxloom.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    root = torch.nn.Module()
    root.stage = inner
    g = fxloom.Graph()
    g.output(g.call_module("stage", (g.placeholder("x"),)))
    drawer = FxGraphDrawer(fxloom.GraphModule(root, g), "outer")
    assert sorted(drawer.get_all_dot_graphs()) == ["outer", "outer_stage"]
    assert drawer.get_dot_graph("stage") is drawer.get_submod_dot_graph("stage")
    assert drawer.get_dot_graph("stage").source.startswith('digraph "outer_stage"')
    assert '"_0"' in drawer.get_dot_graph("stage").source
    with pytest.raises(KeyError, match=r"no drawing of a submodule 'nope'.*\['stage'\]"):
        drawer.get_submod_dot_graph("nope")


def test_drawing_leaves_the_graph_its_names_and_meta_unchanged(resnet) -> None:
    before = [(n.name, n.op, n.target, n.args, dict(n.meta)) for n in resnet.graph.nodes]
    code = resnet.code
    FxGraphDrawer(resnet, "r", parse_stack_trace=True).get_dot_graph()
    assert [(n.name, n.op, n.target, n.args, dict(n.meta)) for n in resnet.graph.nodes] == before
    assert resnet.code == code


def test_a_module_without_a_graph_is_refused_with_what_to_do() -> None:
    with pytest.raises(TypeError, match=r"got a Linear; trace it first"):
        FxGraphDrawer(torch.nn.Linear(2, 2), "linear")


# ---------------------------------------------------------------- escaping nasty labels
NASTY_STRINGS = {
    "einsum": "bij,bjk->bik",
    "quotes": 'it\'s "quoted"',
    "braces_and_bars": "{x} | {y}",
    "angle_brackets": "<B>not bold</B> <TABLE>",
    "ampersand_entities": "&amp; &lt; & ;",
    "backslashes": "C:\\dir\\N\\G\\",
    "newline_and_tab": "line one\nline\ttwo",
    "control": "nul\x00bell\x07",
    "unicode": "π ∑ naïve",
    "record_syntax": "<f0> left|<f1> right",
}


def nasty_graph() -> fxloom.GraphModule:
    """A node per nasty string argument, and names, targets and metadata in DOT's syntax."""
    g = fxloom.Graph()
    x = g.placeholder("x")
    keyword = g.placeholder("graph")  # a DOT keyword as a node name
    unicode_name = g.create_node("call_function", torch.relu, (x,), name="π")
    printed = [g.call_function(print, (unicode_name, text)) for text in NASTY_STRINGS.values()]
    weird_method = g.call_method('m<&>"{|}\\N', (keyword,))
    einsum = g.call_function(torch.einsum, ("bij,bjk->bik", x, keyword), {"note": "a->b"})
    g.output((*printed, weird_method, einsum))
    x.meta["tensor_meta"] = Meta((2, 3), "dtype<&>\\N")
    return fxloom.GraphModule(torch.nn.Module(), g)


@requires_dot
@pytest.mark.parametrize("case", sorted(NASTY_STRINGS))
def test_string_arguments_render_literally(case: str) -> None:
    texts = " ".join(svg_texts(render_strictly(FxGraphDrawer(nasty_graph(), "n").get_dot_graph())))
    shown = repr(NASTY_STRINGS[case])  # arguments are shown as Python literals
    assert shown in texts


@requires_dot
def test_targets_names_and_metadata_with_dot_syntax_render_literally() -> None:
    texts = svg_texts(render_strictly(FxGraphDrawer(nasty_graph(), "n").get_dot_graph()))
    assert 'call_method[target=m<&>"{|}\\N]' in texts
    assert "u03c0" in texts and "graph" in texts  # node names are ASCII: π is spelled out
    assert "args: ('bij,bjk->bik', \N{MIDDLE DOT}, \N{MIDDLE DOT})" in texts
    assert "kwargs: {note: 'a->b'}" in texts
    assert "dtype<&>\\N[2, 3]" in texts


@requires_dot
def test_nasty_names_render_to_png_and_pdf_without_warnings() -> None:
    dot = FxGraphDrawer(nasty_graph(), 'a "quoted" \\ name').get_dot_graph()
    assert render_strictly(dot, "png").startswith(b"\x89PNG")
    assert render_strictly(dot, "pdf").startswith(b"%PDF")


@requires_dot
def test_module_boxes_with_odd_paths_and_type_names_render_literally() -> None:
    g = fxloom.Graph()
    relu = g.call_function(torch.relu, (g.placeholder("x"),))
    relu.meta["nn_module_stack"] = {"a<b>": ("a<b>", "pkg.Mod<locals>&\\N")}
    g.output(relu)
    dot = FxGraphDrawer(fxloom.GraphModule(torch.nn.Module(), g), "g").get_dot_graph()
    assert "a<b> (Mod<locals>&\\N)" in svg_texts(render_strictly(dot))


def test_quote_id_and_html_text_escape_every_special_character() -> None:
    assert _dot.quote_id('a"b\\') == '"a\\"b\\\\"'
    assert _dot.html_text('<&>"') == "&lt;&amp;&gt;&quot;"
    assert _dot.html_text("\\N") == "\\\\N"  # Graphviz would put the node's name in for \N
    assert _dot.html_text("a\nb\x00") == "a\\\\nb\\\\x00"  # shown as Python escapes


# ---------------------------------------------------------------- rendering real models
@requires_dot
def test_resnet_tiny_renders_to_svg_with_its_module_boxes(resnet, tmp_path: Path) -> None:
    path = FxGraphDrawer(resnet, "resnet_tiny").write(tmp_path / "resnet.svg")
    texts = svg_texts(path.read_bytes())
    assert "layers.1.downsample (Sequential)" in texts
    assert "f32[1, 8, 32, 32]" in texts


@requires_dot
def test_transformer_tiny_renders_to_png(transformer, tmp_path: Path) -> None:
    drawer = FxGraphDrawer(transformer, "transformer_tiny", ignore_parameters_and_buffers=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = drawer.write(tmp_path / "transformer.png")
    assert path.read_bytes().startswith(b"\x89PNG")


@pytest.fixture(scope="module")
def bert(traced_hf) -> fxloom.GraphModule:
    shape_prop = pytest.importorskip("fxloom.passes.shape_prop")
    traced = traced_hf("bert")
    with torch.no_grad():
        shape_prop.ShapeProp(traced.gm).propagate(**traced.inputs)
    return traced.gm


def test_a_hugging_face_model_is_boxed_by_its_module_tree(bert) -> None:
    source = FxGraphDrawer(bert, "bert").get_dot_graph().source
    chains = set(cluster_chains(source).values())
    assert (
        "encoder (BertEncoder)",
        "encoder.layer.0 (BertLayer)",
        "encoder.layer.0.attention (BertAttention)",
        "encoder.layer.0.attention.self (BertSelfAttention)",
    ) in chains
    assert any(label and label.startswith("f32[2, 7, ") for label in edge_labels(source).values())


@requires_dot
def test_a_hugging_face_model_renders_to_svg(bert) -> None:
    texts = svg_texts(render_strictly(FxGraphDrawer(bert, "bert").get_dot_graph()))
    assert "embeddings (BertEmbeddings)" in texts


# ------------------------------------------------------------- writing and rendering
@requires_dot
def test_write_picks_the_format_from_the_suffix(tmp_path: Path) -> None:
    dot = FxGraphDrawer(clamped(), "c").get_dot_graph()
    assert dot.write(tmp_path / "c.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert dot.write(tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    assert dot.write(tmp_path / "c.pdf").read_bytes().startswith(b"%PDF")
    assert dot.write(tmp_path / "c.dot").read_text() == dot.source
    assert dot.write(tmp_path / "c.image", format="svg").read_bytes().lstrip().startswith(b"<?xml")


def test_write_without_a_suffix_or_format_says_how_to_choose(tmp_path: Path) -> None:
    dot = FxGraphDrawer(clamped(), "c").get_dot_graph()
    with pytest.raises(ValueError, match=r"give it a suffix \(\.svg, \.png, \.pdf, \.dot\)"):
        dot.write(tmp_path / "drawing")


@requires_dot
def test_pydot_style_methods_work_as_with_torch_fx(tmp_path: Path) -> None:
    dot = FxGraphDrawer(clamped(), "c").get_dot_graph()
    assert dot.to_string() == dot.source == str(dot)
    assert dot.create_svg() == dot.pipe("svg")
    dot.write_svg(tmp_path / "c.svg")
    dot.write_raw(tmp_path / "c.dot")
    assert (tmp_path / "c.dot").read_text() == dot.source


@requires_dot
def test_a_format_dot_does_not_know_raises_graphviz_error() -> None:
    with pytest.raises(GraphvizError, match=r"'dot -Tnosuchformat' failed"):
        FxGraphDrawer(clamped(), "c").get_dot_graph().pipe("nosuchformat")


@requires_dot
def test_graphviz_warnings_become_python_warnings() -> None:
    dot = DotGraph("w", 'digraph "w" { "a" [color="notacolour"] }\n')
    with pytest.warns(GraphvizWarning, match="notacolour"):
        dot.pipe("svg")


def test_without_dot_rendering_says_how_to_install_graphviz(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` to be found
    dot = FxGraphDrawer(clamped(), "c").get_dot_graph()
    with pytest.raises(GraphvizNotFoundError, match=r"apt-get install graphviz.*brew install"):
        dot.write(tmp_path / "c.svg")
    assert not (tmp_path / "c.svg").exists()
    assert dot.write(tmp_path / "c.dot").read_text() == dot.source  # DOT needs no Graphviz
    assert dot._repr_svg_() is None  # Jupyter falls back to the text repr


def test_to_graphviz_hands_the_source_to_the_graphviz_package() -> None:
    graphviz = pytest.importorskip("graphviz")
    dot = FxGraphDrawer(clamped(), "c").get_dot_graph()
    source = dot.to_graphviz()
    assert isinstance(source, graphviz.Source) and source.source == dot.source


def test_to_graphviz_without_the_package_names_the_draw_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz now fails
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'fxloom\[draw\]'"):
        FxGraphDrawer(clamped(), "c").get_dot_graph().to_graphviz()


# ---------------------------------------------------------------------- `fxloom draw`
@requires_dot
def test_cli_draws_a_zoo_model_with_shapes_and_module_boxes(tmp_path: Path, capsys) -> None:
    pytest.importorskip("fxloom.passes.shape_prop")
    output = tmp_path / "resnet.svg"
    assert cli.main(["draw", "resnet_tiny", "-o", str(output)]) == cli.EXIT_OK
    assert f"wrote {output}" in capsys.readouterr().out
    texts = svg_texts(output.read_bytes())
    assert "f32[1, 3, 32, 32]" in texts and "layers.0 (BasicBlock)" in texts


def test_cli_without_output_prints_dot_source(capsys) -> None:
    assert cli.main(["draw", "mlp_tiny", "--no-shapes", "--no-clusters"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith('digraph "mlp_tiny" {') and "subgraph" not in out
    assert "[label=<f32" not in out


def test_cli_options_reach_the_drawer(capsys) -> None:
    assert cli.main(["draw", "mlp_tiny", "--ignore-parameters", "--rankdir", "LR"]) == 0
    out = capsys.readouterr().out
    assert 'rankdir="LR"' in out and "parameter f32" not in out


def test_cli_without_dot_writes_the_dot_file_and_exits_1(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["draw", "mlp_tiny", "-o", str(tmp_path / "m.svg")]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "apt-get install graphviz" in err and "brew install graphviz" in err
    assert f"render it with: dot -Tsvg {tmp_path / 'm.dot'} -o {tmp_path / 'm.svg'}" in err
    assert (tmp_path / "m.dot").read_text().startswith('digraph "mlp_tiny"')
    assert not (tmp_path / "m.svg").exists()


def test_cli_takes_a_factory_and_notes_when_it_gives_no_inputs(capsys) -> None:
    assert cli.main(["draw", "fxloom.zoo.mlp:mlp_tiny"]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert captured.out.startswith('digraph "mlp_tiny"')
    assert (
        "note: shapes are not drawn: the MODEL factory returned no example inputs" in captured.err
    )


def test_cli_factory_inputs_may_be_keyword_arguments(monkeypatch, tmp_path, capsys) -> None:
    pytest.importorskip("fxloom.passes.shape_prop")
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "class Scaled(torch.nn.Module):\n"
        "    def forward(self, x, scale=2.0):\n"
        "        return x * scale\n"
        "def build():\n"
        "    return Scaled(), {'x': torch.ones(3, 4)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["draw", "my_models:build"]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert captured.err == ""
    assert edge_labels(captured.out)["x", "mul"] == "f32[3, 4]"


@pytest.mark.parametrize(
    ("model", "message", "status"),
    [
        # A MODEL that names nothing is a usage error; a factory that runs and returns the
        # wrong thing is the command failing.
        ("no_such_model", r"no zoo model named 'no_such_model': give one of .*mlp_tiny", 2),
        ("no_such_package:build", r"cannot import 'no_such_package'", 2),
        ("fxloom.zoo:nothing_here", r"'fxloom.zoo' has no 'nothing_here'", 2),
        ("fxloom.zoo:MODELS", r"fxloom.zoo:MODELS is a dict, not a function", 2),
        ("fxloom.zoo.mlp:mlp_tiny_inputs", r"returned tuple; a MODEL factory returns", 1),
    ],
)
def test_cli_explains_a_model_it_cannot_load(model: str, message: str, status: int, capsys) -> None:
    assert cli.main(["draw", model]) == status
    assert re.search(message, capsys.readouterr().err)
