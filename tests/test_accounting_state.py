"""QOS, preemption and accounts as code: the config's checks, what slurm.conf and the accounting-state
file say, and the program (components/programs/accounting_state.sh) that makes slurmdbd match the file.

The program runs here under sh with a fake ``sacctmgr`` and ``squeue``, which pins what it asks of
them; tests/slurm/test_preemption.py runs it against a real slurmdbd and shows a real preemption."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dualsched.components.slurm_files import (
    ACCOUNTING_STATE_FILE, kubernetes_site, print_seconds, render_slurm_files, restart_hash, slurm_seconds,
)
from dualsched.config import ConfigError, StackConfig, parse_stack_config
from tests.conftest import raw_stack

PROGRAM = Path(__file__).resolve().parent.parent / "components" / "programs" / "accounting_state.sh"


def with_qos(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (dev) with users, two QOS (high preempts low) and two accounts under one parent."""
    raw = copy.deepcopy(raw)
    slurm = raw["slurm"]
    slurm["users"] = [{"name": "alice", "uid": 5001}, {"name": "bob", "uid": 5002, "defaultAccount": "serving"}]
    slurm["preemption"] = {"type": "qos", "mode": "requeue", "exemptTime": "5:00"}
    slurm["qos"] = [
        {"name": "low", "usageFactor": 0.5, "maxWall": "1:30"},
        {"name": "high", "priority": 1000, "preempt": ["low"], "maxTresPerUser": {"gpus": 8, "cpus": 64},
         "grpTres": {"nodes": 4}, "maxJobsPerUser": 10, "preemptExemptTime": "2-3"},
    ]  # fmt: skip
    slurm["accounts"] = [
        {"name": "research", "fairshare": 10},
        {"name": "training", "parent": "research", "qos": ["low", "normal"], "defaultQos": "normal", "users": ["alice", "bob"]},
        {"name": "serving", "parent": "research", "qos": ["high"], "users": ["bob"]},
    ]
    raw["submission"] = {"identities": []}
    return raw


def config(raw: dict[str, Any]) -> StackConfig:
    return parse_stack_config(raw)


def files(raw: dict[str, Any]) -> dict[str, str]:
    parsed = config(raw)
    return render_slurm_files(parsed, kubernetes_site(parsed))


def conf_lines(text: str, *keys: str) -> list[str]:
    return [line for line in text.splitlines() if line.split("=", 1)[0] in keys]


def state_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(raw)
    return [line.strip() for line in str(caught.value).splitlines()]


PREEMPT_KEYS = ("PreemptType", "PreemptMode", "PreemptExemptTime", "JobRequeue", "AccountingStorageEnforce", "PriorityWeightQOS")


# ------------------------------------------------------------------------ rendering


def test_without_qos_or_accounts_nothing_is_preempted_or_enforced():
    raw = raw_stack("dev")
    text = files(raw)
    assert conf_lines(text["slurm.conf"], *PREEMPT_KEYS) == ["PreemptType=preempt/none", "PreemptMode=OFF", "JobRequeue=1"]
    assert state_lines(text[ACCOUNTING_STATE_FILE]) == [f"Cluster={raw['slurm']['clusterName']} Marker=dualsched:{raw['slurm']['clusterName']}"]


def test_without_accounting_the_program_gets_nothing_to_do():
    raw = raw_stack("dev")
    raw["slurm"]["accounting"] = {"enabled": False}
    assert state_lines(files(raw)[ACCOUNTING_STATE_FILE]) == []


def test_qos_and_accounts_render_slurm_conf_and_the_state_file():
    text = files(with_qos(raw_stack("dev")))
    assert conf_lines(text["slurm.conf"], *PREEMPT_KEYS) == [
        "PriorityWeightQOS=200000",
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "PreemptExemptTime=5:00",
        "JobRequeue=1",
        "AccountingStorageEnforce=associations,limits,qos",
    ]
    cluster = raw_stack("dev")["slurm"]["clusterName"]
    assert state_lines(text[ACCOUNTING_STATE_FILE]) == [
        f"Cluster={cluster} Marker=dualsched:{cluster}",
        # MaxWall in whole minutes, rounded up; TRES sorted by name, as sacctmgr prints them
        # an unset option is left out
        "QOS=low Priority=0 PreemptMode=cluster UsageFactor=0.500000 MaxWall=00:02:00",
        "QOS=high Priority=1000 Preempt=low PreemptMode=cluster PreemptExemptTime=2-03:00:00 UsageFactor=1.000000 "
        "MaxTRESPU=cpu=64,gres/gpu=8 GrpTRES=node=4 MaxJobsPU=10",
        "Account=research Parent=root Fairshare=10 QOS=normal DefaultQOS=normal",
        "Account=training Parent=research Fairshare=1 QOS=low,normal DefaultQOS=normal",
        "Account=serving Parent=research Fairshare=1 QOS=high DefaultQOS=high",
        "User=alice Account=training DefaultAccount=training",
        "User=bob Account=training DefaultAccount=serving",
        "User=bob Account=serving DefaultAccount=serving",
    ]


