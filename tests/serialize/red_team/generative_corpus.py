"""The valid files the generative red team mutates: one small file of every kind fxloom writes.

Each entry is a model captured the way users capture it (traced, traced with real container
modules, exported plain, with a dynamic batch and with ``fxloom.cond``, quantized, lowered to
ONNX Runtime, and the two stage modules of a pipeline), saved with ``fxloom.save`` or
``fxloom.export.save``, with the inputs it is called on. ``corpus(folder)`` builds them once
and keeps the bytes and inputs in ``folder`` (safetensors, no pickle), so a driver restarted
after a crash, or a later run given the same folder, reads the same files. Every build is seeded: the same bytes on every run.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from red_team_files import Cond, Small, exported, lowered_file, saved, saved_gm
from torch import nn

import fxloom
import fxloom.export


@dataclass(frozen=True)
class Entry:
    """One valid file: its bytes, whether ``fxloom.export.load`` reads it, its inputs."""

    name: str
    kind: str  # the kind of file the issue names: traced, exported, dynamic, cond, ...
    exported: bool
    data: bytes
    inputs: tuple[torch.Tensor, ...]


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------ the models
class Containers(nn.Module):
    """Real container modules (Sequential, ModuleDict, ParameterDict, ModuleList) in the saved
    tree, so writes into a container have a target."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        self.heads = nn.ModuleDict({"a": nn.Linear(3, 2), "b": nn.Linear(3, 2)})
        self.extra = nn.ParameterDict({"bias": nn.Parameter(torch.ones(2))})
        self.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Tanh()])

    def forward(self, x):
        h = self.seq(x)
        h = self.heads["a"](h) * 2 + self.heads["b"](h) + self.extra["bias"]
        for block in self.blocks:
            h = block(h)
        return h


class _SequentialLeaves(fxloom.Tracer):
    def is_leaf_module(self, m, qualified_name):
        return isinstance(m, nn.Sequential) or super().is_leaf_module(m, qualified_name)


def _containers_file() -> bytes:
    """Traced with Sequential as a leaf; the containers the trace flattened into plain
    ``Module`` holders are put back, as a user's GraphModule built on the model holds them."""
    model = Containers()
    gm = fxloom.GraphModule(model, _SequentialLeaves().trace(model))
    for name in ("heads", "extra", "blocks"):
        setattr(gm, name, getattr(model, name))
    return saved_gm(gm)


def _quantized_file() -> bytes:
    """A grouped convolution (``groups``, ``stride``, ``dilation`` to perturb) and a Linear."""
    from fxloom.quantize import convert, prepare

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, groups=2), nn.ReLU(), nn.Flatten(), nn.Linear(16, 2)
    ).eval()
    prepared = prepare(model, (_x(2, 2, 4, 4),))
    for _ in range(4):
        prepared(_x(2, 2, 4, 4))
    return saved_gm(convert(prepared))


class Blocks(nn.Module):
    """Four blocks whose first output's size is used after the last: a pipeline cut after
    the second block carries the size (``carry``/``uncarry``), and the dict output makes the
    last stage rebuild it (a pytree codegen with its own parameter names)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

    def forward(self, x):
        h = self.blocks[0](x)
        size = h.size()
        for block in self.blocks[1:]:
            h = block(h).relu()
        return {"out": h.view(size[0], -1) + size[1], "first": h.sum()}


def _stages() -> list[tuple[bytes, tuple]]:
    from fxloom.distributed import pipeline

    x = _x(4, 4)
    plan = pipeline(
        Blocks(), (x,), stages=2, balance=lambda n: 1.0 if n.op == "call_module" else 0.0
    )
    first, last = plan.stage_modules
    with torch.no_grad():
        sent = tuple(first(x))
    return [(saved_gm(first), (x,)), (saved_gm(last), sent)]


# ------------------------------------------------------------------ the table
def _builders() -> dict[str, tuple[str, bool, Callable[[], list[tuple[bytes, tuple]]]]]:
    from fxloom.export import Dim

    def one(build, inputs):
        return lambda: [(build(), inputs)]

    return {
        "traced": ("traced", False, one(lambda: saved(Small()), (_x(4, 3),))),
        "containers": ("traced", False, one(_containers_file, (_x(4, 3),))),
        "exported": ("exported", True, one(lambda: exported(Small(), (_x(4, 3),)), (_x(4, 3),))),
        "dynamic": (
            "dynamic",
            True,
            one(
                lambda: exported(Small(), (_x(4, 3),), dynamic_shapes={"x": {0: Dim("batch")}}),
                (_x(7, 3),),  # another batch size than the example's
            ),
        ),
        "cond": ("cond", True, one(lambda: exported(Cond(), (_x(4, 3),)), (_x(4, 3),))),
        "quantized": ("quantized", False, one(_quantized_file, (_x(2, 2, 4, 4),))),
        "lowered": ("lowered", False, one(lowered_file, (_x(4, 3),))),
        "stage": ("pipeline stage", False, _stages),
    }


def corpus(folder: Path) -> list[Entry]:
    """Every entry, built into ``folder`` on the first call and read from there after."""
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "index.json"
    if not index.exists():
        rows = []
        for name, (kind, is_exported, build) in _builders().items():
            for number, (data, inputs) in enumerate(build()):
                entry = name if number == 0 and name != "stage" else f"{name}{number}"
                (folder / f"{entry}.fxl").write_bytes(data)
                save_file({str(i): t.contiguous() for i, t in enumerate(inputs)},
                          str(folder / f"{entry}.inputs"))  # fmt: skip
                rows.append({"name": entry, "kind": kind, "exported": is_exported})
        partial = folder / f"index.{os.getpid()}.json"  # renamed into place: readers of a
        partial.write_text(json.dumps(rows))  # corpus another run is writing wait for none
        partial.replace(index)
    entries = []
    for row in json.loads(index.read_text()):
        tensors = load_file(str(folder / f"{row['name']}.inputs"))
        inputs = tuple(tensors[str(i)] for i in range(len(tensors)))
        data = (folder / f"{row['name']}.fxl").read_bytes()
        entries.append(Entry(row["name"], row["kind"], row["exported"], data, inputs))
    return entries


def load(entry: Entry, data: bytes):
    """``data`` loaded as ``entry``'s kind of file: the module, and the program (exported)."""
    if entry.exported:
        program = fxloom.export.load(io.BytesIO(data))
        return program.module(), program
    return fxloom.load(io.BytesIO(data)), None
