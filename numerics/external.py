"""Weights trained elsewhere: read without unpickling, mapped into this project's model, measured.

A researcher hands a checkpoint of a one-layer multi-head softmax attention (the model of docs/model.md:
y_hat = sum_h U_h sum_l softmax_l(z_l^T W_h z_q) z_l, the query attending to the L context tokens,
no residual, MLP, norm or bias).  :func:`read_checkpoint` reads it, whatever trained it, in one of
four layouts (docs/audit.md):

- ``authors``: a state_dict of the authors' MultiHeadAttention: ``q_proj.weight``, ``k_proj.weight``,
  ``v_proj.weight`` of shape (H D, D) and ``o_proj.weight`` of shape (m, H D), D = d + m, no biases,
  logits scaled by D^(-1/2).  The mapping, read off the shapes: the projections of a token z are
  q = q_proj z, k = k_proj z, v = v_proj z, each cut into H consecutive pieces of D rows, so with
  Q_h = q_proj[h D:(h+1) D, :], K_h, V_h likewise, the logit of head h is
  <K_h z_l, Q_h z_q> / sqrt(D) = z_l^T (K_h^T Q_h / sqrt(D)) z_q, and o_proj applied to the
  concatenated head outputs is sum_h O_h (sum_l p_hl V_h z_l) with O_h = o_proj[:, h D:(h+1) D].
  Hence W_h = K_h^T Q_h / s, U_h = O_h V_h with s = sqrt(D): this project's *factored* model with
  ``logit_scale`` sqrt(D) (tests/test_audit_layouts.py holds it against an independent forward pass
  written the authors' way).
- ``project``: a checkpoint of ``numerics.train`` (a torch file of tensors and plain values: its
  config, step, parameters) or its ``run.json`` (the readout and trajectory only: no weights).
- ``factored``: named arrays ``K``, ``Q`` (H, k, D), ``V`` (H, k', D), ``O`` (H, m, k') and a scalar
  ``logit_scale`` s (W_h = K_h^T Q_h / s, U_h = O_h V_h); k = k' = D maps onto the factored model,
  any other head width onto the merged one (the same function, its factors not kept).
- ``merged``: named arrays ``W`` (H, D, D) and ``U`` (H, m, D).

``factored`` and ``merged`` files are ``.safetensors`` or ``.npz``; ``auto`` picks the layout by keys
and shapes and says what it picked.  A training time may come with the file: an entry ``time`` (this
project's units) or ``step`` (0-d arrays in an npz, ``__metadata__`` strings in a safetensors file,
plain values beside the state_dict in a torch file).

Safety (the reader contract of numerics.checkpoint: a handed file is data, never structure to trust):
the path is checked before anything is read (a regular file, not a link loop, a FIFO or a device,
its name valid UTF-8: :func:`check_paths`), the file read once, into memory, through
``numerics.io.read_input_bytes`` (at most :data:`MAX_CHECKPOINT_BYTES` and the memory budget),
and parsed by content, never by its name.  Each container is read by its directory first: a
safetensors header bounded, its offsets inside the file and not overlapping, each dtype and shape
consistent with its bytes; an npz's members by their declared sizes and compression method (stored
or deflate; encrypted refused), expanded boundedly, each ``.npy`` header checked before its array
is allocated; a torch file's archive and pickle bounded before ``torch.load(weights_only=True)``
sees them (its restricted unpickler refuses any class or function, so a pickled payload never
runs; a structure of shared references is refused before torch's loader would hash it), and every
tensor in it dense, on the CPU and no larger than its storage.  The arrays of the layout are then
checked against the problem (``tasks``: their declared shapes) and the memory budget before they
are read as float64.  Every number is checked as a flag is (finite, in range, of a real type:
``"2_0"``, ``True``, ``2+1j`` or an integer beyond the float range refused), every array must be
floating point and finite and have the layout's shape: each problem is one :class:`CheckpointError`
line naming the file and the field, raised before any computation.

Measurement (:func:`measure`): the model's own readout (``MultiHeadAttention.semi_singular_values``:
omega, mu, off-D residual; ``theory.initialisation.residual_split``: the part of the off-D weights
the loss can move against the part no gradient reaches), the allocation readout
(``numerics.evaluate``), the factor balance of a factored model, and the held-out loss
(``numerics.evaluate.held_out_loss``) with the loss of its projection onto D on the same prompts.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import re
import time
import warnings
from dataclasses import dataclass, field, fields
from typing import Optional

import numpy as np
import torch

from numerics.io import (MEMORY_FRACTION, PARSE_FACTOR, check_input_files, check_memory, memory_available, memory_budget,
                         parse_json, read_input_bytes)

from .checkpoint import RECORD_FIELDS, check_torch_archive, dense_problem, npz_arrays, safetensors_header, zip_members
from .config import ProblemConfig
from .evaluate import (LossEstimate, allocation, held_out_loss, held_out_loss_difference, held_out_reduced_loss,
                       zero_sum_ratio)
from .model import MultiHeadAttention, factor_balance


MAX_CHECKPOINT_BYTES = 512 * 2 ** 20
# The largest file read (512 MiB).  The models audited here are a few layers of (d + m)^2 numbers:
# the authors' configuration (d = 50, m = 3, H = 3) is 0.1 MB, d = 1000 with 8 heads 100 MB in float32;
# a project checkpoint adds its per-step losses (8 bytes a step, 80 MB at the trainer's limit of 10^7
# steps).  A larger file is another kind of file, or a model this class does not describe.

LAYOUT_KEYS = {"authors": ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"),
               "factored": ("K", "Q", "V", "O"), "merged": ("W", "U")}
# The arrays of each layout of weights (module docstring).
TIME_KEYS = ("time", "t")
STEP_KEYS = ("step", "global_step", "iteration")
NESTED_KEYS = ("state_dict", "model_state_dict", "model", "weights", "params")
# Where a torch file may hold its state_dict beside plain values such as the step.

HELD_OUT_CHUNK = 4096
# Prompts per held-out batch (numerics.evaluate's default): the prompts drawn depend on the chunk,
# so a fixed chunk makes an audit's held-out loss the very number ``held_out_loss(model)`` gives.


class CheckpointError(ValueError):
    """A checkpoint that cannot be audited: one line saying what is wrong and how to fix it."""


@dataclass(frozen=True)
class ExternalModel:
    """A checkpoint read and checked by :func:`read_checkpoint`.

    ``param``: ``factored`` (weights K, Q, V, O), ``merged`` (W, U), ``reduced`` (a project
    checkpoint of the reduced flow: omega, mu are the model) or ``readout`` (a run.json: omega, mu and
    the residual from the file, no weights); ``weights``: float64 arrays by name; ``heads``, ``m``,
    ``token_dim`` (d + m) from the shapes; ``config``: a project file's ProblemConfig fields;
    ``time`` in this project's units (t = lr x steps, loss summed over the tasks) or None, ``step``
    the file's step entry; ``records``: a project file's trajectory records; ``missing``: what this
    file cannot give; ``notes``: what was read and how."""

    path: str
    format: str
    layout: str
    picked: str
    param: str
    heads: int
    m: int
    token_dim: int
    logit_scale: Optional[float]
    weights: dict = field(repr=False)
    stored_dtype: str = "float64"
    sha256: str = ""
    bytes: int = 0
    config: Optional[dict] = None
    time: Optional[float] = None
    time_source: Optional[str] = None
    step: Optional[int] = None
    records: Optional[list] = field(default=None, repr=False)
    readout: Optional[dict] = None
    missing: tuple = ()
    notes: tuple = ()

    @property
    def has_weights(self) -> bool:
        return self.param in ("factored", "merged")

    def summary(self) -> dict:
        """The JSON record of what was read (claims.json's ``model[k].checkpoint``)."""
        kept = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("weights", "config", "records",
                                                                                      "readout", "missing", "notes")}
        return {**kept, "name": os.path.basename(self.path), "arrays": {k: list(v.shape) for k, v in self.weights.items()},
                "missing": list(self.missing), "notes": list(self.notes)}


