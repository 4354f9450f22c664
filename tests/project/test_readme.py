"""The README stays true: its commands come first and its table lists every setting."""

from pathlib import Path

import pytest

from voicehost.config import Settings

pytestmark = pytest.mark.unit

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_starts_with_the_serve_and_test_commands():
    first_blocks = README.split("## ")[0]
    assert "\nmake serve\n" in first_blocks and "\nmake test\n" in first_blocks


def test_every_setting_is_in_the_configuration_table():
    table = README.split("## Configuration")[1].split("\n## ")[0]
    for name in Settings.model_fields:
        assert f"| `VOICEHOST_{name.upper()}` |" in table, name


def test_ci_runs_the_readme_test_command_and_nothing_else():
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines()[1:] if line and not line.startswith("#")]
    runs = [line for line in commands if "make" in line.split()]
    assert runs == ["make test"]  # the README's command, then its wall time on the last line
    assert commands[-1] == 'exit "$status"' and "status=$?" in commands
    assert "wall" in ci.split("make test\n", 1)[1]
    before = commands[: commands.index("make test")]
    assert all(line.startswith(("set ", "cd ", "started=")) for line in before), commands
