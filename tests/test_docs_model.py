"""The notation the code cites is in the project: every reference points to docs/model.md (a
clone has no SPEC.md), and every section a reference names ("docs/model.md 'Setting'") is a
heading there."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITED_SECTION = re.compile(r"docs/model\.md,? (?:\"(?P<section>[^\"]+)\"|'(?P<single>[^']+)')|docs/model\.md, (?P<bare>Setting)\b")
OLD_REFERENCE = re.compile(r"SPEC\.md")


def tracked_text_files():
    out = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True)
    names = out.stdout.split() if out.returncode == 0 else [p.relative_to(ROOT).as_posix() for p in
                                                             ROOT.rglob("*") if p.suffix in (".py", ".md")]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def headings() -> set[str]:
    return {line.lstrip("#").strip() for line in (ROOT / "docs" / "model.md").read_text().splitlines()
            if line.startswith("#")}


def cited_sections(text: str) -> set[str]:
    return {m["section"] or m["single"] or m["bare"] for m in CITED_SECTION.finditer(text)}


def test_no_reference_to_a_file_the_project_does_not_hold():
    me = Path(__file__).resolve()
    bad = [p.relative_to(ROOT).as_posix() for p in tracked_text_files()
           if p.resolve() != me and OLD_REFERENCE.search(p.read_text(errors="replace"))]
    assert not bad, f"these still cite SPEC.md (cite docs/model.md): {bad}"


def test_every_cited_section_of_docs_model_exists():
    have, me = headings(), Path(__file__).resolve()
    missing = {(p.relative_to(ROOT).as_posix(), s) for p in tracked_text_files() if p.resolve() != me
               for s in cited_sections(p.read_text(errors="replace")) if s not in have}
    assert not missing, f"sections cited but not in docs/model.md: {sorted(missing)}"


def test_the_checks_can_fail():
    assert cited_sections("see docs/model.md 'No such section' and docs/model.md \"Setting\"") == {
        "No such section", "Setting"}
    assert "No such section" not in headings() and "Setting" in headings()
    assert OLD_REFERENCE.search("(SPEC" + ".md, Setting)")
