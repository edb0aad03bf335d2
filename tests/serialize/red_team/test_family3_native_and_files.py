"""Family 3 of issue 21: native memory corruption and file access from a graph.

Every ``torch.ops`` operator is allowed today: operators that read or write files by a path
string, unchecked sparse constructors (a file-chosen out-of-bounds write), storage and
``set_`` operators, mutating and ``out=`` overloads. An ONNX Runtime region may point its
tensors at external files, use custom-op domains, or ask for 200,000 threads. Each file must
be refused while loading; a crash is reported with its signal.
"""

import pytest
from red_team_files import (
    call,
    edited,
    graph_with,
    lowered_file,
    ort_records,
    ref,
    with_onnx_model,
)
from red_team_harness import Case, assert_refused, family

LONG = {"dtype": "long"}


def _ops(id, doc, *nodes) -> Case:
    return Case(id, doc, lambda: graph_with(*nodes))


def _index(name, value, shape=(1, 1)):
    """A long tensor of ``shape`` filled with ``value`` (built by the graph)."""
    return call(name, "torch.ops.aten.full.default", list(shape), value, dtype=LONG)


ONES = call("vals", "torch.ops.aten.ones.default", [1])
BIG = 10**8

CASES = [
    _ops(
        "aten.from_file-creates-a-file",
        "aten.from_file(shared=True) creates a file in the cwd",
        call("f", "torch.ops.aten.from_file.default", "fxloom_red_team_created.bin", True, 4096),
    ),
    _ops(
        "aten.from_file-reads-etc-passwd",
        "aten.from_file reads any file of the machine",
        call(
            "f",
            "torch.ops.aten.from_file.default",
            "/etc/passwd",
            False,
            16,
            dtype={"dtype": "uint8"},
        ),
    ),
    _ops(
        "aten.from_file-overload-packet",
        "aten.from_file (packet, no overload) reads a file",
        call("f", "torch.ops.aten.from_file", "/etc/hostname", False, 1, dtype={"dtype": "uint8"}),
    ),
    _ops(
        "aten.save-writes-a-file",
        "aten.save(x, path) writes a file",
        call("f", "torch.ops.aten.save.default", ref("x"), "fxloom_red_team_saved.pt"),
    ),
    _ops(
        "sparse_coo_with_dims_and_tensors-out-of-bounds",
        "_sparse_coo_tensor_with_dims_and_tensors with an index far out of range, densified",
        _index("idx", BIG),
        ONES,
        call(
            "sp",
            "torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors.default",
            1,
            0,
            [4],
            ref("idx"),
            ref("vals"),
            dtype={"dtype": "float"},
            layout={"layout": "sparse_coo"},
        ),
        call("dense", "torch.ops.aten.to_dense.default", ref("sp")),
    ),
    _ops(
        "sparse_coo_tensor_unsafe-out-of-bounds",
        "_sparse_coo_tensor_unsafe with an index far out of range, densified",
        _index("idx", BIG),
        ONES,
        call(
            "sp", "torch.ops.aten._sparse_coo_tensor_unsafe.default", ref("idx"), ref("vals"), [4]
        ),
        call("dense", "torch.ops.aten.to_dense.default", ref("sp")),
    ),
    _ops(
        "torch.sparse_coo_tensor-check_invariants-false",
        "the public torch.sparse_coo_tensor with check_invariants=False and a bad index",
        _index("idx", BIG),
        ONES,
        call("sp", "torch.sparse_coo_tensor", ref("idx"), ref("vals"), [4], check_invariants=False),
        call("dense", "to_dense", ref("sp"), op="call_method"),
    ),
    _ops(
        "sparse_csr_tensor_unsafe-bad-columns",
        "_sparse_csr_tensor_unsafe with column indices out of range, densified",
        call("crow", "torch.ops.aten.arange.start", 0, 2, dtype=LONG),
        _index("col", BIG, (1,)),
        ONES,
        call(
            "sp",
            "torch.ops.aten._sparse_csr_tensor_unsafe.default",
            ref("crow"),
            ref("col"),
            ref("vals"),
            [1, 4],
        ),
        call("dense", "torch.ops.aten.to_dense.default", ref("sp")),
    ),
    _ops(
        "sparse_csc_tensor_unsafe-bad-rows",
        "_sparse_csc_tensor_unsafe with row indices out of range, densified",
        call("ccol", "torch.ops.aten.arange.start", 0, 2, dtype=LONG),
        _index("row", BIG, (1,)),
        ONES,
        call(
            "sp",
            "torch.ops.aten._sparse_csc_tensor_unsafe.default",
            ref("ccol"),
            ref("row"),
            ref("vals"),
            [4, 1],
        ),
        call("dense", "torch.ops.aten.to_dense.default", ref("sp")),
    ),
    _ops(
        "aten.set_.source_Storage_storage_offset-out-of-bounds",
        "set_ rebinds a tensor to a storage with a size far larger than the storage",
        call("st", "untyped_storage", ref("x"), op="call_method"),
        call(
            "big",
            "torch.ops.aten.set_.source_Storage_storage_offset",
            ref("x"),
            ref("st"),
            0,
            [BIG],
            [1],
        ),
        call("s", "torch.ops.aten.sum.default", ref("big")),
    ),
    _ops(
        "aten.set_.source_Tensor-aliases-a-parameter",
        "set_ makes the caller's input share the module's weight storage",
        call("w", "lin.weight", op="get_attr"),
        call("alias", "torch.ops.aten.set_.source_Tensor", ref("x"), ref("w")),
    ),
    # (as_strided itself checks its view against the storage and raises; this one does not.)
    _ops(
        "aten._reshape_alias-out-of-bounds",
        "_reshape_alias: a view beyond the storage, unchecked",
        call("view", "torch.ops.aten._reshape_alias.default", ref("x"), [BIG], [1]),
        call("s", "torch.ops.aten.sum.default", ref("view")),
    ),
    _ops(
        "aten.resize_-the-input",
        "resize_ (a mutating overload) grows the caller's input",
        call("r", "torch.ops.aten.resize_.default", ref("x"), [64, 64]),
    ),
    _ops(
        "aten.add.out-writes-the-input",
        "add.out(out=x) writes into the caller's tensor",
        call("o", "torch.ops.aten.add.out", ref("x"), ref("x"), out=ref("x")),
    ),
    _ops(
        "aten.copy_-overwrites-a-parameter",
        "copy_ overwrites the module's weight at every call",
        call("w", "lin.weight", op="get_attr"),
        call("z", "torch.ops.aten.zeros_like.default", ref("w")),
        call("c", "torch.ops.aten.copy_.default", ref("w"), ref("z")),
    ),
    _ops(
        "aten._index_put_impl_-unsafe",
        "_index_put_impl_(unsafe=True) with an index out of range",
        _index("idx", BIG, (1,)),
        ONES,
        call(
            "put",
            "torch.ops.aten._index_put_impl_.default",
            ref("x"),
            [ref("idx")],
            ref("vals"),
            False,
            True,
        ),
    ),
    _ops(
        "aten.set_.source_Storage-foreign-storage",
        "set_ on a storage the graph took from a buffer",
        call("b", "scale", op="get_attr"),
        call("st", "untyped_storage", ref("b"), op="call_method"),
        call("s", "torch.ops.aten.set_.source_Storage", ref("x"), ref("st")),
    ),
]


