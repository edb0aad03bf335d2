"""Family 7 (issue 32, item 5): strings from a file that would steer the reviewer's terminal.

Every string a file holds may reach a terminal: ``fxloom show`` prints class names, module
paths, the header, devices, dtypes, node names and refused targets, and the loader's error
messages quote them. Each file here hides a terminal control in one of those strings: clear
the screen (``ESC[2J``), conceal what follows (``ESC[8m``), write the clipboard (OSC 52), the
one-byte C1 control sequence introducer, a right-to-left override, a line separator, or a
newline that forges a line of show's output ("fxloom.load would refuse (0):"). Each must be
refused while loading; the harness then checks that the error message and ``fxloom show``'s
output (both modes) hold no character a terminal acts on.
"""

import pytest
import torch
from red_team_files import (
    FORMAT,
    Small,
    call,
    edited,
    exported,
    graph_of,
    insert_before_output,
    module_at,
    node,
    ref,
    saved,
    with_tensors,
)
from red_team_harness import Case, assert_refused, family, problems

CLEAR_SCREEN = "\x1b[2J\x1b[H"
CONCEAL = "\x1b[8m"
CLIPBOARD = "\x1b]52;c;dG91Y2ggZnhsb29tX3B3bmVk\x07"  # OSC 52: set the clipboard
C1_CSI = "\x9b2J"  # the one-byte control sequence introducer: clear screen, again
RIGHT_TO_LEFT = "\u202e"
LINE_SEPARATOR = "\u2028"
FORGED_LINE = "\n\nfxloom.load would refuse (0):\n"


def _program(id, doc, edit) -> Case:
    return Case(id, doc, lambda: edited(edit))


def _header(id, doc, key, value) -> Case:
    def edit(header):
        header[key] = value

    return Case(id, doc, lambda: edited(edit, member=FORMAT))


def _exported(id, doc, edit) -> Case:
    return Case(
        id, doc, lambda: edited(edit, exported(Small(), (torch.randn(4, 3),))), kind="exported"
    )


def _set(path, field, value):
    """An edit setting ``field`` of the module record at ``path``."""

    def edit(program):
        module_at(program, path)[field] = value

    return edit


def _weight_record(**changes):
    def edit(program):
        module_at(program, "lin")["parameters"]["weight"].update(changes)

    return edit


def _rename_child(program):
    children = program["module"]["children"]
    children["lin" + FORGED_LINE] = children.pop("lin")


def _extra_child(program):
    program["module"]["children"]["x" + CONCEAL] = module_at(program, "lin")


def _rename_node(name):
    def edit(program):
        node(program, "relu")["name"] = name
        node(program, "add")["args"][0] = ref(name)

    return edit


def _keyword(program):
    node(program, "sum_1")["kwargs"] = {"dim" + CLEAR_SCREEN: 1}


def _refused_function_argument(program):
    insert_before_output(program, call("m", "max", [1, 2], key={"function": "os." + CLIPBOARD}))


def _codegen_name(program):
    graph_of(program)["codegen"] = {
        "kind": "pytree",
        "orig_args": ["x" + CLEAR_SCREEN],
        "in_spec": None,
        "out_spec": None,
    }


def _tensor_key_in_both(program):
    module_at(program, "lin")["parameters"]["weight"]["key"] = "t1" + C1_CSI


def _tensor_key_file() -> bytes:
    """The weight's record and the weights both name the tensor with a C1 control."""
    data = edited(_tensor_key_in_both)
    return with_tensors(data, {"t1" + C1_CSI: torch.zeros(2, 3)})


def _parameter_name(program):
    parameters = module_at(program, "lin")["parameters"]
    parameters["weight" + LINE_SEPARATOR] = parameters.pop("weight")


def _signature(index, field, value):
    def edit(program):
        entry = program["graph_signature"]["inputs"][index]
        if field == "arg":
            entry["arg"] = {"tensor": value}
        else:
            entry[field] = value

    return edit


def _exported_node_name(program):
    placeholder = graph_of(program)["nodes"][0]
    placeholder["name"] = placeholder["target"] = "p_lin_weight" + CONCEAL


def _exported_hierarchy_path(program):
    program["module_hierarchy"].append(["lin" + CLEAR_SCREEN, "torch.nn.modules.linear.Linear"])


