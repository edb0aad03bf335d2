"""A ``CodeGen`` for functions that take and return nested structures (torch.fx's pytree codegen).

The graph's placeholders are the leaves of the caller's arguments, and its
output is the flat list of leaves of the result. The generated function keeps
the caller's signature: it flattens its arguments with the input spec and
rebuilds the result with the output spec (``fxloom.pytree``)::

    >>> import torch, fxloom
    >>> from fxloom import pytree
    >>> from fxloom.pytree_codegen import PyTreeCodeGen, PyTreeInfo
    >>> g = fxloom.Graph()
    >>> a, b = g.placeholder("a"), g.placeholder("b")
    >>> _ = g.output([g.call_function(torch.add, (a, b)), a])
    >>> _, in_spec = pytree.tree_flatten(({"a": 0, "b": 0},))
    >>> _, out_spec = pytree.tree_flatten({"sum": 0, "first": 0})
    >>> g.set_codegen(PyTreeCodeGen(PyTreeInfo(["pair"], in_spec, out_spec)))
    >>> gm = fxloom.GraphModule(torch.nn.Module(), g)
    >>> print(gm.code.strip())
    def forward(self, pair):
        a, b, = pytree.tree_flatten_spec((pair,), self._in_spec)
        add = torch.add(a, b);  b = None
        return pytree.tree_unflatten([add, a], self._out_spec)
    >>> gm({"b": torch.ones(1), "a": torch.ones(1)})["sum"]
    tensor([2.])

``GraphModule`` keeps the specs as ``_in_spec`` and ``_out_spec``, as
torch.fx does; the ``Interpreter`` flattens and rebuilds through
``process_inputs``/``process_outputs``.

Depends on ``codegen`` and ``pytree``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from fxloom import pytree
from fxloom.codegen import CodeGen

__all__ = ["PyTreeCodeGen", "PyTreeInfo"]


class PyTreeInfo(NamedTuple):
    """The caller's view of a graph: parameter names, and the shapes of arguments and result.

    ``in_spec`` is the spec of the tuple of positional arguments; ``out_spec``
    the spec of the result (None: the output is returned as the graph makes it).
    """

    orig_args: list[str]
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec | None


class PyTreeCodeGen(CodeGen):
    """Flattens the arguments on entry and rebuilds the result on return; see the module docstring."""

    def __init__(self, pytree_info: PyTreeInfo) -> None:
        super().__init__()
        self.pytree_info = pytree_info

    def process_inputs(self, *inputs: Any) -> list[Any]:
        return pytree.tree_flatten_spec(inputs, self.pytree_info.in_spec)

    def process_outputs(self, out: Any) -> Any:
        out_spec = self.pytree_info.out_spec
        if out_spec is None:
            return out
        return pytree.tree_unflatten(out if isinstance(out, (list, tuple)) else [out], out_spec)

    def gen_fn_def(
        self, free_vars: list[str], maybe_return_annotation: str, *, root_module: str = "self"
    ) -> str:
        leaves = free_vars[1:] if free_vars[:1] == [root_module] else free_vars
        params = [name for name in self.pytree_info.orig_args if name != root_module]
        header = super().gen_fn_def([*params], maybe_return_annotation, root_module=root_module)
        if not leaves:
            return header
        # A parameter prints as "x: T = default"; only its name is bound here.
        leaf_names = [leaf.split(":")[0].split("=")[0].strip() for leaf in leaves]
        # (a, b,) or (a,): parameters by name (``*args``, ``b=None`` and ``c: T`` included).
        names = [p.split("=")[0].split(":")[0].strip().lstrip("*") for p in params]
        arguments = "(" + "".join(f"{name}, " for name in names).rstrip() + ")"
        return f"{header}\n    {', '.join(leaf_names)}, = {self.flatten_inputs(arguments, names)}"

    def flatten_inputs(self, arguments: str, names: list[str]) -> str:
        """The expression flattening the tuple of parameters ``arguments`` (override to check
        them another way; bind what it uses in ``additional_globals``)."""
        return f"pytree.tree_flatten_spec({arguments}, self._in_spec)"

    def generate_output(self, output_args: Any, *, repr_fn: Any = None) -> str:
        if self.pytree_info.out_spec is None:
            return super().generate_output(output_args, repr_fn=repr_fn)
        if not isinstance(output_args, (list, tuple)):
            output_args = [output_args]
        return f"return pytree.tree_unflatten({(repr_fn or repr)(output_args)}, self._out_spec)"

    def additional_globals(self) -> list[tuple[str, Any]]:
        return [("pytree", pytree)]
