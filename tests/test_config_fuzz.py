"""A fuzz oracle for the config: whatever validates renders valid Slurm files.

Hypothesis mutates the real stack configs (Pulumi.dev/prod/local.yaml) with
adversarial text and numbers: line breaks and control characters, other
scripts' digits and letters, injected ``Key=Value`` text, huge and boundary
numbers. For every mutant

* the models accept it: slurm.conf, gres.conf and cgroup.conf render, and every
  line is a comment or ``Key=Value`` tokens of printable ASCII; the names that
  become Kubernetes names are DNS-1123 labels outside Kubernetes' own namespaces;
* or they reject it: ConfigError, each problem one ``<path>: <what> (got <value>)``
  line, and nothing else escapes.

Derandomized with no example database, so every run tries the same mutants.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dualsched.components.slurm_files import kubernetes_site, render_slurm_files
from dualsched.config import ConfigError, StackConfig, parse_stack_config
from dualsched.config.types import is_reserved_namespace
from tests.conftest import ROOT

STACKS = ("dev", "prod", "local")
PROBLEM_LINE = re.compile(r"^  \S.*: .+ \(got .*\)$")
# slurm.conf(5): one parameter per line or, for NodeName/PartitionName, several on one line.
SETTING_LINE = re.compile(r"[A-Za-z][A-Za-z0-9]*=[!-~]+( [A-Za-z][A-Za-z0-9]*=[!-~]+)*", re.ASCII)
COMMENT_LINE = re.compile(r"#[ -~]*", re.ASCII)
PLUGIN_LINE = re.compile(r"(required|optional) /[!-~]+\.so( [!-~]+)*", re.ASCII)
"""plugstack.conf's lines (spank(8)): required|optional, the plugin's path, its arguments."""
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)


def _raw(stack: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    return {key.split(":", 1)[1]: value for key, value in document["config"].items() if key.startswith("dualsched:")}


RAW = {stack: _raw(stack) for stack in STACKS}

# ------------------------------------------------------------------------ mutations

_OTHER_DIGITS = str.maketrans("0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669")


def _text_mutations(text: str) -> st.SearchStrategy[str]:
    """Adversarial variants of one text value of a real config."""
    line_breaks = st.sampled_from(["\n", "\r\n", "\r", "\x00", "\x1b[2J", "\u2028", "\u00a0", " ", "\t"])
    return st.one_of(
        line_breaks.map(lambda end: text + end),  # what a YAML block scalar adds; the most likely accident
        line_breaks.map(lambda end: text + end),
        line_breaks.map(lambda start: start + text),
        st.just(text.translate(_OTHER_DIGITS)),  # the same value in Arabic-Indic digits
        st.just(text.upper()),
        st.just(text + "\nSlurmUser=root"),
        st.just(text + " Nodes=ALL"),
        st.just("/" + "a/" * 400 + "\n"),
        st.just(text * 200),
        st.sampled_from(["kube-system", "default", "kubernetes.io/os", "node.kubernetes.io/not-ready", "..", "/", ""]),
        st.text(st.characters(codec="utf-8"), max_size=12).map(lambda noise: text + noise),
    )


_numbers = st.one_of(
    st.sampled_from([-1, 0, 1, 63, 64, 65, 4096, 4097, 65533, 65534, 65535, 65536, 2**24 + 1, 2**31, 2**32, 2**63, 10**30]),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, path + (key,))]
    if isinstance(value, list):
        return [leaf for index, item in enumerate(value) for leaf in _leaves(item, path + (index,))]
    return [path]


def _at(tree: Any, path: tuple) -> Any:
    for part in path:
        tree = tree[part]
    return tree


@st.composite
def mutants(draw) -> dict[str, Any]:
    raw = copy.deepcopy(RAW[draw(st.sampled_from(STACKS))])
    for _ in range(draw(st.integers(1, 3))):
        leaves = _leaves(raw)
        numbers = [p for p in leaves if isinstance(_at(raw, p), (int, float)) and not isinstance(_at(raw, p), bool)]
        texts = [p for p in leaves if isinstance(_at(raw, p), str)]
        if draw(st.booleans()) and numbers:
            path = draw(st.sampled_from(numbers))
            new = draw(_numbers)
        else:
            path = draw(st.sampled_from(texts))
            new = draw(_text_mutations(_at(raw, path)))
        _at(raw, path[:-1])[path[-1]] = new
    return raw


# --------------------------------------------------------------------------- oracle


def assert_valid_slurm_files(config: StackConfig) -> None:
    files = render_slurm_files(config, kubernetes_site(config))
    for name, text in files.items():
        setting = PLUGIN_LINE if name == "plugstack.conf" else SETTING_LINE
        for number, line in enumerate(text.splitlines(), 1):
            if line and not (COMMENT_LINE.fullmatch(line) or setting.fullmatch(line)):
                raise AssertionError(f"{name}:{number} is not a comment or {setting.pattern!r}: {line!r}")
        assert text.isascii() and "\r" not in text and "\x00" not in text, name


def assert_valid_kubernetes_names(config: StackConfig) -> None:
    names = [config.slurm.cluster_name, *(pool.name for pool in config.pools), *(model.name for model in config.inference.models)]
    namespaces = [config.slurm.namespace, config.inference.namespace, config.submission.namespace]
    for name in names + namespaces:
        assert DNS_LABEL.fullmatch(name), f"not a DNS-1123 label: {name!r}"
    assert not any(map(is_reserved_namespace, namespaces)), namespaces
    for pool in config.pools:
        for node in pool.node_names:
            assert len(node) <= 253 and all(DNS_LABEL.fullmatch(label) for label in node.split(".")), node


def oracle(raw: dict[str, Any]) -> str:
    try:
        config = parse_stack_config(copy.deepcopy(raw), "mutant")
    except ConfigError as error:
        lines = str(error).split("\n")
        assert lines[0].startswith("invalid dualsched config in mutant (")
        assert len(lines) == len(error.problems) + 1 and error.problems
        for line in lines[1:]:
            assert PROBLEM_LINE.match(line) and len(line) < 600, f"not '<path>: <what> (got <value>)': {line!r}"
        return "rejected"
    assert_valid_slurm_files(config)
    assert_valid_kubernetes_names(config)
    return "accepted"


def test_the_stacks_themselves_render_valid_files():
    assert [oracle(RAW[stack]) for stack in STACKS] == ["accepted"] * len(STACKS)


@settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutants())
def test_whatever_validates_renders_valid_slurm_files(raw):
    event(oracle(raw))