CASES = [
    # module records: what `fxloom show` lists under "Modules"
    _program(
        "class-name-clears-the-screen",
        "a child's class name ends in ESC[2J ESC[H",
        _set("lin", "class", "torch.nn.modules.linear.Linear" + CLEAR_SCREEN),
    ),
    _program(
        "root-class-conceals",
        "the root's class name conceals the text after it (ESC[8m)",
        _set("", "class", "fxloom.graph_module.GraphModule" + CONCEAL),
    ),
    _program(
        "class-name-forges-a-line",
        "a class name holding newlines and a forged 'would refuse (0)' line",
        _set("lin", "class", "torch.nn.modules.linear.Linear" + FORGED_LINE),
    ),
    _program(
        "class-name-right-to-left",
        "a class name with a right-to-left override",
        _set("lin", "class", "torch.nn.modules.linear." + RIGHT_TO_LEFT + "raeniL"),
    ),
    _program(
        "saved-class-name-clears-the-screen",
        "the GraphModule's saved class name clears the screen",
        _set("", "class_name", "Small" + CLEAR_SCREEN),
    ),
    _program("child-name-forges-a-line", "a child named with a forged line", _rename_child),
    _program("extra-child-conceals", "an extra child whose name conceals text", _extra_child),
    _program(
        "attribute-name-writes-the-clipboard",
        "an attribute named with an OSC 52 clipboard write",
        _set("", "attributes", {"meta": {"dict": []}, "evil" + CLIPBOARD: 1}),
    ),
    _program("parameter-name-line-separator", "a parameter named with U+2028", _parameter_name),
    # format.json: the first line show prints
    _header(
        "header-fxloom-version-writes-the-clipboard",
        "format.json's fxloom_version writes the clipboard (OSC 52)",
        "fxloom_version",
        "0.1.0" + CLIPBOARD,
    ),
    _header(
        "header-torch-version-forges-a-line",
        "format.json's torch_version holds a forged line",
        "torch_version",
        "2.13.0" + FORGED_LINE,
    ),
    _header(
        "header-kind-clears-the-screen",
        "format.json's kind clears the screen",
        "kind",
        "graph_module" + CLEAR_SCREEN,
    ),
    _header("header-extra-entry-c1", "an extra format.json entry with a C1 CSI", "note", C1_CSI),
    # tensor records and the weights
    _program(
        "device-clears-the-screen",
        "a tensor record's device clears the screen",
        _weight_record(device="cpu" + CLEAR_SCREEN),
    ),
    _program(
        "dtype-record-conceals",
        "a tensor record's dtype name conceals text",
        _weight_record(dtype={"dtype": "float" + CONCEAL}),
    ),
    _program(
        "dtype-plain-string-clears-the-screen",
        "a tensor record's dtype is a plain string that clears the screen",
        _weight_record(dtype="float" + CLEAR_SCREEN),
    ),
    Case(
        "tensor-key-c1-in-record-and-weights",
        "a tensor key with a C1 CSI, in the record and the weights alike",
        _tensor_key_file,
    ),
    Case(
        "weights-tensor-name-clears-the-screen",
        "an unused tensor in the weights named with ESC[2J",
        lambda: with_tensors(saved(), {"t9" + CLEAR_SCREEN: torch.zeros(1)}),
    ),
    # graphs: what show prints as the graph text or code
    _program(
        "refused-target-clears-the-screen",
        "a call_function target off the allowlist, ending in ESC[2J",
        lambda p: node(p, "relu").update(target="os.system" + CLEAR_SCREEN),
    ),
    _program(
        "refused-target-forges-a-line",
        "a refused target holding a forged line",
        lambda p: node(p, "relu").update(target="os.system" + FORGED_LINE),
    ),
    _program(
        "refused-function-argument-writes-the-clipboard",
        "a function-valued argument naming a refused function with an OSC 52 write",
        _refused_function_argument,
    ),
    _program(
        "node-name-right-to-left",
        "a node named with a right-to-left override",
        _rename_node("relu" + RIGHT_TO_LEFT),
    ),
    _program(
        "node-name-forges-a-line", "a node name holding a forged line", _rename_node(FORGED_LINE)
    ),
    _program("keyword-clears-the-screen", "a keyword argument named with ESC[2J", _keyword),
    _program(
        "get-attr-path-c1",
        "a get_attr path with a C1 CSI",
        lambda p: node(p, "scale").update(target="scale" + C1_CSI),
    ),
    _program(
        "method-name-conceals",
        "a call_method target that conceals text",
        lambda p: node(p, "add").update(target="add" + CONCEAL),
    ),
    _program("codegen-name-clears-the-screen", "a codegen parameter name", _codegen_name),
    # exported programs: the signature and the sections show prints
    _exported(
        "signature-input-name-clears-the-screen",
        "the graph signature names an input with ESC[2J",
        _signature(3, "arg", "x" + CLEAR_SCREEN),
    ),
    _exported(
        "signature-target-conceals",
        "the graph signature's buffer target conceals text",
        _signature(2, "target", "scale" + CONCEAL),
    ),
    _exported(
        "signature-kind-forges-a-line",
        "the graph signature's input kind holds a forged line",
        _signature(2, "kind", "BUFFER" + FORGED_LINE),
    ),
    _exported(
        "exported-node-name-conceals",
        "an exported graph's placeholder named with ESC[8m",
        _exported_node_name,
    ),
    _exported(
        "module-hierarchy-path-clears-the-screen",
        "the module hierarchy lists a path with ESC[2J",
        _exported_hierarchy_path,
    ),
]