@pytest.mark.parametrize(("settings", "expected"), [
    ({"type": "partition_prio", "mode": "cancel"}, ["PreemptType=preempt/partition_prio", "PreemptMode=CANCEL", "JobRequeue=1"]),
    ({"type": "off", "requeueByDefault": False}, ["PreemptType=preempt/none", "PreemptMode=OFF", "JobRequeue=0"]),
])  # fmt: skip
def test_preemption_without_qos(settings, expected):
    raw = raw_stack("dev")
    raw["slurm"]["preemption"] = settings
    if settings["type"] == "partition_prio":
        raw["slurm"]["partitions"].append({"name": "urgent", "pools": raw["slurm"]["partitions"][0]["pools"], "priorityTier": 9})
    assert conf_lines(files(raw)["slurm.conf"], *PREEMPT_KEYS) == expected


def test_enforcement_needs_a_restart_so_it_rolls_slurmctld():
    plain, managed = files(raw_stack("dev")), files(with_qos(raw_stack("dev")))
    release = parse_stack_config(raw_stack("dev")).slurm.release_version
    assert restart_hash(plain, release) != restart_hash(managed, release)
    # a change of QOS or accounts alone is the program's, not a restart's
    other = with_qos(raw_stack("dev"))
    other["slurm"]["qos"][0]["priority"] = 5
    assert restart_hash(files(other), release) == restart_hash(managed, release)


@pytest.mark.parametrize(("text", "seconds"), [
    ("5", 300), ("1:30", 90), ("2:03:04", 7384), ("2-3", 183600), ("1-00:10", 87000), ("1-00:00:05", 86405),
    ("INFINITE", None), ("UNLIMITED", None),
])  # fmt: skip
def test_slurm_times(text, seconds):
    assert slurm_seconds(text) == seconds


@pytest.mark.parametrize(("seconds", "printed"), [(30, "00:00:30"), (3600, "01:00:00"), (86400 * 2 + 61, "2-00:01:01")])
def test_durations_print_as_sacctmgr_prints_them(seconds, printed):
    assert print_seconds(seconds) == printed


# -------------------------------------------------------------------------- checks


def test_the_example_is_valid():
    config(with_qos(raw_stack("dev")))


