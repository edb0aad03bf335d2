"""Operator facts: what fxloom knows about the operations a graph calls, one table per fact.

Codegen, the tracer, ``Node.is_impure`` and the passes read these tables; none keeps a copy.
Each module holds one kind of fact:

===================== =================================================================
module                what it knows, and how to extend it
===================== =================================================================
``identity``          one key per operator: ``op_key(spelling)`` maps a module class, torch,
                      ``F``, Tensor method, ATen overload or packet, Python operator and
                      in-place twin to ``OpKey(name, in_place)``. The tables below are
                      ``OpTable``/``OpSet``: a row given for one spelling serves them all.
                      Extend ``ALIASES``, ``RENAMED`` or ``MODULE_KEYS`` for spellings
                      torch's namespaces do not tell.
``python_operators``  ``PYTHON_OPERATORS``: each Python operator's ``operator`` function,
                      token, arity, kind and magic method. ``Proxy`` installs its magic
                      methods from it, codegen prints operators with it. Closed: it is
                      Python's grammar.
``mutation``          what a call writes: the in-place operators, the in-place naming rule
                      (``add_``), mutating torch.ops overloads (their schemas), ``out=`` and
                      ``inplace=True``. Extend ``SIDE_EFFECT_FUNCTIONS`` with
                      ``fxloom.has_side_effect(fn)``, and say what such a function writes
                      with ``READ_ONLY_EFFECTS.add(fn)`` (nothing) or
                      ``WRITES_FIRST_ARGUMENT.add(fn)`` (its first argument only).
``effects``           randomness, module purity, results that share no storage with their
                      inputs: ``RANDOM_FUNCTIONS[fn] = None``, ``RANDOM_METHODS``,
                      ``RANDOM_MODULES[cls] = predicate``, ``MODULE_PURITY[cls] = predicate``,
                      ``FRESH_RESULT_FUNCTIONS``/``_MODULES``; views:
                      ``VIEW_OPS``, ``VIEW_IF_CONTIGUOUS`` and ``view_kind``.
``signatures``        the parameters each argument of a call binds to (for ``normalize``):
                      ``SIGNATURES[fn] = inspect.Signature`` or a function with the same one;
                      ``parameter_names`` for formulas that read arguments by name.
``flops``             FLOP formulas (for ``cost``): ``@register_flop_formula(fn)`` for an
                      operator in any spelling, a module class, or a function of yours.
``runtime_functions`` fxloom's own functions that graphs call at run time (guards, input
                      and size checks, ``cond_op``): one row each, with its effect, whether
                      exported graphs, files and backends take it, and its TorchScript twin.
                      Closed: a new one is a new row.
===================== =================================================================

Tables of operator facts are keyed by operator key (``identity``); module classes keep rows
of their own where a row reads the module (matched along the MRO where the table says so);
functions of yours by identity.

Layering: ``fxloom.ops`` is in fxloom's foundation layer, below the IR: it depends on torch,
the standard library and the other foundation modules (``fxloom.pytree``) only, so the IR,
capture and the passes can all read it. It reads nodes and modules it is given but imports
nothing above it (annotations name ``Node`` for type checkers only; ``GraphModule`` registers its
``__call__`` in ``signatures.FORWARD_BINDING_CALLS`` itself). ``fxloom.passes._effects`` combines ``mutation`` and ``effects`` over a graph.
"""
