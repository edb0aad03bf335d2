"""Strings from a file never reach a terminal as they are: errors escape what they quote.

A file's names, keys, devices and dtype names may hold escape sequences (clear the screen,
conceal text, write the clipboard), C1 controls, bidi overrides or newlines that forge a line.
``fxloom._format.printable`` writes every such character as ``repr`` does; ``SerializationError``
(and so ``GraphParseError``) passes its own message through it, so no quoting site can forget.
"""

import io
import unicodedata

import pytest
import torch
from hostile import WEIGHTS, edited, member, record, rewrite, saved
from torch import nn

import fxloom
from fxloom._format import printable
from fxloom.serialize import SerializationError
from fxloom.serialize.errors import DisallowedNameError
from fxloom.serialize.graph_text import GraphParseError
from fxloom.serialize.refused_names import RefusedName
from fxloom.serialize.values import short

ESC = "\x1b[2J\x1b[H"  # clear the screen, cursor home
CONCEAL = "\x1b[8m"
C1_CSI = "\x9b"
RIGHT_TO_LEFT = "\u202e"
FORGED = "\nfxloom.load would refuse (0):"


def forbidden(text: str) -> set[str]:
    """Characters a terminal acts on, but the newlines and tabs fxloom writes itself."""
    return {
        c
        for c in text
        if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")
    }


# ------------------------------------------------------------------ printable
@pytest.mark.parametrize(
    "raw, shown",
    [
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
        ("del\x7f c1\x9b nel\x85", "del\\x7f c1\\x9b nel\\x85"),
        ("rlo\u202e lri\u2066 zwj\u200d", "rlo\\u202e lri\\u2066 zwj\\u200d"),
        ("ls\u2028 ps\u2029", "ls\\u2028 ps\\u2029"),
        ("lone\ud800", "lone\\ud800"),
        ("nbsp\xa0", "nbsp\\xa0"),
    ],
)
def test_printable_writes_each_character_a_terminal_acts_on_as_repr_does(raw, shown):
    assert printable(raw) == shown


def test_printable_leaves_printable_text_as_it_is():
    text = "layer.0.weight torch.relu 'quoted' back\\slash héllo — 名前"
    assert printable(text) == text


def test_printable_twice_is_printable_once():
    once = printable(ESC + RIGHT_TO_LEFT + FORGED)
    assert printable(once) == once and not forbidden(once)


# ------------------------------------------------------ the errors themselves
def test_a_serialization_error_escapes_its_message():
    error = SerializationError(f"module class 'Linear{ESC}' is not allowed{FORGED}")
    assert str(error) == (
        "module class 'Linear\\x1b[2J\\x1b[H' is not allowed\\nfxloom.load would refuse (0):"
    )
    assert error.args == (str(error),)


def test_a_serialization_error_keeps_the_lines_it_is_given_as_lines():
    error = SerializationError(f"line 3: bad{CONCEAL}", "    %x = ...")
    assert str(error).splitlines() == ["line 3: bad\\x1b[8m", "    %x = ..."]


def test_a_refused_name_is_escaped_in_the_message_and_kept_as_it_is_on_the_error():
    error = DisallowedNameError(f"os.system{ESC}")
    assert "'os.system\\x1b[2J\\x1b[H' is not on fxloom's allowlist" in str(error)
    assert error.name == f"os.system{ESC}"
    assert not forbidden(str(error))


def test_a_graph_parse_error_escapes_the_line_it_quotes():
    text = (
        "graph():\n    %x : [num_users=1] = placeholder[target=x]\n"
        f"    %r : [num_users=1] = call_function[target=os.system{ESC}](args = (%x,), kwargs = {{}})"
        "\n    return r"
    )
    with pytest.raises(GraphParseError) as caught:
        fxloom.parse_graph(text)
    lines = str(caught.value).splitlines()
    assert len(lines) == 2 and lines[0].startswith("line 3: ")
    assert "os.system\\x1b[2J\\x1b[H" in lines[1]
    assert not forbidden(str(caught.value))


def test_short_escapes_a_placeholder_whose_repr_is_the_files_name():
    assert short(RefusedName(f"os.{CONCEAL}system")) == "os.\\x1b[8msystem"
    assert short(f"a{C1_CSI}") == "'a\\x9b'"


# ------------------------------------------------ what fxloom.load says of files
class Small(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x).relu().sum(dim=1)


def _node(program: dict, name: str) -> dict:
    return next(n for n in program["module"]["graph"]["nodes"] if n["name"] == name)


