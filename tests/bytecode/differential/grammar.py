"""A hypothesis strategy of small programs over a grammar, one switchable family per feature.

``programs(families)`` draws the source of a module that defines ``f(x, y, n, s)`` (two
square tensors of one size, an int, a float) and the globals its statements use. Every
statement and expression belongs to a family of ``FAMILIES``; only the families asked for
are drawn, so a run can leave out one the compiler is known to get wrong and measure each
one alone. ``cases(families)`` adds a call sequence: a base call and a few variations
(``variations.VARIATIONS``), always starting with the same call twice.

Tensors stay square (``n x n`` for the size of the call), so every op draws on any two
tensors in scope and a size change changes them all alike. Names made inside a block are
not used after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import strategies as st

from differential.harness import Call, Case
from differential.variations import VARIATIONS, sequence, tensor

# family -> what it draws
FAMILIES: dict[str, str] = {
    "tensor": "add, mul, relu, matmul, sum, transposes, view (always drawn)",
    "in-place": "in-place add_ of one tensor to another (inputs included)",
    "control": "if on an int or a shape, for over range",
    "data branch": "if on a tensor's value (a graph break)",
    "reads": "global int, float, list, dict and flag read",
    "counter": "next() of a global itertools.count",
    "enum": "an Enum-valued global setting compared",
    "set": "membership in a global set",
    "writes": "global dict item, global counter, object and class attributes",
    "appends": "an int appended to a global list",
    "tensor writes": "a tensor appended to a global list",
    "item": ".item() into a Python float used later",
    "print": "print of ints, shapes and tensors",
    "numpy": "numpy round-trips: torch.from_numpy(x.numpy() * 2), float(np.mean(...))",
    "raises": "raise on some ints, sizes or values",
    "context": "a block inside a @contextmanager that logs its enter and exit",
    "class statement": "a class defined inside the function, its attribute read",
    "generator expressions": "sum() over a generator expression of tensors",
}

GLOBALS: dict[str, str] = {  # family -> the module-level lines its statements read or write
    "reads": 'G_INT = 2\nG_FLOAT = 0.5\nG_LIST = [1, 2, 3]\nG_DICT = {"scale": 2, "shift": 0.5}\nFLAG = True',
    "counter": "COUNTER = itertools.count()",
    "enum": "class Mode(enum.Enum):\n    A = 1\n    B = 2\n\n\nSETTING = Mode.A",
    "set": 'ACTIVE = {"a", "c"}',
    "writes": "STORE = {}\nCALLS = 0\nSTATE = types.SimpleNamespace(hits=0)\n\n\nclass Box:\n    count = 0",
    "appends": "LOG = []",
    "tensor writes": "SEEN = []",
    "context": 'TAGS = []\n\n\n@contextlib.contextmanager\ndef tag(name):\n    TAGS.append(("enter", name))\n    yield\n    TAGS.append(("exit", name))',
}
# globals the statements only write: a call after one that changed them is still identical
WRITE_ONLY = frozenset({"LOG", "STORE", "SEEN", "TAGS"})
HEADER = "import contextlib\nimport enum\nimport itertools\nimport types\n\nimport numpy as np\nimport torch\n"
MAX_DEPTH = 2


@dataclass
class Scope:
    tensors: list[str]
    ints: list[str]
    floats: list[str]

    def copy(self) -> Scope:
        return Scope(list(self.tensors), list(self.ints), list(self.floats))


@dataclass
class Program:
    source: str
    used: frozenset[str]  # the families its statements drew

    def __repr__(self) -> str:
        return f"Program(used={sorted(self.used)}):\n{self.source}"


@dataclass
class _Writer:
    draw: Callable
    families: frozenset[str]
    left_out: tuple[tuple[str, str], ...] = ()  # pairs of families not drawn together
    lines: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    names: int = 0
    declared: set[str] = field(default_factory=set)  # names of `global` statements

    # -------------------------------------------------------------- small draws
    def pick(self, options: list) -> object:
        return self.draw(st.sampled_from(options))

    def fresh(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def emit(self, indent: int, line: str, family: str = "tensor") -> None:
        self.used.add(family)
        self.lines.append("    " * indent + line)

    def fill(self, template: str, scope: Scope) -> str:
        return template.format(
            a=self.pick(scope.tensors), b=self.pick(scope.tensors), i=self.pick(scope.ints),
            f=self.pick(scope.floats), k=self.draw(st.integers(0, 3)),
        )  # fmt: skip

    # -------------------------------------------------------------- expressions
    def expression(self, scope: Scope) -> tuple[str, str]:
        options = [(family, t) for family, ts in EXPRESSIONS.items() if family in self.families
                   for t in ts]  # fmt: skip
        family, template = self.pick(options)
        return family, self.fill(template, scope)

    # -------------------------------------------------------------- statements
    def block(self, scope: Scope, indent: int, depth: int, most: int = 3) -> None:
        for _ in range(self.draw(st.integers(1, most))):
            self.statement(scope, indent, depth)

    def statement(self, scope: Scope, indent: int, depth: int) -> None:
        options = [name for name, (family, nests) in STATEMENTS.items()
                   if family in self.families and (depth < MAX_DEPTH or not nests)
                   and not self._paired_with_used(family)]  # fmt: skip
        name = self.pick(sorted(options))
        STATEMENT_WRITERS[name](self, scope, indent, depth)

    def nested(self, header: str, family: str, scope: Scope, indent: int, depth: int,
               otherwise: bool = False) -> None:  # fmt: skip
        self.emit(indent, header, family)
        self.block(scope.copy(), indent + 1, depth + 1)
        if otherwise and self.draw(st.booleans()):
            self.emit(indent, "else:", family)
            self.block(scope.copy(), indent + 1, depth + 1)

    def _paired_with_used(self, family: str) -> bool:
        return any((family, used) in self.left_out or (used, family) in self.left_out
                   for used in self.used if used != family)  # fmt: skip

    def declare(self, name: str) -> None:
        self.declared.add(name)


# family -> expression templates ({a}, {b} tensors, {i} an int, {f} a float, {k} 0..3)
EXPRESSIONS: dict[str, list[str]] = {
    "tensor": [
        "{a} + {b}", "{a} * {b}", "torch.relu({a})", "{a} @ {b}", "{a}.t()",
        "{a}.transpose(0, 1)", "{a}.view({a}.shape[0], -1)", "{a}.sum(0, keepdim=True) + {b}",
        "{a} * {f}", "{a} + {i}", "{a} - {a}.sum() / {a}.numel()",
    ],
    "reads": ["{a} * G_INT", "{a} + G_FLOAT", "{a} * G_LIST[{k} % 3]", '{a} + G_DICT["shift"]'],
    "counter": ["{a} + next(COUNTER)"],
    "generator expressions": ["sum(({a} * i for i in range({k})), {b})"],
    "numpy": [
        "torch.from_numpy({a}.detach().numpy() * 2)",
        "{a} * float(np.mean({a}.detach().numpy()))",
    ],
}  # fmt: skip


def _assign(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    family, value = w.expression(scope)
    target = w.pick([*scope.tensors, w.fresh("t")])
    w.emit(indent, f"{target} = {value}", family)
    if target not in scope.tensors:
        scope.tensors.append(target)


def _add_in_place(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    w.emit(indent, w.fill("{a}.add_({b})", scope), "in-place")


def _if_int(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    header = w.pick(["if {i} > {k}:", "if {a}.shape[0] > {k} + 1:", "if {i} % 2 == 0:"])
    w.nested(w.fill(header, scope), "control", scope, indent, depth, otherwise=True)


def _for_range(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    var = w.fresh("i")
    bound = w.fill(w.pick(["{k}", "{i}"]), scope)
    inner = scope.copy()
    inner.ints.append(var)
    w.emit(indent, f"for {var} in range({bound}):", "control")
    w.block(inner, indent + 1, depth + 1)


def _if_data(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    header = w.fill(w.pick(["if {a}.sum() > 0:", "if ({a} > {b}).any():"]), scope)
    w.nested(header, "data branch", scope, indent, depth, otherwise=True)


def _if_flag(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    w.nested("if FLAG:", "reads", scope, indent, depth, otherwise=True)


def _if_enum(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    header = w.pick(["if SETTING is Mode.A:", "if SETTING == Mode.B:"])
    w.nested(header, "enum", scope, indent, depth, otherwise=True)


def _if_set(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    w.nested(w.pick(['if "b" in ACTIVE:', 'if "a" not in ACTIVE:']), "set", scope, indent, depth)


def _write(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    line = w.pick(['STORE["last"] = {i}', "STORE[{i}] = {f}", "CALLS += 1", "STATE.hits += {i}",
                   "Box.count += 1"])  # fmt: skip
    if line == "CALLS += 1":
        w.declare("CALLS")
    w.emit(indent, w.fill(line, scope), "writes")


def _append(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    w.emit(indent, w.fill(w.pick(["LOG.append({i})", "LOG.append({i} * 2)"]), scope), "appends")


def _write_tensor(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    w.emit(indent, w.fill(w.pick(["SEEN.append({a})", "SEEN.append({a}.sum())"]), scope),
           "tensor writes")  # fmt: skip


def _item(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    var = w.fresh("k")
    w.emit(indent, w.fill(f"{var} = {{a}}.sum().item()", scope), "item")
    scope.floats.append(var)


def _print(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    line = w.pick(['print("at", {i}, tuple({a}.shape))', 'print("value", {a}.sum())',
                   'print("float", {f})'])  # fmt: skip
    w.emit(indent, w.fill(line, scope), "print")


def _raise(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    header, error = w.pick([
        ("if {i} == {k}:", 'raise ValueError(f"int is {{{i}}}")'),
        ("if {a}.shape[0] == {k} + 2:", 'raise RuntimeError("size " + str({a}.shape[0]))'),
        ("if {a}.abs().max() > 3:", 'raise ArithmeticError("too large")'),
    ])  # fmt: skip
    header, error = w.fill(header, scope), w.fill(error, scope)
    w.emit(indent, header, "raises")
    w.emit(indent + 1, error, "raises")


def _with(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    w.nested(w.fill('with tag("{i}"):', scope), "context", scope, indent, depth)


def _class(w: _Writer, scope: Scope, indent: int, depth: int) -> None:
    name, target = w.fresh("Local"), w.fresh("t")
    w.emit(indent, f"class {name}:", "class statement")
    w.emit(indent + 1, w.fill("scale = {k}", scope), "class statement")
    w.emit(indent, w.fill(f"{target} = {{a}} * {name}.scale", scope), "class statement")
    scope.tensors.append(target)


# statement -> (family, whether it nests a block)
STATEMENTS: dict[str, tuple[str, bool]] = {
    "assign": ("tensor", False),
    "add in place": ("in-place", False),
    "if on an int or shape": ("control", True),
    "for over range": ("control", True),
    "if on a value": ("data branch", True),
    "if on a flag": ("reads", True),
    "if on an enum": ("enum", True),
    "if on set membership": ("set", True),
    "outside write": ("writes", False),
    "append": ("appends", False),
    "tensor to a global list": ("tensor writes", False),
    "item": ("item", False),
    "print": ("print", False),
    "raise": ("raises", False),
    "with": ("context", True),
    "class": ("class statement", False),
}
STATEMENT_WRITERS: dict[str, Callable[[_Writer, Scope, int, int], None]] = {
    "assign": _assign, "add in place": _add_in_place, "if on an int or shape": _if_int,
    "for over range": _for_range, "if on a value": _if_data, "if on a flag": _if_flag,
    "if on an enum": _if_enum, "if on set membership": _if_set, "outside write": _write,
    "append": _append,
    "tensor to a global list": _write_tensor, "item": _item, "print": _print, "raise": _raise,
    "with": _with, "class": _class,
}  # fmt: skip
RETURNS = ["return {a}", "return {a}, {i}", 'return {{"out": {a}, "n": {i}}}',
           "return {a}, {b}.sum()", "return {a}, {f}"]  # fmt: skip


@st.composite
def programs(
    draw: Callable,
    families: frozenset[str] = frozenset(FAMILIES),
    left_out: tuple[tuple[str, str], ...] = (),
) -> Program:
    """The source of a module defining ``f(x, y, n, s)`` drawn over ``families``, never two
    families paired in ``left_out`` (the first drawn wins)."""
    families = frozenset(families) | {"tensor"}
    writer = _Writer(draw, families, left_out)
    scope = Scope(tensors=["x", "y"], ints=["n"], floats=["s"])
    writer.block(scope, 1, 0, most=6)
    writer.lines.append("    " + writer.fill(writer.pick(RETURNS), scope))
    body = [f"    global {name}" for name in sorted(writer.declared)] + writer.lines
    module_lines = [GLOBALS[f] for f in sorted(writer.used) if f in GLOBALS]
    source = "\n\n".join([HEADER, *module_lines, "def f(x, y, n, s):\n" + "\n".join(body)])
    return Program(source + "\n", frozenset(writer.used))


@dataclass
class GeneratedCase(Case):
    used: frozenset[str] = frozenset()
    variations: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return self.describe()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """How hypothesis prints a falsifying case: the program's source and the calls."""
        printer.text(self.describe())


@st.composite
def cases(
    draw: Callable,
    families: frozenset[str] = frozenset(FAMILIES),
    variations: tuple[str, ...] = tuple(VARIATIONS),
    left_out: tuple[tuple[str, str], ...] = (),
) -> GeneratedCase:
    """A program and its calls: a base call, the same twice again, then 1 to 3 of
    ``variations``; no pair in ``left_out`` (two families, or a family and a variation)."""
    program = draw(programs(families, left_out))
    size, n = draw(st.integers(2, 3)), draw(st.integers(0, 4))
    s = draw(st.sampled_from([0.5, 1.5, -2.0]))
    base = Call((tensor((size, size), 1), tensor((size, size), 2), n, s), label="base")
    others = [name for name in variations if name != "again" and not any(
        (family, name) in left_out for family in program.used)]  # fmt: skip
    chosen = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True))
    calls = sequence(base, ["again", *chosen])
    return GeneratedCase(
        program.source, calls, "generated", WRITE_ONLY, program.used, ("again", *chosen)
    )