@pytest.mark.parametrize(("change", "expected"), [
    (lambda s: s["qos"][1].update(preempt=["lowest"]),
     "slurm.qos[1].preempt[0]: no QOS of that name in slurm.qos (nor Slurm's 'normal') (got 'lowest')"),
    (lambda s: s["qos"][1].update(preempt=["high", "low"]),
     "slurm.qos[1].preempt[0]: a QOS does not preempt its own jobs (got 'high')"),
    (lambda s: s["qos"][0].update(preempt=["high"]),
     "slurm.qos[1].preempt: preemption cycle high -> low -> high: jobs would preempt each other back and forth (got ['low'])"),
    (lambda s: s["qos"].append({"name": "low"}), "slurm.qos[2].name: name is used more than once (got 'low')"),
    (lambda s: s["preemption"].update(mode="suspend"),
     "slurm.preemption.mode: a suspended job keeps its GPUs (slurm.conf(5): \"Suspended jobs will not release GRES\"), "
     "so no GPU job could preempt it: use 'requeue' or 'cancel' (got 'suspend')"),
    (lambda s: s["qos"][1].update(preempt=[]),
     "slurm.preemption.type: no QOS in slurm.qos lists another in its preempt list, so no job would preempt any (got 'qos')"),
    (lambda s: s["preemption"].update(type="off"),
     "slurm.qos[1].preempt: preempts nothing unless slurm.preemption.type is 'qos' (got ['low'])"),
    (lambda s: (s["preemption"].update(type="off"), s["qos"][1].update(preempt=[], preemptMode="requeue")),
     "slurm.qos[1].preemptMode: applies only when slurm.preemption.type is 'qos' (got 'requeue')"),
    (lambda s: s["accounts"][1].update(parent="serving"),
     "slurm.accounts[1].parent: must be root or an account listed before this one (got 'serving')"),
    (lambda s: s["accounts"].append({"name": "root"}),
     "slurm.accounts[3].name: is Slurm's own root account, the parent of all others (got 'root')"),
    (lambda s: s["accounts"].append({"name": "serving"}), "slurm.accounts[3].name: name is used more than once (got 'serving')"),
    (lambda s: s["accounts"][2].update(qos=["high", "gold"]),
     "slurm.accounts[2].qos[1]: no QOS of that name in slurm.qos (nor Slurm's 'normal') (got 'gold')"),
    (lambda s: s["accounts"][2].update(defaultQos="low"),
     "slurm.accounts[2].defaultQos: must be one of the account's qos (high) (got 'low')"),
    (lambda s: s["accounts"][2].update(users=["bob", "carol"]), "slurm.accounts[2].users[1]: is not one of slurm.users (got 'carol')"),
    (lambda s: s["accounts"][2].update(users=["bob", "bob"]), "slurm.accounts[2].users[1]: is listed more than once (got 'bob')"),
    (lambda s: s["accounts"][1].update(users=["bob"]),
     "slurm.users[0].name: is in no account of slurm.accounts, and with accounts Slurm refuses the jobs of a user without "
     "one (AccountingStorageEnforce=associations) (got 'alice')"),
    (lambda s: s["users"][1].update(defaultAccount="research"),
     "slurm.users[1].defaultAccount: must be an account listing the user (training, serving) (got 'research')"),
    (lambda s: s.update(accounts=[]),
     "slurm.accounts: jobs use a QOS through an account's association: list the accounts that may use slurm.qos (got nothing)"),
    (lambda s: s.update(accounting={"enabled": False}),
     "slurm.accounts: accounts and QOS live in slurmdbd: enable slurm.accounting (got ['research', 'training', 'serving'])"),
])  # fmt: skip
def test_each_mistake_is_named_with_its_path(change, expected):
    raw = with_qos(raw_stack("dev"))
    change(raw["slurm"])
    assert expected in problems(raw)


def test_preempt_qos_needs_accounting():
    raw = with_qos(raw_stack("dev"))
    raw["slurm"]["accounting"] = {"enabled": False}
    assert "slurm.preemption.type: preempt/qos reads the QOS from accounting: enable slurm.accounting (got 'qos')" in problems(raw)


def test_partition_prio_needs_two_tiers_over_the_same_nodes():
    raw = raw_stack("dev")
    raw["slurm"]["preemption"] = {"type": "partition_prio"}
    assert ("slurm.preemption.type: no two partitions over the same pool have different priorityTier, so no job would "
            "preempt any (got 'partition_prio')") in problems(raw)


def test_exempt_time_without_preemption_is_refused():
    raw = raw_stack("dev")
    raw["slurm"]["preemption"] = {"exemptTime": "10"}
    assert "slurm.preemption.exemptTime: has no effect while slurm.preemption.type is 'off' (got '10')" in problems(raw)


def test_a_submission_identity_charges_an_account_of_its_user():
    raw = with_qos(raw_stack("dev"))
    raw["submission"] = {"identities": [{"serviceAccount": "pipelines", "user": "alice", "account": "serving"}]}
    assert "submission.identities[0].account: is not an account of user alice (training) (got 'serving')" in problems(raw)


def test_a_default_account_needs_accounts():
    raw = raw_stack("dev")
    raw["slurm"]["users"] = [{"name": "alice", "uid": 5001, "defaultAccount": "training"}]
    raw["submission"] = {"identities": []}
    assert "slurm.users[0].defaultAccount: there are no slurm.accounts (got 'training')" in problems(raw)


# -------------------------------------------------------------------------- program

