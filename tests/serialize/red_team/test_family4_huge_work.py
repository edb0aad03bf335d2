"""Family 4 of issue 21: small files that cost huge work (memory, CPU, time) to load.

Each file is small on disk but asks the loader (or ``parse_graph``) for gigabytes or minutes:
a compressed weights member, millions of tiny JSON objects, symbolic expressions that sympy
cannot finish, a safetensors header of a million tensors, graph text that backtracks or
nests deeply. Each must be refused with SerializationError (GraphParseError for text) within
10 s and 1 GiB; RecursionError and MemoryError must not escape.
"""

import functools
import io
import json
import struct
import zipfile

import pytest
import torch
from red_team_files import PROGRAM, WEIGHTS, Small, edited, exported, read, rewrite, saved
from red_team_harness import Case, assert_refused, case, family

# ------------------------------------------------------------------ members


@case("zip-bomb-weights-member")
def zip_bomb():
    """weights member of 1.2 GiB of zeros, compressed to about 1 MB"""
    size = 1200 * 2**20
    header = json.dumps({"bomb": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}})
    header = header.encode() + b" " * (-len(header) % 8)
    data = saved()
    info = zipfile.ZipInfo(WEIGHTS)
    info.compress_type = zipfile.ZIP_DEFLATED
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            if item.filename != WEIGHTS:
                dst.writestr(item, src.read(item))
        with dst.open(info, "w", force_zip64=True) as member:
            member.write(struct.pack("<Q", len(header)) + header)
            chunk = bytes(2**24)
            for _ in range(size // len(chunk)):
                member.write(chunk)
    return out.getvalue()


def _junk_attribute(id, doc, item, count):
    def build():
        text = "[" + ",".join([item] * count) + "]"

        data = saved()
        program = read(data)
        program["module"]["attributes"]["junk"] = "__JUNK__"
        document = json.dumps(program).replace('"__JUNK__"', text)
        return rewrite(data, {PROGRAM: document.encode()})

    return Case(id, doc, build)


@case("million-empty-tensors-in-safetensors-header")
def million_tensors():
    """a safetensors header listing a million empty tensors"""
    entries = ",".join(
        f'"e{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(10**6)
    )
    header = ("{" + entries + "}").encode()
    header += b" " * (-len(header) % 8)
    return rewrite(saved(), {WEIGHTS: struct.pack("<Q", len(header)) + header})


# ------------------------------------------------------------- shape envs
@functools.cache
def _dynamic() -> bytes:
    from fxloom.export import Dim

    return exported(Small(), (torch.randn(4, 3),), dynamic_shapes={"x": {0: Dim("batch")}})


def _symbol():
    return {"symbol": "s0"}


def _add(*args):
    return {"op": "Add", "args": list(args)}


def _shape_env(id, doc, field, expressions):
    def build():
        def edit(program):
            env = program["shape_env"]
            if field == "replacements":
                env["replacements"] = [["s0", e] for e in expressions()]
            elif field == "guards":
                env["guards"] = [{"expr": e, "location": None, "code": "x"} for e in expressions()]
            else:
                env[field] = expressions()

        return edited(edit, _dynamic())

    return Case(id, doc, build, kind="exported")


def _nested_powers(depth=40):
    e = _symbol()
    for i in range(depth):
        e = {"op": "Pow", "args": [_add(e, i + 1), 63]}
    return e


def _eq(e):
    return {"op": "StrictGreaterThan", "args": [e, 0]}


def _max_of_sums(count=256):
    return {
        "op": "Max",
        "args": [
            _add(_symbol(), i) if i % 2 else _add(_symbol(), {"op": "Mul", "args": [i, _symbol()]})
            for i in range(count)
        ],
    }


# ------------------------------------------------------------- graph text
HEAD = "graph():\n    %x : [num_users=1] = placeholder[target=x]\n"


def _text(args: str) -> str:
    return (
        HEAD
        + f"    %y : [num_users=1] = call_function[target=torch.add](args = (%x, {args}), kwargs = {{}})\n"
        + "    return y"
    )


def _text_case(id, doc, make) -> Case:
    return Case(id, doc, make, kind="text")


CASES = [
    zip_bomb,
    _junk_attribute(
        "program-json-6-million-empty-lists",
        "program.json of six million [] (18 MB)",
        "[]",
        6_000_000,
    ),
    _junk_attribute(
        "program-json-2-million-slices",
        "two million slice objects as an attribute",
        '{"slice":[0,1,2]}',
        2_000_000,
    ),
    _junk_attribute(
        "program-json-3-million-dicts",
        "three million one-item dicts",
        '{"dict":[[1,2]]}',
        3_000_000,
    ),
    million_tensors,
    _shape_env(
        "shape-env-nested-powers-fact",
        "a fact of (((s0+1)**63+2)**63 ...) nested 40 deep",
        "facts",
        lambda: [_eq(_nested_powers())],
    ),
    _shape_env(
        "shape-env-nested-powers-replacement",
        "s0 replaced by nested powers 40 deep",
        "replacements",
        lambda: [_nested_powers()],
    ),
    _shape_env(
        "shape-env-nested-powers-guard",
        "a guard over nested powers 40 deep",
        "guards",
        lambda: [_eq(_nested_powers())],
    ),
    _shape_env(
        "shape-env-max-of-256-sums",
        "one Max of 256 sums of s0",
        "facts",
        lambda: [_eq(_max_of_sums())],
    ),
    _shape_env(
        "shape-env-max-of-256-sums-200-times",
        "200 facts, each a Max of 256 sums",
        "facts",
        lambda: [_eq(_max_of_sums()) for _ in range(200)],
    ),
    _shape_env(
        "shape-env-many-expressions-under-budget",
        "5000 guards each just under the node budget",
        "guards",
        lambda: [
            _eq({"op": "Add", "args": [_add(_symbol(), i) for i in range(250)]})
            for _ in range(5000)
        ],
    ),
    _text_case(
        "text-200k-digit-number",
        "one line with a 200,000-digit number then junk",
        lambda: _text("1" * 200_000 + "e"),
    ),
    _text_case(
        "text-unterminated-escaped-string",
        "an unterminated string of 100,000 escapes",
        lambda: _text("'" + "\\'" * 100_000),
    ),
    _text_case(
        "text-long-dotted-name",
        "a dotted name of 100,000 parts ending in junk",
        lambda: _text("a." * 100_000 + "!"),
    ),
    # (One line of 300,000 arguments is not here: it costs work linear in its size, and
    # test_limits.py shows a megabyte of arguments parses; the call then raises TypeError.)
    _text_case(
        "text-number-backtracking",
        "100,000 '1.' pairs (number pattern backtracking)",
        lambda: _text("1." * 100_000 + "e+"),
    ),
    _text_case(
        "text-deep-parentheses",
        "100,000 nested parentheses (RecursionError must not escape)",
        lambda: _text("(" * 100_000 + ")" * 100_000),
    ),
    _text_case(
        "text-deep-lists", "50,000 nested lists", lambda: _text("[" * 50_000 + "]" * 50_000)
    ),
    _text_case(
        "text-deep-dicts",
        "20,000 nested dicts",
        lambda: _text("{'a': " * 20_000 + "1" + "}" * 20_000),
    ),
    _text_case(
        "text-nesting-70-accepted-but-files-refuse",
        "nesting 70 deep: files refuse more than 64, parse_graph must too",
        lambda: _text("[" * 70 + "1" + "]" * 70),
    ),
    _text_case(
        "text-nesting-500",
        "nesting 500 deep (below Python's recursion limit)",
        lambda: _text("[" * 500 + "1" + "]" * 500),
    ),
]
family("family4", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_huge_work_is_refused_quickly(attack, verdicts):
    """Refused (SerializationError / GraphParseError) within 10 s and 1 GiB, no crash."""
    assert_refused(verdicts, attack)
