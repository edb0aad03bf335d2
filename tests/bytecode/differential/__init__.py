"""Differential tests of ``fxloom.compile`` that vary the call, not only the program (issue 33).

A *case* is a program (Python source defining ``f``, exec'd into a fresh module, so its
outside state is its own) and a sequence of calls. The harness runs the sequence twice, on
two fresh copies of the program's module and of the arguments: plainly, and through
``fxloom.compile``; after every call it compares results, exceptions, printed text, the
arguments and the module's state, and that the cache stays bounded (an identical call
compiles nothing). One concern per file:

- ``compare``: how two values, two exceptions and two states are compared;
- ``harness``: ``Case``, ``Call``, running a case both ways, the failures by kind;
- ``variations``: the call sequences made from one base call (aliasing, views, state advanced
  between calls, sizes, dtypes, strides, ``requires_grad``, in-place mutation, grad mode);
- ``grammar``: the hypothesis strategy of small programs, one switchable family per feature;
- ``run``: drawing many programs and summarising the failures (the CI slice, ``make
  differential``); ``summarise.py`` merges the summaries of a long run's chunks.

The tests: ``test_harness`` (the harness finds each kind of difference), ``test_variations``
(hand-written programs through every variation), ``test_generated`` (the CI slice and the
long run), ``test_fixed_cases`` (failures found and fixed in the handlers),
``test_known_cases`` (failures found on main, each a strict xfail naming its kind).
"""
