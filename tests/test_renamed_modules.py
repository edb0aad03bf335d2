"""``fxloom._renamed_modules``: modules fxloom moved are found under their old names, so that a
pickle made before the move (it names ``fxloom.export.stand_in._rebuild``) still loads."""

from __future__ import annotations

import importlib
import pickle

import pytest
import torch

import fxloom
from fxloom._renamed_modules import new_name
from fxloom.export import export
from fxloom.values.stand_in import StandIn


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def as_before_the_move(data: bytes) -> bytes:
    """A pickle as fxloom wrote it when stand-ins lived in ``fxloom.export`` (same length)."""
    assert b"fxloom.values.stand_in" in data
    return data.replace(b"fxloom.values.stand_in", b"fxloom.export.stand_in")


def test_an_old_name_is_the_moved_module_itself() -> None:
    old = importlib.import_module("fxloom.export.stand_in")
    assert old is importlib.import_module("fxloom.values.stand_in")
    assert old.__spec__.name == "fxloom.values.stand_in"


def test_a_stand_in_pickled_under_its_old_path_loads() -> None:
    stand_in = StandIn(torch.empty(2, 3, device="meta"), torch.device("cpu"))
    loaded = pickle.loads(as_before_the_move(pickle.dumps(stand_in)))
    assert isinstance(loaded, StandIn) and loaded.shape == (2, 3)


def test_an_exported_module_pickled_under_the_old_path_loads_and_runs() -> None:
    gm = export(Double(), (torch.ones(3),)).module()
    loaded = pickle.loads(as_before_the_move(pickle.dumps(gm)))
    assert isinstance(loaded, fxloom.GraphModule)
    assert torch.equal(loaded(torch.ones(3)), torch.full((3,), 2.0))


def test_a_package_row_covers_the_modules_inside_it() -> None:
    assert new_name("fxloom.export.symbolic.shape_env") == "fxloom.values.symbolic.shape_env"


@pytest.mark.parametrize(
    "old, new",
    [
        ("fxloom.export.size_checks", "fxloom.values.symbolic.size_checks"),
        ("fxloom.export.size_trees", "fxloom.values.symbolic.size_trees"),
        ("fxloom.export.dims", "fxloom.values.symbolic.dims"),
        ("fxloom.export.sizes.dims", "fxloom.values.symbolic.dims"),
        ("fxloom.export.sizes.input_sizes", "fxloom.values.symbolic.input_sizes"),
    ],
)
def test_the_size_files_are_found_under_their_names_before_they_moved(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)


def test_a_name_that_never_existed_is_still_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("fxloom.export.never_was")


def test_an_old_module_name_that_is_now_a_public_function_leaves_the_function_in_place() -> None:
    import fxloom.export

    importlib.import_module("fxloom.export.dims")  # what loading an old pickle does
    assert callable(fxloom.export.dims)
    assert fxloom.export.dims("a", "b")[1].__name__ == "b"
