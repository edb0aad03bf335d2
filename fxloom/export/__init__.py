"""Export: sound, operator-level, functional capture of a module (the Export IR of the seeds).

``export(module, args, kwargs)`` runs the module once on stand-in tensors
(shapes, dtypes and devices, no data) and records every ATen operator it
dispatches. The result, an ``ExportedProgram``, is functional (no operator
writes its inputs; state the program writes comes out as extra outputs),
takes its parameters, buffers and constants as inputs, and carries the
spec's metadata on every node::

    >>> import torch
    >>> from fxloom.export import export
    >>> ep = export(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()), (torch.randn(3, 4),))
    >>> ep.graph_signature.parameters
    ['0.weight', '0.bias']
    >>> x = torch.randn(3, 4)
    >>> torch.allclose(ep.module()(x), torch.relu(x @ ep.state_dict["0.weight"].T + ep.state_dict["0.bias"]))
    True

The stand-ins (``fxloom.values.stand_in``, shared with the other frontends), the capture and
the functional rewrite are fxloom's own (``capture``, ``functionalize``); none of torch's export,
compiler, fake-tensor or functionalization machinery is used.
"""

from fxloom._lazy import lazy_names

# name -> the module defining it, imported when the name is first read (PEP 562): importing
# this package, or any module under it, costs nothing more; ``export`` brings sympy then.
_LAZY = {
    "ConstantArgument": "fxloom.export.signature",
    "ExportGraphSignature": "fxloom.export.signature",
    "InputKind": "fxloom.export.signature",
    "InputSpec": "fxloom.export.signature",
    "OutputKind": "fxloom.export.signature",
    "OutputSpec": "fxloom.export.signature",
    "TensorArgument": "fxloom.export.signature",
    "DerivedDim": "fxloom.values.symbolic.dims",
    "Dim": "fxloom.values.symbolic.dims",
    "DimHint": "fxloom.values.symbolic.dims",
    "dims": "fxloom.values.symbolic.dims",
    "DynamicShapesError": "fxloom.values.symbolic.dynamic_shapes",
    "DataDependentError": "fxloom.values.stand_in",
    "StandIn": "fxloom.values.stand_in",
    "ExportError": "fxloom.export.capture",
    "export": "fxloom.export.exporter",
    "UnsupportedOpError": "fxloom.export.functionalize",
    "ExportedProgram": "fxloom.export.program",
    "unflatten": "fxloom.export.unflattening",
    "ExportVerifierError": "fxloom.export.verifier",
    "verify": "fxloom.export.verifier",
    "save": "fxloom.serialize.exported_files",
    "load": "fxloom.serialize.exported_files",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)


__all__ = [
    "ConstantArgument",
    "DataDependentError",
    "DerivedDim",
    "Dim",
    "DimHint",
    "DynamicShapesError",
    "ExportError",
    "ExportGraphSignature",
    "ExportVerifierError",
    "ExportedProgram",
    "InputKind",
    "InputSpec",
    "OutputKind",
    "OutputSpec",
    "StandIn",
    "TensorArgument",
    "UnsupportedOpError",
    "dims",
    "export",
    "load",
    "save",
    "unflatten",
    "verify",
]
