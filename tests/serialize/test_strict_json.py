"""Every JSON document of a file is parsed strictly: a key given twice in one object is refused.

``json.loads`` keeps the last of two values for one key, a reviewer reads the first: a node
``{"target": "torch.relu", "target": "torch.neg"}`` would run ``torch.neg``. ``strict_json``
refuses it, naming the key and the object, in ``format.json``, ``program.json`` and the
weights' safetensors header; ``NaN`` and ``Infinity`` stay refused.
"""

import json

import pytest
import torch
from hostile import PROGRAM, WEIGHTS, member, rewrite, saved
from torch import nn

import fxloom
from fxloom.serialize import FORMAT_VERSION, SerializationError
from fxloom.serialize.strict_json import parse_json

FORMAT = "fxloom/format.json"


def test_a_document_without_repeated_keys_parses_as_json_loads_does():
    text = '{"a": [1, 2.5, {"b": null, "c": "x"}], "d": {}, "e": true}'
    assert parse_json(text.encode(), "doc") == json.loads(text)


def test_a_key_given_twice_at_the_top_is_refused_naming_the_key():
    with pytest.raises(SerializationError, match=r"doc gives the key 'a' twice in one object"):
        parse_json(b'{"a": 1, "b": 2, "a": 3}', "doc")


def test_a_key_given_twice_in_a_nested_object_names_the_object_by_its_name():
    text = b'{"nodes": [{"name": "relu", "target": "torch.relu", "target": "torch.neg"}]}'
    with pytest.raises(SerializationError) as caught:
        parse_json(text, "fxloom/program.json")
    assert str(caught.value).startswith(
        "fxloom/program.json gives the key 'target' twice in one object "
        "(the object whose \"name\" is 'relu')"
    )


def test_an_object_without_a_naming_key_is_named_by_its_keys():
    with pytest.raises(SerializationError, match=r"an object with the keys 'dim', 'keepdim'"):
        parse_json(b'{"kwargs": {"dim": 1, "keepdim": true, "dim": 0}}', "doc")


def test_the_same_value_given_twice_is_refused_too():
    with pytest.raises(SerializationError, match="twice"):
        parse_json(b'{"a": 1, "a": 1}', "doc")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_still_refused(constant):
    with pytest.raises(SerializationError, match=f"doc is not valid JSON: {constant} is not JSON"):
        parse_json(f'{{"a": {constant}}}'.encode(), "doc")


def test_a_key_given_twice_is_quoted_escaped():
    with pytest.raises(SerializationError) as caught:
        parse_json(b'{"\\u001b[2J": 1, "\\u001b[2J": 2}', "doc")
    assert "the key '\\x1b[2J' twice" in str(caught.value)
    assert "\x1b" not in str(caught.value)


# --------------------------------------------------------- in the file's members
class Small(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return torch.relu(self.lin(x))


def _doubled(data: bytes, name: str, original: bytes, doubled: bytes) -> bytes:
    text = member(data, name)
    assert text.count(original) == 1
    return rewrite(data, name, text.replace(original, doubled))


def test_loading_refuses_a_node_whose_target_is_given_twice():
    data = _doubled(
        saved(Small()),
        PROGRAM,
        b'"target":"torch.relu"',
        b'"target":"torch.relu","target":"torch.neg"',
    )
    with pytest.raises(SerializationError, match=r"program.json gives the key 'target' twice"):
        fxloom.load(data)


def test_loading_refuses_format_json_giving_a_key_twice():
    version = f'"version": {FORMAT_VERSION}'.encode()
    data = _doubled(saved(Small()), FORMAT, version, b'"version": 1, ' + version)
    with pytest.raises(SerializationError, match=r"format.json gives the key 'version' twice"):
        fxloom.load(data)


def test_loading_refuses_a_weights_header_naming_a_tensor_twice():
    data = saved(Small())
    blob = member(data, WEIGHTS)
    length = int.from_bytes(blob[:8], "little")
    header = blob[8 : 8 + length].rstrip()
    first = header[1 : header.index(b"}") + 1]  # '"t0":{...}', the first tensor's entry
    header = b"{" + first + b"," + header[1:]
    blob = len(header).to_bytes(8, "little") + header + blob[8 + length :]
    with pytest.raises(SerializationError, match=r"the weights' header gives the key 't0' twice"):
        fxloom.load(rewrite(data, WEIGHTS, blob))


def test_show_refuses_a_file_giving_a_key_twice(tmp_path, capsys):
    from fxloom import cli

    path = tmp_path / "twice.fxl"
    path.write_bytes(
        _doubled(
            saved(Small()),
            PROGRAM,
            b'"class":"torch.nn.modules.linear.Linear"',
            b'"class":"torch.nn.modules.linear.Identity","class":"torch.nn.modules.linear.Linear"',
        )
    )
    assert cli.main(["show", str(path)]) == cli.EXIT_USAGE
    assert "gives the key 'class' twice" in capsys.readouterr().err
