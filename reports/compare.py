"""Compare two audit reports: verdicts and headline numbers side by side, changes marked.

    python -m reports.compare A/claims.json B/claims.json [--out diff.html]

A and B are the ``claims.json`` files of two ``reports.build`` runs (or their directories),
say before and after a code change, or at two configurations; both are read and checked as
``--from-json`` reads one (``reports.render.load_report``: a hand-edited or inconsistent file
is refused, exit 2, as is one written by an older version of this code).  The comparison is of what the reports recorded; nothing
is recomputed.  Per claim id (in A's order, then B's new ids): the outcome in A and in B; per
headline row (matched by claim id, row name and config): theory, side, measured ± se,
tolerance and agreement in A and in B.  A change is any difference of verdict, of agreement, or of a
number beyond relative ``1e-9`` (printing noise), or a claim or row present on one side only.

On stdout: a text summary (one line per claim, the changed rows under it, then the
configurations and profiles of A and B when they differ).  ``--out FILE``: the same as one
self-contained HTML page, checked and written by the project's output policy
(``numerics.io.check_output_path`` / ``write_output``): never one of the inputs, written
through a character device such as /dev/null, atomically with the umask's permissions
otherwise.

Exit status: 0 no change, 1 changes (as ``diff``), 2 bad arguments (a file that disagrees with
itself among them: every agreement and verdict is recomputed from its own numbers by the reader),
75 the disk is full (never read as "reports differ").
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Optional

from reports.render import BadArguments, describe_problem, format_value, headline_cells, load_report, render
from numerics.io import check_output_path, command_line, write_output

EXIT_SAME, EXIT_CHANGED, EXIT_BAD_ARGUMENTS = 0, 1, 2
HEADLINE_FIELDS = ("theory", "measured", "se", "tolerance", "agrees", "side")
# Numbers that differ by less than this (relative) are the same number printed twice.
RELATIVE_NOISE = 1e-9


def same_value(a: Any, b: Any) -> bool:
    """Equal, up to RELATIVE_NOISE for numbers (brackets compared element by element)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    numeric = (int, float)
    if isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool) and not isinstance(b, bool):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= RELATIVE_NOISE * max(abs(a), abs(b))
    return a == b


def compare_reports(a: dict, b: dict) -> list[dict]:
    """The per-claim comparison of two claims.json documents (A's order, then B's new ids): ``{id, a,
    b (the verdicts, None where absent), verdict_changed, changed, rows}``, each row ``{name, a, b
    (its text in A and in B), changed}``."""
    by_id_a = {c["id"]: c for c in a["claims"]}
    by_id_b = {c["id"]: c for c in b["claims"]}
    changes = []
    for cid in list(by_id_a) + [cid for cid in by_id_b if cid not in by_id_a]:
        ca, cb = by_id_a.get(cid), by_id_b.get(cid)
        rows_a, rows_b = _rows(ca), _rows(cb)
        rows = [{"name": name, "a": _row_text(rows_a.get(name)), "b": _row_text(rows_b.get(name)),
                 "changed": name not in rows_a or name not in rows_b
                 or not all(same_value(rows_a[name].get(k), rows_b[name].get(k)) for k in HEADLINE_FIELDS)}
                for name in list(rows_a) + [n for n in rows_b if n not in rows_a]]
        va, vb = (c["verdict"] if c else None for c in (ca, cb))
        changes.append({"id": cid, "a": va, "b": vb, "verdict_changed": va != vb, "rows": rows,
                        "changed": va != vb or any(r["changed"] for r in rows)})
    return changes


def _rows(entry: Optional[dict]) -> dict[str, dict]:
    """The headline rows of a claim keyed by row name and config ("name [config]"); the claim id
    is the outer key, so a row is matched by (claim id, name, config)."""
    if not entry:
        return {}
    return {str(r.get("name")) + (f" [{r['config']}]" if r.get("config") is not None else ""): r
            for r in entry.get("headline") or [] if isinstance(r, dict)}


