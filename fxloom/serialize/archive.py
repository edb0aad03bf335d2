"""The file: a zip archive of JSON documents and one safetensors blob.

Layout (every member under ``fxloom/``)::

    fxloom/format.json        {"format": "fxloom", "version": 3, "kind": "graph_module", ...}
    fxloom/program.json       what the kind describes (a module tree, a program)
    fxloom/weights.safetensors

Reading is defensive: only these members are read, each name once (a zip
may repeat a name, and ``zipfile`` would silently read the last), member names
that would leave the archive (``../``, absolute paths) are refused outright,
each member is decompressed a piece at a time and refused as soon as it passes
its size limit or compresses better than a real file does (so a zip bomb's
claimed size does not matter), and each JSON document is parsed strictly
(``strict_json``: values counted before parsing, a key given twice in one object,
``NaN`` and documents nested too deeply to walk refused). The limits are in ``limits``.
"""

from __future__ import annotations

import io
import json
import os
import stat
import struct
import tempfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fxloom.serialize import limits
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.safetensors_format import read_tensors, write_tensors
from fxloom.serialize.strict_json import parse_json

__all__ = [
    "FORMAT_VERSION",
    "write_archive",
    "read_archive",
    "Archive",
    "UPGRADES",
    "described_kind",
]

# How messages name each kind of file (the header's ``kind``), with its article.
KIND_NAMES = {
    "graph_module": "a GraphModule (fxloom.save)",
    "exported_program": "an ExportedProgram (fxloom.export.save)",
}


def described_kind(kind: str) -> str:
    """``kind`` in a sentence: "an ExportedProgram (fxloom.export.save)"; an unknown kind
    (a damaged or newer file) quoted, escaped."""
    from fxloom._format import printable

    return KIND_NAMES.get(kind, f"a file of kind {printable(repr(kind))}")


FORMAT_NAME = "fxloom"
FORMAT_VERSION = 3


def _records_cpu_devices(archive: Archive) -> Archive:
    """Version 1 to 2: tensor records gained ``device``. Version 1 wrote CPU tensors only and
    a record without a device is a CPU tensor, so the documents stay as they are."""
    return archive


def _plain_quantized_records(archive: Archive) -> Archive:
    """Version 2 to 3: files hold plain tensors only. Version 2's quantized-tensor records
    become integer values with scale and zero-point tensors (``quantized_records``)."""
    from fxloom.serialize import quantized_records  # the tensor records: needed by old files

    quantized_records.upgrade(archive.program, archive.weights)
    return archive


# Upgrades from an older format version to the next: ``UPGRADES[n](archive)`` turns
# version n's documents into version n + 1's. Files of every listed version keep loading.
# Version 2 files are refused by older fxloom, which would load CUDA tensors on the CPU;
# version 3 files too, which would load a quantized tensor's integer values as plain ones.
UPGRADES: dict[int, Callable[[Archive], Archive]] = {
    1: _records_cpu_devices,
    2: _plain_quantized_records,
}
OLDEST_VERSION = FORMAT_VERSION - len(UPGRADES)

_PREFIX = "fxloom/"
_FORMAT = _PREFIX + "format.json"
_PROGRAM = _PREFIX + "program.json"
_WEIGHTS = _PREFIX + "weights.safetensors"
_MEMBERS = (_FORMAT, _PROGRAM, _WEIGHTS)

# The members' size limits (``limits``), named here too so that a test can lower them.
MAX_JSON_BYTES = limits.MAX_JSON_BYTES
MAX_WEIGHTS_BYTES = limits.MAX_WEIGHTS_BYTES

PathOrFile = str | os.PathLike | IO[bytes]


class Archive:
    """The documents of one file: its header (``format.json``), its program, and its
    weights (tensors by key, already checked against the safetensors header)."""

    def __init__(self, header: dict[str, Any], program: Any, weights: dict[str, Any]) -> None:
        self.header = header
        self.program = program
        self.weights = weights

    @property
    def kind(self) -> str:
        return self.header.get("kind", "")


