"""The README's promises: its first two commands, the config reference that matches the models
(docs/configuration.md), and a compatibility matrix whose pinned versions are the ones the tiers install."""

import re
from pathlib import Path

from dualsched.config.reference import BEGIN, END, markdown

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = ROOT / "docs" / "configuration.md"
def test_first_two_commands_are_the_main_job_and_all_tests():
    commands = re.findall(r"^(make \S+)", README, re.M)
    assert commands[:2] == ["make up", "make test"]


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line.startswith("make ")] == ["make test"]


def test_config_reference_matches_the_models():
    section = CONFIGURATION.read_text().split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert section == markdown(), "docs/configuration.md is stale: run `python -m dualsched.config.reference docs/configuration.md`"


def test_readme_links_to_pages_that_exist():
    """The README is a first screen and links: every relative link it has leads to a file, and every
    `#anchor` into docs/ to a heading there."""
    for target in re.findall(r"\]\((?!https?://|#)([^)\s]+)\)", README):
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if anchor and path.endswith(".md"):
            assert anchor in _anchors((ROOT / path).read_text()), f"README links to {target}: no such heading"


def _anchors(markdown_text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", markdown_text, flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
