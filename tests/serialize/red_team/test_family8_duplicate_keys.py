"""Family 8 (issue 32, item 6): a JSON key given twice, so that what one reads is not what runs.

``json.loads`` keeps the last value of a key given twice in one object; a reviewer reading the
file (or another JSON reader) sees the first. A node whose ``"target"`` is ``torch.relu`` and
then ``torch.neg`` would load as ``torch.neg``. Each file here gives one key twice, at the top
of a document or nested in it, in every JSON document a file holds: a node record, its
arguments and meta, a module record, a tensor record, ``program.json``'s top level, an exported
program's signature, ``format.json``, and the weights' safetensors header. Each must be refused
while loading, and the message must name the key.
"""

import io
import struct
import zipfile

import pytest
import torch
from red_team_files import FORMAT, PROGRAM, WEIGHTS, Small, exported, rewrite, saved
from red_team_harness import Case, assert_refused, family

from fxloom.serialize.archive import FORMAT_VERSION


def _member_text(data: bytes, member: str) -> str:
    return zipfile.ZipFile(io.BytesIO(data)).read(member).decode()


def _given_twice(member: str, original: str, doubled: str, data=None):
    """A builder: ``member``'s text with its one ``original`` replaced by ``doubled``."""

    def build() -> bytes:
        source = data() if data is not None else saved()
        text = _member_text(source, member)
        assert text.count(original) == 1, f"{original!r} is not in {member} once"
        return rewrite(source, {member: text.replace(original, doubled).encode()})

    return build


def _weights_header_given_twice(original: str, doubled: str):
    """A builder: the weights' safetensors header with ``original`` replaced by ``doubled``."""

    def build() -> bytes:
        source = saved()
        blob = zipfile.ZipFile(io.BytesIO(source)).read(WEIGHTS)
        length = int.from_bytes(blob[:8], "little")
        header = blob[8 : 8 + length].decode().rstrip()
        assert header.count(original) == 1, f"{original!r} is not in the header once"
        header = header.replace(original, doubled)
        header += " " * (-len(header) % 8)  # safetensors pads its header to 8 bytes
        weights = struct.pack("<Q", len(header)) + header.encode() + blob[8 + length :]
        return rewrite(source, {WEIGHTS: weights})

    return build


def _exported() -> bytes:
    return exported(Small(), (torch.randn(4, 3),))


# id -> (doc, the key given twice, builder, kind)
ATTACKS = {
    "node-target": (
        "a node's target given twice: torch.relu, then torch.neg (the issue's file)",
        "target",
        _given_twice(
            PROGRAM, '"target":"torch.relu"', '"target":"torch.relu","target":"torch.neg"'
        ),
    ),
    "node-op": (
        "a node's opcode given twice: call_function, then call_method",
        "op",
        _given_twice(
            PROGRAM,
            '"name":"relu","op":"call_function"',
            '"name":"relu","op":"call_function","op":"call_method"',
        ),
    ),
    "node-args": (
        "a node's arguments given twice, the second adding relu to itself",
        "args",
        _given_twice(
            PROGRAM,
            '"args":[{"node":"relu"},{"node":"scale"}]',
            '"args":[{"node":"relu"},{"node":"scale"}],"args":[{"node":"relu"},{"node":"relu"}]',
        ),
    ),
    "keyword-nested": (
        "a keyword given twice inside a node's kwargs: dim=1, then dim=0",
        "dim",
        _given_twice(PROGRAM, '"kwargs":{"dim":1,', '"kwargs":{"dim":1,"dim":0,'),
    ),
    "meta-nested": (
        "a key given twice deep in a node's meta",
        "nn_module_stack",
        _given_twice(
            PROGRAM,
            '"target":"torch.relu","args":[{"node":"lin"}],"meta":{"nn_module_stack":1,',
            '"target":"torch.relu","args":[{"node":"lin"}],"meta":{"nn_module_stack":1,'
            '"nn_module_stack":0,',
        ),
    ),
    "module-class": (
        "a module record's class given twice: Identity, then Linear",
        "class",
        _given_twice(
            PROGRAM,
            '"lin":{"class":"torch.nn.modules.linear.Linear"',
            '"lin":{"class":"torch.nn.modules.linear.Identity",'
            '"class":"torch.nn.modules.linear.Linear"',
        ),
    ),
    "module-children": (
        "the root module record's children given twice: none, then lin",
        "children",
        _given_twice(PROGRAM, '{"module":{"class"', '{"module":{"children":{},"class"'),
    ),
    "tensor-record-key": (
        "a tensor record's key given twice: the bias's tensor, then the weight's",
        "key",
        _given_twice(PROGRAM, '"key":"t1"', '"key":"t2","key":"t1"'),
    ),
    "tensor-record-shape": (
        "a tensor record's shape given twice",
        "shape",
        _given_twice(PROGRAM, '"key":"t1","shape":[2,3]', '"key":"t1","shape":[3,2],"shape":[2,3]'),
    ),
    "program-top-level": (
        "program.json's module given twice at its top level: an empty one, then the real one",
        "module",
        _given_twice(PROGRAM, '{"module":', '{"module":{},"module":'),
    ),
    "format-kind": (
        "format.json's kind given twice: exported_program, then graph_module",
        "kind",
        _given_twice(
            FORMAT, '"kind": "graph_module"', '"kind": "exported_program", "kind": "graph_module"'
        ),
    ),
    "format-version": (
        "format.json's version given twice",
        "version",
        _given_twice(
            FORMAT,
            f'"version": {FORMAT_VERSION}',
            f'"version": 1, "version": {FORMAT_VERSION}',
        ),
    ),
    "weights-tensor": (
        "the weights' header names a tensor twice, first with another's bytes",
        "t2",
        _weights_header_given_twice(
            '"t2":{', '"t2":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t2":{'
        ),
    ),
    "weights-entry-nested": (
        "a weights' header entry gives its dtype twice: F64, then F32",
        "dtype",
        _weights_header_given_twice('"t0":{"dtype":"F32"', '"t0":{"dtype":"F64","dtype":"F32"'),
    ),
}
EXPORTED_ATTACKS = {
    "exported-signature-target": (
        "an exported signature's buffer target given twice: lin.bias, then scale",
        "target",
        _given_twice(
            PROGRAM, '"target":"scale"', '"target":"lin.bias","target":"scale"', _exported
        ),
    ),
    "exported-node-target": (
        "an exported node's ATen target given twice: aten.t, then aten.neg",
        "target",
        _given_twice(
            PROGRAM,
            '"target":"torch.ops.aten.t.default"',
            '"target":"torch.ops.aten.t.default","target":"torch.ops.aten.neg.default"',
            _exported,
        ),
    ),
}

CASES = [Case(id, doc, build) for id, (doc, _, build) in ATTACKS.items()] + [
    Case(id, doc, build, kind="exported") for id, (doc, _, build) in EXPORTED_ATTACKS.items()
]
KEYS = {id: key for id, (_, key, _) in {**ATTACKS, **EXPORTED_ATTACKS}.items()}
family("family8", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_a_key_given_twice_is_refused(attack, verdicts):
    """Refused (SerializationError) while loading, the message naming the key given twice."""
    assert_refused(verdicts, attack)
    assert f"gives the key {KEYS[attack.id]!r} twice" in verdicts[attack.id]["message"]
