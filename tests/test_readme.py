"""The README's promises: its first two commands, and a config reference that matches the models."""

import re
from pathlib import Path

from dualsched.config.reference import BEGIN, END, markdown

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_first_two_commands_are_the_main_job_and_all_tests():
    commands = re.findall(r"^(make \S+)", README, re.M)
    assert commands[:2] == ["make up", "make test"]


def test_ci_runs_exactly_the_readme_test_command():
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line.startswith("make ")] == ["make test"]


def test_config_reference_matches_the_models():
    section = README.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert section == markdown(), "README reference is stale: run `python -m dualsched.config.reference README.md`"
