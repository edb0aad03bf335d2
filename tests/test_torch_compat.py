"""fxloom._torch_compat: each private torch entry point fxloom uses answers on this torch, and a
release without one fails the operation that needs it, naming what is missing."""

from __future__ import annotations

import pytest
import torch

from fxloom import _torch_compat as compat

aten = torch.ops.aten


def test_a_composite_operator_is_one_defined_by_other_operators():
    assert compat.has_composite_implicit_kernel(aten.reshape.default)
    assert not compat.has_composite_implicit_kernel(aten.mm.default)


def test_an_operator_with_a_schema_and_no_kernel_is_not_composite_rather_than_an_error():
    # torch itself raises "operator aten::size does not exist" for this lookup
    assert not compat.has_composite_implicit_kernel(aten.size.default)


def test_the_decomposition_tables_are_dicts_keyed_by_operator():
    assert aten.upsample_bilinear2d.vec in compat.decompositions()
    assert isinstance(compat.meta_functions(), dict)
    assert aten.silu.default in compat.core_aten_decompositions()


def test_a_dispatch_mode_is_current_inside_it_and_set_aside_on_request():
    class Mode(compat.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    assert compat.current_dispatch_mode() is None
    with Mode() as mode:
        assert compat.current_dispatch_mode() is mode
        with compat.dispatch_mode_set_aside() as aside:
            assert aside is mode and compat.current_dispatch_mode() is None
        assert compat.current_dispatch_mode() is mode


def test_is_exporting_answers_true_inside_the_block_and_false_after():
    with compat.compiler_reports(compiling=True, exporting=True):
        assert torch.compiler.is_exporting() and torch.compiler.is_compiling()
    assert not torch.compiler.is_exporting()


def test_the_python_dispatcher_runs_an_operators_python_kernel():
    x = torch.randn(1, 2, 4, 4)
    with compat.python_dispatcher():
        got = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="bilinear")
    torch.testing.assert_close(
        got, torch.nn.functional.interpolate(x, scale_factor=2.0, mode="bilinear")
    )


def test_a_missing_entry_point_fails_naming_it_and_the_supported_releases(monkeypatch):
    monkeypatch.delattr(torch._C, "_ExcludeDispatchKeyGuard")
    with pytest.raises(
        compat.MissingTorchFeature, match=r"_ExcludeDispatchKeyGuard.*compatibility"
    ):
        compat.exclude_dispatch_keys(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU))


def test_a_missing_exporting_flag_is_left_out_rather_than_failing(monkeypatch):
    monkeypatch.delattr(torch.compiler, "_is_exporting_flag")
    with compat.compiler_reports(compiling=True, exporting=True):
        assert torch.compiler.is_compiling()
