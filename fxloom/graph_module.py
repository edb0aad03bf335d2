"""``GraphModule``: an ``nn.Module`` whose ``forward`` is code generated from a ``Graph``.

    >>> import operator, torch, fxloom
    >>> root = torch.nn.Module()
    >>> root.linear = torch.nn.Linear(4, 5)
    >>> g = fxloom.Graph()
    >>> x = g.placeholder("x")
    >>> y = g.call_module("linear", (x,))
    >>> _ = g.output(g.call_method("relu", (y,)))
    >>> gm = fxloom.GraphModule(root, g)
    >>> print(gm.code.strip())
    def forward(self, x):
        linear = self.linear(x);  x = None
        relu = linear.relu();  linear = None
        return relu

Code generation is lazy: constructing a GraphModule, assigning ``gm.graph`` or
editing the graph in place costs nothing until ``forward`` is next looked up
(by a call, ``gm.forward``, ``gm.code``); then the code is generated once, so a
pipeline of many edits pays for one regeneration. ``gm.forward`` and ``gm(...)``
always reflect the current graph; ``recompile()`` regenerates eagerly, as in
torch.fx.

How ``forward`` is found — three pieces, each needed:

* **A class per instance** (``GraphModule.__new__``). The generated function
  is stored on the instance's own class, so ``type(gm).forward``,
  ``inspect.signature(type(gm).forward)`` and ``typing.get_type_hints`` see
  the generated signature, as they do in torch.fx. One class shared by all
  GraphModules could hold only one function: two modules with different
  graphs need different forwards. (On the instance instead, as a bound
  method, the function would be invisible from the class and would tie the
  instance to itself in a reference cycle.)
* **A descriptor** (``_GeneratedForward``, which is ``GraphModule.forward``).
  Graphs are edited in place and code is generated lazily, so whoever looks
  ``forward`` up — ``nn.Module.__call__`` reads ``self.forward`` on every
  call — must get code for the current graph. A plain function on the class
  would stay stale after ``node.target = ...`` until someone called
  ``recompile()``. The descriptor compares the graph's version with the one
  compiled (a few attribute reads per call: the generated forward is
  benchmarked against eager) and regenerates when they differ. It defines
  only ``__get__``, so ``gm.forward = f`` on an instance still overrides
  it, as for any method.
* **A weak reference from the class to its instance** (``_instance_ref``).
  ``type(gm).forward`` reaches the descriptor with no instance, yet the code
  must come from that instance's current graph; the class finds the instance
  through this reference. It is weak because the instance holds its class:
  a strong reference back would make a cycle, and a dropped GraphModule —
  parameters included — would wait for the cyclic garbage collector instead
  of being freed at once. The reference also marks the class as an instance
  class: ``_user_class`` steps over it to the user's class (``GraphModule``
  or a subclass), which pickling and copying rebuild from, since the
  instance class cannot be imported by name.

Pickling and ``copy.deepcopy`` carry the graph and regenerate the code; no
code objects are pickled.

Generated code reads submodules by path (``getattr(self.layers, "0").conv1``).
The GraphModule and the empty parents it creates keep their submodules in
their instance ``__dict__`` as well, kept in step with ``_modules``
(``fxloom._mirrored_modules``), so each part of a path is a dict lookup
rather than an ``nn.Module.__getattr__`` call (a fifth of a small MLP's
forward at batch 1).
"""

from __future__ import annotations

import copy
import itertools
import linecache
import textwrap
import weakref
from collections.abc import Callable
from pathlib import Path
from types import MethodType
from typing import Any

import torch

from fxloom import attr_path
from fxloom._mirrored_modules import mirror, without_mirrors
from fxloom._notes import add_note
from fxloom.codegen import PythonCode
from fxloom.graph import Graph
from fxloom.ops.signatures import FORWARD_BINDING_CALLS

__all__ = ["GraphModule"]

# Private names of torch.fx.graph_module that torch.fx's clients import (torchvision's
# feature extraction: its DualGraphModule copies attributes with ``_copy_attr`` and deep-copies
# itself through ``_CodeOnlyModule``), kept with torch.fx's behaviour so such code runs with
# only its import changed.