def _row_text(row: Optional[dict]) -> str:
    if row is None:
        return "(absent)"
    cells = headline_cells(row)
    outcome = {True: "agrees", False: "disagrees"}.get(row.get("agrees"), "no verdict")
    if row.get("side") == "reported":
        outcome = "reported"
    tol = format_value(row.get("tolerance")) if row.get("side", "two-sided") == "two-sided" else cells["allowed"]
    return f"theory {cells['theory']}, measured {cells['measured']}, tol {tol}, {outcome}"


def _setting(report: dict) -> str:
    prov = report["provenance"]
    problem = prov.get("problem")
    where = describe_problem(problem) if problem else "the profile's own configurations"
    return (f"profile {prov.get('profile')}, {where}, seed {prov.get('seed')}, device {prov.get('device')}, "
            f"commit {str((prov.get('git') or {}).get('commit', '?'))[:10]}")


def text_summary(changes: list[dict], a: dict, b: dict, name_a: str, name_b: str) -> str:
    lines = [f"A: {name_a} ({_setting(a)})", f"B: {name_b} ({_setting(b)})"]
    width = max([len(c["id"]) for c in changes] + [5])
    lines.append(f"{'claim':<{width}}  {'A':<7}  {'B':<7}  change")
    for c in changes:
        mark = ("verdict changed" if c["verdict_changed"] else
                f"{sum(r['changed'] for r in c['rows'])} headline row(s) changed" if c["changed"] else "same")
        lines.append(f"{c['id']:<{width}}  {c['a'] or 'absent':<7}  {c['b'] or 'absent':<7}  {mark}")
        for r in c["rows"]:
            if r["changed"]:
                lines += [f"    {r['name']}: A {r['a']}", f"    {' ' * len(r['name'])}  B {r['b']}"]
    n = sum(c["changed"] for c in changes)
    lines.append(f"{n} of {len(changes)} claim(s) changed" if n else f"no change in {len(changes)} claim(s)")
    return "\n".join(lines)


def html_page(changes: list[dict], a: dict, b: dict, name_a: str, name_b: str) -> str:
    """The comparison as one self-contained page (``templates/compare.html.j2``)."""
    return render("compare.html.j2", title="Audit comparison", name_a=name_a, name_b=name_b,
                  setting_a=_setting(a), setting_b=_setting(b), claims=changes,
                  changed=sum(c["changed"] for c in changes))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reports.compare",
        description="Compare two audit reports (their claims.json): verdicts and headline numbers "
                    "side by side, changes marked. Exit status: 0 no change, 1 changes, 2 bad "
                    "arguments (or a claims.json that disagrees with itself), 75 the disk is full.")
    parser.add_argument("a", metavar="A", help="claims.json of the first report (or its directory)")
    parser.add_argument("b", metavar="B", help="claims.json of the second report (or its directory)")
    parser.add_argument("--out", default=None, metavar="FILE.html",
                        help="also write the comparison as one HTML page")
    return parser


@command_line
def main(argv: Optional[list[str]] = None) -> int:
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's own errors: its message, exit status 2
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_ARGUMENTS
    try:
        out = None
        if args.out is not None:
            inputs = [Path(x) / "claims.json" if Path(x).is_dir() else Path(x) for x in (args.a, args.b)]
            try:
                out = check_output_path(args.out, "--out", inputs=inputs)
            except ValueError as exc:
                raise BadArguments(str(exc)) from None
        a = load_report(args.a, "A")
        b = load_report(args.b, "B")
    except BadArguments as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    changes = compare_reports(a, b)
    print(text_summary(changes, a, b, args.a, args.b))
    if args.out is not None:
        write_output(out, html_page(changes, a, b, args.a, args.b))
        print(f"comparison: {args.out}")
    return EXIT_CHANGED if any(c["changed"] for c in changes) else EXIT_SAME


if __name__ == "__main__":
    sys.exit(main())
