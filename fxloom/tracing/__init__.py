"""The pieces of the symbolic tracer; ``fxloom.tracer.Tracer`` puts them together.

Each module owns one concern of a trace, and the ``Tracer`` hooks delegate to it:

============== ===============================================================
module         owns
============== ===============================================================
root_args      the root's parameters: placeholders, defaults, ``*args``/``**kwargs``,
               ``concrete_args`` and fixed arguments (``create_args_for_root``)
patcher        replacing attributes and globals, and putting every one back
wrapped        the registry of functions ``fxloom.wrap`` makes leaves of tracing
patches        what one trace patches (module calls and attribute reads, wrapped
               and autowrapped functions, tensor factories) and the gate that
               makes every patch stand aside while example values are computed
conversions    ``bool``/``len``/``int``/``iter`` of a proxy (``to_bool``, ``length``,
               ``to_python``, ``iter``) and the run-time guards they record
examples       example inputs: binding them, computing values on demand (on stand-ins,
               for real where a question needs data)
constants      tensors captured as graph constants (``_tensor_constant0``, ...)
root_index     where the root's modules, parameters and buffers are
errors         ``TraceError`` messages naming the line, the module and a fix
============== ===============================================================

Stand-ins, the module stack, user frames and torch.fx interoperability are shared with
the other frontends and live in ``fxloom.values``. Everything here is internal: import public names from ``fxloom`` or ``fxloom.tracer``.
This package imports nothing on its own, so each piece can be imported alone.
"""
