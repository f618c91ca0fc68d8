"""An invalid ``SPECGATE_*`` variable stops the commands with one line naming it, not a
traceback, before anything starts."""

from __future__ import annotations

import io

import pytest

from cli.main import main
from tests.unit.conftest import ROOT

LOCAL = str(ROOT / "config" / "local.yaml")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("abc", "Input should be a valid number, unable to parse string as a number"),
        ("inf", "Input should be a finite number"),  # `up` would round it to whole seconds
        ("0", "Input should be greater than 0"),
    ],
)
@pytest.mark.parametrize("command", [["serve"], ["up"]])
def test_an_invalid_setting_is_named_and_nothing_starts(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    value: str,
    problem: str,
) -> None:
    monkeypatch.setenv("SPECGATE_BACKEND_KEEP_ALIVE_S", value)
    monkeypatch.setenv("SPECGATE_MAX_CONNECTIONS", "-1")
    assert main([*command, "--config", LOCAL]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "specgate: invalid settings:",
        f"  SPECGATE_BACKEND_KEEP_ALIVE_S={value!r}: {problem}",
        "  SPECGATE_MAX_CONNECTIONS='-1': Input should be greater than or equal to 1",
    ]


def test_models_prepare_names_an_invalid_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECGATE_PORT", "x")
    assert main(["models", "prepare"]) == 1
    assert "SPECGATE_PORT='x': Input should be a valid integer" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["config", "check", LOCAL], ["explain", "--config", LOCAL]])
def test_every_command_that_reads_the_settings_names_an_invalid_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    monkeypatch.setenv("SPECGATE_BACKEND_KEEP_ALIVE_S", "nan")
    monkeypatch.setattr(
        "sys.stdin", io.StringIO('{"messages": [{"role": "user", "content": "hi"}]}')
    )
    assert main(command) == 1
    assert "SPECGATE_BACKEND_KEEP_ALIVE_S='nan': Input should be a finite number" in (
        capsys.readouterr().err
    )
