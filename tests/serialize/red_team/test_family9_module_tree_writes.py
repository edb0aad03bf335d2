"""Family 9 (issue 32): a graph that changes its own module tree while it runs.

The loader checked the module tree in the file; the generated forward runs on the tree as it
is at run time. Each file here adds nodes that would change it: a ``Sequential``/``ModuleDict``
/``ParameterDict`` entry deleted or replaced (``operator.setitem``/``delitem``, the methods
``__setitem__``/``__delitem__``/``__iadd__``), a child swapped for a hidden module whose
weights ``fxloom show`` never lists, ``nn.Module`` methods called through Tensor method names
(``double``, ``to``, ``requires_grad_``), a module handed to a module or to ``cond`` as an
operand, a mutable attribute written through ``get_attr``. A loaded module tree is frozen
while its graph runs: every file must be refused while loading, nothing recorded.
"""

import pytest
import torch
from red_team_files import call, edited, exported, insert_before_output, ref, saved_gm
from red_team_harness import Case, assert_refused, family
from torch import nn


class Containers(nn.Module):
    """A model with every kind of module container, and a child its forward never calls."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        self.blocks = nn.ModuleList([nn.Linear(3, 3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(3, 3)})
        self.scales = nn.ParameterDict({"p": nn.Parameter(torch.ones(3))})
        self.ident = nn.Identity()
        self.hidden = nn.Linear(3, 3)
        self.sizes = (3, 3)

    def forward(self, x):
        x = self.blocks[0](self.seq(x))
        return self.ident(self.heads["a"](x) * self.scales["p"])


def _containers_file() -> bytes:
    import fxloom

    model = Containers()
    gm = fxloom.symbolic_trace(model)
    # Tracing keeps the paths it called under plain modules; the file holds the containers
    # themselves (the paths inside are the same), and a child the graph never calls.
    for name in ("seq", "blocks", "heads", "scales", "hidden"):
        gm.add_submodule(name, getattr(model, name))
    data = saved_gm(gm)

    def with_list_attribute(program):  # a mutable plain attribute, as an older fxloom saved
        program["module"]["attributes"]["names"] = ["a", "b"]
        program["module"]["attributes"]["table"] = {"dict": [["k", 1]]}

    return edited(with_list_attribute, data)


def _nodes(id: str, doc: str, *nodes: dict) -> Case:
    def build():
        return edited(lambda p: insert_before_output(p, *nodes), _containers_file())

    return Case(id, doc, build)


def get(name: str, path: str) -> dict:
    return call(name, path, op="get_attr")


def method(name: str, target: str, *args, **kwargs) -> dict:
    return call(name, target, *args, op="call_method", **kwargs)


CASES = [
    _nodes(
        "setitem-sequential-child-swapped-for-hidden",
        "operator.setitem(self.seq, 0, self.hidden): the Sequential then computes with weights "
        "fxloom show lists under another path",
        get("seq", "seq"),
        get("hidden", "hidden"),
        call("swap", "operator.setitem", ref("seq"), 0, ref("hidden")),
        call("again", "seq", ref("x"), op="call_module"),
    ),
    _nodes(
        "delitem-moduledict-entry",
        "operator.delitem(self.heads, 'a'): the next call_module of heads.a finds nothing",
        get("heads", "heads"),
        call("drop", "operator.delitem", ref("heads"), "a"),
    ),
    _nodes(
        "setitem-method-parameterdict-stores-getattr",
        "self.scales.__setitem__('q', getattr): a builtin stored in the tree, reached later",
        get("scales", "scales"),
        method("store", "__setitem__", ref("scales"), "q", {"function": "getattr"}),
    ),
    _nodes(
        "delitem-method-sequential",
        "self.seq.__delitem__(0) through a call_method",
        get("seq", "seq"),
        method("drop", "__delitem__", ref("seq"), 0),
    ),
    _nodes(
        "iadd-method-modulelist-appends-hidden",
        "self.blocks.__iadd__([self.hidden]): the ModuleList grows a module",
        get("blocks", "blocks"),
        get("hidden", "hidden"),
        method("grow", "__iadd__", ref("blocks"), [ref("hidden")]),
    ),
    _nodes(
        "iadd-operator-modulelist",
        "operator.iadd(self.blocks, [self.hidden])",
        get("blocks", "blocks"),
        get("hidden", "hidden"),
        call("grow", "operator.iadd", ref("blocks"), [ref("hidden")]),
    ),
    _nodes(
        "double-method-on-a-module",
        "Tensor method name 'double' on a module: nn.Module.double rewrites its parameters",
        get("hid", "hidden"),
        method("rewrite", "double", ref("hid")),
    ),
    _nodes(
        "to-method-on-a-module",
        "self.seq.to(torch.float64): nn.Module.to converts every parameter in place",
        get("seq", "seq"),
        method("rewrite", "to", ref("seq"), {"dtype": "float64"}),
    ),
    _nodes(
        "requires-grad-method-on-a-module",
        "self.hidden.requires_grad_(False): nn.Module's method reached by a Tensor method name",
        get("hid", "hidden"),
        method("freeze", "requires_grad_", ref("hid"), False),
    ),
    _nodes(
        "half-method-on-parameterdict",
        "self.scales.half(): every parameter of the container replaced by a float16 copy",
        get("scales", "scales"),
        method("rewrite", "half", ref("scales")),
    ),
    _nodes(
        "getitem-child-then-double",
        "operator.getitem(self.seq, 0).double(): a child reached through its container",
        get("seq", "seq"),
        call("first", "operator.getitem", ref("seq"), 0),
        method("rewrite", "double", ref("first")),
    ),
    _nodes(
        "module-through-identity-then-double",
        "self.ident(self.hidden) returns the module itself, then .double() rewrites it",
        get("hid", "hidden"),
        call("same", "ident", ref("hid"), op="call_module"),
        method("rewrite", "double", ref("same")),
    ),
    _nodes(
        "module-inside-a-list-argument",
        "torch.stack([x, self.hidden]): a module nested in an argument",
        get("hid", "hidden"),
        call("stacked", "torch.stack", [ref("x"), ref("hid")]),
    ),
    _nodes(
        "setitem-list-attribute",
        "operator.setitem(self.names, 0, 'evil'): a mutable attribute written by the graph",
        get("names", "names"),
        call("write", "operator.setitem", ref("names"), 0, "evil"),
    ),
    _nodes(
        "setitem-method-dict-attribute",
        "self.table.__setitem__('k', 2): a dict attribute written by the graph",
        get("table", "table"),
        method("write", "__setitem__", ref("table"), "k", 2),
    ),
]


def _cond_operand_module():
    """an exported cond program whose operands tuple carries a module (not as a branch)"""

    class Branchy(nn.Module):
        def forward(self, x):
            import fxloom

            return fxloom.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))

    data = exported(Branchy(), (torch.randn(4, 3),))

    def edit(program):
        for node in program["graph_module"]["graph"]["nodes"]:
            if node["op"] == "call_function" and node["target"].endswith("cond_op"):
                node["args"][3] = [ref("x"), ref("true_graph_0")]

    return edited(edit, data)


CASES.append(Case("cond-operand-is-a-module", _cond_operand_module.__doc__, _cond_operand_module))
CASES[-1].kind = "exported"
family("family9", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_a_graph_that_writes_to_its_module_tree_is_refused(attack, verdicts):
    """Refused by fxloom.load (SerializationError), nothing recorded, no crash."""
    assert_refused(verdicts, attack)
