"""``OrtModule``: an ``nn.Module`` that runs one ONNX model with ONNX Runtime on the CPU.

``fxloom.lower`` puts one in place of every region of a graph it translated to ONNX; the
rest of the graph keeps running in PyTorch around it. The module holds the serialized model
(bytes, so it pickles and deep-copies like any module) and creates its
``onnxruntime.InferenceSession`` on first use, with the CPU provider and the thread and
optimization settings given. ``forward`` takes torch tensors (Python numbers for inputs
that are scalars) and returns torch tensors that share the memory ONNX Runtime filled
(``torch.from_numpy``, no copy), rebuilt into the structure the region returned
(``output_spec``: a tensor, a tuple, ...). Inputs of the wrong dtype, rank or fixed size
are refused with an error naming the region and the input, before ONNX Runtime sees them.

Inputs are handed over as NumPy views of the tensors (no copy for contiguous CPU tensors)
to ``InferenceSession.run``, whose output arrays become the result tensors. Measured on
BERT's and resnet_tiny's regions (onnxruntime 1.30, CPU), ``run`` was the fastest way in:
IOBinding took 15-20% longer per call, ``run_with_ort_values`` 50-100% longer. What the
session declares for its inputs is read once, when it starts.

Depends on: torch, numpy, ``fxloom.pytree``; onnxruntime, imported when a session is made
(``require`` says to install ``fxloom[onnx]`` when it is missing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fxloom.lower.extra import require
from fxloom.pytree import LEAF_SPEC, TreeSpec, tree_unflatten

__all__ = ["OPTIMIZATION_LEVELS", "OrtModule", "OrtInputError", "require"]

# ONNX Runtime's tensor type names (NodeArg.type) -> torch dtypes.
ORT_DTYPES: dict[str, torch.dtype] = {
    "tensor(float)": torch.float32,
    "tensor(double)": torch.float64,
    "tensor(float16)": torch.float16,
    "tensor(int64)": torch.int64,
    "tensor(int32)": torch.int32,
    "tensor(int16)": torch.int16,
    "tensor(int8)": torch.int8,
    "tensor(uint8)": torch.uint8,
    "tensor(bool)": torch.bool,
}

# graph_optimization_level by name -> the name of onnxruntime.GraphOptimizationLevel's member.
OPTIMIZATION_LEVELS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


# Session configuration entries every session gets. ONNX Runtime fuses a DequantizeLinear of a
# constant int8/int4 weight followed by MatMul (fxloom's weight-only layers, lowered by
# onnx_ops_quant) into MatMulNBits; accuracy level 4 computes it on int8 activations (per
# block: about 0.5% error), which measured 45-80x faster for 8-bit weights than levels 0/1
# (onnxruntime 1.30, one thread, 2048x2048 at batch 1: 0.4-0.55 ms against 25-42 ms, fp32
# MatMul 2.3 ms). Set explicitly since the default has changed between releases; it changes
# nothing in a model without that pattern.
SESSION_CONFIG: dict[str, str] = {"session.qdq_matmulnbits_accuracy_level": "4"}


class OrtInputError(TypeError):
    """An input to an ``OrtModule`` does not match what its ONNX model declares."""


class OrtModule(nn.Module):
    """Run a serialized ONNX model with ONNX Runtime's CPU provider (see the module docstring).

    Args:
        model_bytes: ``onnx.ModelProto.SerializeToString()`` of the model.
        name: the region's name, used in error messages and reports.
        output_spec: the structure of the region's result (``fxloom.pytree``); the
            default is a single tensor.
        scalar_outputs: positions (among the flattened outputs) of values that are Python
            numbers in PyTorch (a size read from a shape, say); ONNX Runtime's 0-d tensors
            are returned there as numbers.
        constant_outputs: positions of outputs the ONNX model does not compute because the
            translator folded them (a size fixed by the examples), and their values.
        output_layouts: positions of tensor outputs that PyTorch lays out in another order
            than row-major (a transposed view returned as it is), and that order: the
            dimensions from the largest stride to the smallest. ONNX Runtime returns them
            row-major; they are returned laid out as PyTorch had them, so code after the
            region that depends on strides (an exported graph's ``view`` of a transpose)
            runs as it does eagerly.
        fixed_inputs: positions of arguments the translator folded into the ONNX model
            (Python numbers, flags), and the values it folded; a call with another value is
            refused. The other arguments, in order, are the session's inputs.
        intra_op_num_threads: threads inside an operator; None uses
            ``torch.get_num_threads()``, so ONNX Runtime and PyTorch share the machine alike;
            0 leaves ONNX Runtime's own default (one per physical core).
        inter_op_num_threads: threads across operators (1: operators run in sequence).
        graph_optimization_level: ``"disable"``, ``"basic"``, ``"extended"`` or ``"all"``.
        allow_spinning: let ONNX Runtime's worker threads spin, waiting for work, after a
            call. Off by default: spinning threads take the cores that PyTorch needs for the
            operators between regions (measured on 2 cores: eager ResNet-50 ran 2x slower
            next to spinning sessions).

    Example::

        >>> import onnx, torch
        >>> from onnx import TensorProto, helper
        >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
        >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
        >>> graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
        >>> opsets = [helper.make_opsetid("", 18)]
        >>> model = helper.make_model(graph, opset_imports=opsets, ir_version=9)
        >>> relu = OrtModule(model.SerializeToString(), name="relu_region")
        >>> relu(torch.tensor([[-1.0, 2.0, -3.0, 4.0]]))
        tensor([[0., 2., 0., 4.]])
    """

    def __init__(
        self,
        model_bytes: bytes,
        *,
        name: str = "onnx_region",
        output_spec: TreeSpec = LEAF_SPEC,
        scalar_outputs: tuple[int, ...] = (),
        constant_outputs: dict[int, Any] | None = None,
        output_layouts: dict[int, tuple[int, ...]] | None = None,
        fixed_inputs: dict[int, Any] | None = None,
        intra_op_num_threads: int | None = None,
        inter_op_num_threads: int = 1,
        graph_optimization_level: str = "all",
        allow_spinning: bool = False,
    ) -> None:
        super().__init__()
        if graph_optimization_level not in OPTIMIZATION_LEVELS:
            raise ValueError(
                f"graph_optimization_level must be one of {', '.join(OPTIMIZATION_LEVELS)}, "
                f"got {graph_optimization_level!r}"
            )
        self.model_bytes = bytes(model_bytes)
        self.name = name
        self.output_spec = output_spec
        self.scalar_outputs = tuple(scalar_outputs)
        self.constant_outputs = dict(constant_outputs or {})
        self.output_layouts = {p: tuple(order) for p, order in (output_layouts or {}).items()}
        for position, order in self.output_layouts.items():
            ints = all(type(dimension) is int for dimension in order)
            if not ints or sorted(order) != list(range(len(order))):
                raise ValueError(
                    f"output_layouts[{position}] must order the dimensions 0..n-1, got {order}"
                )
        self.fixed_inputs = dict(fixed_inputs or {})
        self.intra_op_num_threads = intra_op_num_threads
        self.inter_op_num_threads = inter_op_num_threads
        self.graph_optimization_level = graph_optimization_level
        self.allow_spinning = allow_spinning
        self._session: Any = None

    # ------------------------------------------------------------------ session
    @property
    def session(self) -> Any:
        """The ``onnxruntime.InferenceSession``, made on first use."""
        if self._session is None:
            self._session = self._make_session()
        return self._session

    def _make_session(self) -> Any:
        ort = require("onnxruntime")
        session = ort.InferenceSession(
            self.model_bytes,
            sess_options=self.session_options(),
            providers=["CPUExecutionProvider"],
        )
        self._inputs = [_DeclaredInput.of(arg) for arg in session.get_inputs()]
        self._output_names = [arg.name for arg in session.get_outputs()]
        return session

    def session_options(self) -> Any:
        """The ``onnxruntime.SessionOptions`` its session starts with (tests add
        ``optimized_model_filepath`` to read the graph ONNX Runtime optimized)."""
        ort = require("onnxruntime")
        options = ort.SessionOptions()
        threads = self.intra_op_num_threads
        options.intra_op_num_threads = torch.get_num_threads() if threads is None else threads
        options.inter_op_num_threads = self.inter_op_num_threads
        level = OPTIMIZATION_LEVELS[self.graph_optimization_level]
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        spinning = "1" if self.allow_spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
        for key, value in SESSION_CONFIG.items():
            options.add_session_config_entry(key, value)
        return options

    def __getstate__(self) -> dict[str, Any]:
        # A session cannot be pickled or copied; the copy makes its own on first use.
        state = self.__dict__.copy()
        state["_session"] = None
        return state

    # ------------------------------------------------------------------ running
    def forward(self, *inputs: Any) -> Any:
        session = self.session
        fed = self._session_inputs(inputs)
        if len(fed) != len(self._inputs):
            names = ", ".join(declared.name for declared in self._inputs)
            raise OrtInputError(
                f"ONNX region {self.name} takes {len(self._inputs) + len(self.fixed_inputs)} "
                f"inputs ({names} and {len(self.fixed_inputs)} fixed), got {len(inputs)}"
            )
        feeds = {d.name: self._as_array(d, value) for d, value in zip(self._inputs, fed)}
        arrays = iter(session.run(self._output_names, feeds))
        outputs: list[Any] = []
        for position in range(self.output_spec.num_leaves):
            if position in self.constant_outputs:
                outputs.append(self.constant_outputs[position])
            elif position in self.scalar_outputs:
                outputs.append(next(arrays).item())
            else:
                outputs.append(self._laid_out(position, torch.from_numpy(next(arrays))))
        return tree_unflatten(outputs, self.output_spec)

    def _laid_out(self, position: int, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` in memory in the order PyTorch had it (``output_layouts``)."""
        order = self.output_layouts.get(position)
        if order is None or len(order) != tensor.dim():
            return tensor
        back = sorted(range(len(order)), key=order.__getitem__)
        return tensor.permute(order).contiguous().permute(back)

    def _session_inputs(self, inputs: tuple[Any, ...]) -> list[Any]:
        """The arguments the session takes; the folded ones must keep their folded values."""
        for position, folded in self.fixed_inputs.items():
            given = inputs[position] if position < len(inputs) else None
            if given != folded:
                raise OrtInputError(
                    f"ONNX region {self.name}: argument {position} was fixed to {folded!r} "
                    f"when it was lowered, got {given!r}; lower the model on inputs that "
                    "give this value"
                )
        return [value for i, value in enumerate(inputs) if i not in self.fixed_inputs]

    def _as_array(self, declared: _DeclaredInput, value: Any) -> np.ndarray:
        if type(value) is torch.Tensor and value.shape == declared.exact and value.is_cpu:
            # The common case, checked at once: a CPU tensor of the declared fixed shape.
            if value.dtype is declared.dtype and not value.requires_grad:
                return value.contiguous().numpy()
        if isinstance(value, (bool, int, float)) and declared.dtype is not None:
            value = torch.tensor(value, dtype=declared.dtype)  # a size fed as a 0-d tensor
        if not isinstance(value, torch.Tensor):
            raise OrtInputError(
                f"ONNX region {self.name}: input {declared.name!r} must be a tensor, "
                f"got {type(value).__name__}"
            )
        problem = declared.mismatch(value)
        if problem is not None:
            raise OrtInputError(f"ONNX region {self.name}: input {declared.name!r} {problem}")
        return value.detach().cpu().contiguous().numpy()

    def extra_repr(self) -> str:
        return f"name={self.name!r}, {len(self.model_bytes)} bytes of ONNX"


@dataclass(frozen=True)
class _DeclaredInput:
    """What the ONNX model declares for one input, read once from the session."""

    name: str
    dtype: torch.dtype | None  # None: a type this module does not map (ONNX Runtime checks it)
    shape: tuple[Any, ...]  # ints are fixed sizes; names or None are free
    exact: tuple[int, ...] | None = None  # the shape, where every size is fixed

    @classmethod
    def of(cls, arg: Any) -> _DeclaredInput:
        shape = tuple(arg.shape)
        fixed = all(type(size) is int for size in shape)
        return cls(arg.name, ORT_DTYPES.get(arg.type), shape, shape if fixed else None)

    def mismatch(self, value: torch.Tensor) -> str | None:
        """Why ``value`` cannot be fed here, or None."""
        if self.dtype is not None and value.dtype != self.dtype:
            return (
                f"must be {self.dtype}, got {value.dtype}; convert it (tensor.to({self.dtype})) "
                "or lower the model again on inputs of this dtype"
            )
        if len(self.shape) != value.dim():
            return (
                f"must have {len(self.shape)} dimensions {_shape_text(self.shape)}, "
                f"got shape {tuple(value.shape)}"
            )
        for axis, (size, got) in enumerate(zip(self.shape, value.shape)):
            if isinstance(size, int) and size != got:
                return (
                    f"has size {got} in dimension {axis}, the model was lowered for "
                    f"{_shape_text(self.shape)}; lower it on inputs of this shape"
                    + " or with this dimension in dynamic_shapes"
                    + (" (or dynamic_batch=True)" if axis == 0 else "")
                )
        return None


def _shape_text(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(s) if s is not None else "?" for s in shape) + ")"
