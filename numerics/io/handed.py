"""A handed file is data, never structure to trust: its container is read with bounds before a
byte of its content is built into objects.

The reader contract of every file a command is handed (a checkpoint, a report read back).  Each
refusal is a ValueError of one line saying what was found and what was expected; the caller
prefixes the file's name.

- :func:`memory_available`: what this process may still take -- the machine's available memory,
  and the address space its resource limit (``RLIMIT_AS``) leaves; a reader compares what it is
  about to build against a fraction of it *before* building it.
- :func:`zip_members`: a zip archive (an ``.npz``, a torch file) by its directory alone: at most
  :data:`MAX_ZIP_MEMBERS` members (counted from the end record, before the directory is parsed),
  none encrypted, each stored or deflated (the two methods ``numpy.savez``/``savez_compressed``
  and ``torch.save`` write; bzip2 and lzma are refused: their decompressors cannot be bounded
  chunk by chunk), the sum of the sizes the members declare within the caller's budget.
  :func:`read_member` decompresses at most the declared size: a member that expands past what it
  declares (a decompression bomb) is refused at that byte.
- :func:`check_pickle`: a pickle (a torch file's ``data.pkl``) by its opcodes, none executed
  (``pickletools.genops``): the object graph they would build is simulated, and every object's
  *expanded* size -- its tree with a shared reference counted each time it is used, which is what
  hashing, comparing, copying or formatting it walks -- must stay within a few nodes per byte of
  the pickle (what a writer that shares nothing but names and functions produces), its depth
  within :data:`MAX_DEPTH`, and no object may contain itself.  A dict key built from 45 levels of
  shared tuples (a few hundred bytes, 2^45 nodes expanded: torch's own loader would hash it for
  hours) is refused here in milliseconds.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import pickletools
import struct
import zipfile
from typing import Any, Optional

try:
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10
    import tomli as _toml

MEMORY_FRACTION = 0.5
"""A reader may build at most half the memory this process can still take (the rest is the
computation's, and the machine's)."""

MAX_ZIP_MEMBERS = 1024
"""Members of an archive: an npz of one model holds at most a dozen arrays, a torch file one record
per storage; a directory of 10^7 entries would take gigabytes to parse."""

ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}

MAX_DEPTH = 32
"""Nesting of a handed object (a state_dict with its metadata is 6 deep, a checkpoint's trajectory
records 5); every later walk of a deeper one would recurse."""

MAX_PICKLE_BYTES = 32 * 2 ** 20
"""A pickle longer than this is not scanned (about 120,000 trajectory records of 3 heads and 3
tasks; the scan reads some 2 MB a second)."""

NODES_PER_BYTE, MIN_NODES = 4, 2 ** 16
"""The expanded size a pickle of n bytes may build: MIN_NODES + 4 n.  Each opcode builds at most one
object, so a pickle that shares only memoised names, functions and storage descriptors (every
``torch.save`` of tensors and plain values) stays under one node per byte; a shared container used
twice doubles its expansion for two bytes, and 45 levels of that make 2^45."""


def memory_available() -> Optional[int]:
    """Bytes this process can still allocate: the least of the machine's available memory
    (``MemAvailable``) and the address space left under ``RLIMIT_AS``; None where neither can be
    read."""
    limits = []
    try:
        with open("/proc/meminfo") as fh:
            limits += [int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        try:
            limits.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as fh:
                used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limits.append(max(soft - used, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else None


def memory_budget() -> Optional[int]:
    """Bytes a reader may build: :data:`MEMORY_FRACTION` of :func:`memory_available` (None where the
    machine does not say)."""
    free = memory_available()
    return None if free is None else int(MEMORY_FRACTION * free)


def check_memory(need: int, what: str) -> None:
    """Refuse, before it is built, ``what`` that would take ``need`` bytes, more than
    :data:`MEMORY_FRACTION` of :func:`memory_available`."""
    free = memory_available()
    if free is not None and need > MEMORY_FRACTION * free:
        raise ValueError(f"{what} would take {need / 2 ** 30:.3g} GiB, more than half the {free / 2 ** 30:.3g} GiB "
                         "this process can still take; it is not built (use a machine with more memory)")


def _member_count(data: bytes) -> Optional[int]:
    """The number of members an archive's end record declares, read before its directory."""
    end = getattr(zipfile, "_EndRecData", None)
    if end is None:
        return None
    try:
        record = end(io.BytesIO(data))
    except (OSError, struct.error, ValueError):
        return None
    return None if record is None else int(record[zipfile._ECD_ENTRIES_TOTAL])


