"""Slurm exporter: serves what Slurm's own commands report as Prometheus metrics (text format 0.0.4).

The Slurm images need not have Python and the Python image has no Slurm, so the work is split in
two containers of slurmctld's pod: ``collect_slurm_state.sh`` (Slurm image) writes the output of
``scontrol show node``, ``squeue`` and ``sdiag`` into a shared directory every round, and this program
(Python image, standard library only) parses the latest files on each scrape. A file is replaced only
when its command succeeded, so a controller that stops answering shows as a growing
``slurm_exporter_snapshot_age_seconds`` and ``slurm_up 0``, never as empty metrics.

Every per-node series carries ``node``, the Kubernetes node name (the label kube-state-metrics puts
on ``kube_pod_info``), so one PromQL join puts Slurm's view of a node beside the pods on it. slurmd
runs with ``-N <Kubernetes node name>``, so it is the Slurm node name too, also given as ``slurm_node``.

Run: ``python3 slurm_exporter.py`` with EXPORTER_STATE_DIR, EXPORTER_PORT and EXPORTER_MAX_AGE (seconds).
"""

from __future__ import annotations

import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable, Iterator, Optional

SOURCES = ("nodes", "jobs", "sdiag")
"""The files collect_slurm_state.sh writes: scontrol -o show node, squeue, sdiag."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = dict[str, str]
Sample = tuple[str, Labels, float]

# name -> (type, help); the exposition lists every family once, in this order
FAMILIES: dict[str, tuple[str, str]] = {
    "slurm_up": ("gauge", "1 when every Slurm snapshot is younger than EXPORTER_MAX_AGE."),
    "slurm_exporter_snapshot_age_seconds": ("gauge", "Seconds since a Slurm command's output was last collected."),
    "slurm_node_state": ("gauge", "1 for the node's base state in Slurm (idle, mixed, allocated, down, ...)."),
    "slurm_node_state_flag": ("gauge", "1 for each flag on the node's state (drain, cloud, not_responding, ...)."),
    "slurm_node_cpus": ("gauge", "CPUs Slurm may allocate to jobs on the node (CPUEfctv)."),
    "slurm_node_cpus_allocated": ("gauge", "CPUs allocated to Slurm jobs on the node."),
    "slurm_node_memory_bytes": ("gauge", "Memory Slurm may allocate to jobs on the node (RealMemory less MemSpecLimit)."),
    "slurm_node_memory_allocated_bytes": ("gauge", "Memory allocated to Slurm jobs on the node."),
    "slurm_node_gpus": ("gauge", "GPUs Slurm has on the node (gres/gpu)."),
    "slurm_node_gpus_allocated": ("gauge", "GPUs allocated to Slurm jobs on the node."),
    "slurm_node_jobs": ("gauge", "Slurm jobs running on the node."),
    "slurm_job_node": ("gauge", "1 per running Slurm job and node it runs on."),
    "slurm_jobs": ("gauge", "Slurm jobs by state and partition (those squeue lists: not yet finished)."),
    "slurm_scheduler_threads": ("gauge", "slurmctld server threads (sdiag)."),
    "slurm_scheduler_agent_queue_size": ("gauge", "slurmctld agent queue size (sdiag)."),
    "slurm_scheduler_jobs": ("gauge", "Jobs by event since sdiag's last reset (midnight UTC or sdiag --reset)."),
    "slurm_scheduler_cycle_last_seconds": ("gauge", "Duration of the scheduler's last cycle, main or backfill."),
    "slurm_scheduler_cycle_mean_seconds": ("gauge", "Mean duration of the scheduler's cycles, main or backfill."),
    "slurm_scheduler_cycles": ("gauge", "Scheduler cycles since sdiag's last reset, main or backfill."),
    "slurm_scheduler_backfilled_jobs": ("gauge", "Jobs started by the backfill scheduler since slurmctld started."),
}


# ----------------------------------------------------------------------------- hostlists


def expand_hostlist(expression: str) -> list[str]:
    """Slurm's compressed host list (``gpu-[001-003,007],cpu-1``) as names, in order."""
    names: list[str] = []
    for part in _top_level(expression):
        names.extend(_expand_part(part))
    return names


