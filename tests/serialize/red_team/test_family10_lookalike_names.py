"""Family 10 (issue 32): look-alike names that compile to one Python name.

``str.isidentifier()`` accepts ``ｓｅｌｆ`` (fullwidth), ``𝐭𝐨𝐫𝐜𝐡`` (mathematical bold), ``ſ``
(long s) and ``K`` (the Kelvin sign), and two such strings compare unequal; but Python folds
identifiers to NFKC when it compiles the generated ``forward``, so a node named ``ｓｅｌｆ``
rebinds ``self``, ``𝐭𝐨𝐫𝐜𝐡`` rebinds ``torch``, ``x`` and ``ｘ`` are one variable,
``self.ſcale`` reads ``self.scale`` and ``max(ｋｅｙ=f)`` is ``max(key=f)``. Names in files are
plain ASCII: every file (and graph text) here must be refused, nothing recorded.
"""

import pytest
import torch
from red_team_files import (
    COMMAND,
    Small,
    call,
    edited,
    exported,
    graph_of,
    insert_before_output,
    module_at,
    node,
    nodes_of,
    record,
    ref,
    saved,
    with_tensors,
)
from red_team_harness import Case, assert_refused, family

FULLWIDTH_SELF = "ｓｅｌｆ"
BOLD_TORCH = "𝐭𝐨𝐫𝐜𝐡"
FULLWIDTH_X = "ｘ"


def _edit(id: str, doc: str, edit, data=None, kind: str = "graph_module") -> Case:
    def build():
        return edited(edit, data() if data else saved())

    return Case(id, doc, build, kind)


def _rename_node(old: str, new: str):
    def edit(program):
        for n in nodes_of(program):
            if n["name"] == old:
                n["name"] = new
            for key in ("args", "kwargs"):
                _replace_refs(n.get(key), old, new)

    return edit


def _replace_refs(value, old, new):
    if isinstance(value, dict):
        if value == {"node": old}:
            value["node"] = new
        for item in value.values():
            _replace_refs(item, old, new)
    elif isinstance(value, list):
        for item in value:
            _replace_refs(item, old, new)


def _self_rebound(program):
    # ｓｅｌｆ = torch.relu(x) ... then self.lin(...) would call a method of the new "self".
    nodes = nodes_of(program)
    nodes.insert(1, call(FULLWIDTH_SELF, "operator.add", ref("x"), 0))


def _torch_rebound(program):
    nodes = nodes_of(program)
    nodes.insert(1, call(BOLD_TORCH, "operator.add", ref("x"), 0))


def _two_names_one_variable(program):
    # ｘ = x + 100 rebinds x: every later use of %x reads the new value
    nodes = nodes_of(program)
    nodes.insert(1, call(FULLWIDTH_X, "operator.add", ref("x"), 100))


def _long_s_buffer(program):
    # A tensor attribute "ſcale" shown next to the buffer "scale"; get_attr of "ſcale" would
    # read self.scale (NFKC folds ſ to s).
    program["module"]["tensors"] = {"ſcale": record("evil", torch.full((2,), 100.0))}
    node(program, "scale")["target"] = "ſcale"


def _fullwidth_keyword(program):
    insert_before_output(
        program,
        call("run", "max", [COMMAND], **{"ｋｅｙ": {"function": "builtins.len"}}),
    )


def _placeholder_target(program):
    node(program, "x")["target"] = FULLWIDTH_SELF


def _child_name(program):
    root = program["module"]
    root["children"]["ｌｉｎ"] = root["children"].pop("lin")
    node(program, "lin")["target"] = "ｌｉｎ"


def _kelvin_buffer(program):
    root = program["module"]
    root["buffers"]["\u212a"] = root["buffers"].pop("scale")
    node(program, "scale")["target"] = "\u212a"


def _attribute_name(program):
    module_at(program, "lin")["attributes"]["ｉｎ_features"] = 3


def _class_name(program):
    program["module"]["class_name"] = "𝐆raphModule"


def _method_name(program):
    insert_before_output(program, call("d", "ｄｏｕｂｌｅ", ref("x"), op="call_method"))


def _exported_orig_args(program):
    codegen = graph_of(program)["codegen"]
    codegen["orig_args"] = [FULLWIDTH_SELF]


def _exported_data():
    return exported(Small(), (torch.randn(4, 3),))


def _tensors_file():
    return with_tensors(saved(), {"evil": torch.full((2,), 100.0)})


CASES = [
    _edit("node-named-fullwidth-self", "a node named ｓｅｌｆ rebinds self", _self_rebound),
    _edit("node-named-bold-torch", "a node named 𝐭𝐨𝐫𝐜𝐡 rebinds torch", _torch_rebound),
    _edit(
        "two-names-one-variable",
        "nodes x and ｘ are one variable: ｘ = x + 100 changes every later x",
        _two_names_one_variable,
    ),
    _edit(
        "long-s-get-attr-reads-another-buffer",
        "get_attr ſcale is self.scale once compiled, not the tensor shown as ſcale",
        _long_s_buffer,
        _tensors_file,
    ),
    _edit(
        "fullwidth-keyword-is-key",
        "max(ｋｅｙ=len) is max(key=len) once compiled",
        _fullwidth_keyword,
    ),
    _edit("placeholder-target-fullwidth", "a parameter named ｓｅｌｆ", _placeholder_target),
    _edit("child-module-name-fullwidth", "a child named ｌｉｎ called as self.lin", _child_name),
    _edit("buffer-name-kelvin-sign", "a buffer named K (Kelvin sign), read as K", _kelvin_buffer),
    _edit(
        "attribute-name-fullwidth",
        "an attribute ｉｎ_features next to in_features",
        _attribute_name,
    ),
    _edit("class-name-bold", "the GraphModule's class named 𝐆raphModule", _class_name),
    _edit("call-method-fullwidth", "call_method ｄｏｕｂｌｅ", _method_name),
    _edit(
        "exported-parameter-name-fullwidth",
        "an exported program's forward parameter named ｓｅｌｆ",
        _exported_orig_args,
        _exported_data,
        "exported",
    ),
]

_TEXT_HEAD = "graph():\n    %x : [num_users=1] = placeholder[target=x]\n"
TEXTS = {
    "text-node-named-fullwidth-self": (
        "graph text: a node named ｓｅｌｆ",
        "    %ｓｅｌｆ : [num_users=1] = call_function[target=operator.add]"
        "(args = (%x, 1), kwargs = {})\n    return ｓｅｌｆ",
    ),
    "text-get-attr-long-s": (
        "graph text: get_attr of ſcale",
        "    %w : [num_users=1] = get_attr[target=ſcale]\n    return w",
    ),
    "text-keyword-fullwidth-key": (
        "graph text: max(ｋｅｙ=len)",
        "    %m : [num_users=1] = call_function[target=max]"
        "(args = ([1, 2],), kwargs = {'ｋｅｙ': len})\n    return m",
    ),
    "text-placeholder-fullwidth": (
        "graph text: a placeholder target ｘ",
        "    %y : [num_users=1] = placeholder[target=ｘ]\n    return y",
    ),
}
for id, (doc, body) in TEXTS.items():
    CASES.append(Case(id, doc, lambda body=body: _TEXT_HEAD + body, "text", [{"randn": [4, 3]}]))
family("family10", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_a_look_alike_name_is_refused(attack, verdicts):
    """Refused (SerializationError, GraphParseError for text), nothing recorded, no crash."""
    assert_refused(verdicts, attack)
