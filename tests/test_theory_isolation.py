"""The layering, checked in a fresh interpreter, where sys.modules shows exactly what an import
pulled in:

- theory is the mathematics the numerics are held against: importing it (the package and every
  submodule) loads neither torch nor anything from numerics, claims or reports (theory is pure
  mathematics; only its command line, ``python -m theory`` -- theory.__main__, which no library
  import loads -- reads options and writes files through numerics.io, and loads nothing else of
  numerics);
- numerics.io is the ground floor (options, files, outputs, processes): importing it loads
  nothing from theory, claims, reports or the rest of numerics (the package ``numerics`` itself
  loads its names lazily), and not torch (the device check imports torch only when asked about a
  CUDA name)."""
import json
import subprocess
import sys

import numerics.io
import theory

SUBMODULES = ["theory", *[f"theory.{name}" for name in theory.__all__], "theory._validate"]
IO_MODULES = ["numerics.io", *[f"numerics.io.{name}" for name in
                               ("files", "handed", "command")]]
THEORY_MUST_NOT_LOAD = ("torch", "numerics", "claims", "reports")
IO_MUST_NOT_LOAD = ("torch", "theory", "numerics", "claims", "reports")
IO_MAY_LOAD = ("numerics", "numerics.io", "numerics.io.")
"""What of the forbidden packages numerics.io may load: the package numerics (its __init__ imports
nothing eagerly), numerics.io and its modules (a name ending in '.' allows every module below it)."""


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
    """Every numerics.io module (the list above is the package's whole content) imports nothing of
    the project but numerics.io, and not torch."""
    import pathlib

    on_disk = {f"numerics.io.{p.stem}" for p in pathlib.Path(numerics.io.__file__).parent.glob("*.py")
               if p.stem != "__init__"}
    assert on_disk == set(IO_MODULES[1:]), "IO_MODULES must list every numerics.io module"
    loaded = _loaded_after_each(IO_MODULES, IO_MUST_NOT_LOAD, IO_MAY_LOAD)
    bad = {name: mods[:10] for name, mods in loaded.items() if mods}
    assert not bad, f"importing numerics.io loaded {bad}"


def test_the_check_can_fail():
    """The same probe sees torch when something does import it (the check is not vacuous)."""
    loaded = _loaded_after_each(["numerics.reduced"], ("torch", "numerics"))
    assert "torch" in loaded["numerics.reduced"]
    assert _loaded_after_each(["numerics.reduced"], ("numerics",), IO_MAY_LOAD)["numerics.reduced"]
    loaded = _loaded_after_each(["theory.__main__"], THEORY_MUST_NOT_LOAD)   # the theory CLI reads through numerics.io
    assert "numerics.io" in loaded["theory.__main__"]


def test_the_theory_command_line_loads_only_numerics_io():
    """``python -m theory`` reads options and writes files through numerics.io, and loads nothing
    else of numerics (no torch), claims or reports."""
    loaded = _loaded_after_each(["theory.__main__"], THEORY_MUST_NOT_LOAD, IO_MAY_LOAD)
    assert loaded["theory.__main__"] == [], loaded
