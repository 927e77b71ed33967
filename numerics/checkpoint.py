"""Weights files a command is handed, and the checkpoints of numerics.train.

A handed file is data, never structure to trust: its container is read with bounds before a
byte of its content is built into objects (the reader contract of every weights file: a
checkpoint here, an external model's file in ``numerics.external``).  Each refusal is a
ValueError of one line saying what was found and what was expected; the caller prefixes the
file's name.

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
  within :data:`numerics.io.MAX_DEPTH`, and no object may contain itself.  A dict key built from
  45 levels of shared tuples (a few hundred bytes, 2^45 nodes expanded: torch's own loader would
  hash it for hours) is refused here in milliseconds.
- :func:`npz_arrays`, :func:`safetensors_header`: an npz's arrays and a safetensors header, each
  read header first (shapes against the bytes they cover) before anything is allocated.

A checkpoint of numerics.train taken at step s (at the start of iteration s, before batch s is
drawn) is a dict of exactly :data:`FIELDS`:

    version, stream, model, estimator   plain str/int: the file format, the prompt stream
                                        (numerics.config.STREAM_VERSION), full or reduced,
                                        the reduced flow's estimator
    config, train                       ProblemConfig.to_dict(), TrainConfig.to_dict()
    step                                s, an int in 0 .. steps
    params                              the trained tensors after s updates, in the run's
                                        order, each of the run's shape and dtype, finite
    generator                           the prompt generator's state (a uint8 tensor of the
                                        generator's own size, seeded with the run's seed)
    losses                              the s batch losses 0 .. s - 1 (the run's dtype),
                                        finite and at most diverge_loss (a diverged run is
                                        never checkpointed)
    trajectory                          one record {t, loss, omega, mu, residual} per
                                        record step k < s, t = k lr, loss = losses[k],
                                        omega and mu (heads, m), residual >= 0
    wall_seconds                        a finite number >= 0

:func:`read` refuses a file that breaks any of these with a :class:`CheckpointError` (a
ValueError; the CLI exits 2) naming the field and what to do, before the run uses any of it,
so that a checkpoint file that exists is either resumed or refused, never silently replaced
by a fresh start.  torch.load runs with ``weights_only=True``: a checkpoint is never unpickled.

What the reader cannot see: a file whose every field is consistent with the run but whose
values were changed (other finite parameters of the right shapes, other Mersenne-Twister
words under the run's seed) resumes as if genuine; telling it apart would take replaying
the run up to step s.  The checks prove consistency with the run, not authenticity.
"""
from __future__ import annotations

import io
import math
import os
import pickle
import pickletools
import struct
import zipfile
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from numerics.io import MAX_DEPTH, check_memory, memory_available, parse_json, read_input_bytes

MAX_ZIP_MEMBERS = 1024
"""Members of an archive: an npz of one model holds at most a dozen arrays, a torch file one record
per storage; a directory of 10^7 entries would take gigabytes to parse."""

ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}

MAX_PICKLE_BYTES = 32 * 2 ** 20
"""A pickle longer than this is not scanned (about 120,000 trajectory records of 3 heads and 3
tasks; the scan reads some 2 MB a second)."""

NODES_PER_BYTE, MIN_NODES = 4, 2 ** 16
"""The expanded size a pickle of n bytes may build: MIN_NODES + 4 n.  Each opcode builds at most one
object, so a pickle that shares only memoised names, functions and storage descriptors (every
``torch.save`` of tensors and plain values) stays under one node per byte; a shared container used
twice doubles its expansion for two bytes, and 45 levels of that make 2^45."""


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



# --- npy/npz, safetensors ------------------------------------------------------------------------

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



# --- checkpoints ---------------------------------------------------------------------------------


CHECKPOINT_VERSION = 1

FIELDS = ("version", "stream", "model", "estimator", "config", "train", "step", "params", "generator",
          "losses", "trajectory", "wall_seconds")
"""The keys of a checkpoint, all required, no others."""

RECORD_FIELDS = ("t", "loss", "omega", "mu", "residual")
"""The keys of one trajectory record (numerics.train.Record)."""

BOOKKEEPING = ("checkpoint", "checkpoint_every", "progress")
"""TrainConfig fields that change how a run is watched, not what it computes: they may differ on resume."""

