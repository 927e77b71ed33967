"""The grid: a TOML file of fixed values and ranges, validated and expanded into points.

    point = {"model": "full" | "reduced", "problem": {ProblemConfig fields},
             "train": {TrainConfig fields}}

Every point carries every field, defaults filled in, in canonical JSON form (tuples as lists,
an integer given for a float field as a float), so that its content hash
(:func:`numerics.stored.point_id`) identifies the full configuration. The format is
described in ``docs/sweep.md``; ``examples/*.toml`` are grids.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from numerics.io import SEED_MAX, TOMLDecodeError, read_input_bytes, toml_loads
from numerics.config import ProblemConfig
from numerics.train import MAX_STEPS, TrainConfig

MODELS = ("full", "reduced", "converged", "atlas")
"""``full``/``reduced``: one ``numerics.train`` run (its [train] section holds TrainConfig fields);
``converged``: a full model trained to its converged loss the way claims 5 and 6 do
(``numerics.experiments.converged``: explore, polish, held-out loss; its [train] section holds
TrainingSchedule fields and ``seed``), so a report built with ``--from-sweep`` takes these runs
instead of training them; ``atlas``: one full model trained from a stated start and measured for the
atlas's phase diagrams (``numerics.experiments.atlas``: its [train] section holds AtlasSchedule
fields and ``seed``; the atlas ids (``claims.atlas``) read these points with ``--from-sweep``)."""
GRID_SECTIONS = ("description", "model", "problem", "train", "cross", "zip")
# TrainConfig fields the sweep owns: its own progress bar replaces the per-run one, and a
# point's checkpoint would be a path outside the content hash.
SWEEP_MANAGED_TRAIN_FIELDS = ("progress", "checkpoint")
MAX_GRID_POINTS = 100_000
"""The most points a grid may expand to, counted arithmetically before any point is built (a
grid of 10^9 points would otherwise fill the memory, even with --dry-run)."""


@dataclass(frozen=True)
class _Field:
    default: Any  # dataclasses.MISSING when the field is required
    type: str     # the annotation as written ("float", "tuple[int, ...]", ...)


def _dataclass_fields(cls) -> dict[str, _Field]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = dataclasses.MISSING
        out[f.name] = _Field(default, f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type)))
    return out


def config_fields(model: str = "full") -> tuple[dict[str, _Field], dict[str, _Field]]:
    """The fields (default, annotation) of ``ProblemConfig`` and of ``TrainConfig``, less the
    training fields the sweep manages itself (progress bar, checkpoint path); for
    ``model = "converged"`` the [train] fields are TrainingSchedule's and ``seed``."""
    problem = _dataclass_fields(ProblemConfig)
    if model == "converged":
        from numerics.experiments.converged import TrainingSchedule
        return problem, {**_dataclass_fields(TrainingSchedule), "seed": _Field(0, "int")}
    if model == "atlas":
        from numerics.experiments.atlas import AtlasSchedule
        return problem, {**_dataclass_fields(AtlasSchedule), "seed": _Field(0, "int")}
    train = {k: v for k, v in _dataclass_fields(TrainConfig).items() if k not in SWEEP_MANAGED_TRAIN_FIELDS}
    return problem, train


def canonical(value: Any, annotation: str) -> Any:
    """JSON form of a field value: tuples become lists, an integer given for a ``float`` field
    becomes a float (``sigma = 0`` and ``sigma = 0.0`` are the same point), and -0.0 becomes 0.0
    (the same number: ``sigma = -0.0`` is the point ``sigma = 0.0``, one id)."""
    if isinstance(value, (list, tuple)):
        return [canonical(v, "") for v in value]
    if annotation.replace(" ", "") in ("float", "float|None", "Optional[float]") and isinstance(value, int) \
            and not isinstance(value, bool):
        return float(value)
    if isinstance(value, float) and value == 0.0:
        return 0.0
    return value


_VALUE_TYPES = (bool, int, float, str)


