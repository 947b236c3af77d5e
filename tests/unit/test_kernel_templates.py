"""The kernel's own messages from its sources (data/kernel_templates.json, scripts/kernel-templates.py): every
template compiles and is named by the matcher the daemon and ``diagnose`` use, every family has a verdict in
judge/kernel_families.py, a real line of each family from a public report is named with its family, and the same
text gives the same findings from the daemon's followed kernel log and from ``diagnose``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.environment import Environment
from dgxdoctor.judge.kernel_families import FAMILIES, assess_message
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.kernel_events import parse_kernel_event, scan_kernel_lines
from dgxdoctor.sources.kernel_templates import (
    anchor,
    lines_to_look_at,
    load_table,
    match_template,
    own_words,
    templates,
)

KERNEL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kernel-templates.py"


def _real_lines() -> list[tuple[str, str, str]]:
    rows = []
    for row in (KERNEL_LOG / "template_lines.tsv").read_text().splitlines():
        if row and not row.startswith("#"):
            family, source, line = row.split("\t")
            rows.append((family, source, line))
    return rows


# printf conversions and a value of each that the kernel could print.
_SAMPLE = re.compile(
    r"%[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|L|z|j|t)?([diouxXeEfgGcsp%])(?:(?<=p)[A-Za-z0-9]*)?"
)
_VALUES = {"d": "8", "i": "8", "u": "8", "o": "7", "x": "1f", "X": "1F", "c": "y", "s": "mlx5_0", "p": "0xffff",
           "%": "%", "e": "1.5", "E": "1.5", "f": "1.5", "g": "1.5", "G": "1.5"}  # fmt: skip


def _filled(template: str) -> str:
    return _SAMPLE.sub(lambda m: _VALUES[m.group(1)], template)


def test_the_table_says_where_it_came_from() -> None:
    table = load_table()
    assert table["generated_by"] == "scripts/kernel-templates.py" and SCRIPT.is_file()
    sources = table["sources"]
    assert isinstance(sources, list)
    kernels = [s for s in sources if s["name"] in ("linux", "linux-ubuntu")]
    nvidia = [s for s in sources if s["name"] == "NVIDIA/open-gpu-kernel-modules"]
    # The series GPU servers run (Ubuntu 20.04's 5.4, 22.04's 5.15, 24.04's 6.8 and its later HWE kernels), each
    # read as its own release, not assumed to sit between others.
    series = {".".join(s["version"].split(".")[:2]) for s in kernels}
    assert series >= {"5.4", "5.10", "5.15", "6.1", "6.2", "6.5", "6.8", "6.11", "6.12", "6.14"}
    assert {s["version"] for s in kernels if s["name"] == "linux-ubuntu"} >= {"5.15.0-138.148"}
    assert len(nvidia) >= 5
    git = [s for s in sources if s["kind"] == "git"]  # the commit each tag or snapshot was read at
    assert len(git) >= len(nvidia) + 5 and all(re.fullmatch(r"[0-9a-f]{40}", s["commit"]) for s in git)
    versions = {s["version"] for s in sources}
    assert all(set(t.versions) <= versions for t in templates())


def test_the_generator_reads_a_release_tree_at_a_commit_in_a_folder(tmp_path: Path) -> None:
    """A repository without release tags whose commit holds one release's tree in a folder (how 6.2.12 was read):
    ``--git NAME@VERSION=GITDIR#COMMIT:FOLDER`` reads the FILES there and records the commit and the folder."""
    work = tmp_path / "work"
    source = work / "linux-9.9.1" / "kernel" / "hung_task.c"
    source.parent.mkdir(parents=True)
    source.write_text('static void f(void)\n{\n\tpr_err("INFO: task %s:%d blocked for more than %ld seconds.\\n",'
                      " t->comm, t->pid, timeout);\n}\n")  # fmt: skip
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # fmt: skip
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "a release's tree in a folder"]):
        subprocess.run(["git", "-C", str(work), *args], check=True, env=env)
    commit = subprocess.run(["git", "-C", str(work), "rev-parse", "HEAD"], capture_output=True, text=True, env=env)
    sha = commit.stdout.strip()
    out = tmp_path / "table.json"
    spec = f"linux@9.9.1={work / '.git'}#{sha}:linux-9.9.1"
    subprocess.run([sys.executable, str(SCRIPT), "--git", spec, "--out", str(out)], check=True, capture_output=True)
    table = json.loads(out.read_text())
    assert table["sources"] == [
        {"name": "linux", "version": "9.9.1", "kind": "git", "commit": sha, "folder": "linux-9.9.1"}
    ]
    (found,) = table["templates"]
    assert (found["family"], found["level"], found["versions"]) == ("hung_task", 3, ["9.9.1"])
    assert found["origins"] == ["9.9.1:kernel/hung_task.c:3"]
    assert re.search(found["regex"], "[ 1.0] INFO: task python3:123 blocked for more than 120 seconds.")