_AFRESH = "delete it to start afresh, or choose another checkpoint path"
"""What to do with a file that is no numerics.train checkpoint at all."""

_DAMAGED = ("the file is damaged or was not written by numerics.train for this run: delete it to start afresh, "
            "or pass the configuration it was written for")


class CheckpointError(ValueError):
    """A checkpoint file this run cannot resume from; the message is one line naming the
    file, the field and what to do."""


@dataclass(frozen=True)
class Run:
    """What a checkpoint must match: the run about to resume.  ``params`` and ``generator``
    are the run's own freshly made tensors and prompt generator (their shapes, dtypes, state
    size and seed are the reference); ``record_at`` the steps at which the run records."""
    kind: str                       # "full" or "reduced"
    estimator: str
    stream: int
    config: dict                    # ProblemConfig.to_dict()
    train: dict                     # TrainConfig.to_dict()
    params: Sequence[torch.Tensor]
    generator: torch.Generator
    steps: int
    record_at: frozenset
    lr: float
    diverge_loss: float
    heads: int
    m: int
    dtype: torch.dtype


@dataclass
class Resume:
    """A checked checkpoint: everything a run continues from."""
    step: int
    params: list                    # CPU tensors, the run's shapes and dtypes
    generator_state: torch.Tensor
    losses: torch.Tensor            # (step,)
    trajectory: list                # dicts of RECORD_FIELDS
    wall_seconds: float


def payload(run: Run, step: int, params, generator: torch.Generator, losses: torch.Tensor, trajectory: list,
            wall_seconds: float) -> dict:
    """The dict a checkpoint at ``step`` holds (:data:`FIELDS`); ``losses`` the run's whole
    loss buffer, of which the first ``step`` are kept."""
    return {"version": CHECKPOINT_VERSION, "stream": run.stream, "model": run.kind, "estimator": run.estimator,
            "config": run.config, "train": run.train, "step": step,
            "params": [p.detach().cpu().clone() for p in params],
            "generator": generator.get_state(), "losses": losses[:step].cpu().clone(),
            "trajectory": trajectory, "wall_seconds": wall_seconds}


def _show(value, limit: int = 60) -> str:
    text = repr(value) if not torch.is_tensor(value) else f"a tensor of shape {tuple(value.shape)}, {value.dtype}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _plain_equal(a, b) -> bool:
    """a == b for the plain values of a configuration (str, int, float, bool, None, lists and
    dicts of them), False for anything else (a tensor, an object) rather than an error."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_plain_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_plain_equal(a[k], b[k]) for k in a)
    plain = (str, int, float, bool, type(None))
    return type(a) is type(b) and isinstance(a, plain) and a == b


def _is_number(v) -> bool:
    """A finite int or float (not a bool); an int beyond the float range is not."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


MAX_BYTES = 2 ** 30
"""The largest checkpoint read: the trainer's longest run (10^7 steps) keeps 80 MB of losses."""


def _load_bytes(path: str) -> bytes:
    """The file's bytes, its size within MAX_BYTES and the memory budget, its archive and pickle
    bounded before torch sees them (check_torch_archive: a structure of shared
    references that torch's own loader would hash for hours is refused here)."""
    try:
        size = os.stat(path).st_size
        check_memory(2 * size, f"loading its {size:,} bytes")
        data = read_input_bytes(path, "checkpoint", max_bytes=MAX_BYTES)
        check_torch_archive(data, memory_available())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path!r} is not a readable numerics.train checkpoint ({str(exc)[:300]}); "
                              f"{_AFRESH}") from None
    return data


