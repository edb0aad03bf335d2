"""Libraries written for torch.fx behave under fxloom as under torch.fx.

They register helpers with ``torch.fx.wrap`` at import time (torchvision's Swin
models) and ask ``torch.fx._symbolic_trace.is_fx_tracing()``; fxloom honours
both (``fxloom/values/fx_interop.py``). Each behaviour is compared with torch.fx.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx
import torch.fx._symbolic_trace as fx_tracer

import fxloom


def shifted_window(x: torch.Tensor, size: int) -> torch.Tensor:
    # Branches on a size: untraceable, unless recorded as one call.
    pad = (size - x.shape[-1] % size) % size
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x


torch.fx.wrap("shifted_window")  # as torchvision's swin_transformer does at import time


class Swinish(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shifted_window(x, 4) * 2


class AsksIfTracing(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fx_tracer.is_fx_tracing():
            return x + 1
        return x - 1


def targets(gm: torch.nn.Module) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_a_function_registered_with_torch_fx_wrap_is_recorded_as_one_call() -> None:
    reference = torch.fx.symbolic_trace(Swinish())
    ours = fxloom.symbolic_trace(Swinish())
    assert targets(ours)[0] is shifted_window
    assert [t.__name__ for t in targets(ours)] == [t.__name__ for t in targets(reference)]
    x = torch.randn(2, 7)
    torch.testing.assert_close(ours(x), reference(x))


def test_the_registered_function_is_put_back_after_tracing() -> None:
    original = globals()["shifted_window"]
    fxloom.symbolic_trace(Swinish())
    assert globals()["shifted_window"] is original


def test_is_fx_tracing_answers_true_while_fxloom_traces() -> None:
    x = torch.randn(3)
    reference = torch.fx.symbolic_trace(AsksIfTracing())
    ours = fxloom.symbolic_trace(AsksIfTracing())
    torch.testing.assert_close(ours(x), reference(x))
    torch.testing.assert_close(ours(x), x + 1)


def test_is_fx_tracing_answers_false_again_after_tracing() -> None:
    fxloom.symbolic_trace(AsksIfTracing())
    assert fx_tracer.is_fx_tracing() is False


def test_the_tracing_flag_is_restored_when_tracing_fails() -> None:
    class Fails(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("broken model")

    try:
        fxloom.symbolic_trace(Fails())
    except Exception:
        pass
    assert fx_tracer.is_fx_tracing() is False


# ------------------------------------------- isinstance(traced, torch.Tensor)
class AssertsTensor(torch.nn.Module):
    """As torchvision's box decoding does before it decodes."""

    def forward(self, boxes: torch.Tensor) -> torch.Tensor:
        assert isinstance(boxes, torch.Tensor)
        return boxes[:, 2:] - boxes[:, :2]


def test_a_traced_tensor_is_a_torch_tensor_when_tracing_with_example_inputs() -> None:
    boxes = torch.rand(5, 4)
    gm = fxloom.symbolic_trace(AssertsTensor(), example_inputs=(boxes,))
    torch.testing.assert_close(gm(boxes), AssertsTensor()(boxes))


def test_without_example_inputs_a_traced_value_is_no_tensor_as_in_torch_fx() -> None:
    with pytest.raises(AssertionError):
        torch.fx.symbolic_trace(AssertsTensor())
    with pytest.raises(fxloom.TraceError, match="AssertionError"):
        fxloom.symbolic_trace(AssertsTensor())


def test_a_traced_non_tensor_is_no_torch_tensor() -> None:
    seen = {}

    class AsksOfASize(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen["size"] = isinstance(x.size(0), torch.Tensor)
            return x

    fxloom.symbolic_trace(AsksOfASize(), example_inputs=(torch.rand(2),))
    assert seen == {"size": False}


def test_type_of_a_traced_tensor_stays_proxy() -> None:
    seen = {}

    class Looks(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen["type"], seen["is_proxy"] = type(x), isinstance(x, fxloom.Proxy)
            return x

    fxloom.symbolic_trace(Looks(), example_inputs=(torch.rand(2),))
    assert seen == {"type": fxloom.Proxy, "is_proxy": True}


def test_torch_functions_given_a_traced_tensor_still_record_it() -> None:
    # torch's own isinstance checks get the plain answer, so it never hands a Proxy to C++.
    class Pow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert isinstance(x, torch.Tensor)
            return torch.pow(x, 2).sum(-1)

    x = torch.randn(2, 3)
    gm = fxloom.symbolic_trace(Pow(), example_inputs=(x,))
    torch.testing.assert_close(gm(x), Pow()(x))


def test_isinstance_is_put_back_after_tracing() -> None:
    import builtins

    original = builtins.isinstance
    fxloom.symbolic_trace(AssertsTensor(), example_inputs=(torch.rand(5, 4),))
    assert builtins.isinstance is original