# --------------------------------------------------------------------------- reading

def _torch_load(data: bytes):
    """A torch file checked before it is loaded (its archive and pickle bounded:
    numerics.checkpoint.check_torch_archive), loaded weights-only, and every tensor in it dense, in
    the file and no larger than its storage (numerics.checkpoint.dense_problem)."""
    try:
        check_torch_archive(data, memory_budget())
    except ValueError as exc:
        raise CheckpointError(f"a torch file refused before loading: {exc}") from None
    try:
        with warnings.catch_warnings():   # torch's note on the pickle protocol is not the user's business
            warnings.simplefilter("ignore")
            payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:   # the unpickler's refusal, a truncated archive, a corrupt record
        text = str(exc).replace("\n", " ")
        if "weights_only" in text.lower() or "unsupported global" in text.lower() or "weights only" in text.lower():
            raise CheckpointError("refused: the file holds pickled objects other than tensors and plain values (torch's "
                                  "weights-only loader would not run them, and neither does this command); save the "
                                  "weights only (torch.save(model.state_dict(), ...)) or export them as safetensors "
                                  "(docs/audit.md)") from None
        raise CheckpointError(f"not a readable torch file: truncated or corrupt ({type(exc).__name__}: {text[:160]})") from None
    walk = [("", payload)]
    while walk:                     # bounded: the pickle's expanded size was checked above
        where, value = walk.pop()
        if torch.is_tensor(value):
            problem = dense_problem(value)
            if problem:
                raise CheckpointError(f"{where or 'the payload'} is {problem}; save dense CPU tensors (state_dict())")
        elif isinstance(value, dict):
            walk += [(f"a key of {where or 'the payload'}", k) for k in value if not isinstance(k, str)]
            walk += [(str(k)[:80], v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            walk += [(f"{where}[{k}]", v) for k, v in enumerate(value)]
    return payload


def _zip_load(data: bytes):
    """A zip archive is a torch file (it holds a data.pkl) or an npz (only .npy members), each
    read by its directory first (numerics.io)."""
    try:
        archive, members = zip_members(data, memory_budget())
    except ValueError as exc:
        raise CheckpointError(f"a zip archive refused: {exc}") from None
    if any(info.filename.endswith("data.pkl") for info in members):
        return "torch", _torch_load(data)
    try:
        return "npz", npz_arrays(archive, members)
    except ValueError as exc:
        raise CheckpointError(f"an npz refused: {exc}") from None


def _safetensors_load(data: bytes):
    """Tensors and metadata strings of a safetensors file, its header checked first
    (numerics.checkpoint.safetensors_header), then read by the safetensors parser."""
    from safetensors import SafetensorError
    from safetensors.torch import load as st_load

    try:
        _, meta = safetensors_header(data)
        tensors = st_load(data)
    except ValueError as exc:
        raise CheckpointError(f"a safetensors file refused, truncated or corrupt: {exc}") from None
    except SafetensorError as exc:
        raise CheckpointError(f"a safetensors file that cannot be read: truncated or corrupt ({exc})") from None
    return {**tensors, **meta}      # metadata strings: the step/time/logit_scale entries are read from them


def _array(name: str, value) -> np.ndarray:
    """A float64 array of a tensor/array entry; integer, boolean or complex data refused."""
    if torch.is_tensor(value):
        if not value.is_floating_point():
            raise CheckpointError(f"{name} has dtype {value.dtype}, not floating point; weights are real numbers")
        return value.detach().to(torch.float64).numpy()
    if not isinstance(value, np.ndarray):
        raise CheckpointError(f"{name} is a {type(value).__name__}, not an array; weights are arrays of real numbers")
    if value.dtype.kind != "f":
        raise CheckpointError(f"{name} has dtype {value.dtype}, not floating point; weights are real numbers")
    return value.astype(np.float64)


def _stored_dtype(values) -> str:
    kinds = sorted({str(v.dtype).replace("torch.", "") for v in values if hasattr(v, "dtype")})
    return ",".join(kinds) or "float64"


_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def _a(value) -> str:
    """What a value is, for a message, without formatting it (a handed object may be large)."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return repr(value)[:40]
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _number(name: str, value, text: bool = False):
    """A real number of a file as a Python int or float, checked as a command line's number is: a
    plain int or float, a one-element integer or floating-point array, or (``text``: the strings of
    safetensors metadata) a string of decimal digits (no underscores: float('2_0') is 20); never a
    bool (True is not 1.0), a complex (2+1j is not 2.0), a list or an object; finite, an int within
    the range of a float."""
    shown = _a(value)
    if isinstance(value, str) and text:
        if not _NUMBER_TEXT.match(value.strip()):
            raise CheckpointError(f"{name} must be a number written in decimal digits (e.g. 0.5 or 1e-3; no underscores), "
                                  f"got {shown}")
        value = float(value)
    elif torch.is_tensor(value) or isinstance(value, (np.ndarray, np.generic)):
        dtype = str(value.dtype).replace("torch.", "")
        if math.prod(tuple(value.shape)) != 1 or not dtype.startswith(("float", "int", "uint", "bfloat")):
            raise CheckpointError(f"{name} must be a single real number, got an array of shape {tuple(value.shape)} and "
                                  f"dtype {dtype}")
        value = value.reshape(-1)[0].item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"{name} must be a single real number, got {shown}")
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        got = shown if isinstance(value, float) else "an integer beyond the range of a float"
        raise CheckpointError(f"{name} must be a finite number, got {got}")
    return value


def _scalar(name: str, value, low: Optional[float] = None, above: bool = False,
            text: bool = False) -> float:
    """:func:`_number` as a float, at least ``low`` (above it with ``above``)."""
    x = float(_number(name, value, text))
    if low is not None and (x < low or (above and x == low)):
        raise CheckpointError(f"{name} must be {'>' if above else '>='} {low:g}, got {x:g}")
    return x


MAX_STEP = 2 ** 53
# The largest step read: t = lr x step is computed in floats, which hold whole numbers exactly up to 2^53.


def _count(name: str, value, text: bool = False) -> int:
    """:func:`_number` as a whole number in 0 .. MAX_STEP (a float only if it is whole)."""
    x = _number(name, value, text)
    if isinstance(x, float) and not x.is_integer() or not 0 <= x <= MAX_STEP:
        raise CheckpointError(f"{name} must be a whole number in 0 .. 2^53, got {x:g}")
    return int(x)


def _grid(name: str, value, shape: tuple) -> np.ndarray:
    """A (heads, m) table of finite numbers given as nested lists or an array of that shape."""
    if torch.is_tensor(value) or isinstance(value, np.ndarray):
        rows = value.tolist() if tuple(value.shape) == shape else None
    else:
        rows = value
    if not (isinstance(rows, (list, tuple)) and len(rows) == shape[0]
            and all(isinstance(r, (list, tuple)) and len(r) == shape[1] for r in rows)):
        raise CheckpointError(f"{name} must be {shape[0]} lists of {shape[1]} numbers (heads x m), as its config says")
    return np.array([[_scalar(f"{name}[{h}][{i}]", x) for i, x in enumerate(r)] for h, r in enumerate(rows)])


def _records(value, shape: tuple) -> Optional[list]:
    """A project file's trajectory: a list of records {t, loss, omega, mu, residual} with t and
    residual >= 0, every number finite, omega and mu (heads, m); None when absent or empty."""
    if value is None or isinstance(value, (list, tuple)) and not value:
        return None
    if not isinstance(value, (list, tuple)):
        raise CheckpointError(f"trajectory must be a list of records, got {_a(value)}")
    out = []
    for k, r in enumerate(value):
        if not isinstance(r, dict) or not set(RECORD_FIELDS) <= set(r):
            raise CheckpointError(f"trajectory[{k}] must be a record of {', '.join(RECORD_FIELDS)}")
        out.append({"t": _scalar(f"trajectory[{k}].t", r["t"], 0.0),
                    "loss": _scalar(f"trajectory[{k}].loss", r["loss"]),
                    "omega": _grid(f"trajectory[{k}].omega", r["omega"], shape).tolist(),
                    "mu": _grid(f"trajectory[{k}].mu", r["mu"], shape).tolist(),
                    "residual": _scalar(f"trajectory[{k}].residual", r["residual"], 0.0)})
    return out


def _finite(arrays: dict) -> None:
    for name, a in arrays.items():
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        if bad:
            raise CheckpointError(f"{name} holds {bad} NaN or infinite entries (a diverged run?); a model with "
                                  "non-finite weights has no loss to audit")


def _flatten(payload) -> dict:
    """The entries of a torch payload: a state_dict, or a dict holding one (NESTED_KEYS) beside
    plain values (step, time); a project checkpoint is returned as it is."""
    if not isinstance(payload, dict):
        return {"": payload}
    if {"version", "params", "config"} <= set(payload):
        return payload
    out = {k: v for k, v in payload.items() if not isinstance(v, dict)}
    nested = [payload[k] for k in NESTED_KEYS if isinstance(payload.get(k), dict)]
    if len(nested) == 1:
        out.update(nested[0])
    elif any(isinstance(v, dict) for v in payload.values()):
        out.update({k: v for k, v in payload.items() if isinstance(v, dict)})
    return out


def _common_prefix(keys) -> Optional[str]:
    """The prefix p ('' or ending in '.') for which every authors' key p + 'q_proj.weight' etc. is
    present (one wrapping module, e.g. 'attention.'), or None."""
    for k in keys:
        if isinstance(k, str) and k.endswith("q_proj.weight"):
            p = k[: -len("q_proj.weight")]
            if (p == "" or p.endswith(".")) and all(p + a in keys for a in LAYOUT_KEYS["authors"]):
                return p
    return None


def _pick(entries: dict) -> tuple[str, str]:
    """(layout, why) from the keys and shapes (the ``auto`` rule)."""
    keys = set(entries)
    if {"version", "params", "config"} <= keys:
        return "project", "a numerics.train checkpoint (keys version, params, config)"
    if {"config", "omega", "mu", "trajectory"} <= keys:
        return "project", "a numerics.train run.json (keys config, omega, mu, trajectory)"
    p = _common_prefix(keys)
    if p is not None:
        return "authors", f"keys {p}q_proj.weight, {p}k_proj.weight, {p}v_proj.weight, {p}o_proj.weight"
    for layout in ("factored", "merged"):
        if set(LAYOUT_KEYS[layout]) <= keys:
            return layout, f"arrays {', '.join(LAYOUT_KEYS[layout])}"
    shown = sorted(str(k) for k in keys)[:8]
    raise CheckpointError(f"holds {shown}{' ...' if len(keys) > 8 else ''}: none of the layouts (authors: "
                          "q_proj/k_proj/v_proj/o_proj.weight; factored: K, Q, V, O, logit_scale; merged: W, U; "
                          "project: a numerics.train checkpoint or run.json); see docs/audit.md for the export")


def check_paths(paths) -> None:
    """Every checkpoint path checked before any file is read (numerics.io.check_input_files: a
    regular file, not a link loop, a FIFO or a device, its name valid UTF-8, at most
    :data:`MAX_CHECKPOINT_BYTES`): one :class:`CheckpointError` line for the first that is not."""
    texts = [os.fspath(p) for p in paths]
    try:
        check_input_files(texts, "checkpoint", max_bytes=MAX_CHECKPOINT_BYTES)
    except ValueError as exc:
        big = next((t for t in texts if os.path.isfile(t) and os.path.getsize(t) > MAX_CHECKPOINT_BYTES), None)
        raise CheckpointError(str(exc) if big is None or "MiB" not in str(exc) else (
            f"{big} is {os.path.getsize(big) / 2 ** 20:.0f} MiB, more than the {MAX_CHECKPOINT_BYTES / 2 ** 20:.0f} MiB "
            "a checkpoint of this model class can be (docs/audit.md); give the attention layer's weights only")) from None


def _read_bytes(text: str) -> bytes:
    """The file's bytes: a checked path (:func:`check_paths`), no larger than the memory budget,
    read once."""
    check_paths([text])
    try:
        size = os.stat(text).st_size
        check_memory(size, f"reading its {size:,} bytes")
        return read_input_bytes(text, "checkpoint", max_bytes=MAX_CHECKPOINT_BYTES)
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(exc)) from None


def _load(data: bytes) -> tuple[str, object]:
    """(format, payload) of a file's bytes, by its first bytes (never its name): a zip archive (a
    torch file or an npz), a safetensors header length and brace, a pickle's protocol byte, JSON."""
    if not data:
        raise CheckpointError("empty file (0 bytes); give the saved weights")
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _zip_load(data)
    if len(data) >= 9 and 0 < int.from_bytes(data[:8], "little") <= len(data) - 8 and data[8:9] == b"{":
        return "safetensors", _safetensors_load(data)
    if data[:1] == b"\x80":
        return "torch", _torch_load(data)
    if data.lstrip()[:1] in (b"{", b"["):
        _within_memory(PARSE_FACTOR * len(data), "parsing it")
        try:
            return "json", parse_json(data.decode("utf-8"))
        except ValueError as exc:       # UnicodeDecodeError is one
            raise CheckpointError(f"not valid JSON: truncated or corrupt ({str(exc)[:160]})") from None
    raise CheckpointError("not a format this command reads (a torch file, .safetensors, .npz or a run.json), by its "
                          "first bytes; see docs/audit.md for the export")


def read_checkpoint(path, layout: str = "auto", logit_scale: Optional[float] = None,
                    tasks: Optional[tuple] = None) -> ExternalModel:
    """Read and check one checkpoint (module docstring); :class:`CheckpointError` on anything
    wrong, before any computation.  ``logit_scale``: the s of a factored file that does not
    carry one (refused where the file or the layout fixes it).  ``tasks``: the problem's block
    sizes, against which the arrays' declared shapes are checked before they are read."""
    text = os.fspath(path)
    data = _read_bytes(text)
    try:
        return _read(text, data, layout, logit_scale, tasks)
    except CheckpointError as exc:      # each check names the field; the file is named here, once
        raise CheckpointError(f"{text}: {exc}") from None
    except (ArithmeticError, LookupError, TypeError, ValueError, RuntimeError, MemoryError) as exc:
        # every check above names what it refuses; this line is what a check not yet written would say
        raise CheckpointError(f"{text}: cannot be read ({type(exc).__name__}: {str(exc)[:160]})") from None


def _read(text: str, data: bytes, layout: str, logit_scale, tasks) -> ExternalModel:
    fmt, payload = _load(data)
    entries = _flatten(payload) if fmt == "torch" else payload
    if not isinstance(entries, dict):
        raise CheckpointError(f"holds a {type(entries).__name__}, not named weights; save a state_dict or named arrays")
    try:
        picked, why = _pick(entries)
    except CheckpointError as exc:
        if layout == "auto":
            raise
        picked, why = None, str(exc)
    if layout != "auto" and picked != layout:
        raise CheckpointError(f"--layout {layout} does not fit this file ({'it ' + why if picked is None else 'it reads as ' + picked + ': ' + why}); "
                              f"use --layout auto or {picked or 'the export of docs/audit.md'}")
    common = dict(path=text, format=fmt, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data),
                  picked=("auto: " if layout == "auto" else "given: ") + why)
    if picked == "project":
        if logit_scale is not None:
            raise CheckpointError("--logit-scale does not apply: a project file carries its configuration's logit_scale")
        return _project(entries, fmt, common)
    t, s = (next((entries[k] for k in keys if k in entries), None) for keys in (TIME_KEYS, STEP_KEYS))
    common.update(time=None if t is None else _scalar("time", t, 0.0, text=True),
                  step=None if s is None else _count("step", s, text=True),
                  time_source=None if t is None else "the file's time entry")
    return _layout_model(entries, picked, logit_scale, common, tasks)