# The key of ``gm.meta`` whose dict (attribute name -> value) a deep copy sets on the copy.
_USER_PRESERVED_ATTRIBUTES_KEY = "_user_preserved_attributes"

# Instance state derived from the graph; dropped when pickling or copying.
_CODEGEN_STATE = (
    "_code",
    "_compiled_graph",
    "_compiled_version",
    "_source_file",
    "_in_spec",
    "_out_spec",
)

_file_counter = itertools.count()


class _SourceLoader:
    """Serves generated source to ``linecache`` (tracebacks, pdb) on demand."""

    def __init__(self, src: str) -> None:
        self._src = src

    def get_source(self, module_name: str) -> str:
        return self._src


def _compile_forward(code: PythonCode, class_name: str, tree: Any = None) -> tuple[Any, str]:
    """Execute generated source (or ``tree``, the ``ast.Module`` parsed from it); return the
    ``forward`` function and its file name."""
    filename = f"<fxloom-generated>/{class_name}_{next(_file_counter)}.py"
    namespace = dict(code.globals)
    namespace["__name__"] = filename
    namespace["__loader__"] = _SourceLoader(code.src)
    # dont_inherit: this file's ``from __future__ import annotations`` must not
    # turn the generated annotations into strings.
    source = code.src if tree is None else tree
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)
    forward = namespace["forward"]
    # Registered eagerly so tracebacks and inspect see the source at once; removed after the
    # function is gone so big generated sources do not pile up. Not removed by the finalizer
    # itself: it runs whenever the garbage collector does, possibly while linecache.checkcache
    # (pdb, doctest) walks the cache's keys, which then fails on the missing one.
    while _DEAD_SOURCES:
        linecache.cache.pop(_DEAD_SOURCES.pop(), None)
    lines = code.src.splitlines(keepends=True)
    linecache.cache[filename] = (len(code.src), None, lines, filename)
    weakref.finalize(forward, _DEAD_SOURCES.append, filename)
    return forward, filename


# Files of generated forwards that were garbage-collected, dropped from linecache at the
# next compilation.
_DEAD_SOURCES: list[str] = []


class _GeneratedForward:
    """``GraphModule.forward``: the generated function, regenerated first if the graph changed.

    A descriptor, so every way of reaching ``forward`` (``gm(x)``,
    ``gm.forward``, ``type(gm).forward``, ``inspect.signature``) sees code for
    the current graph. Assigning ``gm.forward = f`` on an instance still
    overrides it, as for any method. The compiled function is kept on the
    instance's class as ``_generated_forward`` (by ``recompile``); the module
    docstring says why each piece exists.
    """

    def __get__(self, instance: GraphModule | None, owner: type) -> Any:
        try:
            if instance is None:
                return self._for_class(owner)
            graph = instance._graph  # inlined _ensure_current: this runs on every call
            if (
                instance._compiled_graph is not graph
                or instance._compiled_version != graph._version
            ):
                instance.recompile()
            return MethodType(owner._generated_forward, instance)
        except AttributeError as err:
            # An AttributeError escaping a descriptor would make nn.Module report
            # "no attribute 'forward'", hiding the real failure.
            raise RuntimeError(f"generating forward failed: {type(err).__name__}: {err}") from err

    def _for_class(self, owner: type) -> Any:
        ref = owner.__dict__.get("_instance_ref")
        instance = ref() if ref is not None else None
        if instance is None:
            return self
        instance._ensure_current()
        return owner._generated_forward


