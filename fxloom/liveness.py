"""When each value of a graph may be released: the one last-use analysis.

Generated code (``codegen``) and the ``Interpreter`` both let go of a value as
soon as no later node needs it, so a long chain of operations holds no more
tensors at once than eager execution does. Both ask ``last_uses`` which values
die after each node; neither works it out on its own.

Depends on ``node`` only (``Graph`` for type hints).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxloom.graph import Graph
    from fxloom.node import Node

__all__ = ["last_uses"]


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