_TASK_AXES = {"q_proj.weight": ((1, "D"),), "k_proj.weight": ((1, "D"),), "v_proj.weight": ((1, "D"),),
              "o_proj.weight": ((0, "m"),), "K": ((2, "D"),), "Q": ((2, "D"),), "V": ((2, "D"),), "O": ((1, "m"),),
              "W": ((1, "D"), (2, "D")), "U": ((1, "m"), (2, "D"))}
# The axes of each layout's arrays that the problem fixes: the token width D = d + m, the m outputs.


def _check_raw(raw: dict, tasks: Optional[tuple]) -> None:
    """A layout's arrays before they are read as float64: their declared shapes against ``tasks``
    (when given) and their size against the memory budget (numerics.io.check_memory)."""
    if tasks is not None:
        want = {"D": sum(tasks) + len(tasks), "m": len(tasks)}
        for name, value in raw.items():
            shape = tuple(getattr(value, "shape", ()))
            for axis, what in _TASK_AXES[name]:
                if len(shape) <= axis or shape[axis] != want[what]:
                    raise CheckpointError(f"{name} has shape {shape}: --tasks {','.join(map(str, tasks))} needs "
                                          f"{'d + m' if what == 'D' else 'm'} = {want[what]} on its axis {axis}; it is not read")
    count = sum(math.prod(tuple(getattr(a, "shape", ()))) for a in raw.values())
    _within_memory(16 * count, f"reading its {count:,} weights as float64 (two copies)")