def _check_value(label: str, value: Any) -> None:
    """A configuration value is a number, a string, a boolean or a list of them (what JSON, the
    point's stored form, holds); TOML's dates and times, and tables, are refused here -- before
    any output folder exists -- naming the field."""
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_value(label, v)
        return
    if not isinstance(value, _VALUE_TYPES):
        kind = {"datetime": "a TOML date-time", "date": "a TOML date", "time": "a TOML time",
                "dict": "a table"}.get(type(value).__name__, type(value).__name__)
        raise ValueError(f"grid: {label} = {value} is {kind}, not a configuration value; give a number, a string, "
                         "true/false or a list of them")


def _flatten_ranges(table: dict, where: str, problem: dict, train: dict) -> list[tuple[tuple[str, str], Any]]:
    """``{"L": [..], "train": {"seed": [..]}}`` -> ``[(("problem", "L"), [..]), (("train", "seed"), [..])]``.

    A bare name is looked up in ProblemConfig, then TrainConfig (they share no field name);
    ``problem.X`` / ``train.X`` (TOML dotted keys or sub-tables) name the section explicitly."""
    out = []
    for key, values in table.items():
        if key in ("problem", "train") and isinstance(values, dict):
            fields_ = problem if key == "problem" else train
            for sub, sub_values in values.items():
                if sub not in fields_:
                    raise ValueError(f"{where}: {key}.{sub} is not a {'ProblemConfig' if key == 'problem' else 'TrainConfig'} "
                                     f"field; the fields are: {', '.join(sorted(fields_))}")
                out.append(((key, sub), sub_values))
            continue
        if key == "model":
            out.append((("model", "model"), values))
        elif key in problem and key in train:
            raise ValueError(f"{where}: {key!r} is a field of both ProblemConfig and TrainConfig; "
                             f"write problem.{key} or train.{key}")
        elif key in problem:
            out.append((("problem", key), values))
        elif key in train:
            out.append((("train", key), values))
        elif key in SWEEP_MANAGED_TRAIN_FIELDS:
            raise ValueError(f"{where}: {key!r} is set by the sweep itself and cannot be swept")
        else:
            raise ValueError(f"{where}: unknown field {key!r}; ranges may name 'model', a ProblemConfig field "
                             f"({', '.join(sorted(problem))}) or a TrainConfig field ({', '.join(sorted(train))})")
    return out


def _check_range(where: str, name: str, values: Any, problem: dict, unique: bool = True,
                 annotation: str = "") -> list:
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: the range of {name} must be a non-empty list of values, got {values!r} "
                         f"(a fixed value belongs in [problem] or [train])")
    for v in values:
        _check_value(f"{where} {name}", v)
    if name in problem and "tuple" in problem[name].type:
        bad = [v for v in values if not isinstance(v, list)]
        if bad:
            raise ValueError(f"{where}: {name} takes a list per point, so its range is a list of lists, "
                             f"e.g. {name} = [[3, 3], [4, 4]]; got {values!r}")
    # compared in the form the point stores (0 and 0.0 for a float, 0.0 and -0.0: one point)
    canon = [json.dumps(canonical(v, annotation), sort_keys=True) for v in values]
    if unique and len(set(canon)) != len(canon):
        raise ValueError(f"{where}: the range of {name} repeats a value: {values!r} (compared as a point stores "
                         "them: 0 and 0.0 of a float field, and 0.0 and -0.0, are one value)")
    return values


