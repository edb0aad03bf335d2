"""``fxloom.lower.lower``: supported regions run in ONNX Runtime, the rest stays in PyTorch.

Every lowered module is compared with the eager model on its example inputs (and, with a
dynamic batch, on another batch size); the report is checked for what it says.
"""

from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import fxloom
from fxloom import zoo

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from fxloom.lower.lowering import LoweringError, lower  # noqa: E402
from fxloom.lower.runtime import OrtInputError, OrtModule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, str(ROOT))


# Tiny models on a busy two-core machine: one thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


def spectral_gate(x: torch.Tensor) -> torch.Tensor:
    """An operator ONNX has no translation for (an FFT), kept opaque by ``fxloom.wrap``."""
    return torch.fft.fft(x).real


fxloom.wrap("spectral_gate")


class GatedMLP(torch.nn.Module):
    """Linear layers on both sides of an unsupported operator."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 16)
        self.outer = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.inner(x))
        gated = spectral_gate(hidden)
        return torch.sigmoid(self.outer(gated)) * 2


def gated_mlp() -> tuple[GatedMLP, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return GatedMLP().eval(), (torch.randn(3, 8),)


def ort_regions(lowered: fxloom.GraphModule) -> list[str]:
    return [name for name, m in lowered.named_children() if isinstance(m, OrtModule)]


def eager(model: torch.nn.Module, inputs: tuple) -> torch.Tensor:
    with torch.no_grad():
        return model(*inputs)


# ---------------------------------------------------------------- splitting
def test_an_unsupported_operator_in_the_middle_leaves_two_regions_around_it():
    model, inputs = gated_mlp()
    lowered = lower(model, inputs)
    assert ort_regions(lowered) == ["_run_on_acc_0", "_run_on_acc_1"]
    code = lowered.code
    first, gate, second = (code.index(s) for s in ("_acc_0(x)", "spectral_gate =", "_acc_1("))
    assert first < gate < second  # PyTorch runs the gate between the two regions
    assert_close(eager(lowered, inputs), eager(model, inputs), rtol=1e-4, atol=1e-5)


def test_the_lowered_module_matches_eager_on_other_inputs_of_the_same_shape():
    model, inputs = gated_mlp()
    lowered = lower(model, inputs)
    other = (torch.randn(3, 8),)
    assert_close(eager(lowered, other), eager(model, other), rtol=1e-4, atol=1e-5)


def test_the_report_names_the_unsupported_operator_its_reason_and_source_line():
    model, inputs = gated_mlp()
    report = lower(model, inputs).lowering_report
    (left,) = report.left
    assert left.name == "spectral_gate"
    assert "no ONNX translation" in left.reason
    assert left.source is not None and "test_lower.py" in left.source
    assert "spectral_gate(hidden)" in left.source
    assert [region.lowered for region in report.regions] == [True, True]
    assert report.regions[0].ops == {"Linear": 1, "torch.relu": 1}
    text = str(report)
    assert "2 of 2 regions in onnxruntime" in text and "%spectral_gate" in text


def test_the_report_prints_as_a_rich_table():
    from rich.console import Console

    model, inputs = gated_mlp()
    console = Console(record=True, width=120)
    console.print(lower(model, inputs).lowering_report)
    shown = console.export_text()
    assert "_run_on_acc_1" in shown and "PyTorch" in shown and "onnxruntime" in shown


def test_a_region_that_does_no_arithmetic_stays_in_pytorch():
    def reshape_around_gate(x: torch.Tensor) -> torch.Tensor:
        return spectral_gate(x.relu()).reshape(-1)

    lowered = lower(reshape_around_gate, (torch.randn(2, 3),))
    regions = {region.name: region for region in lowered.lowering_report.regions}
    assert regions["_run_on_acc_0"].lowered
    assert not regions["_run_on_acc_1"].lowered
    assert "no arithmetic" in regions["_run_on_acc_1"].reason
    assert ort_regions(lowered) == ["_run_on_acc_0"]


# ---------------------------------------------------------------- check, errors, the user's model
def test_check_records_the_largest_error_against_eager():
    model, inputs = gated_mlp()
    check = lower(model, inputs, check=True).lowering_report.check
    assert check is not None and check.passed
    assert check.max_abs_error < 1e-5 and check.max_rel_error < 1e-5


def test_check_raises_when_the_lowered_model_differs_from_eager():
    model, inputs = gated_mlp()
    with pytest.raises(LoweringError, match="differs from eager PyTorch"):
        lower(model, inputs, check=True, rtol=0.0, atol=0.0)  # ORT rounds differently


def test_the_users_module_is_unchanged():
    model, inputs = gated_mlp()
    before = copy.deepcopy(model.state_dict())
    children = dict(model.named_children())
    lower(model, inputs, check=True)
    assert dict(model.named_children()) == children
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name])


def test_a_traced_graph_module_is_lowered_and_left_unchanged():
    model, inputs = gated_mlp()
    gm = fxloom.symbolic_trace(model)
    code = gm.code
    lowered = lower(gm, inputs)
    assert gm.code == code and not ort_regions(gm)
    assert_close(eager(lowered, inputs), eager(model, inputs), rtol=1e-4, atol=1e-5)


def test_an_unknown_backend_is_refused():
    model, inputs = gated_mlp()
    with pytest.raises(ValueError, match="no backend .tensorrt.; known: eager, onnxruntime"):
        lower(model, inputs, backend="tensorrt")


def test_without_onnxruntime_the_error_names_the_extra(monkeypatch):
    model, inputs = gated_mlp()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"pip install fxloom\[onnx\]"):
        lower(model, inputs)


# ---------------------------------------------------------------- dynamic batch, inputs
def test_dynamic_batch_runs_at_other_batch_sizes():
    model, inputs = gated_mlp()
    lowered = lower(model, inputs, dynamic_batch=True)
    for batch in (1, 7):
        x = (torch.randn(batch, 8),)
        assert_close(eager(lowered, x), eager(model, x), rtol=1e-4, atol=1e-5)


class PositionalMLP(torch.nn.Module):
    """A region fed a tensor with no batch dimension (positions made in PyTorch)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(4, 8))
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = spectral_gate(self.table)  # (4, 8): the same for every batch
        return torch.relu(self.linear(x + positions))