@pytest.mark.parametrize("template", templates(), ids=lambda t: f"{t.family}:{t.template[:50]}")
def test_every_template_compiles_is_judged_and_is_named(template: object) -> None:
    from dgxdoctor.sources.kernel_templates import KernelTemplate

    assert isinstance(template, KernelTemplate)
    re.compile(template.regex)
    assert template.family in FAMILIES  # a verdict, or INFO by its rule
    assert template.level is None or 0 <= template.level <= 4  # warning level and above only
    assert template.versions and len(template.origins) == len(template.versions)
    assert re.search(template.regex, _filled(template.template))
    if own_words(template.template):  # what the matcher looks a line up by (none: it names too little)
        filled = _filled(template.template.removeprefix("%s"))  # a leading %s: cper.c's pfx, a prefix
        found = match_template("[  12.345678] {1}[Hardware Error]: " + filled)
        assert found is not None, template.template
        # cper.c prints aer.c's words too: the same message may be another family's, never another message
        assert found.template.family == template.family or anchor(found.template.template) == anchor(template.template)


def test_every_family_has_a_rule_with_its_reason() -> None:
    families = {t.family for t in templates()}
    assert families == set(FAMILIES)
    for family, rule in FAMILIES.items():
        assert rule.reason and rule.code == f"KERNEL_{family.upper()}_MESSAGE"
        info = assess_message(family, None)
        assert info.status is Status.OK  # a level the caller computes: INFO
        worst = assess_message(family, 0)
        assert worst.status is (Status.OK if rule.warn_at is None else Status.WARNING)
        assert worst.status is not Status.CRITICAL  # a template alone never pages


@pytest.mark.parametrize(("family", "source", "line"), _real_lines(), ids=lambda v: str(v)[:40])
def test_a_real_line_of_each_family_is_named_with_its_family(family: str, source: str, line: str) -> None:
    found = match_template(line)
    assert found is not None and found.template.family == family, source


def test_each_family_has_a_real_line_but_bonding() -> None:
    assert {f for f, _, _ in _real_lines()} == set(FAMILIES) - {"bonding"}


def test_a_templated_message_is_judged_by_its_family_and_level() -> None:
    # workqueue.c pr_warn: a CPU hog is INFO; hung_task.c pr_err: a WARNING; watchdog.c pr_emerg hard lockup too.
    hog = "[ 461.6] workqueue: rht_deferred_worker hogged CPU for >10000us 4 times, consider switching to WQ_UNBOUND"
    hard = "[ 1024.5] watchdog: Watchdog detected hard LOCKUP on cpu 12"
    findings = {f.code: f for f in KernelLogAnalyzer().analyze(hog + "\n" + hard + "\n").findings}
    assert findings["KERNEL_WORKQUEUE_MESSAGE"].status is Status.OK
    assert findings["KERNEL_WATCHDOG_MESSAGE"].status is Status.WARNING
    assert "Watchdog detected hard LOCKUP on cpu %d" in findings["KERNEL_WATCHDOG_MESSAGE"].message


def test_a_pasted_hard_lockup_alone_is_a_kernel_log_and_an_info_line_alone_is_an_ok_one() -> None:
    (found,) = diagnose("[ 1024.5] watchdog: Watchdog detected hard LOCKUP on cpu 12\n")
    assert found.kind == "kernel-log"
    assert [(f.code, f.status) for f in found.findings] == [("KERNEL_WATCHDOG_MESSAGE", Status.WARNING)]
    # A kernel line by its shape (issue 35): a kernel log, and a healthy one (the message is INFO at most).
    (info,) = diagnose("[ 461.6] workqueue: x hogged CPU for >10000us 4 times, consider switching to WQ_UNBOUND\n")
    assert info.kind == "kernel-log" and info.status is Status.OK


def test_aer_detail_lines_join_the_error_they_follow() -> None:
    # aer.c aer_print_error: the summary, the device's line, then its status and the bits (6.x words).
    text = (
        "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0\n"
        "nvidia 0000:01:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)\n"
        "nvidia 0000:01:00.0:   device [10de:2330] error status/mask=00004000/00000000\n"
        "nvidia 0000:01:00.0:    [14] CmpltTO                (First)\n"
        "pcieport 0000:00:01.0: AER:   Error of this Agent is reported first\n"
    )
    events = list(scan_kernel_lines(text.splitlines()))
    assert [(e.kind, e.pci) for e in events] == [("aer_fatal", "0000:01:00.0")]
    event = parse_kernel_event("nvidia 0000:01:00.0:   device [10de:2330] error status/mask=00004000/00000000")
    assert event is not None and event.kind == "kernel_message" and event.family == "aer"


