"""Family 11 (issue 32): classes as call targets.

Calling a class runs its code: ``collections.defaultdict`` keeps a factory that runs at every
missing key, a library's class may do anything in ``__new__``/``__init__``. Registering a
class with a pytree says how to take a container apart and rebuild it, not that a graph may
call it. A graph from a file may call only the classes fxloom lists (``torch.Size``,
``torch.device``, dtype info, result types, transformers' ``ModelOutput`` dataclasses); each
file here calls another class, or passes one as a function value, and must be refused.
"""

import pytest
from red_team_files import call, graph_with, ref
from red_team_harness import Case, assert_refused, family


def _calls(id: str, target: str, *args, doc: str, **kwargs) -> Case:
    return Case(id, doc, lambda: graph_with(call("made", target, *args, **kwargs)))


CASES = [
    _calls(
        "defaultdict-with-a-factory",
        "collections.defaultdict",
        {"function": "torch.randn"},
        doc="collections.defaultdict(torch.randn): the factory runs at a missing key",
    ),
    _calls(
        "defaultdict-then-missing-key",
        "collections.defaultdict",
        {"function": "builtins.list"},
        doc="collections.defaultdict registered with torch's pytree, called from a graph",
    ),
    _calls("ordered-dict", "collections.OrderedDict", doc="collections.OrderedDict called"),
    _calls("deque", "collections.deque", [ref("x")], doc="collections.deque called"),
    _calls(
        "torch-constant-function",
        "torch._higher_order_ops.flat_apply._ConstantFunction",
        1,
        doc="torch's _ConstantFunction, a pytree-registered callable class",
    ),
    _calls(
        "torch-schema-holder",
        "torch._higher_order_ops.auto_functionalize.SchemaHolder",
        "aten::add",
        doc="torch's SchemaHolder, registered with torch's pytree, parses a schema string",
    ),
    _calls(
        "immutable-list-of-torch-fx",
        "torch.fx.immutable_collections.immutable_list",
        [1],
        doc="torch.fx's immutable_list, a registered container class",
    ),
    _calls(
        "namedtuple-subclass-of-the-standard-library",
        "tokenize.TokenInfo",
        1,
        "x",
        [0, 0],
        [0, 0],
        "line",
        doc="a standard-library named tuple subclass with methods of its own",
    ),
    _calls("builtins-type", "builtins.type", ref("x"), doc="type(x): a class, not on the list"),
    _calls("torch-generator", "torch.Generator", doc="torch.Generator: a torch class not listed"),
    _calls(
        "class-as-function-value",
        "max",
        [1, 2],
        doc="a container class passed as a function value (max's key)",
        key={"function": "collections.defaultdict"},
    ),
    _calls(
        "class-as-argument-of-a-listed-function",
        "isinstance",
        ref("x"),
        {"function": "collections.OrderedDict"},
        doc="a container class given as a function value to an allowed builtin",
    ),
]
family("family11", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_a_class_that_is_not_listed_is_not_called(attack, verdicts):
    """Refused (SerializationError), nothing recorded, no crash."""
    assert_refused(verdicts, attack)
