"""``dynamic_shapes`` for ``lower`` and ``to_onnx``: batch and sequence length both free.

``fxloom.export``'s form (a dict by parameter name of ``{dimension: Dim}``) says which input
dimensions vary; the ONNX inputs and outputs declare them symbolic, named after their Dims,
so ONNX Runtime runs the file at other sizes without a warning. Numerics are compared with
eager on two sizes other than the examples'.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytest.importorskip("transformers")

import onnxruntime  # noqa: E402

import fxloom  # noqa: E402
from fxloom.export import Dim  # noqa: E402
from fxloom.lower import lower, to_onnx  # noqa: E402
from fxloom.lower.dynamic_dims import SizeRun, dim_names  # noqa: E402
from fxloom.values.symbolic.dynamic_shapes import DynamicShapesError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.zoo.methods import fixed_args  # noqa: E402
from benchmarks.zoo.registry import get  # noqa: E402

OTHER_SIZES = [(1, 5), (3, 13)]  # (batch, sequence), neither the examples' (2, 7)


# Tiny models on a busy two-core machine: one thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bert():
    spec = get("bert")
    model, inputs = spec.build()
    model.eval()
    fixed = fixed_args(model, inputs)
    return spec, model, inputs, fixed


def batch_and_sequence(inputs: dict) -> dict:
    batch, seq = Dim("batch", max=16), Dim("seq", max=32)
    return {name: {0: batch, 1: seq} for name in inputs}


def outputs_of(value) -> list[torch.Tensor]:
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    return [v for v in fxloom.pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def eager(model, inputs: dict, fixed: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        return outputs_of(model(**inputs, **fixed))


def quiet_session(path: Path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 2  # warnings, such as an output of another shape than declared
    return onnxruntime.InferenceSession(
        str(path), sess_options=options, providers=["CPUExecutionProvider"]
    )


def assert_no_onnxruntime_warning(capfd) -> None:
    """ONNX Runtime logs from C++ to the process's stderr: "[W:onnxruntime:, ...] Expected
    shape from model of {2,7,32} does not match actual shape ..." for an output declared at
    the example's size."""
    logged = capfd.readouterr()
    assert "W:onnxruntime" not in logged.out + logged.err, logged


def bert_file(bert, tmp_path: Path) -> Path:
    spec, model, inputs, fixed = bert
    gm = fxloom.symbolic_trace(model, fixed, example_inputs=inputs)
    path = tmp_path / "bert.onnx"
    to_onnx(gm, inputs, path, dynamic_shapes=batch_and_sequence(inputs))
    return path


def test_bert_file_runs_at_two_other_batch_sizes_and_lengths_without_a_warning(
    bert, tmp_path, capfd
):
    spec, model, _, fixed = bert
    session = quiet_session(bert_file(bert, tmp_path))
    capfd.readouterr()
    for batch, seq in OTHER_SIZES:
        inputs = spec.make_inputs(batch, seq)
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        for value, expected in zip(got, eager(model, inputs, fixed)):
            assert_close(torch.from_numpy(value), expected, rtol=1e-4, atol=1e-5)
    assert_no_onnxruntime_warning(capfd)


def test_bert_file_declares_its_outputs_with_the_dims_names(bert, tmp_path):
    proto = onnx.load(str(bert_file(bert, tmp_path)))
    shapes = [
        [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        for value in (*proto.graph.input, *proto.graph.output)
    ]
    assert shapes == [["batch", "seq"], ["batch", "seq"], ["batch", "seq", 32], ["batch", 32]]


def test_lowered_bert_with_dynamic_batch_and_sequence_matches_eager_at_two_other_sizes(bert, capfd):
    spec, model, inputs, fixed = bert
    lowered = lower(
        model, inputs, concrete_args=fixed, dynamic_shapes=batch_and_sequence(inputs), threads=1
    )
    assert lowered.lowering_report.lowered, str(lowered.lowering_report)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch, seq in OTHER_SIZES:
            other = spec.make_inputs(batch, seq)
            with torch.no_grad():
                got = outputs_of(lowered(**other))
            for value, expected in zip(got, eager(model, other, fixed), strict=True):
                assert_close(value, expected, rtol=1e-4, atol=1e-5)
    assert not [str(w.message) for w in caught if "shape" in str(w.message).lower()]
    assert_no_onnxruntime_warning(capfd)


def test_dynamic_batch_is_sugar_for_a_batch_dim_on_every_input(bert, tmp_path):
    spec, model, inputs, fixed = bert
    gm = fxloom.symbolic_trace(model, fixed, example_inputs=inputs)
    proto = to_onnx(gm, inputs, tmp_path / "bert.onnx", dynamic_batch=True)
    outputs = [
        [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
        for o in proto.graph.output
    ]
    assert outputs == [["batch", 7, 32], ["batch", 32]]


def test_dynamic_batch_and_dynamic_shapes_together_are_refused(bert, tmp_path):
    spec, model, inputs, fixed = bert
    with pytest.raises(ValueError, match="give dynamic_shapes only"):
        lower(model, inputs, concrete_args=fixed, dynamic_batch=True, dynamic_shapes={})


def test_a_dynamic_shapes_name_forward_does_not_take_is_refused_by_name(bert):
    spec, model, inputs, fixed = bert
    with pytest.raises(DynamicShapesError, match="'ids'"):
        lower(model, inputs, concrete_args=fixed, dynamic_shapes={"ids": {0: Dim("batch")}})


def test_a_size_changed_by_two_dims_gets_a_name_of_its_own():
    runs = [SizeRun((), {(2, 4): "batch"}), SizeRun((), {(8, 16): "seq"})]
    # (batch * seq, 32) after a flatten: 16 -> 32 in the batch run and 16 -> 32 in the seq run
    assert dim_names((16, 32), [(32, 32), (32, 32)], runs, "output_0") == ["output_0_dim_0", 32]


def test_a_dim_that_follows_one_dim_takes_its_name():
    runs = [SizeRun((), {(2, 4): "batch"}), SizeRun((), {(8, 16): "seq"})]
    assert dim_names((2, 8, 32), [(4, 8, 32), (2, 16, 32)], runs, "x") == ["batch", "seq", 32]


def test_positional_inputs_take_dynamic_shapes_by_name_or_as_a_tuple(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    gm = fxloom.symbolic_trace(model, example_inputs=(x,))
    name = gm.graph.find_nodes(op="placeholder")[0].target
    for shapes in ({name: {0: Dim("batch")}}, ({0: Dim("batch")},)):
        proto = to_onnx(model, (x,), tmp_path / "mlp.onnx", dynamic_shapes=shapes)
        output = proto.graph.output[0].type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in output] == ["batch", 3]


def test_a_dim_whose_range_holds_only_the_example_is_refused_by_name():
    model = torch.nn.Linear(4, 3).eval()
    only_two = Dim("rows", min=2, max=2)
    with pytest.raises(DynamicShapesError, match="Dim\\('rows', min=2, max=2\\) can take no size"):
        lower(model, (torch.randn(2, 4),), dynamic_shapes=({0: only_two},))


class ReturnsItsBatch(torch.nn.Module):
    """A region that returns a size (the batch) as well as a tensor: PyTorch reads both."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return torch.sort(y).values.reshape(y.shape[0], -1) + 1


def test_a_size_a_region_returns_follows_the_batch():
    model, x = ReturnsItsBatch(), torch.randn(2, 3, 4)
    lowered = lower(model, (x,), dynamic_batch=True)
    assert lowered.lowering_report.lowered
    other = torch.randn(5, 3, 4)
    assert_close(lowered(other), model(other))
