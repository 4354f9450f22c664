"""docs/API.md's table of every error code, made from the API's error table
(``voicehost.api.errors``): its status, its code, what it means and the operations that answer
it. ``make docs`` writes it between the markers; ``tests/api/test_errors.py`` fails when the
document's table is not what this makes.

    python -m voicehost.tools.errors_doc            # print the table
    python -m voicehost.tools.errors_doc --write    # rewrite it in docs/API.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from voicehost.api.errors import ANY, ERRORS, KEYED
from voicehost.tools.settings_doc import made_between

START = "<!-- errors: made by `make docs` from voicehost/api/errors.py; edit them there -->"
END = "<!-- errors: end -->"
API_DOC = Path(__file__).resolve().parents[2] / "docs" / "API.md"
GROUPS = {KEYED: "every keyed route", ANY: "every route"}


def answered_by(operations: frozenset[str]) -> str:
    if not operations:
        return "no public operation (the router's own, or an internal route's)"
    named = sorted(GROUPS[o] if o in GROUPS else f"`{o}`" for o in operations)
    return ", ".join(named)


def table() -> str:
    lines = [START, "", "| Status | `code` | Meaning | Answered by |", "|---|---|---|---|"]
    for kind in sorted(ERRORS.values(), key=lambda k: (k.status, k.code)):
        retry = " With `Retry-After`." if kind.retry_after else ""
        meaning = kind.meaning[0].upper() + kind.meaning[1:]
        row = f"| {kind.status} | `{kind.code}` | {meaning}{retry} |"
        lines.append(f"{row} {answered_by(kind.answered_by)} |")
    lines += ["", END]
    return "\n".join(lines)


def replaced(text: str) -> str:
    return made_between(text, START, END, table())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite docs/API.md's table")
    args = parser.parse_args(argv)
    if args.write:
        API_DOC.write_text(replaced(API_DOC.read_text()))
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