def _top_level(expression: str) -> Iterator[str]:
    """Split at the commas that are outside brackets."""
    depth, start = 0, 0
    for index, char in enumerate(expression):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            yield expression[start:index]
            start = index + 1
    if expression[start:]:
        yield expression[start:]


def _expand_part(part: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", part)
    if not match:
        return [part]
    head, tail = part[: match.start()], part[match.end():]
    return [f"{head}{middle}{rest}" for middle in _expand_ranges(match.group(1)) for rest in _expand_part(tail)]


def _expand_ranges(ranges: str) -> Iterator[str]:
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        if not high:
            yield low
            continue
        for number in range(int(low), int(high) + 1):
            yield str(number).zfill(len(low))  # gpu-[001-010] keeps its zeros


# ----------------------------------------------------------------------------- parsing


def scontrol_record(line: str) -> dict[str, str]:
    """One ``scontrol -o show`` record: Key=Value pairs separated by spaces (values such as OS= may hold spaces)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(\S+?)=(.*?)(?=\s+[A-Za-z/:_]+=|$)", line.strip())}


def tres(value: str) -> dict[str, str]:
    """``cpu=2,mem=3000M,gres/gpu=2`` as a dict."""
    return dict(item.split("=", 1) for item in value.split(",") if "=" in item)


MIB = 2**20
"""scontrol reports RealMemory and AllocMem in MiB."""


def _number(value: Optional[str]) -> float:
    return float(value) if value and re.fullmatch(r"\d+(\.\d+)?", value) else 0.0


def node_samples(text: str) -> Iterator[Sample]:
    for line in text.splitlines():
        record = scontrol_record(line)
        name = record.get("NodeName")
        if not name:
            continue
        labels = {"node": name, "slurm_node": name}
        base, *flags = record.get("State", "UNKNOWN").split("+")
        yield "slurm_node_state", {**labels, "state": base.rstrip("*").lower()}, 1
        for flag in flags:
            yield "slurm_node_state_flag", {**labels, "flag": flag.lower()}, 1
        configured, allocated = tres(record.get("CfgTRES", "")), tres(record.get("AllocTRES", ""))
        # what jobs may use: less the cores (CoreSpecCount, in CPUEfctv) and memory (MemSpecLimit) kept for the system
        yield "slurm_node_cpus", labels, _number(record.get("CPUEfctv") or record.get("CPUTot"))
        yield "slurm_node_cpus_allocated", labels, _number(record.get("CPUAlloc"))
        usable_memory = _number(record.get("RealMemory")) - _number(record.get("MemSpecLimit"))
        yield "slurm_node_memory_bytes", labels, usable_memory * MIB
        yield "slurm_node_memory_allocated_bytes", labels, _number(record.get("AllocMem")) * MIB
        yield "slurm_node_gpus", labels, _number(configured.get("gres/gpu"))
        yield "slurm_node_gpus_allocated", labels, _number(allocated.get("gres/gpu"))


def job_rows(text: str) -> Iterator[dict[str, str]]:
    """squeue's ``%i|%T|%P|%u|%N`` lines."""
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) == 5:
            yield dict(zip(("job_id", "state", "partition", "user", "nodes"), fields))


def job_samples(text: str, node_names: Iterable[str]) -> Iterator[Sample]:
    counts: dict[tuple[str, str], int] = {}
    running: dict[str, int] = dict.fromkeys(node_names, 0)  # every node has a series, 0 when idle
    for job in job_rows(text):
        state_partition = (job["state"].lower(), job["partition"])
        counts[state_partition] = counts.get(state_partition, 0) + 1
        if job["state"] != "RUNNING":
            continue
        for node in expand_hostlist(job["nodes"]):
            running[node] = running.get(node, 0) + 1
            labels = {"node": node, "slurm_node": node, "job_id": job["job_id"], "user": job["user"], "partition": job["partition"]}
            yield "slurm_job_node", labels, 1
    for (state, partition), count in sorted(counts.items()):
        yield "slurm_jobs", {"state": state, "partition": partition}, count
    for node, count in sorted(running.items()):
        yield "slurm_node_jobs", {"node": node, "slurm_node": node}, count