def load(path: str) -> dict:
    """The checkpoint dict of the file at ``path`` (weights_only: plain tensors and
    containers, nothing unpickled; checked before loading by :func:`_load_bytes`), with exactly
    the keys :data:`FIELDS`; its values are checked by :func:`read`."""
    data = _load_bytes(path)
    try:
        ck = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        what = ("holds objects other than tensors and plain containers, which are never unpickled (weights_only): "
                "not a readable numerics.train checkpoint" if isinstance(exc, pickle.UnpicklingError)
                and "weights_only" in str(exc) else "exists but is not a readable numerics.train checkpoint "
                "(corrupt, truncated or another kind of file)")
        raise CheckpointError(f"checkpoint {path!r} {what}; {_AFRESH}") from None
    if not isinstance(ck, dict) or not all(isinstance(k, str) for k in ck):
        what = "a dict whose keys are not all names" if isinstance(ck, dict) else f"a {type(ck).__name__}"
        raise CheckpointError(f"checkpoint {path!r} is a torch file of {what}, not a numerics.train checkpoint (a "
                              f"dict of named fields); {_AFRESH}")
    missing, extra = [k for k in FIELDS if k not in ck], sorted(set(ck) - set(FIELDS))
    if missing or extra:
        what = "; ".join(([f"missing field(s) {', '.join(missing)}"] if missing else [])
                         + ([f"unknown field(s) {_show(extra)}"] if extra else []))
        raise CheckpointError(f"checkpoint {path!r} is a torch file but not a numerics.train checkpoint ({what}); "
                              f"{_AFRESH}")
    return ck


def _identity_differences(ck: dict, run: Run) -> list:
    """What says the checkpoint is of another run: format, stream, model, estimator, configs."""
    diffs = []
    if not _plain_equal(ck["version"], CHECKPOINT_VERSION):
        diffs.append(f"version: checkpoint {_show(ck['version'])}, this code {CHECKPOINT_VERSION}")
    if not _plain_equal(ck["stream"], run.stream):    # the generator state continues only the same stream
        diffs.append(f"prompt stream: checkpoint version {_show(ck['stream'])}, this code version {run.stream} "
                     "(numerics.config changed how prompts are drawn)")
    for key, mine in (("estimator", run.estimator), ("model", run.kind)):
        if not _plain_equal(ck[key], mine):
            diffs.append(f"{key}: checkpoint {_show(ck[key])}, this run {mine!r}")
    for what, mine in (("config", run.config), ("train", run.train)):
        theirs = ck[what]
        if not isinstance(theirs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in theirs):
            diffs.append(f"{what}: checkpoint {_show(theirs)}, not a dict of named fields")
            continue
        skip = BOOKKEEPING if what == "train" else ()
        for k in sorted((set(theirs) | set(mine)) - set(skip)):
            if not _plain_equal(theirs.get(k), mine.get(k)):
                diffs.append(f"{what}.{k}: checkpoint {_show(theirs.get(k))}, this run {_show(mine.get(k))}")
    return diffs


def dense_problem(t: torch.Tensor) -> str | None:
    """Why a loaded tensor is not an array of values the file holds (None when it is): nested,
    sparse or another layout than strided, on the meta device (a shape without data) or another,
    or a view of more elements than its storage holds (a one-element storage seen as 15,000 x
    15,000 by zero strides: reading it would build 1.8 GB the file never held)."""
    if t.is_nested:
        return "a nested tensor, not a dense one"
    if t.layout != torch.strided:
        return f"a {t.layout} tensor, not a dense one"
    if t.device.type != "cpu":
        return f"a tensor on the {t.device.type} device, whose values are not in the file"
    held = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    if t.numel() > held:
        return (f"a view of shape {tuple(t.shape)} ({t.numel():,} values) on a storage of {held:,}: reading it would "
                "build values the file does not hold")
    return None


def _tensor_problem(t, shape, dtype) -> str | None:
    if not torch.is_tensor(t):
        return f"is {_show(t)}, not a tensor"
    dense = dense_problem(t)
    if dense:
        return f"is {dense}"
    if t.dtype != dtype:
        return f"has dtype {t.dtype}, this run's is {dtype}"
    if tuple(t.shape) != tuple(shape):
        return f"has shape {tuple(t.shape)}, this run's is {tuple(shape)}"
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        return f"holds {int((~torch.isfinite(t)).sum())} non-finite value(s)"
    return None