def test_dynamic_batch_lowers_a_region_fed_a_tensor_without_the_batch():
    torch.manual_seed(0)
    model = PositionalMLP().eval()
    lowered = lower(model, (torch.randn(2, 4, 8),), dynamic_batch=True)
    (region,) = lowered.lowering_report.regions
    assert region.lowered, str(lowered.lowering_report)
    x = (torch.randn(5, 4, 8),)
    assert_close(eager(lowered, x), eager(model, x))


def row_count(x: torch.Tensor) -> int:
    """The batch size, computed in PyTorch (wrapped) and passed to a region as a number."""
    return int(x.shape[0])


fxloom.wrap("row_count")


class RowsFromPyTorch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = row_count(x)
        return torch.relu(self.linear(x)).reshape(rows, 2, 4)


def test_dynamic_batch_keeps_a_region_fed_a_number_that_changes_with_the_batch_in_pytorch():
    torch.manual_seed(0)
    model = RowsFromPyTorch().eval()
    lowered = lower(model, (torch.randn(2, 8),), dynamic_batch=True)
    (region,) = lowered.lowering_report.regions
    assert not region.lowered
    assert region.reason.startswith("dynamic_batch: its input 1 (2) changes with batch")
    x = (torch.randn(5, 8),)
    assert_close(eager(lowered, x), eager(model, x))


def test_a_static_region_refuses_another_batch_size_by_name():
    model, inputs = gated_mlp()
    lowered = lower(model, inputs)
    with pytest.raises(OrtInputError, match="_run_on_acc_0.*dynamic_shapes"):
        lowered.get_submodule("_run_on_acc_0")(torch.randn(5, 8))


def test_a_region_refuses_an_input_of_the_wrong_dtype_by_name():
    model, inputs = gated_mlp()
    region = lower(model, inputs).get_submodule("_run_on_acc_0")
    with pytest.raises(OrtInputError, match="_run_on_acc_0: input .* must be torch.float32"):
        region(torch.randn(3, 8, dtype=torch.float64))


def test_the_lowered_module_pickles_and_deep_copies():
    model, inputs = gated_mlp()
    lowered = lower(model, inputs)
    expected = eager(lowered, inputs)
    for copied in (pickle.loads(pickle.dumps(lowered)), copy.deepcopy(lowered)):
        assert_close(eager(copied, inputs), expected)


def test_thread_settings_reach_the_sessions():
    model, inputs = gated_mlp()
    region = lower(model, inputs, threads=2).get_submodule("_run_on_acc_0")
    assert region.intra_op_num_threads == 2
    assert region.session.get_session_options().intra_op_num_threads == 2