def zip_members(data: bytes, budget: Optional[int] = None) -> tuple[zipfile.ZipFile, list]:
    """The archive of ``data`` and its members (ZipInfo), checked by their directory alone (module
    docstring); ``budget``: the most bytes their declared sizes may add up to."""
    count = _member_count(data)
    if count is not None and count > MAX_ZIP_MEMBERS:
        raise ValueError(f"a zip archive that declares {count:,} members, more than the {MAX_ZIP_MEMBERS} a model's "
                         "file holds")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error) as exc:
        raise ValueError(f"a zip archive that cannot be read: truncated or corrupt ({exc})") from None
    if len(members) > MAX_ZIP_MEMBERS:
        raise ValueError(f"a zip archive of {len(members):,} members, more than the {MAX_ZIP_MEMBERS} a model's file holds")
    for info in members:
        name = info.filename[:80]
        if info.flag_bits & 0x1:
            raise ValueError(f"member {name!r} is encrypted; the weights must be readable without a password")
        if info.compress_type not in ZIP_METHODS:
            raise ValueError(f"member {name!r} is compressed by method {info.compress_type}; expected stored or "
                             "deflate (what numpy.savez, numpy.savez_compressed and torch.save write)")
    declared = sum(info.file_size for info in members)
    if budget is not None and declared > budget:
        raise ValueError(f"its members declare {declared:,} bytes when expanded, more than the {budget:,} bytes "
                         "allowed here; they are not expanded")
    return archive, members


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """The content of member ``info``, decompressed to at most the size it declares (one byte
    more is a decompression bomb, refused)."""
    try:
        with archive.open(info) as fh:
            data = fh.read(info.file_size + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as exc:
        raise ValueError(f"member {info.filename[:80]!r} cannot be read: truncated or corrupt ({exc})") from None
    if len(data) > info.file_size:
        raise ValueError(f"member {info.filename[:80]!r} expands past the {info.file_size:,} bytes it declares "
                         "(a decompression bomb?); it is not expanded further")
    return data


_MARK = object()
_GROWS = frozenset({"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"})
"""Opcodes that add to the object below the mark (a list, dict, set, or an object's state)."""


def _stack_effect(op) -> tuple[int, bool, int]:
    """(items popped below the mark or in all, whether a mark is popped, items pushed)."""
    before = op.stack_before
    if pickletools.markobject in before:
        return before.index(pickletools.markobject), True, len(op.stack_after)
    return len(before), False, len(op.stack_after)


_EFFECTS = {op.name: _stack_effect(op) for op in pickletools.opcodes}


def _pickle_graph(data: bytes) -> list:
    """The objects a pickle builds, as lists of the objects each holds (indices, a shared one as
    often as it is used), simulated from its opcodes (none executed)."""
    kids, stack, memo = [], [], {}
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        below, marked, pushed = _EFFECTS[name]
        if not (below or marked):          # a leaf: a number, a string, an empty container, a global
            if name in ("BINGET", "LONG_BINGET", "GET"):
                stack.append(memo[arg])
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[arg] = stack[-1]
            elif name == "MARK":
                stack.append(_MARK)
            elif pushed:
                kids.append([])
                stack.append(len(kids) - 1)
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name == "DUP":
            stack.append(stack[-1])
        else:
            held = []
            if marked:
                cut = len(stack) - 1 - stack[::-1].index(_MARK)
                held, stack[cut:] = stack[cut + 1:], []
            if below:
                held, stack[-below:] = stack[-below:] + held, []
            held = [p for p in held if p is not _MARK]
            if name in _GROWS:
                kids[held[0]].extend(held[1:])       # the deepest item is the object added to
                stack.append(held[0])
            elif pushed:
                kids.append(held)
                stack.extend([len(kids) - 1] * pushed)
    return kids


def _expanded(kids: list, max_nodes: int) -> tuple[int, int]:
    """(largest expanded size, largest depth) over the objects of :func:`_pickle_graph`, each
    capped just past ``max_nodes`` / :data:`MAX_DEPTH`; ValueError for an object that contains
    itself.  One post-order pass, no recursion."""
    size, depth, state = [0] * len(kids), [0] * len(kids), bytearray(len(kids))
    for root in range(len(kids)):
        if state[root]:
            continue
        state[root], walk = 1, [(root, 0)]
        while walk:
            node, i = walk[-1]
            if i < len(kids[node]):
                walk[-1] = (node, i + 1)
                child = kids[node][i]
                if state[child] == 1:
                    raise ValueError("its pickle builds an object that contains itself")
                if state[child] == 0:
                    state[child] = 1
                    walk.append((child, 0))
                continue
            walk.pop()
            held = kids[node]
            if held:
                size[node] = min(1 + sum(map(size.__getitem__, held)), max_nodes + 1)
                depth[node] = min(1 + max(map(depth.__getitem__, held)), MAX_DEPTH + 1)
            else:
                size[node] = depth[node] = 1
            state[node] = 2
    return max(size, default=0), max(depth, default=0)


def check_pickle(data: bytes) -> None:
    """Refuse a pickle whose objects are unbounded (module docstring): longer than
    :data:`MAX_PICKLE_BYTES`, malformed, an object expanding past MIN_NODES + NODES_PER_BYTE x its
    length, nested deeper than :data:`MAX_DEPTH`, or containing itself.  Nothing is executed."""
    if len(data) > MAX_PICKLE_BYTES:
        raise ValueError(f"its pickle is {len(data) / 2 ** 20:.0f} MiB, more than the {MAX_PICKLE_BYTES // 2 ** 20} "
                         "MiB scanned before loading")
    try:
        kids = _pickle_graph(data)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"its pickle is malformed ({type(exc).__name__}: {str(exc)[:80]})") from None
    max_nodes = MIN_NODES + NODES_PER_BYTE * len(data)
    nodes, deepest = _expanded(kids, max_nodes)
    if nodes > max_nodes:
        raise ValueError(f"its pickle builds an object of more than {max_nodes:,} values once its shared references "
                         f"are expanded, from {len(data):,} bytes (a structure of shared references, which hashing "
                         "or formatting would walk for hours); it is not loaded")
    if deepest > MAX_DEPTH:
        raise ValueError(f"its pickle nests objects more than {MAX_DEPTH} levels deep; it is not loaded")


