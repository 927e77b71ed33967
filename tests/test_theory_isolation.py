"""The layering, checked in a fresh interpreter, where sys.modules shows exactly what an import
pulled in, and in the source, where an import inside a function shows too:

- theory is the mathematics the numerics are held against: every module of theory/ (every file on
  disk, a ``__main__`` included) imports neither torch nor anything from numerics, claims or
  reports, and does no I/O (no file opened, nothing printed, no command line: that is
  ``python -m reports.theory``);
- numerics.io is the ground floor (options, files, outputs, processes): importing it loads
  nothing from theory, claims, reports or the rest of numerics (the package ``numerics`` itself
  loads its names lazily), and not torch (the device check imports torch only when asked about a
  CUDA name);
- the report's commands refuse bad arguments before they load torch or matplotlib: importing
  claims.core, reports.build or reports.audit loads neither (numerics.evaluate imports torch, and
  reports.render matplotlib, only inside the functions that compute or draw)."""
import ast
import json
import pathlib
import subprocess
import sys

import theory

THEORY_FILES = sorted(pathlib.Path(theory.__file__).parent.glob("*.py"))
SUBMODULES = ["theory", *[f"theory.{p.stem}" for p in THEORY_FILES if p.stem != "__init__"]]
IO_MODULES = ["numerics.io"]
THEORY_MUST_NOT_LOAD = ("torch", "numerics", "claims", "reports")
IO_MUST_NOT_LOAD = ("torch", "theory", "numerics", "claims", "reports")
LIGHT_MODULES = ["claims.core", "reports.build", "reports.audit"]
LIGHT_MUST_NOT_LOAD = ("torch", "matplotlib")
IO_MAY_LOAD = ("numerics", "numerics.io")
"""What of the forbidden packages numerics.io may load: the package numerics (its __init__ imports
nothing eagerly) and numerics.io itself."""


def _loaded_after_each(modules, forbidden, allowed=()) -> dict:
    """{module: the modules of the forbidden top-level packages, less the allowed ones, loaded once
    it and those before it are imported}."""
    code = ("import importlib, json, sys\n"
            f"forbidden, allowed = {tuple(forbidden)!r}, {tuple(allowed)!r}\n"
            "def bad(m):\n"
            "    return m.split('.')[0] in forbidden and not any(m == a or (a.endswith('.') and m.startswith(a))\n"
            "                                                     for a in allowed)\n"
            f"out = {{}}\nfor name in {list(modules)!r}:\n"
            "    importlib.import_module(name)\n"
            "    out[name] = sorted(m for m in sys.modules if bad(m))\n"
            "print(json.dumps(out))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_theory_loads_neither_torch_nor_numerics():
    """One fresh interpreter imports every submodule in turn and reports, after each, the
    forbidden modules loaded so far (one interpreter: a sympy start-up per module would cost
    seconds each)."""
    loaded = _loaded_after_each(SUBMODULES, THEORY_MUST_NOT_LOAD)
    assert set(loaded) == set(SUBMODULES)
    bad = {name: mods[:10] for name, mods in loaded.items() if mods}
    assert not bad, f"importing theory loaded {bad}"


def test_numerics_io_is_the_ground_floor():
    """numerics.io imports nothing of the project but itself, and not torch."""
    loaded = _loaded_after_each(IO_MODULES, IO_MUST_NOT_LOAD, IO_MAY_LOAD)
    bad = {name: mods[:10] for name, mods in loaded.items() if mods}
    assert not bad, f"importing numerics.io loaded {bad}"


def test_the_report_commands_load_no_torch_or_matplotlib_before_their_arguments_are_checked():
    """claims.core reads numerics.evaluate's estimators and reports.build its schema; neither import
    may pull in torch or matplotlib (seconds of start-up before a bad argument is refused)."""
    loaded = _loaded_after_each(LIGHT_MODULES, LIGHT_MUST_NOT_LOAD)
    bad = {name: mods[:10] for name, mods in loaded.items() if mods}
    assert not bad, f"importing the report's commands loaded {bad}"


def _forbidden_in_source(path, forbidden=THEORY_MUST_NOT_LOAD + ("argparse",),
                        io_calls=("open", "print", "input")) -> list:
    """The imports of ``forbidden`` packages anywhere in the file (a function's lazy import
    included) and the calls of the built-ins that read or write (``io_calls``)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] in forbidden]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in forbidden:
            bad.append(node.module)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in io_calls:
            bad.append(f"{node.func.id}() at line {node.lineno}")
    return bad


def test_no_theory_source_imports_the_project_or_does_io():
    """Every file of theory/, read as source: a lazy import inside a function (which the probe
    above sees only once the function runs) or a print counts too."""
    assert {p.name for p in THEORY_FILES} >= {"__init__.py", "exact.py", "reduced_ode.py"}
    bad = {p.name: found for p in THEORY_FILES if (found := _forbidden_in_source(p))}
    assert not bad, f"theory/ must be pure mathematics: {bad}"


def test_the_check_can_fail(tmp_path):
    """The same probe sees torch when something does import it, and the source check sees a lazy
    import of numerics.io and a print (neither check is vacuous)."""
    loaded = _loaded_after_each(["numerics.model"], ("torch", "numerics"))
    assert "torch" in loaded["numerics.model"]
    assert _loaded_after_each(["numerics.model"], ("numerics",), IO_MAY_LOAD)["numerics.model"]
    impure = tmp_path / "impure.py"
    impure.write_text("import math\n\ndef f(x):\n    from numerics.io import write_output\n"
                      "    print(x)\n    return math.sqrt(x)\n")
    assert _forbidden_in_source(impure) == ["numerics.io", "print() at line 5"]