FAKE_SACCTMGR = r"""#!/bin/sh
# Answers `show` from the files in $FAKE, logs every other call; fails an action whose words match $FAKE/refuse.
echo "$*" >> "$FAKE/calls"
case "$*" in
*" show qos "*) cat "$FAKE/qos" ;;
*" show association "*) cat "$FAKE/assoc" ;;
*" show account "*) cat "$FAKE/accounts" ;;
*" show user "*) cat "$FAKE/users" ;;
*) if [ -s "$FAKE/refuse" ] && echo "$*" | grep -q -f "$FAKE/refuse"; then echo "Nothing modified: refused" >&2; exit 1; fi ;;
esac
"""
FAKE_SQUEUE = r"""#!/bin/sh
echo "squeue $*" >> "$FAKE/calls"
[ -e "$FAKE/squeue-fails" ] && { echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1; }
case "$*" in
*"--account=training"*"%u"*) cat "$FAKE/training-users" 2>/dev/null ;;
*"--account=training"*) cat "$FAKE/training-jobs" 2>/dev/null ;;
esac
exit 0
"""

IN_PLACE = {
    "qos": "normal|0||cluster||1.000000|||||Normal QOS default\n"
           "low|0||cluster||0.500000|00:02:00||||dualsched:dev\n"
           "high|1000|low|cluster|2-03:00:00|1.000000||gres/gpu=8,cpu=64|node=4|10|dualsched:dev\n",
    "assoc": "root|||1|normal|\nroot|root||1|normal|\n"
             "research||root|10|normal|normal\n"
             "training||research|1|normal,low|normal\ntraining|alice||1|low,normal|normal\ntraining|bob||1|low,normal|normal\n"
             "serving||research|1|high|high\nserving|bob||1|high|high\n",
    "accounts": "research|dualsched:dev\nroot|default root account\nserving|dualsched:dev\ntraining|dualsched:dev\n",
    "users": "alice|training\nbob|serving\nroot|root\n",
}  # fmt: skip


@dataclasses.dataclass
class Fake:
    directory: Path
    state: Path

    def held(self, **changes: str) -> None:
        for name, text in {**IN_PLACE, **changes}.items():
            (self.directory / name).write_text(text)

    def run(self) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": f"{self.directory / 'bin'}:{os.environ['PATH']}", "FAKE": str(self.directory)}
        return subprocess.run(["sh", str(PROGRAM), str(self.state)], env=env, capture_output=True, text=True, timeout=60)

    def actions(self) -> list[str]:
        calls = (self.directory / "calls").read_text().splitlines() if (self.directory / "calls").exists() else []
        return [call for call in calls if " show " not in f" {call} " and not call.startswith("squeue ")]

    def squeues(self) -> list[str]:
        calls = (self.directory / "calls").read_text().splitlines() if (self.directory / "calls").exists() else []
        return [call for call in calls if call.startswith("squeue ")]


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sacctmgr", FAKE_SACCTMGR), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / ACCOUNTING_STATE_FILE
    state.write_text(files(with_qos(raw_stack("dev")))[ACCOUNTING_STATE_FILE])
    result = Fake(tmp_path, state)
    result.held()
    return result


def test_everything_in_place_is_left_alone(fake: Fake):
    done = fake.run()
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert fake.actions() == []


def test_an_empty_slurmdbd_gets_everything_added(fake: Fake):
    fake.held(qos=IN_PLACE["qos"].splitlines(keepends=True)[0], assoc="root|||1|normal|\n",
              accounts="root|default root account\n", users="root|root\n")  # fmt: skip
    done = fake.run()
    assert (done.returncode, done.stderr) == (0, "")
    # The fake's state does not change, so what is added once is added and set again: the calls are what counts.
    assert fake.actions()[:2] == ["--immediate add qos low Description=dualsched:dev", "--immediate add qos high Description=dualsched:dev"]
    assert ("--immediate add account research cluster=dev Description=dualsched:dev Parent=root Fairshare=10 QOS=normal "
            "DefaultQOS=normal") in fake.actions()
    assert "--immediate add user bob account=serving cluster=dev" in fake.actions()
    assert "--immediate modify user where name=bob cluster=dev set DefaultAccount=serving" in fake.actions()