class GraphModule(torch.nn.Module):
    """An ``nn.Module`` running code generated from ``graph``; see the module docstring.

    Args:
        root: where ``get_attr``/``call_module`` targets come from: an
            ``nn.Module`` (each referenced submodule, parameter, buffer or
            attribute is copied to the same qualified path here, with empty
            intermediate modules created as needed) or a dict from qualified
            name to object.
        graph: the graph to run.
        class_name: the name of this module's class (shown in printing and errors).
    """

    # TorchScript compiles a module's properties unless told not to; these read the Python
    # graph, which it cannot type. ``torch.jit.script(gm)`` then compiles the generated
    # forward alone, as for a hand-written module.
    __jit_unused_properties__ = ["graph", "code"]

    def __new__(cls, *args: Any, **kwargs: Any) -> GraphModule:
        # A fresh subclass per instance: the generated function lives on it
        # (see the module docstring for why).
        base = cls._user_class()
        instance_class = type(base.__name__, (base,), {})
        instance = super().__new__(instance_class)
        instance_class._instance_ref = weakref.ref(instance)
        return instance

    @classmethod
    def _user_class(cls) -> type:
        """The class the user instantiated: ``cls`` itself unless it is an instance class."""
        return cls.__bases__[0] if "_instance_ref" in cls.__dict__ else cls

    def __init__(
        self,
        root: torch.nn.Module | dict[str, Any],
        graph: Graph,
        class_name: str = "GraphModule",
    ) -> None:
        super().__init__()
        mirror(self)  # submodules as instance attributes: generated paths read them fast
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphModule needs an fxloom.Graph, got {type(graph).__name__}")
        self._set_class_name(class_name)
        state = self.__dict__  # plain attributes: see _invalidate
        if isinstance(root, torch.nn.Module):
            state["training"] = root.training
            copy_attr = _copy_attr_from_module
        elif isinstance(root, dict):
            copy_attr = _copy_attr_from_dict
        else:
            raise TypeError(
                f"GraphModule's root must be an nn.Module or a dict of qualified names, "
                f"got {type(root).__name__}"
            )
        for node in _first_node_per_target(graph):
            copy_attr(root, self, node)
        state["meta"] = {}
        self.graph = graph

    def _set_class_name(self, class_name: str) -> None:
        cls = type(self)
        cls.__name__ = class_name
        cls.__qualname__ = class_name

    # ------------------------------------------------------------------ graph
    @property
    def graph(self) -> Graph:
        """The graph this module runs; assigning a new one regenerates code on next use."""
        return self._graph

    @graph.setter
    def graph(self, graph: Graph) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(
                f"GraphModule.graph must be an fxloom.Graph, got {type(graph).__name__}"
            )
        self.__dict__["_graph"] = graph
        graph.owning_module = self
        self._invalidate()

    def _invalidate(self) -> None:
        # Plain attributes are written to __dict__, as nn.Module.__setattr__ would end up
        # doing after checking whether each is a parameter, module or buffer (microseconds
        # a name, and construction and recompilation are benchmarked against torch.fx).
        self.__dict__.update(
            _code=None,  # PythonCode | None
            _compiled_graph=None,  # Graph | None
            _compiled_version=-1,
            _source_file=None,  # str | None
        )

    def _ensure_current(self) -> None:
        graph = self._graph
        if self._compiled_graph is not graph or self._compiled_version != graph._version:
            self.recompile()

    forward = _GeneratedForward()

    def recompile(self, *, check: Callable[[PythonCode], Any] | None = None) -> PythonCode:
        """Regenerate and compile ``forward`` from the graph now; return the ``PythonCode``.

        ``check``, if given, is called with the generated code before any of it is compiled
        or run, and may raise to stop it (``fxloom.load`` checks a file's code this way). It
        may return the ``ast.Module`` it parsed from ``code.src``: that tree is compiled, so
        what was checked is exactly what runs (and the source is parsed once).
        """
        graph = self._graph
        code = graph.python_code(root_module="self")
        tree = check(code) if check is not None else None
        forward, filename = _compile_forward(code, type(self).__name__, tree)
        type(self)._generated_forward = forward
        pytree_info = getattr(graph._codegen, "pytree_info", None)
        state = self.__dict__  # plain attributes: see _invalidate
        if pytree_info is not None:  # read by the generated code as self._in_spec, as in torch.fx
            state["_in_spec"] = pytree_info.in_spec
            state["_out_spec"] = pytree_info.out_spec
        state.update(
            _code=code,
            _compiled_graph=graph,
            _compiled_version=graph._version,
            _source_file=filename,
        )
        return code

    @property
    def code(self) -> str:
        """The Python source of ``forward`` for the current graph."""
        self._ensure_current()
        assert self._code is not None
        return self._code.src

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            # Looked up on each call: tracing patches nn.Module.__call__ (a GraphModule
            # used inside a module being traced is traced through).
            return torch.nn.Module.__call__(self, *args, **kwargs)
        except Exception as err:
            _note_failing_node(err, self)
            raise

    # -------------------------------------------------------------- printing
    def print_readable(self, print_output: bool = True) -> str:
        """This module (and nested GraphModules) as readable class definitions."""
        text = self._readable(type(self).__name__)
        if print_output:
            print(text)
        return text

    def _readable(self, class_name: str) -> str:
        parts = [f"class {class_name}(torch.nn.Module):"]
        for name, child in self.named_children():
            if isinstance(child, GraphModule):
                parts.append(textwrap.indent(child._readable(name), "    "))
        parts.append(textwrap.indent(self.code, "    "))
        return "\n".join(parts)

    def __str__(self) -> str:
        return f"{super().__str__()}\n\n{self.code}"

    # ------------------------------------------------------------ submodules
    def add_submodule(self, target: str, m: torch.nn.Module) -> bool:
        """Install ``m`` at qualified path ``target``, creating empty parents as needed.

        Returns False (and changes nothing) if a non-module attribute is in the way.
        """
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"add_submodule needs an nn.Module, got {type(m).__name__}")
        try:
            attr_path.install(self, target, m)
        except attr_path.PathBlockedError:
            return False
        return True

    def delete_submodule(self, target: str) -> bool:
        """Remove the submodule at ``target``; False if there is no such submodule."""
        if not isinstance(attr_path.find(self, target), torch.nn.Module):
            return False
        return attr_path.delete(self, target)

    def delete_all_unused_submodules(self) -> None:
        """Delete submodules no ``call_module``/``get_attr`` node needs (a called module keeps its children)."""
        used: set[str] = set()
        called: set[str] = set()
        for op in ("call_module", "get_attr"):
            for node in self._graph.find_nodes(op=op, sort=False):
                used.update(attr_path.prefixes(node.target))
                if op == "call_module":
                    called.add(node.target)
        unused = []
        for name, _ in self.named_modules():
            if not name or name in used:
                continue
            if any(outer in called for outer in attr_path.prefixes(name)[:-1]):
                continue
            unused.append(name)
        for name in unused:
            self.delete_submodule(name)

    # ------------------------------------------------------- copy and pickle
    def __reduce__(self) -> tuple:
        _refuse_scripted_submodules(self)
        state = {
            k: v
            for k, v in without_mirrors(self.__dict__).items()
            if k not in _CODEGEN_STATE and k != "_graph"
        }
        return (_rebuild, (type(self)._user_class(), state, self._graph, type(self).__name__))

    def __deepcopy__(self, memo: dict[int, Any]) -> GraphModule:
        base = type(self)._user_class()
        new = base.__new__(base)
        memo[id(self)] = new
        for key, value in without_mirrors(self.__dict__).items():
            if key not in _CODEGEN_STATE and key != "_graph":
                new.__dict__[key] = copy.deepcopy(value, memo)
        mirror(new)
        new._set_class_name(type(self).__name__)
        new.graph = copy.deepcopy(self._graph, memo)
        return new

    def __copy__(self) -> GraphModule:
        base = type(self)._user_class()
        new = base.__new__(base)
        new.__dict__.update(self.__dict__)
        for key in ("_modules", "_parameters", "_buffers"):
            new.__dict__[key] = dict(self.__dict__[key])
        mirror(new)
        new._set_class_name(type(self).__name__)
        new.graph = self._graph
        return new

    def _replicate_for_data_parallel(self) -> GraphModule:
        """A replica for ``nn.DataParallel``/``replicate``, sharing this module's generated code.

        ``nn.Module``'s version makes the replica with ``__new__`` (so a fresh instance class,
        without ``_generated_forward``) and copies ``__dict__``, marks of the compiled version
        included: the replica would look compiled and find no function. It gets this module's
        function instead (code for the same graph, compiled once, not once per replica) and its
        own mirrors, which replicate's ``setattr`` of each copied submodule keeps in step.
        """
        self._ensure_current()
        replica = super()._replicate_for_data_parallel()
        type(replica)._generated_forward = type(self)._generated_forward
        replica._set_class_name(type(self).__name__)
        mirror(replica)
        return replica

    def to_folder(self, folder: str | Path, module_name: str = "FxModule") -> None:
        """Write an importable package: ``from <folder> import <module_name>`` then ``<module_name>()``.

        Parameters and buffers go to ``state_dict.pt`` (loaded with
        ``weights_only=True``); standard ``torch.nn`` leaves are rebuilt from
        their constructor; other submodules are pickled (loading those runs
        their classes' code, so load only folders you trust).
        """
        from fxloom._to_folder import write_folder

        write_folder(self, Path(folder), module_name)


