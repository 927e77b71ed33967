"""theory is the mathematics the numerics are held against: importing it (the package and
every submodule) must load neither torch nor anything from numerics or claims.  Checked in
a fresh interpreter, where sys.modules shows exactly what an import pulled in."""
import json
import subprocess
import sys

import theory

SUBMODULES = ["theory", *[f"theory.{name}" for name in theory.__all__], "theory._validate"]


def test_importing_theory_loads_neither_torch_nor_numerics():
    """One fresh interpreter imports every submodule in turn and reports, after each, the
    forbidden modules loaded so far (one interpreter: a sympy start-up per module would cost
    seconds each)."""
    code = ("import importlib, json, sys\n"
            f"out = {{}}\nfor name in {SUBMODULES!r}:\n"
            "    importlib.import_module(name)\n"
            "    out[name] = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numerics', 'claims'))\n"
            "print(json.dumps(out))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(loaded) == set(SUBMODULES)
    bad = {name: mods[:10] for name, mods in loaded.items() if mods}
    assert not bad, f"importing theory loaded {bad}"


def test_the_check_can_fail():
    """The same probe sees torch when something does import it (the check is not vacuous)."""
    code = ("import json, sys, numerics.reduced; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numerics'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "torch" in json.loads(out.stdout.strip().splitlines()[-1])