def _record_problem(r, k: int, losses: torch.Tensor, run: Run) -> str | None:
    if not isinstance(r, dict) or set(r) != set(RECORD_FIELDS):
        return f"is {_show(r)}, not a record of the fields {', '.join(RECORD_FIELDS)}"
    for name in ("t", "loss", "residual"):
        if not _is_number(r[name]):
            return f"field {name} is {_show(r[name])}, not a finite number"
    if r["t"] != k * run.lr:
        return f"has t = {r['t']!r}, the run records step {k} at t = {k * run.lr!r}"
    if r["loss"] != float(losses[k]):
        return f"has loss {r['loss']!r}, but the checkpoint's losses[{k}] is {float(losses[k])!r}"
    if r["residual"] < 0:
        return f"has residual {r['residual']!r} < 0"
    for name in ("omega", "mu"):
        v = r[name]
        if not (isinstance(v, list) and len(v) == run.heads
                and all(isinstance(row, list) and len(row) == run.m and all(map(_is_number, row)) for row in v)):
            return f"field {name} is {_show(v)}, not {run.heads} lists of {run.m} finite numbers (heads x m)"
    return None


def read(path: str, run: Run) -> Resume:
    """The checkpoint at ``path`` checked field by field against ``run`` (module docstring);
    :class:`CheckpointError` naming the first wrong field otherwise."""
    ck = load(path)
    diffs = _identity_differences(ck, run)
    if diffs:
        raise CheckpointError(f"checkpoint {path!r} belongs to a different run and cannot be resumed ("
                              + "; ".join(diffs) + "); use another --checkpoint path, pass the configuration it "
                              "was written for, or delete the file to start afresh")

    def bad(field: str, problem: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path!r}: {field} {problem}; {_DAMAGED}")

    step = ck["step"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= run.steps:
        raise bad("step", f"is {_show(step)}, not an integer in 0 .. {run.steps} (this run's steps)")

    params = ck["params"]
    if not isinstance(params, (list, tuple)) or len(params) != len(run.params):
        n = len(params) if isinstance(params, (list, tuple)) else None
        raise bad("params", f"is {_show(params) if n is None else f'a list of {n} tensor(s)'}, this run trains "
                            f"{len(run.params)} ({run.kind} model)")
    for i, (saved, mine) in enumerate(zip(params, run.params)):
        problem = _tensor_problem(saved, mine.shape, mine.dtype)
        if problem:
            raise bad(f"params[{i}]", problem)

    state = ck["generator"]
    fresh = run.generator.get_state()
    problem = _tensor_problem(state, fresh.shape, fresh.dtype)
    if problem:
        raise bad("generator", f"{problem} (a {run.generator.device.type} generator's state)")
    probe = torch.Generator(device=run.generator.device)
    try:
        probe.set_state(state)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise bad("generator", f"is not a valid generator state (torch: {str(exc).splitlines()[0]})") from None
    if probe.initial_seed() != run.generator.initial_seed():
        raise bad("generator", f"was seeded with {probe.initial_seed()}, this run's prompt stream with "
                               f"{run.generator.initial_seed()} (train.seed)")

    losses = ck["losses"]
    problem = _tensor_problem(losses, (step,), run.dtype)
    if problem:
        raise bad("losses", f"{problem} (one batch loss per step before step {step})")
    if step and float(losses.max()) > run.diverge_loss:
        k = int(losses.argmax())
        raise bad(f"losses[{k}]", f"= {float(losses[k])!r} is above diverge_loss = {run.diverge_loss:g}: a "
                            "diverged run is never checkpointed")

    trajectory = ck["trajectory"]
    recorded = sorted(k for k in run.record_at if k < step)
    if not isinstance(trajectory, list) or len(trajectory) != len(recorded):
        held = f"{len(trajectory)} record(s)" if isinstance(trajectory, list) else _show(trajectory)
        raise bad("trajectory", f"is {held}, this run records {len(recorded)} time(s) before step {step} (records, "
                                "record_every)")
    for i, (r, k) in enumerate(zip(trajectory, recorded)):
        problem = _record_problem(r, k, losses, run)
        if problem:
            raise bad(f"trajectory[{i}]", problem)

    wall = ck["wall_seconds"]
    if not _is_number(wall) or wall < 0:
        raise bad("wall_seconds", f"is {_show(wall)}, not a finite number >= 0")
    return Resume(step=step, params=list(params), generator_state=state, losses=losses, trajectory=trajectory,
                  wall_seconds=float(wall))