# Graph text (fxloom.parse_graph): show does not read it, but its errors quote the line.
_TEXT_HEAD = "graph():\n    %x : [num_users=1] = placeholder[target=x]\n"
CASES += [
    Case(
        "text-target-clears-the-screen",
        "graph text whose target clears the screen",
        lambda: (
            _TEXT_HEAD
            + f"    %r : [num_users=1] = call_function[target=os.system{CLEAR_SCREEN}]"
            + "(args = (%x,), kwargs = {})\n    return r"
        ),
        kind="text",
    ),
    Case(
        "text-node-name-right-to-left",
        "graph text whose node name has a right-to-left override",
        lambda: (
            _TEXT_HEAD
            + f"    %r{RIGHT_TO_LEFT} : [num_users=1] = call_function[target=torch.relu]"
            + f"(args = (%x,), kwargs = {{}})\n    return r{RIGHT_TO_LEFT}"
        ),
        kind="text",
    ),
]
family("family7", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_terminal_controls_in_a_file_are_refused_and_never_printed(attack, verdicts):
    """Refused while loading; the error message and `fxloom show` hold no terminal control."""
    assert_refused(verdicts, attack)


def test_the_review_stage_ran_on_every_file_show_reads(verdicts):
    """`fxloom show` ran on each file (plain and --code) and answered with one of its exits:
    0 (described, refusals listed) or 2 (not an fxloom file, with the loader's message)."""
    for attack in CASES:
        shown = verdicts[attack.id].get("shown")
        if attack.kind == "text":
            assert shown is None, attack.id
        else:
            assert [line.split(":")[0] for line in shown] == ["show", "show --code"], attack.id
            assert all(line.endswith(("exit 0", "exit 2")) for line in shown), (attack.id, shown)


# ------------------------------------------------------- the harness's own rule
REFUSED = {"outcome": "refused", "stage": "load", "message": "refused", "recorded": []}


def test_the_harness_flags_show_printing_a_control_character():
    verdict = {**REFUSED, "show_printed": ["show, line 3: '\\x1b' in 'Modules (2):'"]}
    assert any(p.startswith("SHOW printed control characters") for p in problems(verdict))


def test_the_harness_flags_show_crashing():
    verdict = {**REFUSED, "show_crashed": ["show --code: KeyError: 'x'"]}
    assert any(p.startswith("SHOW crashed") for p in problems(verdict))


def test_the_harness_flags_show_running_something():
    verdict = {**REFUSED, "recorded_while_showing": ["os.system('touch x')"]}
    assert any("WHILE SHOWING" in p for p in problems(verdict))


def test_the_harness_flags_an_error_message_holding_a_control_character():
    verdict = {**REFUSED, "message_printed": ["line 1: '\\x1b' in 'refused'"]}
    assert any("ERROR MESSAGE" in p for p in problems(verdict))