def test_what_differs_is_set_and_a_dropped_limit_cleared(fake: Fake):
    fake.held(qos=IN_PLACE["qos"].replace("high|1000|low|cluster|2-03:00:00|1.000000||gres/gpu=8,cpu=64|node=4|10",
                                          "high|900||requeue|2-03:00:00|1.000000|01:00:00|gres/gpu=8,cpu=64,node=2|node=4,gres/gpu=16|"),
              assoc=IN_PLACE["assoc"].replace("serving||research|1|high|high", "serving||root|5|high,low|low"))  # fmt: skip
    done = fake.run()
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "set qos high: Priority=1000 Preempt=low PreemptMode=cluster MaxWall=-1 MaxTRESPerUser=cpu=64,gres/gpu=8,node=-1 "
        "GrpTRES=node=4,gres/gpu=-1 MaxJobsPerUser=10",
        "set account serving: Parent=research Fairshare=1 QOS=high DefaultQOS=high",
    ]
    assert fake.actions() == [
        "--immediate modify qos where name=high set Priority=1000 Preempt=low PreemptMode=cluster MaxWall=-1 "
        "MaxTRESPerUser=cpu=64,gres/gpu=8,node=-1 GrpTRES=node=4,gres/gpu=-1 MaxJobsPerUser=10",
        "--immediate modify account where name=serving cluster=dev set Parent=research Fairshare=1 QOS=high DefaultQOS=high",
    ]


def test_only_what_it_made_is_removed(fake: Fake):
    fake.held(
        qos=IN_PLACE["qos"] + "old|0||cluster||1.000000|||||dualsched:dev\nadmins|0||cluster||1.000000|||||made by hand\n"
            "other|0||cluster||1.000000|||||dualsched:another-cluster\n",
        assoc=IN_PLACE["assoc"] + "physics||root|1|normal|\nphysics|carol||1|normal|\n"
              "training|carol||1|low,normal|normal\nlab||root|1|normal|\nlab|bob||1|normal|\n",
        accounts=IN_PLACE["accounts"] + "physics|by hand\nlab|dualsched:dev\n",
    )  # fmt: skip
    done = fake.run()
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "removed user carol from account training",
        "removed user bob from account lab",
        "removed account lab",
        "removed qos old",
    ]


def test_nothing_jobs_use_is_removed_and_it_says_so(fake: Fake):
    state = fake.state.read_text()
    fake.state.write_text("\n".join(line for line in state.splitlines() if "training" not in line and not line.startswith("User=alice")))
    (fake.directory / "training-jobs").write_text("41\n42\n")
    (fake.directory / "training-users").write_text("alice\nbob\nalice\n")
    done = fake.run()
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "kept user alice in account training: 2 job(s) of the user's there still pending or running; removed once they end",
        "kept user bob in account training: 1 job(s) of the user's there still pending or running; removed once they end",
        "kept account training: 2 job(s) charged to it still pending or running; removed once they end",
    ]
    assert not [action for action in fake.actions() if "remove" in action]


def test_when_slurmctld_does_not_answer_nothing_is_removed(fake: Fake):
    fake.held(qos=IN_PLACE["qos"] + "old|0||cluster||1.000000|||||dualsched:dev\n")
    (fake.directory / "squeue-fails").touch()
    done = fake.run()
    assert done.returncode == 1
    assert "kept qos old: slurmctld did not answer: slurm_load_jobs error: Unable to contact slurm controller" in done.stderr
    assert fake.actions() == []


def test_a_refused_action_fails_the_run_and_the_rest_goes_on(fake: Fake):
    fake.held(assoc=IN_PLACE["assoc"].replace("research||root|10", "research||root|7").replace("serving||research|1|", "serving||research|2|"))
    (fake.directory / "refuse").write_text("name=research\n")
    done = fake.run()
    assert done.returncode == 1
    assert "accounting state: sacctmgr modify account where name=research cluster=dev set Fairshare=10 failed: Nothing modified: refused" in done.stderr
    assert done.stdout == "set account serving: Fairshare=1\n"


@pytest.mark.parametrize("line", [
    "QOS=x Priority=1",
    "QOS=x Priority=1 PreemptMode=cluster UsageFactor=1.000000 Colour=red",
    "QOS=x Priority=1 PreemptMode=cluster UsageFactor=1.000000 MaxWall",
    "QOS=x Priority=1 PreemptMode=cluster UsageFactor=1.000000 MaxWall=",
    "Account=x Parent=root",
    "User=x",
    "Reservation=x",
])  # fmt: skip
def test_a_line_not_the_templates_changes_nothing(fake: Fake, line: str):
    fake.state.write_text(fake.state.read_text() + line + "\n")
    done = fake.run()
    assert done.returncode == 1 and "not a" in done.stderr and line in done.stderr
    assert fake.actions() == [] and fake.squeues() == []


def test_no_cluster_line_no_work(fake: Fake):
    fake.state.write_text("# accounting disabled\n")
    done = fake.run()
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not (fake.directory / "calls").exists()