# GraphModule.__call__ only annotates errors: calls bind to the generated forward's signature.
FORWARD_BINDING_CALLS.add(GraphModule.__call__)


def _refuse_scripted_submodules(gm: GraphModule) -> None:
    """Pickle cannot save a TorchScript module (torch reports only its class): say which and why."""
    for path, module in gm.named_modules():
        if isinstance(vars(module).get("_c"), torch.ScriptModule):
            raise TypeError(
                f"cannot pickle {type(gm).__name__}: its submodule {path!r} is a TorchScript "
                "module, which pickle cannot save (torch.jit.save saves it in its own format); "
                "trace the Python module instead of its scripted form, or save the scripted "
                "submodule separately (deepcopy works)"
            )


def _rebuild(base: type, state: dict[str, Any], graph: Graph, class_name: str) -> GraphModule:
    gm = base.__new__(base)
    gm.__dict__.update(state)
    mirror(gm)
    gm._set_class_name(class_name)
    gm.graph = graph
    return gm


# -------------------------------------------------------- copying attributes
# root module -> {constant name: value} captured by every trace of that root
# (``fxloom.tracing.constants``): torch.fx sets such constants on the root, fxloom notes them
# here. Weak, so a dropped root drops its constants (torch.fx's live exactly as long).
_CAPTURED: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def captured_on(root: torch.nn.Module) -> dict[str, Any]:
    """The constants traces of ``root`` captured (name -> tensor or torchbind object)."""
    captured = _CAPTURED.get(root)
    if captured is None:
        captured = _CAPTURED[root] = {}
    return captured