def check_torch_archive(data: bytes, budget: Optional[int] = None) -> None:
    """A file for ``torch.load`` checked before it is loaded: a zip archive by :func:`zip_members`
    and every pickle in it by :func:`check_pickle`; a file of the legacy format (a sequence of
    pickles before the raw storages) by its first five pickles (magic number, protocol, system
    information, the object, its storage keys)."""
    if data[:4] == b"PK\x03\x04":
        archive, members = zip_members(data, budget)
        for info in members:
            if info.filename.endswith(".pkl"):
                check_pickle(read_member(archive, info))
        return
    start = 0
    for _ in range(5):
        window = io.BytesIO(data[start:start + MAX_PICKLE_BYTES + 1])
        try:
            for _op in pickletools.genops(window):
                pass
        except ValueError:
            if len(window.getbuffer()) > MAX_PICKLE_BYTES:
                raise ValueError(f"its pickle is longer than the {MAX_PICKLE_BYTES // 2 ** 20} MiB scanned before "
                                 "loading") from None
            return               # not a pickle from here: torch.load says what it is
        check_pickle(window.getvalue()[:window.tell()])
        start += window.tell()


# --- JSON, npy/npz, safetensors -------------------------------------------------------------------

def _refuse_constant(name: str):
    raise ValueError(f"non-strict JSON constant {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a float (it would be read as infinity)")
    return value


PARSE_FACTOR = 30
"""Memory per byte of a parsed JSON document at worst (``[{}, {}, ...]``: a 64-byte dict and an
8-byte pointer for every 3 bytes; a 190 MB claims.json took 5.2 GB): a reader checks
PARSE_FACTOR x its size against :func:`check_memory` before parsing."""


def parse_json(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, no number that overflows a float (``1e400`` is not read as
    infinity), and a document nested too deep for the parser a ValueError, not a RecursionError."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deep for the parser") from None


