"""The README's configuration table, made from the settings themselves (``voicehost.config``):
each setting's variable, its default and its description, grouped by concern as the settings
class groups them (``Settings.GROUPS``). ``make docs`` writes it between the README's markers;
``tests/project/test_readme.py`` fails when the README's table is not what this makes.

    python -m voicehost.tools.settings_doc            # print the table
    python -m voicehost.tools.settings_doc --write    # rewrite it in README.md
"""

from __future__ import annotations

import argparse
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from voicehost.config import Settings

START = "<!-- settings: made by `make docs` from voicehost/config.py; edit them there -->"
END = "<!-- settings: end -->"
README = Path(__file__).resolve().parents[2] / "README.md"


def shown_default(field: FieldInfo) -> str:
    """A field's default as the table shows it: its ``default_doc`` where the code's value does
    not say it (one set at start-up, a long list), else the value, in code spans."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "default_doc" in extra:
        return str(extra["default_doc"])
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "unset" if not value.get_secret_value() else "set"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, list | dict):
        return f"`{json.dumps(value, default=str)}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 30, not 30.0: a setting reads either
    return f"`{value}`"


def variable(name: str) -> str:
    return "VOICEHOST_" + name.upper()


def table() -> str:
    """The settings' tables, one per group, between the README's markers."""
    lines = [START]
    for name, field in Settings.model_fields.items():
        if name in Settings.GROUPS:
            lines += ["", f"**{Settings.GROUPS[name]}**", "", "| Variable | Default | Meaning |"]
            lines.append("|---|---|---|")
        description = " ".join((field.description or "").split())
        lines.append(f"| `{variable(name)}` | {shown_default(field)} | {description} |")
    lines += ["", END]
    return "\n".join(lines)


def made_between(text: str, start: str, end: str, made: str) -> str:
    """``text`` with what lies from ``start`` to ``end`` replaced by ``made`` (which holds
    both markers)."""
    before, _, rest = text.partition(start)
    _, found, after = rest.partition(end)
    if not found:
        raise ValueError(f"no markers {start} ... {end}")
    return before + made + after


def replaced(readme: str) -> str:
    """``readme`` with its settings' tables made anew."""
    return made_between(readme, START, END, table())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite README.md's tables")
    args = parser.parse_args(argv)
    if args.write:
        README.write_text(replaced(README.read_text()))
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