class _CodeOnlyModule(torch.nn.Module):
    """A module whose state is ``body``, an instance ``__dict__`` (deep-copied from another
    module): the ``root`` a GraphModule subclass rebuilds a copy of itself from."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__()
        self.__dict__ = body


def _copy_attr(from_module: torch.nn.Module, to_module: torch.nn.Module, target: str) -> None:
    """Copy what ``from_module`` holds at the dotted path ``target`` to the same path in
    ``to_module``, creating empty parent modules as needed (torch.fx's helper of that name).

    A parent that ``to_module`` already shares with ``from_module`` is left as it is: everything
    under it is there already. A tensor that is not a parameter becomes a buffer (persistent
    or not as it was in ``from_module``). A constant a trace of ``from_module`` captured
    (``_tensor_constant0``: torch.fx sets those on the root, fxloom notes them beside it) is
    copied from where fxloom noted it.
    """
    source, dest = from_module, to_module
    for name in target.split(".")[:-1]:
        source, dest = getattr(source, name), getattr(dest, name, None)
        if dest is source:
            return
        if dest is None:
            break
    value = attr_path.find(from_module, target)
    if value is attr_path.MISSING:
        value = captured_on(from_module).get(target, attr_path.MISSING)
        if value is attr_path.MISSING:
            attr_path.get(from_module, target)  # raises, naming what is missing
        attr_path.install(to_module, target, value, as_buffer=True)
    elif _held_as_buffer(from_module, target) or isinstance(value, torch.nn.Parameter):
        attr_path.install(to_module, target, value, copied_from=from_module)
    else:  # a module, or a plain attribute (a tensor among them becomes a buffer)
        attr_path.install(to_module, target, value, as_buffer=True)


def _held_as_buffer(module: torch.nn.Module, target: str) -> bool:
    parent, _, field = target.rpartition(".")
    owner = attr_path.find(module, parent) if parent else module
    return isinstance(owner, torch.nn.Module) and field in owner._buffers


def _first_node_per_target(graph: Graph) -> list[Any]:
    """The get_attr nodes, then the call_module nodes, in graph order, one per target.

    A target used by several nodes (a module called twice) is copied once.
    """
    first = []
    for op in ("get_attr", "call_module"):
        seen: set[str] = set()
        for node in graph.find_nodes(op=op):
            if node.target not in seen:
                seen.add(node.target)
                first.append(node)
    return first


def _copy_attr_from_module(root: torch.nn.Module, gm: GraphModule, node: Any) -> None:
    target: str = node.target
    constants = node.graph.constants
    if node.op == "get_attr" and target in constants:  # captured by a tracer
        value = constants[target]
        if isinstance(value, torch.Tensor):
            gm.register_buffer(target, value)
        else:  # a branch of fxloom.cond (a module), a torchbind object
            attr_path.install(gm, target, value)
        return
    value = attr_path.find(root, target)
    if value is attr_path.MISSING:
        raise attr_path.MissingAttributeError(
            root,
            target,
            context=f"GraphModule: %{node.name} ({node.op}) refers to {target!r}",
            fix="add it to the root or fix the node's target",
        )
    if node.op == "call_module" and not isinstance(value, torch.nn.Module):
        raise TypeError(
            f"GraphModule: %{node.name} calls {target!r} as a module, but in "
            f"{type(root).__name__} it is a {type(value).__name__}"
        )
    attr_path.install(gm, target, value, copied_from=root)


class MissingRootKeyError(KeyError, RuntimeError):
    """A node's target that the root dict does not provide (a ``RuntimeError`` in torch.fx)."""

    __str__ = BaseException.__str__  # KeyError would print the message quoted


def _copy_attr_from_dict(root: dict[str, Any], gm: GraphModule, node: Any) -> None:
    if node.target not in root:
        raise MissingRootKeyError(
            f"GraphModule: %{node.name} ({node.op}) refers to {node.target!r}, which is not a "
            f"key of the root dict (keys: {', '.join(sorted(root)) or 'none'})"
        )
    value = root[node.target]
    if node.op == "call_module" and not isinstance(value, torch.nn.Module):
        raise TypeError(
            f"GraphModule: %{node.name} calls {node.target!r} as a module, but the root dict "
            f"maps it to a {type(value).__name__}"
        )
    attr_path.install(gm, node.target, value, as_buffer=True)


# ------------------------------------------------------------------ errors
def _note_failing_node(err: BaseException, gm: GraphModule) -> None:
    """Add a note naming the node whose generated line raised ``err``."""
    if gm._code is None:
        return
    tb = err.__traceback__
    lineno = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == gm._source_file:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    name = gm._code.node_at_line(lineno) if lineno is not None else None
    if name is None:
        return
    source_line = gm._code.src.splitlines()[lineno - 1].strip()
    note = (
        f"fxloom: raised by %{name}, line {lineno} of the generated forward of "
        f"{type(gm).__name__}:\n    {source_line}"
    )
    node = next((n for n in gm._graph.nodes if n.name == name), None)
    if node is not None:
        note += f"\n  node: {node.format_node()}"
        if node.stack_trace:
            note += f"\n  captured from:\n{textwrap.indent(node.stack_trace.rstrip(), '    ')}"
    add_note(err, note)
