"""A full disk for the tests that need one (tests/test_hostile_inputs.py,
test_report_frontdoor.py): a small tmpfs of its own (the ``small_fs`` fixture; import it into the
test module) and :func:`fill`.  A helper module, not a test file."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs of its own (root only; skipped where it cannot be mounted: then the
    simulated ENOSPC tests above are the disk-full tests)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()[:80]})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path, leave: int = 0) -> None:
    """Fill the file system of ``mnt`` with 4 KiB files, then free ``leave`` bytes of them."""
    d = mnt / ".filler"
    d.mkdir(exist_ok=True)
    k = 0
    try:
        while True:
            with open(d / str(k), "wb") as fh:
                fh.write(b"\0" * 4096)
            k += 1
    except OSError:
        (d / str(k)).unlink(missing_ok=True)
    for j in range(min(k, -(-leave // 4096))):
        (d / str(j)).unlink()
