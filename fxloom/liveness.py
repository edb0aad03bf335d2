"""When each value of a graph may be released: the one last-use analysis.

Generated code (``codegen``) and the ``Interpreter`` both let go of a value as
soon as no later node needs it, so a long chain of operations holds no more
tensors at once than eager execution does. Both ask ``last_uses`` which values
die after each node; neither works it out on its own.

``reused_argument`` builds on it: where a call may write its result into an
argument that dies at it (``runtime_functions``, ``reuses``).

Depends on ``node`` and ``ops.runtime_functions`` (``Graph`` for type hints).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fxloom.node import Node, map_arg
from fxloom.ops.runtime_functions import returns_fresh

if TYPE_CHECKING:
    from fxloom.graph import Graph

__all__ = ["last_uses", "reused_argument"]


def last_uses(graph: Graph) -> dict[Node, list[Node]]:
    """For each node, the values that are dead once it has run.

    The rules, for every opcode alike (placeholders and ``get_attr`` included):

    * a value dies after its last user in graph order. A node that uses a
      value several times (``x + x``) counts once;
    * a value that no node uses dies right after it is computed. It comes
      first in its own node's list, so ``dead[0] is node`` tells an unused
      value;
    * the output node is no value and is never listed. What it returns dies
      at the output node itself, so nothing returned is released earlier.

    Within a list, after the node itself when unused, values come in the
    order the node's arguments mention them. Nodes after which nothing dies
    are absent. One backward walk over the graph: the first user met walking
    backwards is the last in program order.

        >>> import operator, fxloom
        >>> g = fxloom.Graph()
        >>> x = g.placeholder("x")
        >>> y = g.call_function(operator.add, (x, x))
        >>> _ = g.call_function(print, (y,))
        >>> _ = g.output(y)
        >>> {n.name: [v.name for v in dead] for n, dead in last_uses(g).items()}
        {'output': ['add'], 'print_1': ['print_1'], 'add': ['x']}
    """
    dead_after: dict[Node, list[Node]] = {}
    seen: set[Node] = set()
    root = graph._root
    node = root._prev
    while node is not root:
        dead = [node] if not node.users and node._op != "output" else None
        for value in node._input_nodes:
            if value not in seen:
                seen.add(value)
                if dead is None:
                    dead = [value]
                else:
                    dead.append(value)
        if dead is not None:
            dead_after[node] = dead
        node = node._prev
    return dead_after


def reused_argument(node: Node, dead: list[Node], reusing: dict[Any, tuple[int, Any]]) -> Any:
    """The function to call for ``node`` instead of its target, one that may write its
    result into the argument at the row's position (``reusing``:
    ``runtime_functions.reusing_functions()``), or None. Only where no one could see that
    storage afterwards, which the graph alone decides:

    * the argument is a value that dies at ``node`` (in ``dead``, ``last_uses[node]``) and
      ``node`` reads it once (it is no other argument of the same call);
    * it was made by a function whose result is new storage (``returns_fresh``), not a
      placeholder, an attribute or a view, and every other node that reads it is such a
      function too (each keeps nothing of it and makes no alias of it).
    """
    try:
        found = reusing.get(node._target)
    except TypeError:  # an unhashable callable
        return None
    if found is None:
        return None
    position, instead = found
    args = node._args
    if position >= len(args):
        return None
    value = args[position]
    if type(value) is not Node or not any(d is value for d in dead):
        return None
    reads: list[bool] = []
    map_arg((args, node._kwargs), lambda read: reads.append(read is value))
    if sum(reads) != 1:  # also x, or inside a list: the kernel would read what it writes
        return None
    if value._op != "call_function" or not returns_fresh(value._target):
        return None
    for user in value.users:
        if user is not node and (user._op != "call_function" or not returns_fresh(user._target)):
            return None
    return instead
