"""A strict reader of Prometheus' text exposition format 0.0.4, for the exporter's tests of every tier.

prometheus_client is not in the venv; this follows the format's specification
(prometheus.io/docs/instrumenting/exposition_formats) and refuses what a lenient parser lets by:
a sample before its family's TYPE, a family's samples apart, a family typed twice, a series twice,
bad names, unescaped label values, a value that is no float, a body not ending in a newline.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

EXPORTER = Path(__file__).resolve().parent.parent / "components" / "programs" / "slurm_exporter.py"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>(?:{_LABEL}={_VALUE}(?:,{_LABEL}={_VALUE})*)?,?)\}})?"
    r" (?P<value>\S+)(?: (?P<timestamp>-?\d+))?$"
)
_PAIR = re.compile(rf"({_LABEL})=({_VALUE})")
_TYPE = re.compile(rf"^# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)$")
_HELP = re.compile(rf"^# HELP ({_NAME})(?: (.*))?$")
_FLOAT = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|NaN)$")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _unescape(quoted: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), quoted[1:-1])


def parse(text: str) -> tuple[dict[str, str], list[Sample]]:
    """(family -> type, samples); AssertionError naming the line for anything the format does not allow."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    types: dict[str, str] = {}
    samples: list[Sample] = []
    seen_series: set[tuple] = set()
    closed: set[str] = set()  # families whose samples are over
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}: {line!r}"
        if not line.strip():
            continue
        if line.startswith("#"):
            typed, helped = _TYPE.match(line), _HELP.match(line)
            if typed:
                assert typed.group(1) not in types, f"{where}: second TYPE"
                types[typed.group(1)] = typed.group(2)
            else:
                assert helped or not line.startswith(("# TYPE", "# HELP")), f"{where}: malformed"
            continue
        match = _SAMPLE.match(line)
        assert match, f"{where}: not a sample"
        name = match.group("name")
        assert name in types, f"{where}: sample before its family's TYPE"
        if name != current:
            assert name not in closed, f"{where}: the family's samples are not together"
            if current is not None:
                closed.add(current)
            current = name
        labels = {key: _unescape(value) for key, value in _PAIR.findall(match.group("labels") or "")}
        series = (name, tuple(sorted(labels.items())))
        assert series not in seen_series, f"{where}: series given twice"
        seen_series.add(series)
        assert _FLOAT.match(match.group("value")), f"{where}: value is not a float"
        value = float(match.group("value").replace("Inf", "inf"))
        assert not math.isnan(value) or match.group("value") == "NaN", where
        samples.append(Sample(name, labels, value))
    return types, samples


def find(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    """The samples of ``name`` whose labels include ``labels``."""
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


@contextmanager
def running_exporter(state_dir: Path, max_age: float = 90) -> Iterator[str]:
    """The exporter program as its container runs it, on a free loopback port; its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "EXPORTER_STATE_DIR": str(state_dir), "EXPORTER_PORT": str(port), "EXPORTER_MAX_AGE": str(max_age)}
    process = subprocess.Popen([sys.executable, str(EXPORTER)], env=env)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "the exporter did not listen"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