def write_archive(
    target: PathOrFile,
    kind: str,
    program: Any,
    weights: dict[str, Any],
    extra: dict | None = None,
) -> None:
    """Write the file; a path is replaced only once the whole file is written."""
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": kind, **(extra or {})}
    if hasattr(target, "write"):
        _write_zip(target, header, program, weights)
        return
    path = Path(target)
    handle, temporary = tempfile.mkstemp(
        dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "wb") as f:
            _write_zip(f, header, program, weights)
        # mkstemp makes the file 0600; the file gets the mode ``open(path, "wb")`` would give
        # it: the one it had when replacing a file, else what the umask allows.
        os.chmod(temporary, _mode_for(path))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    # Reading the umask means setting it; done under a lock so that two saves in threads
    # never leave the process with the wrong one.
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


_UMASK_LOCK = threading.Lock()


def _write_zip(f: IO[bytes], header: dict, program: Any, weights: dict[str, Any]) -> None:
    with zipfile.ZipFile(f, "w") as z:
        z.writestr(_FORMAT, json.dumps(header, indent=1), zipfile.ZIP_DEFLATED)
        z.writestr(
            _PROGRAM,
            json.dumps(program, separators=(",", ":"), allow_nan=False),
            zipfile.ZIP_DEFLATED,
        )
        # Stored, not deflated: weights barely compress, and loading reads them in place.
        with z.open(_WEIGHTS, "w", force_zip64=True) as member:
            write_tensors(member, weights)


def read_archive(source: PathOrFile | bytes) -> Archive:
    """The documents of a file, checked and upgraded to the current format version."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:  # FileNotFoundError stays itself
            return _read_archive(f, str(source))
    return _read_archive(io.BytesIO(source) if isinstance(source, bytes) else source, _name(source))


def _read_archive(f: IO[bytes], source: str) -> Archive:
    try:
        opened = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
        raise SerializationError(
            f"{_name(source)} is not an fxloom file (not a zip archive: {e})"
        ) from None
    with opened as z:
        names = _member_names(z, source)
        foreign = sorted(names - set(_MEMBERS))
        if _FORMAT not in names:
            held = f"; it holds {', '.join(map(repr, foreign[:3]))}" if foreign else ""
            raise SerializationError(
                f"{_name(source)} is not an fxloom file (it has no {_FORMAT}{held})"
            )
        for name in foreign:
            # Nothing else is read, but a file carrying more (a pickle) is not ours.
            raise SerializationError(
                f"{_name(source)} holds the member {name!r}, which fxloom files do not "
                f"have (only {', '.join(_MEMBERS)}); refused"
            )
        header = _read_json(z, _FORMAT, limits.MAX_FORMAT_BYTES)
        _check_header(header, source)
        missing = [m for m in _MEMBERS if m not in names]
        if missing:
            raise SerializationError(f"{_name(source)} is incomplete: {', '.join(missing)} missing")
        weights = _read_weights(z, f, _WEIGHTS, MAX_WEIGHTS_BYTES)
        archive = Archive(header, _read_json(z, _PROGRAM, MAX_JSON_BYTES), weights)
    version = header["version"]
    while version < FORMAT_VERSION:
        archive = UPGRADES[version](archive)
        version += 1
    return archive


def _member_names(z: zipfile.ZipFile, source: Any) -> set[str]:
    """The names of the archive's members, each a path inside it and each held once."""
    names: set[str] = set()
    for info in z.infolist():
        name = info.filename
        if (
            name.startswith(("/", "\\"))
            or ".." in name.replace("\\", "/").split("/")
            or ":" in name
        ):
            raise SerializationError(
                f"{_name(source)} holds the member {name!r}, a path outside the archive; refused"
            )
        if name in names:
            # zipfile reads the last of the two, a reader that walks the archive the first:
            # a name must have one meaning.
            raise SerializationError(f"{_name(source)} holds the member {name!r} twice; refused")
        names.add(name)
    return names


