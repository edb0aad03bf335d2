"""The rules that made ``fxloom/serialize/torch_names.py``, the torch functions and Tensor
methods a saved graph may call, and the command that writes the lists again for a new torch:

    python -m tests.serialize.torch_functions_rules --write

Review the diff it makes before committing it: each new name is a function a file may make
fxloom call. ``tests/serialize/test_call_table.py`` checks that the list is what these rules
give on the pinned torch, so a torch upgrade cannot widen it unseen.

The rules: the public functions of torch's function namespaces (and of the C namespaces
their functions print as, ``torch._C._nn.gelu`` for ``F.gelu``), listed under the name they
print as, except classes, modules and what ``DENIED`` names: functions that change
process-wide state, touch files, import or compile code, call a function they are given,
wrap foreign memory, or build tensors without checking them.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types
from pathlib import Path

import torch

from fxloom._format import qualified_name

LIST_PATH = Path(__file__).resolve().parents[2] / "fxloom" / "serialize" / "torch_names.py"
NAMESPACES = (
    "torch",
    "torch.nn.functional",
    "torch.special",
    "torch.linalg",
    "torch.fft",
    "torch._C._nn",
    "torch._C._fft",
    "torch._C._linalg",
    "torch._C._special",
)
# Why each is refused, by the last part of its name (a pattern where a family shares a prefix).
DENIED: dict[str, str] = {
    r"set_.*|use_deterministic_algorithms|init_num_threads|prepare_multiprocessing_environment": "changes process-wide state",
    r"manual_seed|seed|initial_seed|thread_safe_generator": "changes or reads the random generator's seed",
    r".*autocast.*|profiler_.*": "changes process-wide state",
    r"load|save|from_file|get_file_path": "touches files",
    r"compile|import_ir_module.*|parse_ir|parse_schema|parse_type_comment|merge_type_from_type_comment|unify_type_list|compiled_with_cxx11_abi": "compiles or parses code",
    r"get_device_module|typename|classproperty": "returns Python objects beyond tensors",
    r"from_numpy|frombuffer|from_dlpack|asarray|_to_dlpack": "wraps memory it is given",
    r"vmap|cond|while_loop|fork|wait|lobpcg|triplet_margin_with_distance_loss|handle_torch_function|boolean_dispatch|_has_torch_function.*": "calls a function it is given",
    r"(?:cudnn|miopen|mkldnn|fbgemm)_.*": "a backend kernel's entry point, trusting its inputs to come from torch's own layers",
    r"sparse_.*tensor|sym_fresh_size": "builds tensors or sizes without checking them",
}
# Private names that captured graphs hold, listed with why they are safe.
EXTRA_FUNCTIONS: dict[str, str] = {
    "torch._assert": "what an `assert` becomes in a traced graph: raises if its condition is false",
}
_DENIED = re.compile("|".join(f"(?:{pattern})" for pattern in DENIED))
# Tensor methods refused, and why: each leaves torch's values (raw memory, numpy, storages),
# calls a function it is given, or changes what a tensor is backed by.
DENIED_METHODS: dict[str, str] = {
    "numpy tolist data_ptr const_data_ptr storage untyped_storage storage_type": "leaves torch's values",
    "apply_ map_ map2_ register_hook register_post_accumulate_grad_hook backward": "calls a function",
    "as_subclass module_load set_ share_memory_ sparse_resize_ sparse_resize_and_clear_": "changes what backs a tensor",
    "resize_as_sparse_ to_sparse to_sparse_coo to_sparse_csr to_sparse_csc to_sparse_bsr to_sparse_bsc to_mkldnn": "makes layouts files do not hold",
}
_DENIED_METHODS = frozenset(" ".join(DENIED_METHODS).split())


def allowed_methods() -> list[str]:
    """Public methods of ``torch.Tensor`` (not properties), minus ``DENIED_METHODS``, sorted."""
    names = set(vars(torch.Tensor)) | set(vars(torch._C.TensorBase))
    return sorted(
        name
        for name in names
        if not name.startswith("_")
        and name not in _DENIED_METHODS
        and callable(getattr(torch.Tensor, name, None))
        and not isinstance(inspect.getattr_static(torch.Tensor, name), property)
    )


def allowed_names() -> list[str]:
    """The torch functions the rules give on this torch, sorted."""
    names = set()
    for namespace in NAMESPACES:
        module = importlib.import_module(namespace)
        for attr, value in vars(module).items():
            if (
                attr.startswith("_")
                or not callable(value)
                or isinstance(value, (type, types.ModuleType))
            ):
                continue
            try:
                name = qualified_name(value)
            except Exception:  # an object that cannot say its name is not listed
                continue
            owner, _, last = name.rpartition(".")
            if owner in NAMESPACES and not _DENIED.fullmatch(last):
                names.add(name)
    return sorted(names | set(EXTRA_FUNCTIONS))


def render(functions: list[str], methods: list[str]) -> str:
    """The module's text: two sorted frozensets of names."""
    version = torch.__version__.split("+")[0]
    lines = [
        f'"""The torch functions and Tensor methods a saved graph may call (torch {version}).',
        "",
        "Written by ``python -m tests.serialize.torch_functions_rules --write`` from the rules",
        "there; review the diff before committing. ``fxloom.serialize.call_table`` reads them.",
        '"""',
        "",
        "TORCH_FUNCTIONS = frozenset(",
        "    {",
        *(f'        "{name}",' for name in functions),
        "    }",
        ")",
        "TENSOR_METHODS = frozenset(",
        "    {",
        *(f'        "{name}",' for name in methods),
        "    }",
        ")",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m tests.serialize.torch_functions_rules --write")
    LIST_PATH.write_text(render(allowed_names(), allowed_methods()))
    print(f"wrote {LIST_PATH}")