def _within_memory(need: int, what: str) -> None:
    """numerics.io.check_memory, its refusal a CheckpointError (read_checkpoint names the file)."""
    try:
        check_memory(need, what)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None


def _extras(entries: dict, layout: str, taken: set) -> list:
    """Notes on the arrays of a file besides its layout's (and its time, step and logit_scale):
    the authors' all-zero biases are ignored; any other array is another model's, refused."""
    extra = sorted(str(k) for k, v in entries.items() if (torch.is_tensor(v) or isinstance(v, np.ndarray))
                   and k not in taken and k not in TIME_KEYS + STEP_KEYS + ("logit_scale",))
    notes = []
    for k in (extra if layout == "authors" else ()):
        if k.endswith(".bias"):
            if np.any(_array(k, entries[k]) != 0):
                raise CheckpointError(f"{k} is a nonzero bias; this model has none (docs/model.md: one layer of attention, "
                                      "no biases), so these weights are another model")
            notes.append(f"{k} is all zero (ignored)")
    others = [k for k in extra if not (layout == "authors" and k.endswith(".bias"))]
    if others:
        what = ("weights besides the attention's q/k/v/o projections" if layout == "authors" else
                f"arrays besides {', '.join(LAYOUT_KEYS[layout])}{' and logit_scale' if layout == 'factored' else ''}")
        raise CheckpointError(f"holds {what} ({others[:4]}); this model is one attention layer and nothing else, so these "
                              "weights are another model")
    return notes