def expand_grid(spec: dict) -> list[dict]:
    """A grid spec (a parsed TOML file) -> the list of its points, in a fixed order.

    Sections (all optional but ``tasks``, ``heads`` and ``L`` must be given somewhere):

    - ``model = "full" | "reduced"`` (default ``"full"``);
    - ``[problem]`` fixed ProblemConfig fields; ``[train]`` fixed TrainConfig fields;
    - ``[cross]`` ranges, crossed with each other: ``L = [64, 128, 256]``,
      ``tasks = [[3, 3], [4, 4]]``, ``model = ["full", "reduced"]``, ``seed = [0, 1]``;
      a name may be qualified, ``train.seed`` or ``problem.L``;
    - ``[zip]`` (or several ``[[zip]]``): ranges of equal length taken together, each group
      one more factor of the cross: ``tasks = [[3, 3], [3, 3, 3]]`` with ``heads = [2, 3]``.

    The points are the Cartesian product of the factors in the order they are written
    (``[cross]`` keys, then the ``[zip]`` groups), the last factor varying fastest. Every
    point carries every field, defaults filled in, so that its content hash identifies the
    full configuration. Structural mistakes (an unknown field, a key both fixed and swept,
    an empty or repeated range, an unknown model) raise ``ValueError`` here; a *value* that
    ProblemConfig rejects (say ``heads = 0``) does not: that point fails when it runs, with
    ProblemConfig's message, and the rest of the sweep goes on.
    """
    if not isinstance(spec, dict):
        raise TypeError(f"a grid spec is a dict (a parsed TOML file), got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(GRID_SECTIONS))
    if unknown:
        raise ValueError(f"grid: unknown top-level key(s) {unknown}; allowed: {', '.join(GRID_SECTIONS)}")
    problem_fields, train_fields = config_fields(spec.get("model", "full"))
    _check_fixed_sections(spec, problem_fields, train_fields)
    factors = _range_factors(spec, problem_fields, train_fields)
    _check_grid_size(factors)
    return [_grid_point(spec, factors, combo, problem_fields, train_fields)
            for combo in itertools.product(*[values for _, values in factors])]


def _check_fixed_sections(spec: dict, problem_fields: dict, train_fields: dict) -> None:
    """[problem] and [train] are tables of known fields, none of them one the sweep sets."""
    for name, section, fields_, cls in (("[problem]", spec.get("problem", {}), problem_fields, "ProblemConfig"),
                                        ("[train]", spec.get("train", {}), train_fields, "TrainConfig")):
        if not isinstance(section, dict):
            raise ValueError(f"grid: {name} must be a table of {cls} fields")
        for key in section:
            if key in SWEEP_MANAGED_TRAIN_FIELDS and cls == "TrainConfig":
                raise ValueError(f"grid: {name} {key!r} is set by the sweep itself; remove it")
            if key not in fields_:
                raise ValueError(f"grid: {name} has unknown field {key!r}; {cls} fields are: "
                                 f"{', '.join(sorted(fields_))}")


def _range_factors(spec: dict, problem_fields: dict, train_fields: dict) -> list[tuple[list[tuple[str, str]], list[tuple]]]:
    """The factors of the grid's product, in the order written: one per [cross] range (its
    values as 1-tuples), then one per [zip] group (its rows); each factor is (the
    (section, name) targets it sets, its values). A field is swept at most once and never
    also fixed."""
    swept: dict[tuple[str, str], str] = {}
    factors: list[tuple[list[tuple[str, str]], list[tuple]]] = []
    cross = spec.get("cross", {})
    if not isinstance(cross, dict):
        raise ValueError("grid: [cross] must be a table of ranges")
    for target, values in _flatten_ranges(cross, "[cross]", problem_fields, train_fields):
        _claim(spec, swept, target, "[cross]")
        values = _check_range("[cross]", target[1], values, problem_fields,
                              annotation=_annotation(target, problem_fields, train_fields))
        factors.append(([target], [(v,) for v in values]))
    zips = spec.get("zip", [])
    zips = [zips] if isinstance(zips, dict) else zips
    if not isinstance(zips, list) or not all(isinstance(z, dict) for z in zips):
        raise ValueError("grid: [zip] must be a table (or [[zip]] tables) of equal-length ranges")
    for n, group in enumerate(zips):
        factors.append(_zip_factor(spec, swept, group, f"[zip] group {n + 1}", problem_fields, train_fields))
    return factors


def _annotation(target: tuple[str, str], problem_fields: dict, train_fields: dict) -> str:
    """The annotation of a swept field ("" for the model), which fixes its canonical form."""
    fields_ = problem_fields if target[0] == "problem" else train_fields if target[0] == "train" else {}
    return fields_[target[1]].type if target[1] in fields_ else ""


def _claim(spec: dict, swept: dict, target: tuple[str, str], where: str) -> None:
    """Record that ``where`` sweeps ``target``; refuse a second sweep of it, or a sweep of a
    field the spec also fixes (the point would not say which value it ran)."""
    section, name = target
    label = name if section == "model" else f"{section}.{name}"
    if target in swept:
        raise ValueError(f"grid: {label} is swept twice ({swept[target]} and {where}); keep one")
    if (section == "problem" and name in spec.get("problem", {})) or (section == "train" and name in spec.get("train", {})) \
            or (section == "model" and "model" in spec):
        raise ValueError(f"grid: {label} is both fixed and swept in {where}; keep one")
    swept[target] = where


def _zip_factor(spec: dict, swept: dict, group: dict, where: str, problem_fields: dict,
                train_fields: dict) -> tuple[list[tuple[str, str]], list[tuple]]:
    """One [zip] group as a factor: its ranges, of equal lengths, taken together row by row;
    a value may repeat within a range ((4, 4) with 1 and 2 heads), a whole row may not."""
    entries = _flatten_ranges(group, where, problem_fields, train_fields)
    if not entries:
        raise ValueError(f"grid: {where} is empty")
    for target, values in entries:
        _claim(spec, swept, target, where)
        _check_range(where, target[1], values, problem_fields, unique=False)
    lengths = {target[1]: len(values) for target, values in entries}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"grid: the ranges of {where} are taken together, so they need equal lengths; got {lengths}")
    rows = list(zip(*[values for _, values in entries]))
    canon_rows = {json.dumps([canonical(v, _annotation(t, problem_fields, train_fields)) for (t, _), v in zip(entries, row)],
                             sort_keys=True)
                  for row in rows}
    if len(canon_rows) != len(rows):
        raise ValueError(f"grid: {where} repeats a row: {rows}")
    return [t for t, _ in entries], rows