def _check_header(header: Any, source: Any) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise SerializationError(
            f"{_name(source)} is not an fxloom file (its format.json says otherwise)"
        )
    version = header.get("version")
    if type(version) is not int:
        raise SerializationError(
            f"{_name(source)}: the format version must be an integer, found {version!r}"
        )
    if version > FORMAT_VERSION:
        raise SerializationError(
            f"{_name(source)} is in format version {version}, written by a newer fxloom; this "
            f"fxloom reads versions {OLDEST_VERSION} to {FORMAT_VERSION}. Upgrade fxloom to load it"
        )
    if version < OLDEST_VERSION:
        raise SerializationError(f"{_name(source)}: unknown format version {version}")
    if not isinstance(header.get("kind"), str):
        raise SerializationError(f"{_name(source)}: the header does not say what the file holds")
    for key, value in header.items():
        # The header is the first line `fxloom show` prints: its strings are text to read.
        if not all(text.isprintable() for text in (key, value) if isinstance(text, str)):
            raise SerializationError(
                f"{_name(source)}: format.json's {key!r} entry holds a control or format "
                f"character ({value!r:.80}); refused"
            )


def _read(z: zipfile.ZipFile, name: str, limit: int) -> bytearray:
    """The bytes of the member ``name``, decompressed a piece at a time and refused as soon
    as they pass ``limit`` or the compression ratio a real file has (``limits``)."""
    info = z.getinfo(name)
    _check_decompressed(name, info.file_size, info.compress_size, limit, "as its entry claims")
    data = bytearray()
    try:
        with z.open(name) as member:
            while piece := member.read(limits.READ_CHUNK_BYTES):
                size = len(data) + len(piece)
                _check_decompressed(name, size, info.compress_size, limit, "and more")
                data += piece
    except SerializationError:
        raise
    except Exception as e:  # BadZipFile, zlib.error, EOFError...: a damaged archive
        raise SerializationError(f"cannot read {name}: the archive is damaged ({e})") from None
    return data


def _check_decompressed(name: str, size: int, compressed: int, limit: int, how: str) -> None:
    """Refuse ``name`` decompressing to ``size`` bytes (``how``: claimed, or read so far)."""
    if size > limit:
        raise limits.exceeded(f"{name}, decompressed,", limit, f"{size:,} bytes {how}")
    if size > limits.COMPRESSION_EXEMPT_BYTES and size > compressed * limits.MAX_COMPRESSION_RATIO:
        raise limits.exceeded(
            f"the compression ratio of {name} (a zip bomb?)",
            limits.MAX_COMPRESSION_RATIO,
            f"{size // max(compressed, 1):,} ({compressed:,} bytes decompress to {size:,} {how})",
        )


def _read_weights(z: zipfile.ZipFile, f: IO[bytes], name: str, limit: int) -> dict[str, Any]:
    """The tensors of the stored (uncompressed) weights member, read from ``f`` in place.

    Weights are the bulk of a file: each tensor is read once, into its own
    memory (``safetensors_format``), and the safetensors structure is what is
    checked, not a CRC over the bytes. A compressed member (not written by
    fxloom) is read whole first, within the compression ratio of ``_read``. A stored
    member must lie inside the file: its tensors are allocated before they are read.
    """
    info = z.getinfo(name)
    if info.file_size > limit:
        raise limits.exceeded(f"{name}", limit, f"{info.file_size:,} bytes")
    if info.compress_type != zipfile.ZIP_STORED:
        data = _read(z, name, limit)
        return read_tensors(io.BytesIO(data), 0, len(data))
    f.seek(info.header_offset)
    local = f.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise SerializationError(f"cannot read {name}: the archive is damaged")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    start = info.header_offset + 30 + name_length + extra_length
    if info.compress_size != info.file_size or start + info.file_size > f.seek(0, io.SEEK_END):
        raise SerializationError(f"the weights are truncated: {name} ends outside the file")
    return read_tensors(f, start, info.file_size)


def _read_json(z: zipfile.ZipFile, name: str, limit: int) -> Any:
    return parse_json(_read(z, name, limit), name)


def _name(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return getattr(source, "name", None) or "the file"