def _logit_scale(entries: dict, layout: str, given) -> tuple[Optional[float], list]:
    """(s, notes): the file's logit_scale or ``--logit-scale`` for a factored file (exactly one of
    them); none for the authors' layout (s = sqrt(d + m) by their module) or a merged file."""
    if layout == "authors" and given is not None:
        raise CheckpointError("--logit-scale does not apply to the authors' layout: its logits are scaled by (d + m)^(-1/2)")
    if layout == "merged" and ("logit_scale" in entries or given is not None):
        raise CheckpointError("a merged file has no logit scale (W_h multiplies the tokens directly); drop logit_scale, or "
                              "give K, Q, V, O as a factored file")
    if layout != "factored":
        return None, []
    if "logit_scale" in entries:
        if given is not None:
            raise CheckpointError("the file carries its logit_scale; --logit-scale would be ignored: drop it")
        return _scalar("logit_scale", entries["logit_scale"], 0.0, above=True, text=True), []
    if given is None:
        raise CheckpointError("a factored file needs logit_scale (the s of W_h = K_h^T Q_h / s): store it beside K, Q, V, O "
                              "(0-d array, or safetensors metadata), or pass --logit-scale")
    if not given > 0:
        raise CheckpointError(f"logit_scale must be > 0, got {given}")
    return float(given), [f"logit scale {float(given):g} from --logit-scale"]


def _authors_factors(arr: dict) -> tuple[dict, str]:
    """K, Q, V, O of the authors' projections (module docstring): rows h D .. (h+1) D of q_proj,
    k_proj, v_proj and columns h D .. (h+1) D of o_proj are head h."""
    q, k_, v, o = (arr[n] for n in LAYOUT_KEYS["authors"])
    if not (q.shape == k_.shape == v.shape):
        raise CheckpointError(f"q_proj, k_proj, v_proj must have one shape (H (d+m), d+m), got {q.shape}, {k_.shape}, {v.shape}")
    rows, D = q.shape
    if D < 2 or rows < D or rows % D:
        raise CheckpointError(f"q_proj.weight has shape {q.shape}: its rows ({rows}) must be H x its columns (d + m = {D}), "
                              "H >= 1 heads of width d + m >= 2, in the authors' layout")
    H, m = rows // D, o.shape[0]
    if o.shape[1] != rows:
        raise CheckpointError(f"o_proj.weight has shape {o.shape}; it must be (m, H (d+m)) = (m, {rows}) to read the {H} "
                              "concatenated heads")
    factors = {"K": k_.reshape(H, D, D), "Q": q.reshape(H, D, D), "V": v.reshape(H, D, D),
               "O": o.reshape(m, H, D).transpose(1, 0, 2)}
    return factors, f"authors' layout: H = {H} heads of width d + m = {D}, logit scale sqrt({D}) = {math.sqrt(D):.6g}"


