"""The generative red team's mutations: a table of small edits of a valid ``program.json``.

Each row of ``MUTATIONS`` is one kind of edit an attacker makes to a file fxloom wrote, with
the attack it models; its function edits the document in place, drawing every choice from
hypothesis (``draw``), and returns what it did in words. Three families, as issue 32 names
them:

* **look-alike names** (``rename_*``): a name reaching generated code or a lookup replaced
  by a string Python folds (NFKC) to another name: one in the file, ``self``, ``torch``, a
  global of the generated code, a builtin, a keyword, or the name itself. The string is
  built from fullwidth and mathematical letters, ``ſ``, the Kelvin sign, ligatures,
  superscripts and modifier letters (``FOLDS``, every character NFKC maps to ASCII), or from
  combining marks (two names, one precomposed, one decomposed);
* **writes to the module tree** (``write_*``, ``call_class``): nodes inserted before the
  output that store into, delete from or retype what a ``get_attr`` reads (a module, a
  container, a plain attribute, a tensor), call classes, then read or call the written
  path again;
* **attributes within their types** (``perturb_attribute``): an int, bool, float, string or
  tuple of ints of a module record changed to another value of its type.

``Program`` wraps the document: its module records, graphs and the names in them.
"""

from __future__ import annotations

import builtins
import itertools
import keyword
import re
import unicodedata
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from fxloom.serialize.values import encode_value

Draw = Callable  # hypothesis's ``data.draw``