def npy_array(name: str, raw: bytes):
    """The array of an ``.npy`` member, read from its header first: object arrays (only unpickling
    could read them) and a shape whose byte count is not what the member holds (a header declaring
    10^15 elements over a few bytes) are refused before anything is allocated; the array is a view
    of ``raw``."""
    import numpy as np

    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f"npy format version {version}; expected 1.0 or 2.0 (what numpy.savez writes)")
        shape, fortran, dtype = reader(stream)
    except (ValueError, SyntaxError, TypeError, struct.error) as exc:
        raise ValueError(f"{name}: an npy header that cannot be read ({str(exc)[:120]})") from None
    if dtype.hasobject:
        raise ValueError(f"{name} holds object arrays, which only unpickling could read; refused (save float arrays: "
                         "np.savez(path, K=..., ...))")
    count = math.prod(shape)
    held = len(raw) - stream.tell()
    if count * dtype.itemsize != held:
        raise ValueError(f"{name}: its header declares shape {tuple(shape)} of {dtype} ({count * dtype.itemsize:,} "
                         f"bytes), but the member holds {held:,} bytes; nothing is allocated")
    array = np.frombuffer(raw, dtype, count, offset=stream.tell())
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def npz_arrays(archive: zipfile.ZipFile, members: list) -> dict:
    """The arrays of an npz (an archive checked by :func:`zip_members`) by member name (``.npy``
    dropped), each expanded boundedly (:func:`read_member`) and read header first
    (:func:`npy_array`)."""
    if not members or not all(info.filename.endswith(".npy") for info in members):
        raise ValueError(f"a zip archive that is neither a torch file nor an npz (members "
                         f"{[info.filename[:40] for info in members[:4]]})")
    return {info.filename[:-4]: npy_array(info.filename, read_member(archive, info)) for info in members}


MAX_HEADER_BYTES = 2 ** 20
"""A safetensors header names each tensor with its dtype, shape and offsets (about 100 bytes each)
and a few metadata strings: a megabyte is ten thousand tensors."""

SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                      "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


def _tensor_entry_problem(entry: Any, body: int) -> Optional[str]:
    """What is wrong with one tensor's header entry against a data section of ``body`` bytes."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        return "is not an entry of dtype, shape and data_offsets"
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in SAFETENSORS_DTYPES:
        return f"has dtype {str(dtype)[:20]!r}, not one of {', '.join(SAFETENSORS_DTYPES)}"
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
    if not isinstance(shape, list) or len(shape) > 8 or not all(map(whole, shape)):
        return f"has shape {str(shape)[:40]}, not a list of at most 8 whole numbers"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(whole, offsets)):
        return f"has data_offsets {str(offsets)[:40]}, not two whole numbers"
    begin, end = offsets
    if not begin <= end <= body:
        return f"has data_offsets [{begin}, {end}], outside the {body:,} bytes of data the file holds"
    if math.prod(shape) * SAFETENSORS_DTYPES[dtype] != end - begin:
        return (f"has shape {shape} of {dtype} ({math.prod(shape) * SAFETENSORS_DTYPES[dtype]:,} bytes) over "
                f"{end - begin:,} bytes of data")
    return None


def safetensors_header(data: bytes) -> tuple[dict, dict]:
    """(tensor entries by name, metadata) of a safetensors file, its header checked before any
    tensor is built: at most :data:`MAX_HEADER_BYTES`, strict JSON, each entry's dtype, shape and
    offsets consistent with the bytes it covers, inside the data section and not overlapping
    another's; the metadata a map of strings to strings (the format's own rule)."""
    size = int.from_bytes(data[:8], "little")
    if size > MAX_HEADER_BYTES:
        raise ValueError(f"its header is {size:,} bytes, more than the {MAX_HEADER_BYTES:,} a model's header needs")
    try:
        header = parse_json(data[8:8 + size].decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"its header is not strict JSON ({str(exc)[:120]})") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object of tensor entries")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("its __metadata__ is not a map of names to strings (the safetensors format's rule)")
    body = len(data) - 8 - size
    for name, entry in header.items():
        problem = _tensor_entry_problem(entry, body)
        if problem:
            raise ValueError(f"tensor {name[:60]!r} {problem}")
    spans = sorted((e["data_offsets"][0], e["data_offsets"][1], name) for name, e in header.items())
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise ValueError(f"tensors {first[:40]!r} and {second[:40]!r} overlap in the data section")
    return header, meta


# --- writing JSON, reading TOML --------------------------------------------------------------------

def jsonable(obj: Any) -> Any:
    """Convert numpy/torch scalars and arrays, tuples, dataclasses and non-finite floats to plain
    JSON.

    Non-finite floats become the strings ``"nan"``, ``"inf"``, ``"-inf"`` so that the file is
    strict JSON; anything else that is not a number, a string, a sequence or a mapping becomes
    its ``str``."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return jsonable(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float) or hasattr(obj, "__float__"):
        v = float(obj)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    return str(obj)


toml_loads, TOMLDecodeError = _toml.loads, _toml.TOMLDecodeError
"""TOML reading: the standard library's ``tomllib`` (Python >= 3.11), else the ``tomli``
distribution it was taken from (declared for Python < 3.11 in pyproject.toml)."""