def _ort(id, doc, edit_region=None, edit_model=None) -> Case:
    def build():
        data = lowered_file()
        if edit_model is not None:
            data = with_onnx_model(data, edit_model)
        if edit_region is not None:
            data = edited(lambda p: edit_region(ort_records(p)[0]), data)
        return data

    return Case(id, doc, build)


def _external(location):
    def edit(model):
        from onnx import TensorProto

        init = model.graph.initializer[0]
        init.ClearField("raw_data")
        del init.float_data[:]
        init.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", "24")):
            entry = init.external_data.add()
            entry.key, entry.value = key, value

    return edit


def _custom_domain(model):
    model.graph.node[-1].domain = "com.red_team.custom"
    entry = model.opset_import.add()
    entry.domain, entry.version = "com.red_team.custom", 1


def _threads(name, count):
    def edit(region):
        region["state"]["settings"][name] = count

    return edit


CASES += [
    _ort(
        "ort-initializer-external-data-in-cwd",
        "an ONNX initializer whose bytes are read from a file in the working directory",
        edit_model=_external("case000.fxl"),
    ),
    _ort(
        "ort-initializer-external-data-etc-passwd",
        "an ONNX initializer whose bytes are read from /etc/passwd by relative path",
        edit_model=_external("../../../../../../etc/passwd"),
    ),
    _ort("ort-custom-op-domain", "an ONNX node in a custom-op domain", edit_model=_custom_domain),
    _ort(
        "ort-200000-intra-op-threads",
        "session settings asking for 200,000 intra-op threads",
        edit_region=_threads("intra_op_num_threads", 200_000),
    ),
    _ort(
        "ort-200000-inter-op-threads",
        "session settings asking for 200,000 inter-op threads",
        edit_region=_threads("inter_op_num_threads", 200_000),
    ),
]


def _tensor_device(device):
    """The file with its Linear weight recorded on ``device``."""

    def edit(program):
        program["module"]["children"]["lin"]["parameters"]["weight"]["device"] = device

    return lambda: edited(edit)


def _device_argument(device):
    """A graph making a tensor with ``device=`` that device (a device value in the file)."""
    return lambda: graph_with(
        call("made", "torch.ops.aten.ones.default", [1], device={"device": device})
    )


CASES += [
    Case(
        "device-record-with-code",
        "a tensor record whose device string carries Python code",
        _tensor_device("cuda:0; __import__('os').system('touch fxloom_red_team_pwned')"),
    ),
    Case(
        "device-record-wrapped-index",
        "a tensor record on cuda:9999, which torch's 8-bit index would make cuda:15",
        _tensor_device("cuda:9999"),
    ),
    Case(
        "device-record-lazy-backend",
        "a tensor record on the lazy device, a backend torch would initialise to probe",
        _tensor_device("lazy"),
    ),
    Case(
        "device-argument-unknown-type",
        "an aten.ones call with device= a type no torch backend has",
        _device_argument("fxloom_red_team_backend:0"),
    ),
]
family("family3", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_native_and_file_access_is_refused_while_loading(attack, verdicts):
    """Refused (SerializationError); no crash, nothing recorded, no file changed."""
    assert_refused(verdicts, attack)