# ------------------------------------------------------------------ the document
class Program:
    """A ``program.json`` document and the places mutations reach in it."""

    def __init__(self, document: dict, exported: bool):
        self.document = document
        self.exported = exported
        self.root = document["graph_module" if exported else "module"]

    def records(self) -> list[tuple[str, dict]]:
        """(path, module record) for every module of the tree, root ("") first."""
        found, stack = [], [("", self.root)]
        while stack:
            path, record = stack.pop()
            found.append((path, record))
            children = record.get("children", {})
            stack.extend((join(path, name), child) for name, child in reversed(children.items()))
        return found

    def graphs(self) -> list[tuple[str, dict]]:
        return [(path, record["graph"]) for path, record in self.records() if "graph" in record]

    def names(self) -> list[str]:
        """Every name a look-alike may fold to: nodes, targets' parts, children, attributes,
        parameters and buffers, the exported program's state names."""
        found: set[str] = set()
        for path, record in self.records():
            found.update(path.split(".") if path else [])
            for field in ("attributes", "parameters", "buffers"):
                found.update(record.get(field, {}))
            found.update(record.get("state", {}).get("attributes", {}))
        for _, graph in self.graphs():
            for node in graph["nodes"]:
                found.add(node["name"])
                if node["op"] in ("get_attr", "call_module", "placeholder"):
                    found.update(str(node["target"]).split("."))
        for key in self.document.get("state_dict", {}):
            found.update(key.split("."))
        return sorted(n for n in found if n.isidentifier())

    def user_inputs(self, path: str, graph: dict) -> list[str]:
        """The placeholders of ``graph`` the caller's tensors reach (an exported program's
        root: the USER_INPUT ones, not its lifted parameters)."""
        placeholders = [n["name"] for n in graph["nodes"] if n["op"] == "placeholder"]
        if self.exported and path == "":
            signature = self.document["graph_signature"]["inputs"]
            users = [s["arg"].get("tensor") for s in signature if s["kind"] == "USER_INPUT"]
            return [name for name in placeholders if name in users]
        return placeholders


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def references(value, old: str, new: str) -> None:
    """Rename ``{"node": old}`` to ``new`` everywhere in ``value`` (a node's args, a signature)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("node", "tensor") and item == old:
                value[key] = new
            else:
                references(item, old, new)
    elif isinstance(value, list):
        for item in value:
            references(item, old, new)


def pick(draw: Draw, items, label: str):
    items = list(items)
    return draw(st.sampled_from(items), label=label)


# ------------------------------------------------------------------ look-alike names
def _folds() -> dict[str, list[str]]:
    """ASCII text -> the characters NFKC folds to it, in code-point order: fullwidth and
    mathematical letters and digits, ``ſ`` (s), the Kelvin sign (K), ligatures (``ﬁ``: fi),
    superscripts and modifier letters (``ⁱ``: i), ..."""
    table = defaultdict(list)
    for code in itertools.chain(range(0x80, 0x10000), range(0x1D400, 0x1D800)):
        char = chr(code)
        folded = unicodedata.normalize("NFKC", char)
        if folded != char and re.fullmatch(r"[A-Za-z0-9_]{1,3}", folded):
            table[folded].append(char)
    return dict(table)


FOLDS = _folds()
# What a look-alike folds to, beside the file's own names: the generated forward's first
# parameter and globals (the driver adds those it finds), builtins, keywords.
SPECIAL_TARGETS = {
    "self": ["self"],
    "torch": ["torch"],
    "global of the generated code": ["torch", "fxloom", "pytree", "inf", "nan", "device"],
    "builtin": sorted(n for n in dir(builtins) if n.isidentifier()),
    "keyword": sorted(keyword.kwlist + keyword.softkwlist),
}


def add_generated_globals(names) -> None:
    """The driver adds the globals it finds in the generated code of the corpus."""
    known = SPECIAL_TARGETS["global of the generated code"]
    known.extend(sorted(set(names) - set(known)))


def look_alike(target: str, draw: Draw) -> str:
    """A string other than ``target`` that is an identifier and NFKC-folds to ``target``:
    at least one character (or ligature's letters) replaced by a character that folds to it."""
    pieces, i = [], 0
    while i < len(target):
        choices = [
            (size, char)
            for size in (3, 2, 1)
            for char in FOLDS.get(target[i : i + size], [])
            if i + size <= len(target) and _fits(char, first=i == 0)
        ]
        if choices and draw(st.booleans(), label="replace"):
            size, char = draw(st.sampled_from(choices), label="look-alike character")
            pieces.append(char)
            i += size
        else:
            pieces.append(target[i])
            i += 1
    result = "".join(pieces)
    if result == target:  # nothing drawn to replace: replace the first character that can be
        for i, char in enumerate(target):
            options = [c for c in FOLDS.get(char, []) if _fits(c, first=i == 0)]
            if options:
                return target[:i] + draw(st.sampled_from(options)) + target[i + 1 :]
    return result


def _fits(char: str, first: bool) -> bool:
    return (char + "a").isidentifier() if first else ("a" + char).isidentifier()


def fold_target(program: Program, draw: Draw, own: str) -> tuple[str, str]:
    """(what kind of name, the name) a look-alike of ``own`` will fold to."""
    kinds = ["name in the file", "itself", *SPECIAL_TARGETS]
    kind = pick(draw, kinds, "fold target kind")
    if kind == "itself":
        return kind, own
    names = program.names() if kind == "name in the file" else SPECIAL_TARGETS[kind]
    return kind, pick(draw, names, "fold target")


def confusable(program: Program, draw: Draw, own: str) -> tuple[str, str]:
    """A look-alike name, and words saying what it folds to."""
    kind, target = fold_target(program, draw, own)
    new = look_alike(target, draw)
    return new, f"{new!r} (folds to {kind} {target!r})"


def rename_node(program: Program, draw: Draw) -> str | None:
    """Two names one variable, a node that rebinds ``self``/``torch``/a builtin: a node's
    name (and every reference to it, the exported signature's too) becomes a look-alike."""
    path, graph = pick(draw, program.graphs(), "graph")
    node = pick(draw, [n for n in graph["nodes"] if n["op"] != "output"], "node")
    new, said = confusable(program, draw, node["name"])
    old, node["name"] = node["name"], new
    references(graph["nodes"], old, new)
    if program.exported and path == "":
        references(program.document["graph_signature"], old, new)
    return f"node %{old} of graph {path or 'root'} renamed {said}"


def rename_placeholder_target(program: Program, draw: Draw) -> str | None:
    """A parameter of the generated ``forward`` named ``𝐬𝐞𝐥𝐟`` or like another parameter."""
    path, graph = pick(draw, program.graphs(), "graph")
    nodes = [n for n in graph["nodes"] if n["op"] == "placeholder"]
    node = pick(draw, nodes, "placeholder")
    new, said = confusable(program, draw, node["target"])
    old, node["target"] = node["target"], new
    return f"placeholder {old!r} of graph {path or 'root'} given the target {said}"


def rename_path_part(program: Program, draw: Draw) -> str | None:
    """``self.ſcale`` compiles to ``self.scale``: one part of a get_attr/call_module target
    becomes a look-alike (the file's module tree left as it was)."""
    path, graph = pick(draw, program.graphs(), "graph")
    nodes = [n for n in graph["nodes"] if n["op"] in ("get_attr", "call_module")]
    if not nodes:
        return None
    node = pick(draw, nodes, "node")
    parts = node["target"].split(".")
    index = draw(st.integers(0, len(parts) - 1), label="part")
    new, said = confusable(program, draw, parts[index])
    old, parts[index] = node["target"], new
    node["target"] = ".".join(parts)
    return f"target {old!r} of %{node['name']} ({node['op']}) part {index} renamed {said}"


def rename_child(program: Program, draw: Draw) -> str | None:
    """A module of the tree renamed to a look-alike, and every target through it too: the
    file is consistent, the compiled paths fold it onto another module or a global."""
    edges = [(path, name) for path, r in program.records() for name in r.get("children", {})]
    if not edges:
        return None
    parent, name = pick(draw, edges, "child")
    new, said = confusable(program, draw, name)
    records = dict(program.records())
    children = records[parent]["children"]
    records[parent]["children"] = {(new if k == name else k): v for k, v in children.items()}
    _rename_in_paths(program, join(parent, name), join(parent, new))
    return f"child module {join(parent, name)!r} renamed {said}"


def rename_tensor(program: Program, draw: Draw) -> str | None:
    """A parameter or buffer renamed to a look-alike (weight -> 𝐛𝐢𝐚𝐬), with the targets and
    the exported program's state names that reach it: which tensor does the code read?"""
    sites = [
        (path, field, name)
        for path, record in program.records()
        for field in ("parameters", "buffers")
        for name in record.get(field, {})
    ]
    sites += [("", "state_dict", key) for key in program.document.get("state_dict", {})]
    if not sites:
        return None
    path, field, name = pick(draw, sites, "tensor")
    last = name.rsplit(".", 1)[-1]
    new_last, said = confusable(program, draw, last)
    new = name[: len(name) - len(last)] + new_last
    if field == "state_dict":
        state = program.document["state_dict"]
        program.document["state_dict"] = {(new if k == name else k): v for k, v in state.items()}
    else:
        record = dict(program.records())[path]
        record[field] = {(new if k == name else k): v for k, v in record[field].items()}
    _rename_in_paths(program, join(path, name), join(path, new))
    return f"{field[:-1] if field != 'state_dict' else 'state'} {join(path, name)!r} renamed {said}"


def _rename_in_paths(program: Program, old: str, new: str) -> None:
    """Every graph target, signature target and ParameterDict key that is ``old`` or under it."""
    for path, graph in program.graphs():
        for node in graph["nodes"]:
            if node["op"] in ("get_attr", "call_module"):
                full = join(path, node["target"])
                if full == old or full.startswith(old + "."):
                    node["target"] = (new + full[len(old) :])[len(path) + 1 if path else 0 :]
    for spec in program.document.get("graph_signature", {}).get("inputs", []):
        target = spec.get("target")
        if isinstance(target, str) and (target == old or target.startswith(old + ".")):
            spec["target"] = new + target[len(old) :]
    parent, _, name = old.rpartition(".")
    record = dict(program.records()).get(parent, {})
    keys = record.get("attributes", {}).get("_keys")  # a ParameterDict's own list of names
    if isinstance(keys, dict) and "dict" in keys:
        for pair in keys["dict"]:
            if pair[0] == name:
                pair[0] = new.rpartition(".")[2]


def rename_keyword(program: Program, draw: Draw) -> str | None:
    """A keyword argument's name (``dim``, ``keepdim``) becomes a look-alike: of itself, of
    another keyword (``key=``, ``out=``), of a Python keyword."""
    sites = [
        (path, node)
        for path, graph in program.graphs()
        for node in graph["nodes"]
        if isinstance(node.get("kwargs"), dict) and node["kwargs"]
    ]
    if not sites:
        return None
    path, node = pick(draw, sites, "node with keywords")
    old = pick(draw, sorted(node["kwargs"]), "keyword")
    new, said = confusable(program, draw, old)
    node["kwargs"] = {(new if k == old else k): v for k, v in node["kwargs"].items()}
    return f"keyword {old!r} of %{node['name']} renamed {said}"


# Keywords a look-alike spells when added to a call: ``out=`` writes into its argument,
# ``key=`` makes ``max`` call what it is given, the others change what a call computes.
ADDED_KEYWORDS = ["out", "key", "dim", "dtype", "inplace", "alpha", "default", "input"]


def add_keyword(program: Program, draw: Draw) -> str | None:
    """``torch.relu(x, ｏｕｔ=self.weight)``: a keyword the file spells in look-alike letters
    (the loader compares strings; the compiled call passes ``out=``), given a node's value."""
    path, graph = pick(draw, program.graphs(), "graph")
    calls = [n for n in graph["nodes"] if n["op"] in ("call_function", "call_method")]
    if not calls:
        return None
    node = pick(draw, calls, "call")
    earlier = [n["name"] for n in graph["nodes"][: graph["nodes"].index(node)]]
    word = pick(draw, ADDED_KEYWORDS, "keyword")
    spelled = look_alike(word, draw)
    value = {"node": pick(draw, earlier, "value")} if earlier else 0
    node.setdefault("kwargs", {})[spelled] = value
    return f"keyword {spelled!r} (folds to {word!r}) = {value} added to %{node['name']}"


def rename_attribute(program: Program, draw: Draw) -> str | None:
    """A module's plain attribute (``in_features``, ``groups``) renamed to a look-alike:
    the module keeps the old name's value where the class reads another."""
    sites = [
        (path, holder, name)
        for path, record in program.records()
        for holder in (record.get("attributes"), record.get("state", {}).get("attributes"))
        if isinstance(holder, dict)
        for name in holder
    ]
    if not sites:
        return None
    path, holder, name = pick(draw, sites, "attribute")
    new, said = confusable(program, draw, name)
    holder[new] = holder.pop(name)
    return f"attribute {join(path, name)!r} renamed {said}"


def rename_class_name(program: Program, draw: Draw) -> str | None:
    """A GraphModule's class name (the generated class) becomes a look-alike."""
    records = [(p, r) for p, r in program.records() if "class_name" in r]
    path, record = pick(draw, records, "graph module")
    new, said = confusable(program, draw, record["class_name"])
    old, record["class_name"] = record["class_name"], new
    return f"class_name {old!r} of {path or 'root'} renamed {said}"


def rename_forward_parameter(program: Program, draw: Draw) -> str | None:
    """``def forward(self, 𝐬𝐞𝐥𝐟)``: a name of the forward's signature (a pytree codegen's
    ``orig_args``, an exported program's ``arg_names``) becomes a look-alike."""
    sites = [
        (names, i)
        for _, graph in program.graphs()
        if isinstance(names := graph.get("codegen", {}).get("orig_args"), list)
        for i in range(len(names))
    ]
    sites += [
        (program.document["arg_names"], i)
        for i in range(len(program.document.get("arg_names", [])))
    ]
    if not sites:
        return None
    names, i = pick(draw, sites, "parameter")
    old = names[i]["name"] if isinstance(names[i], dict) else names[i]
    new, said = confusable(program, draw, old)
    if isinstance(names[i], dict):
        names[i]["name"] = new
    else:
        names[i] = new
    return f"forward parameter {old!r} renamed {said}"


# Combining marks: the same letters precomposed (NFC) and decomposed (NFD) are two strings
# and one identifier once compiled.
ACCENTS = {
    "a": "\u0301",
    "e": "\u0301",
    "i": "\u0308",
    "o": "\u0302",
    "u": "\u0308",
    "n": "\u0303",
    "c": "\u0327",
}


def rename_combining(program: Program, draw: Draw) -> str | None:
    """Two nodes of one graph named with the same accented letters, one precomposed and one
    with a combining mark: two names in the file, one variable in the compiled forward."""
    path, graph = pick(draw, program.graphs(), "graph")
    nodes = [n for n in graph["nodes"] if n["op"] != "output"]
    if len(nodes) < 2:
        return None
    first = pick(draw, nodes, "first node")
    second = pick(draw, [n for n in nodes if n is not first], "second node")
    base = first["name"]
    at = next((i for i, c in enumerate(base) if c in ACCENTS), None)
    if at is None:
        base, at = "e" + base, 0
    decomposed = base[:at] + base[at] + ACCENTS[base[at]] + base[at + 1 :]
    composed = unicodedata.normalize("NFC", decomposed)
    for node, new in ((first, composed), (second, decomposed)):
        old, node["name"] = node["name"], new
        references(graph["nodes"], old, new)
        if program.exported and path == "":
            references(program.document["graph_signature"], old, new)
    return f"nodes %{base} and %{second['name']!r} named {composed!r} and {decomposed!r}"


# ------------------------------------------------------------------ writes to the tree
@dataclass
class Site:
    """Where nodes are inserted: a graph, its module's path, the names already taken."""

    program: Program
    path: str
    graph: dict
    taken: set

    def fresh(self, stem: str = "gen") -> str:
        for i in itertools.count():
            if f"{stem}_{i}" not in self.taken:
                self.taken.add(f"{stem}_{i}")
                return f"{stem}_{i}"
        raise AssertionError

    def insert(self, nodes: list[dict], returns: str | None = None) -> None:
        output = self.graph["nodes"].pop()
        self.graph["nodes"].extend(nodes)
        if returns is not None:
            output["args"] = [{"node": returns}]
        self.graph["nodes"].append(output)


def _site(program: Program, draw: Draw) -> Site:
    path, graph = pick(draw, program.graphs(), "graph")
    return Site(program, path, graph, {n["name"] for n in graph["nodes"]})


def _receivers(site: Site) -> dict[str, list[str]]:
    """What a get_attr in the site's graph can read, by kind (paths relative to its module)."""
    found = defaultdict(list)
    prefix = site.path + "." if site.path else ""
    for path, record in site.program.records():
        if path != site.path and not path.startswith(prefix):
            continue
        relative = path[len(prefix) :] if path != site.path else ""
        if relative:
            found["module"].append(relative)
            if ".container." in record.get("class", ""):
                found["container"].append(relative)
        for name in record.get("attributes", {}) | record.get("state", {}).get("attributes", {}):
            found["plain attribute"].append(join(relative, name))
        for field in ("parameters", "buffers"):
            found["tensor"].extend(join(relative, name) for name in record.get(field, {}))
    return {kind: sorted(set(paths)) for kind, paths in found.items() if paths}


def _children_of(site: Site, receiver: str) -> list[str]:
    full = join(site.path, receiver)
    record = dict(site.program.records()).get(full, {})
    return sorted(record.get("children", {})) + sorted(record.get("parameters", {}))


# Functions a write stores or a class is given (a defaultdict's factory): some the call table
# has (a file may name them), some it must refuse.
FUNCTIONS = [
    "builtins.print", "builtins.eval", "builtins.exec", "builtins.globals", "builtins.exit",
    "builtins.breakpoint", "builtins.input", "builtins.id", "os.system", "os.getcwd",
    "torch.relu", "torch.seed", "torch.manual_seed", "torch.nn.Module.train",
    "builtins.list", "builtins.dict", "torch.nn.Module", "torch.zeros", "builtins.getattr",
]  # fmt: skip
NAMES = ["forward", "weight", "bias", "training", "__class__", "_forward_hooks", "__call__", "x"]


def _operand(
    site: Site, draw: Draw, kind: str, receiver: str, receivers: dict, nodes: list
) -> object:
    """One argument of an inserted call (nodes it needs are appended to ``nodes``): ``T`` a
    tensor input,
    ``K`` a key, ``V`` a value to store, ``F`` a function, ``N`` an attribute name,
    ``M`` another module's node; anything else is itself."""
    if kind == "T":
        inputs = site.program.user_inputs(site.path, site.graph)
        return {"node": inputs[0]} if inputs else 0
    if kind == "K":
        keys = _children_of(site, receiver) + [0, -1, 1, "a", "forward", "missing"]
        return pick(draw, keys, "key")
    if kind == "F":
        return {"function": pick(draw, FUNCTIONS, "function")}
    if kind == "N":
        return pick(draw, NAMES + _children_of(site, receiver), "name")
    if kind in ("V", "M"):
        return _value(site, draw, receivers, nodes, only_modules=kind == "M")
    return kind


# Values stored by a write: another module or tensor of the tree (read by a new get_attr),
# a constant, or a function.
CONSTANTS = {"int": 0, "str": "x", "None": None}


def _value(site: Site, draw: Draw, receivers: dict, nodes: list, only_modules: bool) -> object:
    # mostly another module: a container's entry swapped for a module the file does not show
    kinds = ["module"] if only_modules else ["module"] * 3 + ["tensor", *CONSTANTS, "function"]
    kinds = [k for k in kinds if k in receivers or k not in ("module", "tensor")] or ["None"]
    what = pick(draw, kinds, "value")
    if what in ("module", "tensor"):
        read = {"name": site.fresh(), "op": "get_attr", "target": pick(draw, receivers[what], what)}
        nodes.append(read)
        return _ref(read)
    if what == "function":
        return {"function": pick(draw, FUNCTIONS, "function")}
    return CONSTANTS[what]


# Writes through what a get_attr reads: (opcode, target, argument template), in two groups:
# what writes a container (its items), and what rewrites a module (nn.Module methods, most of
# them spelled like Tensor methods). The template's letters are ``_operand``'s; the receiver
# is always first.
CONTAINER_WRITES: dict[str, tuple[str, str, list]] = {
    "operator.setitem": ("call_function", "operator.setitem", ["R", "K", "V"]),
    "operator.delitem": ("call_function", "operator.delitem", ["R", "K"]),
    "operator.iadd": ("call_function", "operator.iadd", ["R", "V"]),
    "operator.ior": ("call_function", "operator.ior", ["R", "V"]),
    "operator.imul": ("call_function", "operator.imul", ["R", 2]),
    "__setitem__": ("call_method", "__setitem__", ["R", "K", "V"]),
    "__delitem__": ("call_method", "__delitem__", ["R", "K"]),
    "__iadd__": ("call_method", "__iadd__", ["R", "V"]),
    "__ior__": ("call_method", "__ior__", ["R", "V"]),
    "update": ("call_method", "update", ["R", "V"]),
    "pop": ("call_method", "pop", ["R", "K"]),
    "clear": ("call_method", "clear", ["R"]),
    "append": ("call_method", "append", ["R", "V"]),
    "insert": ("call_method", "insert", ["R", 0, "V"]),
}
MODULE_WRITES: dict[str, tuple[str, str, list]] = {
    "double": ("call_method", "double", ["R"]),
    "half": ("call_method", "half", ["R"]),
    "float": ("call_method", "float", ["R"]),
    "bfloat16": ("call_method", "bfloat16", ["R"]),
    "to": ("call_method", "to", ["R", encode_value(torch.float64)]),
    "type": ("call_method", "type", ["R", encode_value(torch.float64)]),
    "cpu": ("call_method", "cpu", ["R"]),
    "zero_": ("call_method", "zero_", ["R"]),
    "fill_": ("call_method", "fill_", ["R", 0]),
    "requires_grad_": ("call_method", "requires_grad_", ["R", False]),
    "share_memory_": ("call_method", "share_memory_", ["R"]),
    "apply_": ("call_method", "apply_", ["R", "F"]),
    "apply": ("call_method", "apply", ["R", "F"]),
    "register_buffer": ("call_method", "register_buffer", ["R", "N", "T"]),
    "register_parameter": ("call_method", "register_parameter", ["R", "N", None]),
    "add_module": ("call_method", "add_module", ["R", "N", "M"]),
    "register_forward_hook": ("call_method", "register_forward_hook", ["R", "F"]),
    "train": ("call_method", "train", ["R"]),
    "eval": ("call_method", "eval", ["R"]),
    "set_": ("call_method", "set_", ["R", "T"]),
    "detach_": ("call_method", "detach_", ["R"]),
    "builtins.setattr": ("call_function", "builtins.setattr", ["R", "N", "V"]),
    "builtins.delattr": ("call_function", "builtins.delattr", ["R", "N"]),
    "__setattr__": ("call_method", "__setattr__", ["R", "N", "V"]),
    "__delattr__": ("call_method", "__delattr__", ["R", "N"]),
}
WRITES = {**CONTAINER_WRITES, **MODULE_WRITES}
# Which group a receiver mostly gets (the other one now and then).
GROUPS_BY_RECEIVER = {
    "container": [CONTAINER_WRITES, CONTAINER_WRITES, MODULE_WRITES],
    "module": [MODULE_WRITES, MODULE_WRITES, CONTAINER_WRITES],
    "plain attribute": [CONTAINER_WRITES, CONTAINER_WRITES, MODULE_WRITES],
    "tensor": [MODULE_WRITES, CONTAINER_WRITES],
}
# How often each kind of receiver is drawn, where the graph's module has one: containers
# and modules most, as the tree is what must not change.
RECEIVER_WEIGHTS = {"container": 3, "module": 2, "plain attribute": 1, "tensor": 1}
# Private state a getattr reaches from a module, then written like a container.
PRIVATE = ["_modules", "_parameters", "_buffers", "__dict__", "_forward_hooks"]


def write_through_get_attr(program: Program, draw: Draw) -> str | None:
    """The module tree written while the graph runs: a get_attr of a module, container,
    plain attribute or tensor, a write from ``WRITES`` on it (or on a private dict a
    ``getattr`` reaches), then a call_module or get_attr of the written path."""
    site = _site(program, draw)
    receivers = _receivers(site)
    if not receivers:
        return None
    kinds = [k for k in RECEIVER_WEIGHTS for _ in range(RECEIVER_WEIGHTS[k]) if k in receivers]
    kind = pick(draw, kinds, "receiver kind")
    receiver = pick(draw, receivers[kind], "receiver")
    read = {"name": site.fresh(), "op": "get_attr", "target": receiver}
    nodes, said = [read], f"get_attr {receiver!r} ({kind})"
    if kind in ("module", "container") and draw(st.integers(0, 7), label="private") == 0:
        private = pick(draw, PRIVATE, "private")
        nodes.append(_call(site, "call_function", "builtins.getattr", [_ref(read), private]))
        said += f" .{private}"
    group = draw(st.sampled_from(GROUPS_BY_RECEIVER[kind]), label="write group")
    write = pick(draw, sorted(group), "write")
    op, target, template = group[write]
    args = [_ref(nodes[-1])]
    args += [_operand(site, draw, t, receiver, receivers, nodes) for t in template[1:]]
    nodes.append(_call(site, op, target, args))
    said += f" -> {write}{tuple(_short(a) for a in args[1:])}"
    written = join(receiver, args[1]) if "K" in template and isinstance(args[1], str) else None
    later = _follow_up(site, draw, receiver, kind, written)
    if later is not None:
        nodes.append(later)
        said += f", then {later['op']} {later['target']!r}"
    returns = nodes[-1]["name"] if draw(st.booleans(), label="returned") else None
    site.insert(nodes, returns=returns)
    return f"graph {site.path or 'root'}: {said}"


def _ref(node: dict) -> dict:
    return {"node": node["name"]}


def _short(value) -> str:
    if isinstance(value, dict) and len(value) == 1:
        return "/".join(str(v) for v in value.values())
    return repr(value)


def _call(site: Site, op: str, target: str, args: list, kwargs: dict | None = None) -> dict:
    node = {"name": site.fresh(), "op": op, "target": target, "args": args}
    if kwargs:
        node["kwargs"] = kwargs
    return node


def _follow_up(
    site: Site, draw: Draw, receiver: str, kind: str, written: str | None = None
) -> dict | None:
    """A later use of the written path, or None: the path a write stored to (``written``),
    the receiver or a child of it, called as a module on a tensor input or read by get_attr."""
    if kind not in ("module", "container") or draw(st.integers(0, 3), label="follow up") == 0:
        return None
    children = [join(receiver, c) for c in _children_of(site, receiver)]
    targets = [written] * 3 if written else []
    target = pick(draw, [*targets, receiver, *children], "follow-up target")
    inputs = site.program.user_inputs(site.path, site.graph)
    if inputs and draw(st.integers(0, 3), label="call it") > 0:
        return _call(site, "call_module", target, [{"node": inputs[0]}])
    return {"name": site.fresh(), "op": "get_attr", "target": target}


# Classes a graph may try to call (issue 32 item 3): a factory that runs at a missing key, a
# pytree-registered constant wrapper, containers, and classes that make classes.
CLASSES: dict[str, list] = {
    "collections.defaultdict": ["F"],
    "collections.OrderedDict": [],
    "collections.deque": [],
    "torch._higher_order_ops.flat_apply._ConstantFunction": ["F"],
    "fxloom.immutable_collections.immutable_dict": [],
    "builtins.dict": [],
    "builtins.type": ["x", {"tuple": []}, {"dict": []}],
    "builtins.object": [],
    "functools.partial": ["F"],
    "torch.Size": [[1, 2]],
    "torch.nn.Module": [],
    "torch.nn.Linear": [3, 3],
    "torch.Generator": [],
    "types.SimpleNamespace": [],
}
# What is done with the instance: look a missing key up (a defaultdict runs its factory),
# call it, store it into a container of the tree.
CLASS_USES_CALLS = {
    "getitem missing": ("call_function", "operator.getitem", ["missing"]),
    "__missing__": ("call_method", "__missing__", ["missing"]),
    "__call__": ("call_method", "__call__", ["T"]),
}
CLASS_USES = [*CLASS_USES_CALLS, "store into the tree", "nothing"]


def call_class(program: Program, draw: Draw) -> str | None:
    """A class called from the graph, then used: ``defaultdict(print)['missing']``, a
    ``_ConstantFunction`` of a function called, an instance stored into a container."""
    site = _site(program, draw)
    receivers = _receivers(site)
    name = pick(draw, sorted(CLASSES), "class")
    nodes: list[dict] = []
    args = [_operand(site, draw, t, "", receivers, nodes) for t in CLASSES[name]]
    made = _call(site, "call_function", name, args)
    nodes.append(made)
    use = pick(draw, CLASS_USES, "use")
    if use == "store into the tree":
        holders = receivers.get("container", []) or receivers.get("module", [])
        if not holders:
            return None
        holder = pick(draw, holders, "container")
        read = {"name": site.fresh(), "op": "get_attr", "target": holder}
        key = pick(draw, _children_of(site, holder) + ["new"], "key")
        nodes += [
            read,
            _call(site, "call_function", "operator.setitem", [_ref(read), key, _ref(made)]),
        ]
        later = _follow_up(site, draw, holder, "container", join(holder, str(key)))
        nodes += [later] if later is not None else []
        use += f" {holder}[{key!r}]"
    elif use != "nothing":
        op, target, extra = CLASS_USES_CALLS[use]
        operands = [_operand(site, draw, t, "", receivers, nodes) for t in extra]
        nodes.append(_call(site, op, target, [_ref(made), *operands]))
    returns = nodes[-1]["name"] if draw(st.booleans(), label="returned") else None
    site.insert(nodes, returns=returns)
    return f"graph {site.path or 'root'}: {name}({', '.join(_short(a) for a in args)}), then {use}"


# ------------------------------------------------------------------ attribute values
# Zero and -1 come up most (a divisor, a count, a stride: what native kernels trust), then
# small and huge values.
INTS = [0, 0, 0, -1, -1, 1, 2, 3, 2**31 - 1, 2**31, 2**63 - 1, -(2**63), 2**64, 10**9]
FLOATS = [{"float": "nan"}, {"float": "inf"}, {"float": "-inf"}, 0.0, -1.0, 1e-45, 1e308]
STRINGS = [
    "zeros", "reflect", "replicate", "circular", "mean", "sum", "none", "tanh", "relu",
    "gelu", "fan_in", "linear", "cpu", "cuda", "meta", "float64", "LSTM", "GRU", "RNN_TANH",
    "x", "", "self", "torch", "os.system", "__init__", "_run_on_acc_0", "a" * 300,
]  # fmt: skip


def _value_sites(record: dict) -> list[tuple[object, object, object]]:
    """(holder, key, value) for every number, bool, string and int tuple of a module record's
    attributes and saved state (tensor records left out)."""
    sites, stack = [], [record.get("attributes", {}), record.get("state", {})]
    while stack:
        holder = stack.pop()
        items = holder.items() if isinstance(holder, dict) else enumerate(holder)
        for key, value in items:
            if isinstance(value, dict) and "key" in value and "shape" in value:
                continue  # a tensor
            if isinstance(value, (bool, int, float, str)) or _is_float(value) or _ints(value):
                sites.append((holder, key, value))
            elif isinstance(value, (dict, list)):
                stack.append(value)
    return sites


def _is_float(value) -> bool:
    return isinstance(value, dict) and set(value) == {"float"}


def _ints(value) -> list | None:
    """The int list of ``{"tuple": [ints]}`` or ``[ints]``, else None."""
    items = value.get("tuple") if isinstance(value, dict) and set(value) == {"tuple"} else value
    if isinstance(items, list) and items and all(type(v) is int for v in items):
        return items
    return None


def _perturbed(value, draw: Draw):
    """Another value of ``value``'s type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return pick(draw, [v for v in INTS + [value + 1, value - 1] if v != value], "int")
    if isinstance(value, float) or _is_float(value):
        return pick(draw, FLOATS, "float")
    if isinstance(value, str):
        return pick(draw, [s for s in STRINGS if s != value], "string")
    items = list(_ints(value))
    how = pick(draw, ["element", "shorter", "longer", "empty"], "tuple change")
    if how == "element":
        i = draw(st.integers(0, len(items) - 1), label="element")
        items[i] = pick(draw, [v for v in INTS if v != items[i]], "int")
    elif how == "shorter":
        items = items[:-1]
    elif how == "longer":
        items = items + [items[-1]]
    else:
        items = []
    return {"tuple": items} if isinstance(value, dict) else items


def perturb_attribute(program: Program, draw: Draw) -> str | None:
    """A module attribute or saved state value changed within its type (``groups`` to 0,
    ``stride`` to ``(1, 0)``, ``inplace`` flipped, ``scale`` to nan, a mode string to another):
    what a native kernel or a module's forward trusts."""
    sites = [
        (path, holder, key, value)
        for path, record in program.records()
        for holder, key, value in _value_sites(record)
    ]
    if not sites:
        return None
    path, holder, key, value = pick(draw, sites, "attribute value")
    holder[key] = _perturbed(value, draw)
    return f"{path or 'root'} attribute {key!r}: {_short(value)} -> {_short(holder[key])}"


# ------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Mutation:
    """One row of the table: its function returns what it did, or None where the file has
    nothing it applies to (then another is drawn)."""

    name: str
    family: str  # "names", "writes", "attributes"
    mutate: Callable[[Program, Draw], str | None]


MUTATIONS: list[Mutation] = [
    Mutation("rename node", "names", rename_node),
    Mutation("rename placeholder target", "names", rename_placeholder_target),
    Mutation("rename target part", "names", rename_path_part),
    Mutation("rename child module", "names", rename_child),
    Mutation("rename tensor", "names", rename_tensor),
    Mutation("rename keyword", "names", rename_keyword),
    Mutation("add look-alike keyword", "names", add_keyword),
    Mutation("rename attribute", "names", rename_attribute),
    Mutation("rename class_name", "names", rename_class_name),
    Mutation("rename forward parameter", "names", rename_forward_parameter),
    Mutation("combining marks", "names", rename_combining),
    Mutation("write through get_attr", "writes", write_through_get_attr),
    Mutation("call a class", "writes", call_class),
    Mutation("perturb attribute", "attributes", perturb_attribute),
]
FAMILIES = sorted({m.family for m in MUTATIONS})
ATTEMPTS = 8  # draws of a mutation that applies, before giving up on one


def mutate(program: Program, draw: Draw) -> list[tuple[str, str]]:
    """One to three mutations of ``program`` in place (a family drawn first, so each family
    is tried as often as the others): (mutation name, what it did)."""
    done = []
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]), label="how many mutations")):
        for _ in range(ATTEMPTS):
            family = draw(st.sampled_from(FAMILIES), label="family")
            rows = [m for m in MUTATIONS if m.family == family]
            mutation = draw(st.sampled_from(rows), label="mutation")
            did = mutation.mutate(program, draw)
            if did is not None:
                done.append((mutation.name, did))
                break
    return done
