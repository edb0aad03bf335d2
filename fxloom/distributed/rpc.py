"""Program scheduling on ``torch.distributed.rpc``: blocking remote calls overlapped with local work.

A model that fetches from a parameter server usually makes the blocking call right before
it needs the value, so the process sits idle for the round trip. fxloom does two things for
such models (declared in tables, ``fxloom.tracing.wrapped.LIBRARY_LEAVES`` and
``fxloom.passes.schedule.LIBRARY_ASYNC_CALLS``: no import of this module is needed):

* ``rpc.rpc_sync`` and ``rpc.rpc_async`` become leaves of symbolic tracing: a traced
  model's ``rpc.rpc_sync("ps", lookup, args=(ids,))`` (or a bare ``rpc_sync`` imported
  from ``torch.distributed.rpc``) is recorded as one ``call_function`` node, not run on
  proxies;
* ``schedule_async`` knows the non-blocking form of ``rpc_sync`` (``register_async``):
  ``rpc_sync(to, func, args, kwargs, timeout)`` is ``rpc_wait(rpc_async(to, func, args,
  kwargs, timeout))``. So ``schedule_async(gm)`` starts each remote call as soon as its
  arguments exist and waits for it just before its result is used (tracing and
  scheduling need no rpc agent; running does)::

    >>> import torch, fxloom
    >>> import torch.distributed.rpc as rpc
    >>> from fxloom.passes.schedule import schedule_async
    >>> def lookup(ids):  # runs on the parameter server "ps"
    ...     return TABLE[ids]
    >>> def rank(dense, ids):
    ...     h = torch.relu(dense)                             # local work
    ...     embedded = rpc.rpc_sync("ps", lookup, args=(ids,))  # blocks for a round trip
    ...     return torch.cat([h, embedded], 1)
    >>> print(schedule_async(fxloom.symbolic_trace(rank)).code.strip())
    def forward(self, dense, ids):
        rpc_sync_handle = torch.distributed.rpc.api.rpc_async('ps', lookup, args=(ids,));  ids = None
        relu = torch.relu(dense);  dense = None
        rpc_sync = rpc_wait(rpc_sync_handle);  rpc_sync_handle = None
        cat = torch.cat([relu, rpc_sync], 1);  relu = rpc_sync = None
        return cat

The scheduled module computes what the blocking one does: the same remote function on the
same arguments, its error (or timeout) raised by the wait. ``examples/rpc_schedule.py``
runs this between two processes.

What the pass assumes of a remote call: it is a read (a lookup), so it moves past local
work and overlaps other remote calls, and dead-code elimination may drop one whose value is
unused. A call made for its effect (a push of gradients) must keep its place: mark its node
with ``node.meta["is_impure"] = True`` before scheduling (or every call, with
``fxloom.has_side_effect(rpc.rpc_sync)``); it then stays among the other effects in order.

A graph that calls ``torch.distributed.rpc`` is refused by ``fxloom.save``: loading a file
must not reach other processes unless the user allows each function it calls
(``fxloom.register_serializable``).

Depends on: ``torch.distributed.rpc``, ``fxloom.passes.schedule``.
"""

from __future__ import annotations

import torch

# The wait lives with the pass that pairs it (``LIBRARY_ASYNC_CALLS``); it is public here.
from fxloom.passes.schedule import rpc_wait

__all__ = ["rpc_available", "rpc_wait"]


def rpc_available() -> bool:
    """Whether this torch build has ``torch.distributed.rpc`` (Linux builds do)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed import rpc

    return rpc.is_available()