def _layout_model(entries: dict, layout: str, given_scale, common: dict, tasks=None) -> ExternalModel:
    """The weights of an ``authors``, ``factored`` or ``merged`` file (:data:`LAYOUT_KEYS`), every
    shape checked, mapped onto this project's factored model (K, Q, V, O of width d + m) or merged
    one (W, U)."""
    keys, ndim = LAYOUT_KEYS[layout], (2 if layout == "authors" else 3)
    prefix = _common_prefix(set(entries)) if layout == "authors" else ""
    s, notes = _logit_scale(entries, layout, given_scale)
    raw = {k: entries[prefix + k] for k in keys}
    _check_raw(raw, tasks)
    notes = _extras(entries, layout, {prefix + k for k in keys}) + notes
    arr = {k: _array(k, v) for k, v in raw.items()}
    if any(a.ndim != ndim for a in arr.values()):
        what = "matrices" if ndim == 2 else "stacks of per-head matrices (3 dimensions, heads first)"
        raise CheckpointError(f"{', '.join(keys)} must be {what}, got " + ", ".join(f"{n} {tuple(a.shape)}" for n, a in arr.items()))
    if layout == "merged":
        W, U = arr["W"], arr["U"]
        H, m, D = W.shape[0], U.shape[1], W.shape[2]
        if W.shape != (H, D, D) or U.shape[0] != H or U.shape[2] != D:
            raise CheckpointError(f"W must be (H, d+m, d+m) and U (H, m, d+m), got W {W.shape}, U {U.shape}")
        weights, param = arr, "merged"
    else:
        weights = arr
        if layout == "authors":
            weights, note = _authors_factors(arr)
            notes.append(note)
        K, Q, V, O = (weights[n] for n in "KQVO")
        H, m, D = K.shape[0], O.shape[1], K.shape[2]
        if not (Q.shape == K.shape and V.shape[0] == H and V.shape[2] == D and O.shape[0] == H
                and O.shape[2] == V.shape[1]):
            raise CheckpointError(f"K, Q must be (H, k, d+m), V (H, k', d+m) and O (H, m, k'), got K {K.shape}, "
                                  f"Q {Q.shape}, V {V.shape}, O {O.shape}")
        s, param = (math.sqrt(D) if layout == "authors" else s), "factored"
        if K.shape[1] != D or V.shape[1] != D:
            weights, param = {"W": np.einsum("hka,hkb->hab", K, Q) / s, "U": O @ V}, "merged"
            notes.append(f"head widths k = {K.shape[1]}, k' = {V.shape[1]} differ from d + m = {D}: mapped onto the "
                         "merged model W_h = K_h^T Q_h / s, U_h = O_h V_h (the same function; the factors are not kept)")
            s = None
    if H < 1 or not 1 <= m < D:
        raise CheckpointError(f"the weights have {H} heads and {m} output rows (m tasks) for tokens of width {D}: need "
                              "H >= 1 and 1 <= m < d + m")
    _finite(arr)
    return ExternalModel(layout=layout, param=param, heads=H, m=m, token_dim=D, logit_scale=s, weights=weights,
                         stored_dtype=_stored_dtype(raw.values()), notes=tuple(notes), **common)


def _project(entries: dict, fmt: str, common: dict) -> ExternalModel:
    """A numerics.train checkpoint or run.json: its config, model kind, trajectory and every number
    checked as the trainer's own flags are (an unknown kind, a non-finite or negative rate or time
    refused)."""
    config = entries["config"]
    huge = [k for k, v in config.items() if isinstance(v, int) and abs(v) >= 2 ** 1024] if isinstance(config, dict) else []
    if huge:
        raise CheckpointError(f"config.{str(huge[0])[:40]} is an integer beyond the range of a float")
    try:
        cfg = ProblemConfig.from_dict(dict(config))
    except (TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"a project file whose config is not a valid ProblemConfig ({str(exc)[:200]})") from None
    H, m, D = cfg.heads, cfg.m, cfg.token_dim
    kind = entries.get("model", "full")
    if kind not in ("full", "reduced"):
        raise CheckpointError(f"its model is {_a(kind)}, not 'full' or 'reduced' (the two kinds numerics.train writes)")
    base = dict(heads=H, m=m, token_dim=D, config=cfg.to_dict(), records=_records(entries.get("trajectory"), (H, m)),
                notes=(f"numerics.train {kind} {'run' if fmt == 'json' else 'checkpoint'}",), **common)
    if fmt == "json":
        return _run_json(entries, cfg, kind, base)
    train = entries.get("train")
    if train is not None and not isinstance(train, dict):
        raise CheckpointError(f"its train is {_a(train)}, not the trainer's configuration")
    lr = None if not train or train.get("lr") is None else _scalar("train.lr", train["lr"], 0.0, above=True)
    step = _count("step", entries.get("step"))
    time_ = None if lr is None else lr * step
    if time_ is not None and not math.isfinite(time_):
        raise CheckpointError(f"train.lr x step = {lr:g} x {step} is beyond the range of a float; not a training time")
    params = entries.get("params")
    if not isinstance(params, (list, tuple)) or not all(torch.is_tensor(p) for p in params):
        raise CheckpointError("a project checkpoint whose params are not a list of tensors; it is not one numerics.train wrote")
    if kind == "reduced":
        names, shapes = ("omega", "mu"), [(H, m), (H, m)]
    elif cfg.param == "factored":
        names, shapes = LAYOUT_KEYS["factored"], [(H, D, D)] * 3 + [(H, m, D)]
    else:
        names, shapes = LAYOUT_KEYS["merged"], [(H, D, D), (H, m, D)]
    if len(params) != len(names):
        raise CheckpointError(f"a {kind} {cfg.param} checkpoint needs {len(names)} parameter tensors ({', '.join(names)}), "
                              f"got {len(params)}")
    for n, p, shape in zip(names, params, shapes):
        if tuple(p.shape) != shape:
            raise CheckpointError(f"{n} has shape {tuple(p.shape)}, its config (tasks {cfg.tasks}, H = {H}) says {shape}")
    _check_raw(dict(zip(names, params)), None)
    arr = {n: _array(n, p) for n, p in zip(names, params)}
    _finite(arr)
    param = "reduced" if kind == "reduced" else cfg.param
    return ExternalModel(layout="project", param=param, logit_scale=cfg.logit_scale if param == "factored" else None,
                         weights=arr, stored_dtype=_stored_dtype(params),
                         readout={"omega": arr["omega"], "mu": arr["mu"], "residual": 0.0} if kind == "reduced" else None,
                         time=time_, step=step,
                         time_source="project checkpoint: step x train.lr" if time_ is not None else None, **base)