# sdiag's lines as "Field: value", under section headings; (section, field) -> (metric, labels, scale)
_SDIAG: dict[tuple[str, str], tuple[str, Labels, float]] = {
    ("", "Server thread count"): ("slurm_scheduler_threads", {}, 1),
    ("", "Agent queue size"): ("slurm_scheduler_agent_queue_size", {}, 1),
    **{("", f"Jobs {event}"): ("slurm_scheduler_jobs", {"event": event}, 1)
       for event in ("submitted", "started", "completed", "canceled", "failed")},
    ("main", "Last cycle"): ("slurm_scheduler_cycle_last_seconds", {"scheduler": "main"}, 1e-6),
    ("main", "Mean cycle"): ("slurm_scheduler_cycle_mean_seconds", {"scheduler": "main"}, 1e-6),
    ("main", "Total cycles"): ("slurm_scheduler_cycles", {"scheduler": "main"}, 1),
    ("backfill", "Last cycle"): ("slurm_scheduler_cycle_last_seconds", {"scheduler": "backfill"}, 1e-6),
    ("backfill", "Mean cycle"): ("slurm_scheduler_cycle_mean_seconds", {"scheduler": "backfill"}, 1e-6),
    ("backfill", "Total cycles"): ("slurm_scheduler_cycles", {"scheduler": "backfill"}, 1),
    ("backfill", "Total backfilled jobs (since last slurm start)"): ("slurm_scheduler_backfilled_jobs", {}, 1),
}


def sdiag_samples(text: str) -> Iterator[Sample]:
    section = ""  # the heading the indented lines below belong to
    for line in text.splitlines():
        if line.startswith(("\t", " ")):
            line_section = section
        else:
            line_section = ""
            section = "main" if line.startswith("Main schedule") else "backfill" if line.startswith("Backfilling") else "other"
        field, _, value = line.strip().partition(":")
        wanted = _SDIAG.get((line_section, field))
        if wanted and value.strip().isdigit():
            metric, labels, scale = wanted
            yield metric, labels, int(value.strip()) * scale


# ----------------------------------------------------------------------------- exposition


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def exposition(samples: Iterable[Sample]) -> str:
    """Prometheus text format 0.0.4: each family once with HELP and TYPE, then its samples."""
    by_family: dict[str, list[str]] = {name: [] for name in FAMILIES}
    for name, labels, value in samples:
        label_text = ",".join(f'{label}="{_escape(text)}"' for label, text in labels.items())
        by_family[name].append(f"{name}{{{label_text}}} {_format_value(value)}" if label_text else f"{name} {_format_value(value)}")
    lines = []
    for name, rows in by_family.items():
        if rows:
            kind, help_text = FAMILIES[name]
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows]
    return "\n".join(lines) + "\n"


def snapshot_samples(state_dir: Path, max_age: float, now: float) -> list[Sample]:
    """Everything the latest files say; a missing file counts as infinitely old."""
    texts, ages = {}, {}
    for source in SOURCES:
        path = state_dir / source
        try:
            ages[source] = max(0.0, now - path.stat().st_mtime)
            texts[source] = path.read_text()
        except FileNotFoundError:
            ages[source], texts[source] = float("inf"), ""
    nodes = list(node_samples(texts["nodes"]))
    node_names = [labels["node"] for name, labels, _ in nodes if name == "slurm_node_state"]
    samples: list[Sample] = [("slurm_up", {}, int(all(age <= max_age for age in ages.values())))]
    samples += [("slurm_exporter_snapshot_age_seconds", {"source": source}, age) for source, age in ages.items() if age != float("inf")]
    return samples + nodes + list(job_samples(texts["jobs"], node_names)) + list(sdiag_samples(texts["sdiag"]))


# ----------------------------------------------------------------------------- server


def serve(state_dir: Path, port: int, max_age: float) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            body = exposition(snapshot_samples(state_dir, max_age, time.time())).encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # scrapes every few seconds: keep the log for problems
            pass

    server = ThreadingHTTPServer(("", port), Handler)
    print(f"serving {state_dir} on :{port}/metrics", file=sys.stderr, flush=True)
    server.serve_forever()


def main() -> None:
    serve(Path(os.environ["EXPORTER_STATE_DIR"]), int(os.environ["EXPORTER_PORT"]), float(os.environ["EXPORTER_MAX_AGE"]))


if __name__ == "__main__":
    main()