def spins(region: OrtModule) -> str:
    options = region.session.get_session_options()
    return options.get_session_config_entry("session.intra_op.allow_spinning")


def test_one_region_covering_the_model_gets_onnx_runtimes_default_settings():
    model, inputs = zoo.build("resnet_tiny")
    lowered = lower(model.eval(), inputs)
    region = lowered.get_submodule("_run_on_acc_0")
    assert region.session.get_session_options().intra_op_num_threads == 0  # one per core
    assert spins(region) == "1"
    assert "one region covers the model: ONNX Runtime's default threads, spinning on" in (
        lowered.lowering_report.notes
    )


def test_regions_with_pytorch_between_them_do_not_spin_and_take_torchs_threads():
    model, inputs = gated_mlp()
    lowered = lower(model, inputs)
    for name in ort_regions(lowered):
        region = lowered.get_submodule(name)
        assert spins(region) == "0"
        assert region.session.get_session_options().intra_op_num_threads == 1  # one_thread
    assert "PyTorch runs between regions: 1 ONNX Runtime thread, spinning off" in (
        lowered.lowering_report.notes
    )


def test_threads_and_spinning_given_win_over_the_defaults():
    model, inputs = zoo.build("resnet_tiny")
    region = lower(model.eval(), inputs, threads=1, spinning=False).get_submodule("_run_on_acc_0")
    assert region.session.get_session_options().intra_op_num_threads == 1
    assert spins(region) == "0"


# ---------------------------------------------------------------- embedded models
@pytest.mark.parametrize("name", ["resnet_tiny", "transformer_tiny", "mlp_tiny", "cnn_small"])
def test_embedded_models_are_lowered_and_match_eager(name):
    model, inputs = zoo.build(name)
    lowered = lower(model.eval(), inputs, check=True)
    report = lowered.lowering_report
    assert report.lowered, str(report)
    assert_close(eager(lowered, inputs), eager(model, inputs), rtol=1e-4, atol=1e-4)


def test_resnet_tiny_is_lowered_whole_into_one_region():
    model, inputs = zoo.build("resnet_tiny")
    report = lower(model.eval(), inputs).lowering_report
    assert len(report.regions) == 1 and report.regions[0].lowered
    assert report.nodes_in_pytorch == 0, str(report)


def test_resnet_tiny_with_a_dynamic_batch():
    model, inputs = zoo.build("resnet_tiny")
    lowered = lower(model.eval(), inputs, dynamic_batch=True)
    x = (torch.randn(4, *inputs[0].shape[1:]),)
    assert_close(eager(lowered, x), eager(model, x), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- Hugging Face models
@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_hugging_face_models_are_lowered_and_match_eager(name):
    pytest.importorskip("transformers")
    from benchmarks.zoo.methods import fixed_args
    from benchmarks.zoo.registry import get

    model, inputs = get(name).build()
    model.eval()
    flags = fixed_args(model, inputs)
    lowered = lower(model, inputs, check=True, concrete_args=flags)
    assert lowered.lowering_report.lowered, str(lowered.lowering_report)


# ---------------------------------------------------------------- layouts
class TransposeThenSort(torch.nn.Module):
    """A region returning a transposed view, then an operator ONNX has no translation for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort((x * 2).transpose(1, 2)).values


def test_a_region_returns_a_transposed_result_laid_out_as_pytorch_had_it():
    x = torch.randn(2, 3, 4)
    lowered = lower(TransposeThenSort(), (x,))
    (name,) = ort_regions(lowered)
    region = getattr(lowered, name)
    got, expected = region(x), (x * 2).transpose(1, 2)
    assert region.output_layouts == {0: (0, 2, 1)}
    assert got.stride() == expected.stride()
    assert_close(got, expected)


def test_output_layouts_must_order_every_dimension_once():
    with pytest.raises(ValueError, match=r"output_layouts\[0\] must order the dimensions"):
        OrtModule(b"", output_layouts={0: (0, 0, 1)})


def test_a_saved_lowered_module_keeps_its_regions_layouts(tmp_path):
    x = torch.randn(2, 3, 4)
    lowered = lower(TransposeThenSort(), (x,))
    fxloom.save(lowered, tmp_path / "lowered.fxl")
    loaded = fxloom.load(tmp_path / "lowered.fxl")
    (name,) = ort_regions(loaded)
    assert getattr(loaded, name).output_layouts == {0: (0, 2, 1)}
    assert_close(loaded(x), lowered(x))
