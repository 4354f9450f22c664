"""The README stays true: its commands come first and its table lists every setting."""

from pathlib import Path

import pytest

from voicehost.config import Settings
from voicehost.tools import settings_doc

pytestmark = pytest.mark.unit

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_starts_with_the_serve_and_test_commands():
    first_blocks = README.split("## ")[0]
    assert "\nmake serve\n" in first_blocks and "\nmake test\n" in first_blocks


def test_every_setting_is_in_the_configuration_table():
    table = README.split("## Configuration")[1].split("\n## ")[0]
    for name in Settings.model_fields:
        assert f"| `VOICEHOST_{name.upper()}` |" in table, name


def test_the_configuration_tables_are_the_ones_the_settings_make():
    """Each setting is described once, in config.py: the README's tables are made from it
    (``make docs``), and a description changed there and not here fails this."""
    assert settings_doc.replaced(README) == README, "the README's settings are stale: make docs"


def test_every_setting_has_a_description_and_a_group():
    fields = list(Settings.model_fields)
    assert fields[0] in Settings.GROUPS and set(Settings.GROUPS) <= set(fields)
    for name, field in Settings.model_fields.items():
        assert field.description and field.description.strip(), name
        assert "|" not in field.description.replace("\\|", ""), name  # a table cell each


def test_a_stale_table_is_told_apart(monkeypatch):
    changed = Settings.model_fields["port"].description + " Changed."
    monkeypatch.setattr(Settings.model_fields["port"], "description", changed)
    assert settings_doc.replaced(README) != README


def test_ci_runs_the_readme_test_command_and_nothing_else():
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines()[1:] if line and not line.startswith("#")]
    runs = [line for line in commands if "make" in line.split()]
    assert runs == ["make test"]  # the README's command, then its wall time on the last line
    assert commands[-1] == 'exit "$status"' and "status=$?" in commands
    assert "wall" in ci.split("make test\n", 1)[1]
    before = commands[: commands.index("make test")]
    assert all(line.startswith(("set ", "cd ", "started=")) for line in before), commands