def _run_json(entries: dict, cfg: ProblemConfig, kind: str, base: dict) -> ExternalModel:
    """A run.json of numerics.train: the readout (omega, mu, residual), the tail loss, t_end; no weights."""
    shape = (cfg.heads, cfg.m)
    om, mu = _grid("omega", entries.get("omega"), shape), _grid("mu", entries.get("mu"), shape)
    value = lambda key, low=None: None if entries.get(key) is None else _scalar(key, entries[key], low)  # noqa: E731
    t_end = value("t_end", 0.0)
    return ExternalModel(layout="project", param="readout" if kind == "full" else "reduced",
                         logit_scale=cfg.logit_scale, weights={"omega": om, "mu": mu},
                         readout={"omega": om, "mu": mu, "residual": value("residual", 0.0),
                                  "train_tail_loss": value("loss")},
                         time=t_end, time_source="run.json t_end",
                         missing=("weights: a run.json holds the readout and the trajectory, not the weights, so "
                                  "the model's own held-out loss and its off-D split cannot be measured (hand the "
                                  "--checkpoint file of the run instead)",) if kind == "full" else (), **base)


# --------------------------------------------------------------------------- configuration

def check_against(ext: ExternalModel, tasks: tuple) -> None:
    """The checkpoint's shapes against the researcher's ``--tasks``: m outputs and token width
    d + m; one :class:`CheckpointError` naming both on a mismatch (a project file's config is held
    against the request by claims.audit.plan_audit)."""
    d, m = sum(tasks), len(tasks)
    spec = ",".join(map(str, tasks))
    if ext.m != m:
        raise CheckpointError(f"{ext.path}: the weights have m = {ext.m} outputs (one per task), but --tasks {spec} "
                              f"gives m = {m} tasks")
    if ext.token_dim != d + m:
        raise CheckpointError(f"{ext.path}: the weights read tokens of width d + m = {ext.token_dim}, but --tasks "
                              f"{spec} gives d + m = {d} + {m} = {d + m}")


def problem_config(ext: ExternalModel, tasks, L: int, sigma: float = 0.0, basis: str = "identity",
                   basis_seed: int = 0, device: str = "cpu") -> ProblemConfig:
    """The ProblemConfig the checkpoint is audited at: the researcher's problem, the checkpoint's H,
    parametrisation and logit scale, float64."""
    check_against(ext, tuple(tasks))
    param = "merged" if ext.param == "merged" else "factored"
    return ProblemConfig(tasks=tuple(tasks), heads=ext.heads, L=int(L), sigma=float(sigma), basis=basis,
                         basis_seed=int(basis_seed), param=param,
                         logit_scale=float(ext.logit_scale) if ext.logit_scale else 1.0, device=device)


def build_model(ext: ExternalModel, cfg: ProblemConfig) -> Optional[MultiHeadAttention]:
    """The checkpoint as this project's model (``MultiHeadAttention.from_weights``), None for a file
    without weights (run.json, a reduced checkpoint)."""
    if not ext.has_weights:
        return None
    return MultiHeadAttention.from_weights(cfg, **{k: torch.as_tensor(v, dtype=cfg.torch_dtype, device=cfg.device)
                                                   for k, v in ext.weights.items()})


def held_out_chunk(cfg: ProblemConfig) -> int:
    """Prompts per held-out batch: HELD_OUT_CHUNK unless a batch of that size (context, logits and
    their softmax, about numerics.train.step_memory_bytes) would take more than
    numerics.io.MEMORY_FRACTION (a half) of the memory available; a CheckpointError if not even 2 prompts fit."""
    from .train import step_memory_bytes

    free = memory_available() if cfg.device == "cpu" else None
    chunk = HELD_OUT_CHUNK
    while free is not None and chunk > 2 and step_memory_bytes(cfg, chunk) > MEMORY_FRACTION * free:
        chunk //= 2
    if free is not None and step_memory_bytes(cfg, chunk) > MEMORY_FRACTION * free:
        raise CheckpointError(f"a held-out batch of {chunk} prompts at L = {cfg.L}, d + m = {cfg.token_dim}, "
                              f"H = {cfg.heads} needs {step_memory_bytes(cfg, chunk) / 2 ** 30:.2g} GiB, more than "
                              f"half the {free / 2 ** 30:.2g} GiB available; lower --L or use a larger machine")
    return chunk


# --------------------------------------------------------------------------- measurement

@dataclass(frozen=True)
class Measurement:
    """What numerics measures of one checkpoint (module docstring): the readout, its off-D split
    (``split``: theory.initialisation.residual_split; None without weights), the allocation
    readout and the zero-sum ratios, the factor balance (factored models: max over heads and tasks
    of |k^2 - q^2| / (2 s |omega|) and |o^2 - v^2| / (2 |mu|), 0 when balanced), the held-out loss
    (None without weights; a reduced checkpoint's is its reduced loss) and the loss of the
    projection onto D at the readout on the same prompts; ``spread`` (H x m each, None without
    weights): the off-D part of the very entries each value is read from -- ``omega``: the RMS
    deviation ||Phi_i^T (W_h - P_D W_h)_XX Phi_i||_F / sqrt(r_i) of block i's eigenvalues from
    omega[h, i], ``mu``: the norm of row i of U_h - P_D U_h (0 on D)."""

    omega: np.ndarray
    mu: np.ndarray
    residual: Optional[float]
    split: Optional[dict]
    allocation: dict
    zero_sum: tuple
    balance: Optional[dict]
    loss: Optional[LossEstimate]
    projected_loss: Optional[LossEstimate]
    spread: Optional[dict]
    chunk: int
    seed: int
    seconds: float
    cpu_seconds: float


def _balance(model: MultiHeadAttention, omega: np.ndarray, mu: np.ndarray) -> dict:
    c_om, c_mu = factor_balance(model)
    s = model.cfg.logit_scale
    with np.errstate(divide="ignore", invalid="ignore"):
        r_om = np.where(np.abs(omega) > 0, np.abs(c_om) / (2.0 * s * np.abs(omega)), np.where(c_om == 0, 0.0, np.inf))
        r_mu = np.where(np.abs(mu) > 0, np.abs(c_mu) / (2.0 * np.abs(mu)), np.where(c_mu == 0, 0.0, np.inf))
    return {"omega": float(np.max(r_om)), "mu": float(np.max(r_mu)), "c_omega": c_om.tolist(), "c_mu": c_mu.tolist()}


