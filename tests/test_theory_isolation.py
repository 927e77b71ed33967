"""The layering, checked in a fresh interpreter, where sys.modules shows exactly what an import
pulled in:

- theory is the mathematics the numerics are held against: importing it (the package and every
  submodule) loads neither torch nor anything from numerics, claims, reports, tools or audit_io
  (theory is pure mathematics; only its command line, ``python -m theory`` -- theory.__main__,
  which no library import loads -- reads options and writes files through audit_io);
- audit_io is the ground floor (options, files, outputs, processes): importing it loads nothing
  from theory, numerics, claims, reports or tools, and not torch (the device check imports torch
  only when asked about a CUDA name)."""
import json
import subprocess
import sys

import audit_io
import theory

SUBMODULES = ["theory", *[f"theory.{name}" for name in theory.__all__], "theory._validate"]
AUDIT_IO_MODULES = ["audit_io", *[f"audit_io.{name}" for name in
                                  ("options", "files", "handed", "processes", "command", "jsonable", "toml", "device")]]
THEORY_MUST_NOT_LOAD = ("torch", "numerics", "claims", "reports", "tools", "audit_io")
AUDIT_IO_MUST_NOT_LOAD = ("torch", "theory", "numerics", "claims", "reports", "tools")


def _loaded_after_each(modules, forbidden) -> dict:
    """{module: the forbidden top-level packages loaded once it and those before it are imported}."""
    code = ("import importlib, json, sys\n"
            f"out = {{}}\nfor name in {list(modules)!r}:\n"
            "    importlib.import_module(name)\n"
            f"    out[name] = sorted(m for m in sys.modules if m.split('.')[0] in {tuple(forbidden)!r})\n"
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


def test_audit_io_is_the_ground_floor():
    """Every audit_io module (the list above is the package's whole content) imports nothing of
    the project and not torch."""
    import pathlib

    on_disk = {f"audit_io.{p.stem}" for p in pathlib.Path(audit_io.__file__).parent.glob("*.py") if p.stem != "__init__"}
    assert on_disk == set(AUDIT_IO_MODULES[1:]), "AUDIT_IO_MODULES must list every audit_io module"
    loaded = _loaded_after_each(AUDIT_IO_MODULES, AUDIT_IO_MUST_NOT_LOAD)
    bad = {name: mods[:10] for name, mods in loaded.items() if mods}
    assert not bad, f"importing audit_io loaded {bad}"


def test_the_check_can_fail():
    """The same probe sees torch when something does import it (the check is not vacuous)."""
    loaded = _loaded_after_each(["numerics.reduced"], ("torch", "numerics"))
    assert "torch" in loaded["numerics.reduced"]
    loaded = _loaded_after_each(["theory.__main__"], THEORY_MUST_NOT_LOAD)   # the theory CLI reads through audit_io
    assert "audit_io" in loaded["theory.__main__"]