def _rename_relu(program: dict) -> None:
    _node(program, "relu")["name"] = "relu" + RIGHT_TO_LEFT
    _node(program, "sum_1")["args"][0] = {"node": "relu" + RIGHT_TO_LEFT}


def _codegen_name(program: dict) -> None:
    program["module"]["graph"]["codegen"] = {
        "kind": "pytree",
        "orig_args": ["x" + ESC],
        "in_spec": None,
        "out_spec": None,
    }


EDITS = {
    "class name": (
        lambda p: record(p, "lin").update({"class": "torch.nn.modules.linear.Linear" + ESC}),
        "Linear\\x1b[2J\\x1b[H",
    ),
    "child name": (
        lambda p: record(p)["children"].update({"lin" + FORGED: record(p, "lin")}),
        "lin\\nfxloom.load would refuse (0):",
    ),
    "node name": (_rename_relu, "relu\\u202e"),
    "keyword": (
        lambda p: _node(p, "sum_1").update(kwargs={"dim" + C1_CSI: 1}),
        "dim\\x9b",
    ),
    "call_function target": (
        lambda p: _node(p, "relu").update(op="call_function", target="os." + CONCEAL),
        "os.\\x1b[8m",
    ),
    "device": (
        lambda p: record(p, "lin")["parameters"]["weight"].update(device="cpu" + ESC),
        "cpu\\x1b[2J\\x1b[H",
    ),
    "dtype name": (
        lambda p: record(p, "lin")["parameters"]["weight"].update(dtype={"dtype": "f" + ESC}),
        "f\\x1b[2J\\x1b[H",
    ),
    "tensor key": (
        lambda p: record(p, "lin")["parameters"]["weight"].update(key="t" + RIGHT_TO_LEFT),
        "t\\u202e",
    ),
    "codegen name": (_codegen_name, "x\\x1b[2J\\x1b[H"),
}


@pytest.mark.parametrize("where", EDITS)
def test_loading_refuses_a_file_string_with_controls_and_quotes_it_escaped(where):
    edit, escaped = EDITS[where]
    with pytest.raises(SerializationError) as caught:
        fxloom.load(edited(saved(Small()), edit))
    message = str(caught.value)
    assert escaped in message and not forbidden(message), message


def test_a_tensor_named_with_controls_in_the_weights_is_refused_by_name_escaped():
    data = saved(Small())
    blob = member(data, WEIGHTS)
    length = int.from_bytes(blob[:8], "little")
    header = blob[8 : 8 + length].replace(b'"t0"', b'"t\\u001b[2J"')
    blob = len(header).to_bytes(8, "little") + header + blob[8 + length :]
    with pytest.raises(SerializationError, match=r"tensor 't\\x1b\[2J': its name holds a control"):
        fxloom.load(rewrite(data, WEIGHTS, blob))


def test_a_header_string_with_controls_is_refused():
    data = saved(Small())
    header = member(data, "fxloom/format.json").replace(b'"0.', b'"\\u001b]52;c;eA==\\u0007 0.')
    with pytest.raises(SerializationError) as caught:
        fxloom.load(rewrite(data, "fxloom/format.json", header))
    message = str(caught.value)
    assert "format.json's 'fxloom_version' entry holds a control or format character" in message
    assert "\\x1b]52;c;eA==\\x07" in message and not forbidden(message)


def test_a_dict_argument_key_prints_escaped_in_the_graph_text():
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(dict, ({"\x1b[2Jk": x},)))
    assert "\x1b" not in str(graph) and "\\x1b[2Jk" in str(graph)


def test_an_exported_programs_printed_strings_hold_no_controls():
    import json

    import fxloom.export

    buffer = io.BytesIO()
    fxloom.export.save(fxloom.export.export(nn.Linear(3, 2), (torch.randn(2, 3),)), buffer)
    program = json.loads(member(buffer.getvalue(), "fxloom/program.json"))
    program["module_hierarchy"] = [["", "torch.nn.modules.linear.Linear\x1b[8m"]]
    data = rewrite(buffer.getvalue(), "fxloom/program.json", json.dumps(program).encode())
    with pytest.raises(SerializationError, match="not a class name") as refused:
        fxloom.export.load(data)
    assert "\x1b" not in str(refused.value)


def test_the_cli_prints_an_unexpected_error_escaped():
    from fxloom.cli import _one_line

    assert _one_line(ValueError("bad \x1b]52;c;aGk=\x07 name")) == (
        "ValueError: bad \\x1b]52;c;aGk=\\x07 name"
    )