def readout_spread(W: np.ndarray, U: np.ndarray, cfg: ProblemConfig) -> dict:
    """The ``spread`` of :class:`Measurement` from merged weights W (H, D, D), U (H, m, D)."""
    from theory.reduced_ode import project_decomposable

    Phi, d = cfg.basis_numpy(), cfg.d
    W_D, U_D = project_decomposable(W, U, cfg.tasks, Phi)
    off_W, off_U = W - W_D, U - U_D
    om = np.stack([np.linalg.norm(np.einsum("ak,hab,bl->hkl", Phi[:, sl], off_W[:, :d, :d], Phi[:, sl]), axis=(1, 2))
                   / math.sqrt(sl.stop - sl.start) for sl in cfg.block_slices], axis=1)
    mu = np.linalg.norm(off_U, axis=2)
    return {"omega": om.tolist(), "mu": mu.tolist()}


def measure(ext: ExternalModel, cfg: ProblemConfig, n: int = 16384, seed: int = 0) -> Measurement:
    """Measure one checkpoint at ``cfg`` (the class docstring): ``n`` held-out prompts of the
    held-out stream of ``seed`` (numerics.evaluate), in batches of :func:`held_out_chunk`."""
    from theory.initialisation import residual_split

    t0, c0 = time.perf_counter(), time.process_time()
    chunk = held_out_chunk(cfg)
    model = build_model(ext, cfg)
    balance = split = spread = None
    if model is not None:
        ro = model.semi_singular_values()
        omega, mu, residual = ro.omega, ro.mu, float(ro.residual)
        W, U = (x.detach().to("cpu", torch.float64).numpy() for x in model.merged_weights())
        split = residual_split(W, U, cfg.tasks, cfg.basis_numpy())
        spread = readout_spread(W, U, cfg)
        if cfg.param == "factored":
            balance = _balance(model, omega, mu)
        with torch.no_grad():
            loss = held_out_loss(model, n=n, seed=seed, chunk=chunk)
    else:
        omega, mu = np.asarray(ext.readout["omega"], float), np.asarray(ext.readout["mu"], float)
        residual = ext.readout.get("residual")
        loss = None
    projected = held_out_reduced_loss(omega, mu, cfg, n=n, seed=seed, chunk=chunk)
    if ext.param == "reduced":
        loss = projected            # the reduced model is its own projection
    return Measurement(omega=np.asarray(omega, float), mu=np.asarray(mu, float), residual=residual, split=split,
                       allocation=allocation(omega, mu).to_dict(), zero_sum=zero_sum_ratio(mu), balance=balance,
                       loss=loss, projected_loss=projected, spread=spread, chunk=chunk, seed=int(seed),
                       seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0)


def gradient_noise(omega, mu, cfg: ProblemConfig, n: int = 16384, seed: int = 0,
                   chunk: int = HELD_OUT_CHUNK) -> dict:
    """The held-out gradient of the loss at the point (omega, mu) of D and its noise: over ``n``
    fresh prompts of the held-out stream of ``seed`` (numerics.evaluate's), the per-prompt
    gradients J of the reduced model's prompt loss (the one prediction formula,
    numerics.model.predict_from_scores, differentiated prompt by prompt with torch.func:
    memory linear in the batch, unlike a Jacobian of the batch's losses) give ``mean`` (2, H, m:
    d/domega, d/dmu), their standard errors ``se`` (2, H, m) and per (h, i) the 2 x 2 covariance
    ``cov`` (H, m, 2, 2) of (J_omega[h, i], J_mu[h, i]) per prompt.  On D the reduced model's
    gradient is the full model's read out on D (the chain rule)."""
    from torch.func import grad, vmap

    from .config import sample_prompts
    from .evaluate import held_out_generator
    from .model import block_scores, predict_from_scores

    gen = held_out_generator(seed, cfg.device)
    om = torch.as_tensor(np.asarray(omega, float), dtype=cfg.torch_dtype, device=cfg.device)
    mu_ = torch.as_tensor(np.asarray(mu, float), dtype=cfg.torch_dtype, device=cfg.device)

    def prompt_loss(o, u, scores, labels, target):
        return ((predict_from_scores(o, u, scores[None], labels[None])[0] - target) ** 2).sum()
    per_prompt = vmap(grad(prompt_loss, argnums=(0, 1)), in_dims=(None, None, 0, 0, 0))
    H, m = cfg.heads, cfg.m
    s1 = np.zeros((2, H, m))
    s2 = np.zeros((H, m, 2, 2))
    left = n
    while left > 0:
        b = min(chunk, left)
        pr = sample_prompts(cfg, b, gen)
        scores, labels = block_scores(pr, cfg)
        J = per_prompt(om, mu_, scores, labels, pr.target)
        G = torch.stack([j.detach() for j in J], dim=-1).to("cpu", torch.float64).numpy()   # (b, H, m, 2)
        s1 += np.moveaxis(G.sum(axis=0), -1, 0)
        s2 += np.einsum("bhia,bhic->hiac", G, G)
        left -= b
    mean = s1 / n
    mean_hi = np.moveaxis(mean, 0, -1)                                       # (H, m, 2)
    cov = (s2 / n - np.einsum("hia,hic->hiac", mean_hi, mean_hi)) * n / (n - 1)
    se = np.sqrt(np.maximum(np.stack([cov[..., 0, 0], cov[..., 1, 1]]), 0.0) / n)
    return {"mean": mean, "se": se, "cov": cov, "n": int(n), "seed": int(seed), "chunk": int(chunk)}


def loss_descent(earlier: ExternalModel, later: ExternalModel, cfg: ProblemConfig, n: int, seed: int,
                 chunk: int) -> Optional[LossEstimate]:
    """The held-out loss of ``earlier`` minus that of ``later`` on the same prompts, with the
    paired standard error (``numerics.evaluate.held_out_loss_difference``): how much the run still
    fell between the two checkpoints.  None when either file has no weights."""
    a, b = build_model(earlier, cfg), build_model(later, cfg)
    if a is None or b is None:
        return None
    with torch.no_grad():
        return held_out_loss_difference(a, b, n=n, seed=seed, chunk=chunk)