def _check_grid_size(factors: list) -> None:
    """Refuse more than MAX_GRID_POINTS points, counted before anything is built."""
    size = math.prod(len(values) for _, values in factors)
    if size > MAX_GRID_POINTS:
        shape = " x ".join(f"{len(values)} ({'/'.join(t[1] for t in targets)})" for targets, values in factors)
        raise ValueError(f"grid: {shape} = {size:,} points, more than the limit of {MAX_GRID_POINTS:,} (a sweep "
                         "of more is weeks of compute even at seconds a point, and its list of points alone takes "
                         "gigabytes); split the grid or shorten its ranges")


def _grid_point(spec: dict, factors: list, combo: tuple, problem_fields: dict, train_fields: dict) -> dict:
    """The point of one combination of the factors' values: the fixed fields with the swept
    ones set, every field filled in canonical form, its model and schedule checked."""
    fixed_model = spec.get("model", "full")
    model, problem, train = fixed_model, dict(spec.get("problem", {})), dict(spec.get("train", {}))
    for (targets, _), values in zip(factors, combo):
        for (section, name), value in zip(targets, values):
            if section == "model":
                model = value
            elif section == "problem":
                problem[name] = value
            else:
                train[name] = value
    if model not in MODELS:
        raise ValueError(f"grid: model must be one of {MODELS}, got {model!r}")
    if (model == "converged") != (fixed_model == "converged"):
        raise ValueError("grid: model 'converged' takes TrainingSchedule fields in [train]; it cannot be swept "
                         "together with 'full'/'reduced' (write two grids)")
    if (model == "atlas") != (fixed_model == "atlas"):
        raise ValueError("grid: model 'atlas' takes AtlasSchedule fields in [train]; it cannot be swept "
                         "together with other models (write two grids)")
    filled = _fill(train, train_fields, "train")
    if model == "atlas":
        from numerics.experiments.atlas import check_point
        check_point({"model": model, "train": filled}, problem=False)   # the schedule; ProblemConfig at run time
    elif model == "converged":
        from numerics.experiments.converged import check_schedule
        check_schedule(filled, int(problem.get("L", 1)) if isinstance(problem.get("L"), int) else 1)
    else:
        _check_steps(filled)
    return {"model": model, "problem": _fill(problem, problem_fields, "problem"), "train": filled}


