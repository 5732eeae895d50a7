"""The benchmarks keep their shape: nothing here is timed (the numbers are synthetic or recorded).

- the flat floor (bench/flat_program.py) registers exactly the library's Kubernetes and Random
  objects, so neither `make bench` nor `make bench-engine` can compare against a stale program;
- the fleet variants of the real-engine benchmark change what they say they change;
- bench/engine.py's table and verdicts have one row per size and operation and the columns
  docs/benchmark.md shows; a recorded bench/engine-results.json still renders;
- the recorded tables (bench/RESULTS.md, bench/ENGINE-RESULTS.md and their copies in docs/benchmark.md,
  which the measuring commands write) agree, and what they count of the deployment (resources, Kubernetes
  objects, slurm.conf) is what the code deploys now.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from pathlib import Path

from bench import bench, engine
from bench.fleet import VARIANTS, fleet_config

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "benchmark.md").read_text()


def _registered_types(program: str, nodes: int) -> Counter:
    import pulumi
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from bench.bench import _kubernetes_and_random, _lean_mocks

    config = fleet_config(nodes)
    if program == "library":
        from dualsched.components.program import build

        def body():
            build(config)
    else:
        from bench import flat_program

        plan = flat_program.capture(config)

        def body():
            flat_program.build(plan)

    mocks = _lean_mocks()
    pulumi.runtime.set_mocks(mocks, project="dualsched", stack="bench", preview=False)
    _sync_await(run_pulumi_func(body))
    return _kubernetes_and_random(mocks.types)


def test_flat_program_registers_the_same_objects_as_the_library():
    library, flat = _registered_types("library", 16), _registered_types("flat", 16)
    assert library == flat
    # nothing per node in either: the node keeper's ConfigMap carries the pools' labels and taints
    assert not [t for t in library if t.startswith("kubernetes:core/v1:Node")]
    assert library == _registered_types("library", 64)


def test_flat_plan_keeps_options_and_the_pool_fan_out():
    from bench.flat_program import capture

    plan = capture(fleet_config(16))
    resources = plan["resources"]
    assert json.loads(json.dumps(plan)) == plan  # plain data: the engine benchmark writes it to a file
    [keeper] = [i for i, r in enumerate(resources) if r["type"] == "kubernetes:apps/v1:Deployment" and r["name"] == "dualsched-node-keeper"]
    slurmd = [r for r in resources if r["type"] == "kubernetes:apps/v1:DaemonSet"]
    assert len(slurmd) == 8 and all(keeper in r["depends_on"] for r in slurmd)  # the labels they select on are there
    assert any(r["protect"] for r in resources)


def test_flat_plan_feeds_each_secret_from_its_own_random_resource_in_every_capture():
    """Registrations and the mocks' calls interleave differently from one render to the next (about one
    in six renders generated the JWT key before the munge key): a plan that paired generated values with
    Random resources by order swapped the keys between captures, so its `pool` and `conf` updates
    rotated both Secrets and rolled every pod that mounts them, work the library never does."""
    from bench.flat_program import _REF, capture

    def random_feeding(plan, secret):
        [spec] = [r for r in plan["resources"] if r["type"] == "kubernetes:core/v1:Secret" and r["name"] == secret]
        [[_, index, attr]] = [ref for value in spec["inputs"]["data"].values() if isinstance(value, dict) and _REF in value
                              for ref in value["refs"]]
        return plan["resources"][index]["name"], attr

    for _ in range(24):  # a swap in 1 of 6: an order-based pairing passes 24 captures 1 time in 80
        plan = capture(fleet_config(16))
        assert random_feeding(plan, "dualsched-munge-slurm") == ("dualsched-munge-bytes", "base64")
        assert random_feeding(plan, "dualsched-jwt-key") == ("dualsched-jwt-key-bytes", "base64")


def test_fleet_variants_change_one_pool_then_slurm_conf_only():
    base, pool, conf = (fleet_config(64, v) for v in VARIANTS)
    changed = [a.name for a, b in zip(base.pools, pool.pools) if a != b]
    assert changed == ["pool-7"]
    assert pool.pools == conf.pools and len(conf.slurm.partitions) == len(pool.slurm.partitions) + 1


def _rows(sizes=(256, 1024)):
    rows = []
    for nodes in sizes:
        for program in engine.PROGRAMS:
            for op in engine.OPS:
                rows.append({
                    "program": program, "nodes": nodes, "op": op, "seconds": nodes / 100, "cpu_seconds": nodes / 200,
                    "rss_engine_mib": 100.0, "rss_program_mib": 200.0, "rss_provider_mib": 300.0, "rss_total_mib": 600.0,
                    "state_bytes": nodes * 1000, "api_requests": 0 if op == "preview" else nodes, "summary": "",
                })
    return rows


def test_engine_table_has_a_row_per_size_and_operation():
    text = engine.table(_rows())
    lines = text.splitlines()
    assert lines[0].startswith("| nodes | operation | wall library (flat) | ratio |")
    assert len(lines) == 2 + 2 * len(engine.OPS)
    header_cells = lines[0].count("|")
    assert all(line.count("|") == header_cells for line in lines)
    assert "| 1,024 | noop-up | 10.2 s (10.2 s) | 1.00 |" in text
    assert "| 0 (0) | 1.00 |" in text  # a no-op preview may make no request at all


def test_engine_verdicts_name_every_target():
    verdicts = "\n".join(engine.verdicts(_rows()))
    for phrase in ("no-op preview at 1,024 nodes", "no-op up at 1,024 nodes", "worst library/flat ratio",
                   "peak memory of the engine and the program", "peak memory with the providers' processes",
                   "preview wall time 256 -> 1,024 nodes", "one-pool change at 1,024 nodes"):
        assert phrase in verdicts
    assert all(line.endswith(("PASS", "MISS")) for line in verdicts.splitlines())


def test_the_pool_change_is_judged_on_its_time_and_on_slurmctld_keeping_running():
    rows = [{**row, "controller_restarts": 0} if row["op"] in engine.CHANGES else row for row in _rows()]
    [pool] = [v for v in engine.verdicts(rows) if "one-pool change" in v]
    assert pool == "- one-pool change at 1,024 nodes: 10.2 s (target <= 30 s), slurmctld pods restarted: 0 (target 0): PASS"
    restarted = [{**row, "controller_restarts": 2} if row["op"] == "pool" else row for row in rows]
    assert [v for v in engine.verdicts(restarted) if "one-pool change" in v][0].endswith("restarted: 2 (target 0): MISS")
    [unknown] = [v for v in engine.verdicts(_rows()) if "one-pool change" in v]  # rows recorded before they were counted
    assert "slurmctld restarts not counted in this run" in unknown


def test_an_operation_restarted_the_pods_that_are_gone_or_new_objects():
    assert engine.restarted({"slurmctld-0": "a", "slurmctld-1": "b"}, {"slurmctld-0": "a", "slurmctld-1": "b"}) == 0
    assert engine.restarted({"slurmctld-0": "a", "slurmctld-1": "b"}, {"slurmctld-0": "c"}) == 2


def test_a_restart_in_any_run_of_a_repeated_operation_counts():
    runs = [{**_rows()[2], "controller_restarts": restarts} for restarts in (0, 1, 0)]
    assert engine.median_row(runs)["controller_restarts"] == 1


def test_repeated_no_op_runs_report_the_median_of_each_figure():
    runs = [{**row, "seconds": seconds, "cpu_seconds": 10 - seconds} for row, seconds in zip(_rows()[:3], (3.0, 1.0, 2.0))]
    row = engine.median_row(runs)
    assert (row["seconds"], row["cpu_seconds"], row["runs"], row["seconds_all"]) == (2.0, 8.0, 3, [3.0, 1.0, 2.0])
    assert engine.median_row(runs[:1]) == runs[0]


def test_memory_held_at_once_is_shown_and_judged_when_measured():
    """Summed per-process peaks overstate what the tree needs (the processes peak at different times): once
    every row has what the tree held at once, the verdict is judged on that."""
    rows = [{**row, "rss_total_mib": 1500.0, "rss_together_mib": 512.0} for row in _rows()]
    assert "| 512 MiB (512 MiB) |" in engine.table(rows)
    [held] = [v for v in engine.verdicts(rows) if "with the providers" in v]
    assert "512 MiB held at once (1500 MiB summed per-process peaks" in held and held.endswith("PASS")
    over = [{**row, "rss_together_mib": 1100.0} for row in rows]
    assert [v for v in engine.verdicts(over) if "with the providers" in v][0].endswith("MISS")
    assert "| - (-) |" in engine.table(_rows())  # rows recorded before it was measured
    [summed] = [v for v in engine.verdicts(_rows()) if "with the providers" in v]
    assert "summed per-process peaks (target" in summed


def test_recorded_engine_results_still_render():
    """docs/benchmark.md and bench/ENGINE-RESULTS.md show these recorded results: they must exist and still render."""
    rows = json.loads((ROOT / "bench" / "engine-results.json").read_text())
    assert {"program", "nodes", "op", *engine.COLUMNS} <= set(rows[0])
    assert engine.table(rows).count("\n") >= 2


def _recorded_rows(text: str) -> list[dict[str, int]]:
    """The structural columns of a recorded `make bench` table: what the code deploys, not how fast."""
    row = re.compile(r"^\| ([\d,]+) \([\d,]+\) \| ([\d,]+) \(([\d,]+)\) \|.*\| ([\d,]+) B, (\d+) lines \|", re.M)
    return [dict(zip(("nodes", "resources", "k8s_objects", "conf_bytes", "conf_lines"), (int(v.replace(",", "")) for v in m.groups())))
            for m in row.finditer(text)]  # fmt: skip


@functools.cache
def _deployed(program: str, nodes: int) -> Counter:
    """Every resource the program registers at this fleet size (one evaluation under the benchmark's mocks)."""
    from bench.bench import worker

    return Counter(worker(program, nodes)["types"])


def test_the_recorded_benchmark_table_matches_what_the_code_deploys():
    """bench/RESULTS.md (and its table in docs/benchmark.md) count the resources and slurm.conf that the code of
    the commit deploys: a change that adds a resource or a line has `make bench` record the table again."""
    from bench.bench import _kubernetes_and_random, slurm_files_stats

    recorded = _recorded_rows((ROOT / "bench" / "RESULTS.md").read_text())
    assert [r["nodes"] for r in recorded] == [256, 1024, 4096], recorded
    for row in recorded:
        types = _deployed("library", row["nodes"])
        conf = slurm_files_stats(row["nodes"], runs=1)
        measured = {
            "nodes": row["nodes"], "resources": sum(types.values()),
            "k8s_objects": sum(n for t, n in _kubernetes_and_random(types).items() if t.startswith("kubernetes:")),
            "conf_bytes": conf["conf_bytes"], "conf_lines": conf["conf_lines"],
        }  # fmt: skip
        assert measured == row, f"bench/RESULTS.md is stale (run `make bench`): {row} != {measured}"


def test_the_benchmark_page_shows_the_recorded_tables():
    """docs/benchmark.md holds no hand copy: between its markers are the tables and verdicts that `make bench`
    and `make bench-engine` wrote into bench/RESULTS.md and bench/ENGINE-RESULTS.md, and the engine's is what
    bench/engine-results.json renders to."""
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    mocks = bench.between(DOC, bench.BEGIN, bench.END)
    assert mocks and mocks in results, "docs/benchmark.md's `make bench` table is not bench/RESULTS.md's: run `make bench`"
    assert _recorded_rows(mocks) == _recorded_rows(results)
    rows = json.loads((ROOT / "bench" / "engine-results.json").read_text())
    real = bench.between(DOC, engine.DOC_BEGIN, engine.DOC_END)
    assert real == engine.recorded(rows), "docs/benchmark.md's real-engine table is not bench/engine-results.json's"
    assert real in (ROOT / "bench" / "ENGINE-RESULTS.md").read_text()


def test_the_measuring_commands_write_the_page_between_its_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# before\n\n{bench.BEGIN}\nold table\n{bench.END}\n\nafter\n")
    bench.replace_between(page, bench.BEGIN, bench.END, "| new |")
    assert page.read_text() == f"# before\n\n{bench.BEGIN}\n| new |\n{bench.END}\n\nafter\n"


def _engine_resources(rows: list[dict]) -> dict[tuple[str, int], int]:
    """Resources of each first `up` in recorded rows, from the engine's summary ('+ 108 to create')."""
    return {(r["program"], r["nodes"]): int(re.fullmatch(r"\+ (\d+) to create", r["summary"])[1]) for r in rows if r["op"] == "up"}


def test_the_recorded_real_engine_run_deployed_what_the_code_deploys():
    """The real-engine table's state sizes and API requests follow from what was deployed; the engine's summary of
    each first `up` counts it: the program's resources (as registered under mocks) and the stack."""
    recorded = _engine_resources(json.loads((ROOT / "bench" / "engine-results.json").read_text()))
    assert len(recorded) == 6, recorded
    now = {(program, nodes): sum(_deployed(program, nodes).values()) + 1 for program, nodes in recorded}
    assert recorded == now, f"the real-engine run is stale (run `make bench-engine`): recorded {recorded}, the code now {now}"