def test_mce_bank_lines_join_the_machine_check() -> None:
    # mce/core.c print_mce: the bank line, then the TSC/ADDR/MISC and PROCESSOR lines of the same record.
    text = (
        "mce: [Hardware Error]: CPU 1: Machine Check: 0 Bank 11: bc00000000010135\n"
        "mce: [Hardware Error]: TSC 0 ADDR 1f5d3c0c0 MISC 9000000001000086\n"
        "mce: [Hardware Error]: PROCESSOR 0:50657 TIME 1611573331 SOCKET 0 APIC 2 microcode 5003003\n"
    )
    events = list(scan_kernel_lines(text.splitlines()))
    assert [(e.kind, e.other) for e in events] == [("mce_uncorrected", "cpu1")]


def _followed(tmp_path: Path, text: str) -> set[tuple[str, str | None, Status, str | None]]:
    log = tmp_path / "kern.log"
    log.write_text(text)
    env = Environment(kmsg_path=log, sysfs_root=tmp_path / "no-sys", state_dir=tmp_path / "state")
    check = XidCheck(XidSettings(), env)
    try:
        found: list[Finding] = [f for f in check.run().findings if f.code.startswith("KERNEL_")]
    finally:
        check.stop()
    return {(f.code, f.subject, f.status, f.evidence) for f in found}


def test_the_daemon_and_diagnose_agree_on_every_family(tmp_path: Path) -> None:
    text = "[ 1024.5] watchdog: Watchdog detected hard LOCKUP on cpu 12\n"
    text += "".join(line + "\n" for _, _, line in _real_lines())
    pasted = {
        (f.code, f.subject, f.status, f.evidence)
        for f in KernelLogAnalyzer().analyze(text).findings
        if f.code.startswith("KERNEL_")
    }
    assert _followed(tmp_path, text) == pasted
    assert {code for code, *_ in pasted} >= {"KERNEL_NFS_MESSAGE", "KERNEL_SUNRPC_MESSAGE", "KERNEL_WATCHDOG_MESSAGE"}


def test_the_whole_text_pass_finds_every_line_a_format_names() -> None:
    """``diagnose`` looks up only the lines one automaton pass over the text finds; the daemon looks up every line:
    the pass must find every line the lookup names, or the two would differ."""
    lines = [f"[ 12.3] {{1}}[Hardware Error]: {_filled(t.template.removeprefix('%s'))}" for t in templates()]
    lines += [line for _, _, line in _real_lines()]
    found = set(lines_to_look_at("\n".join(lines) + "\n"))
    named = [line for line in lines if match_template(line) is not None]
    assert named and all(line in found for line in named)


def test_the_follower_looks_up_only_records_the_kernel_logged_at_warning_or_above() -> None:
    from dgxdoctor.checks.kernel_events import KernelEventLedger
    from dgxdoctor.sources.kmsg import KmsgRecord

    hard = "watchdog: Watchdog detected hard LOCKUP on cpu 12"
    ledger = KernelEventLedger(clock=lambda: 1000.0, monotonic=lambda: 10.0)
    assert ledger.ingest([KmsgRecord(hard, facility=0, level=6, seq=1, usec=1)]) == 0  # info: none of the table's
    assert ledger.ingest([KmsgRecord(hard, facility=0, level=0, seq=2, usec=2)]) == 1  # emerg, as watchdog.c prints it
    assert [key for key, _ in ledger.snapshot()] == [("watchdog_message", "")]


def test_a_line_no_anchor_names_runs_no_regex_of_the_table() -> None:
    """One pass of the anchors' automaton decides; only the formats a line may print compile and run their regex
    (compiling the whole table took ~80 ms of a ``diagnose`` that met one kernel-looking line)."""
    from dgxdoctor.sources.kernel_templates import _by_word

    index = _by_word()
    index._regexes.clear()
    assert match_template("[    1.000000] IPv6: ADDRCONF(NETDEV_CHANGE): enp1s0f0: link becomes ready") is None
    assert not index._regexes
    found = match_template("[ 1024.5] watchdog: Watchdog detected hard LOCKUP on cpu 12")
    assert found is not None and found.template.family == "watchdog"
    assert 0 < len(index._regexes) <= 3


def test_the_gated_pass_over_a_text_gives_what_parsing_every_line_gives() -> None:
    """``diagnose`` parses only the lines one automaton pass names (``scan_kernel_text``); the daemon parses every
    line: on every kernel fixture the two give the same events, and the pass leaves most look-alike lines out."""
    from dgxdoctor.sources.kernel_events import _gate_patterns, _gated_lines, scan_kernel_text

    assert len(_gate_patterns()) >= 35  # every parser's pattern but the two that alone name nothing
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(KERNEL_LOG.rglob("*")) if p.is_file()]
    texts.append("".join(line + "\n" for _, _, line in _real_lines()))
    texts.append("NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792) ünïcode\r\nx\x0cy\n")
    for text in texts:
        assert list(scan_kernel_text(text)) == list(scan_kernel_lines(text.splitlines()))
    lookalikes = (KERNEL_LOG / "lookalikes.txt").read_text().splitlines()
    gated = _gated_lines(lookalikes)
    assert gated is not None and len(gated) < len(lookalikes) / 2