def _check_steps(train: dict) -> None:
    """Refuse a point whose step count round(time / lr) is absurd (time 1e18, lr 1e-300):
    structural like a NaN, since no such run could end; TrainConfig's limit, named here with
    the grid's fields."""
    time_, lr = train.get("time"), train.get("lr")
    if isinstance(time_, (int, float)) and isinstance(lr, (int, float)) and not isinstance(time_, bool) \
            and not isinstance(lr, bool) and lr > 0 and time_ > 0 and not time_ / lr <= MAX_STEPS:
        raise ValueError(f"grid: train.time / train.lr = {time_:g} / {lr:g} = {time_ / lr:.3g} steps, more than the "
                         f"trainer's limit of {MAX_STEPS:,} steps (numerics.train.MAX_STEPS); raise train.lr or "
                         "lower train.time")


def _fill(given: dict, fields_: dict[str, _Field], section: str) -> dict:
    out = {}
    for name, f in fields_.items():
        if name in given:
            _check_value(f"{section}.{name}", given[name])
            _check_finite(f"{section}.{name}", given[name])
            if name.endswith("seed"):
                _check_seed(f"{section}.{name}", given[name])
            out[name] = canonical(given[name], f.type)
        elif f.default is dataclasses.MISSING:
            raise ValueError(f"grid: every point needs {section}.{name}; give it in [{section}] or as a range in [cross]")
        else:
            out[name] = canonical(f.default, f.type)
    return out


def _check_seed(label: str, value: Any) -> None:
    """Seeds are integers in 0 .. 2^64 - 1 (numerics.io.SEED_MAX): refused up front, as
    the command lines' --seed, rather than as a failed point."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"grid: {label} = {value!r} is not a seed: seeds are integers in 0 .. 2^64 - 1")


def _check_finite(label: str, value: Any) -> None:
    """Refuse nan/inf (TOML writes them ``nan``, ``inf``) up front, naming the field: a point
    holding one has no JSON form, so it could be neither hashed nor stored."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"grid: {label} = {value} is not a finite number; give a finite value (TOML's nan and "
                         "inf are not valid configuration values)")
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_finite(label, v)


def complete_point(point: dict) -> dict:
    """A hand-made point (``{"model", "problem": {...}, "train": {...}}`` naming only some
    fields) in the canonical form of :func:`expand_grid`: every field, defaults filled in,
    so that it has the same :func:`point_id` as the same configuration coming from a grid."""
    if not isinstance(point, dict) or not isinstance(point.get("problem"), dict):
        raise TypeError("a point is a dict {'model': ..., 'problem': {...}, 'train': {...}}")
    spec = {"model": point.get("model", "full"), "problem": point["problem"], "train": point.get("train", {})}
    unknown = sorted(set(point) - {"model", "problem", "train"})
    if unknown:
        raise ValueError(f"a point has only the keys model, problem, train; got also {unknown}")
    (completed,) = expand_grid(spec)
    return completed


def load_grid(path: Union[str, Path]) -> tuple[dict, str]:
    """Read a grid file: ``(parsed spec, its text)``; a clear error if missing or not TOML."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"grid file {str(path)!r} is a directory; pass the grid TOML file itself "
                         "(see examples/grid.toml for the format)")
    if not os.path.lexists(path):
        raise FileNotFoundError(f"grid file {str(path)!r} does not exist (see examples/grid.toml for the format)")
    data = read_input_bytes(path, "grid file")   # a FIFO or a file over 16 MiB: refused unread
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"grid file {str(path)!r} is not a text file (it is not UTF-8: a binary file?); pass "
                         "the grid TOML file (see examples/grid.toml for the format)") from None
    try:
        spec = toml_loads(text)
    except TOMLDecodeError as exc:
        raise ValueError(f"grid file {str(path)!r} is not valid TOML: {exc}") from None
    return spec, text
