"""The interpreter's instruction handlers, one family per file; importing this package
registers them all in ``fxloom.bytecode.interpreter.HANDLERS``.

Each handler is ``handler(interp, frame, instruction) -> None | Returned`` and works on the
normalised instruction form of ``fxloom.bytecode.instructions``, so none of them asks which
Python version runs.
"""

from fxloom.bytecode.handlers import (  # noqa: F401 - imported to register
    calling,
    containers,
    control,
    exceptions,
    generators,
    names,
    operators,
    stack,
    unsupported,
)
