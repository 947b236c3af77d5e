"""Every query of the shipped Grafana dashboards, evaluated by a real Prometheus scraping real agents and a real vLLM.

The setup, one for the module: a real vLLM (the CPU build, the small model of vllm_model.py) under a sustained
little load; two real dgxdoctor daemons ("dgx-a" and "dgx-b", two ports on loopback) that compare each other,
each reading its own sysfs InfiniBand tree (dgx-a healthy, dgx-b degraded) whose traffic counters grow while the
test runs, a kernel log file (XID and SXID lines from real logs are appended to dgx-b's), and the NCCL probe's
output (a real nccl-tests run on H200s, played back: there is no GPU here); dgx-a checks vLLM. A real Prometheus
(Debian's package) scrapes both agents and vLLM every second with the shipped recording and alert rules, the vLLM
job attaching ``node="dgx-a"`` as docs/dashboards.md says.

Then each panel query is sent as Grafana would (``$node`` = All, ``$__rate_interval`` = 15s) to Prometheus's HTTP
API: each must parse, name only metrics that the real scrapes or the loaded rules produce, and every panel must
return series, except those listed in NO_DATA_HERE with the reason. The answers are kept for the picture in
docs/dashboards.md (``DGXDOCTOR_WRITE_DOCS=1`` writes it there).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import FIXTURES, REPO
from dashboard_queries import dashboards, metric_names, panels_with_queries, substitute
from sysfstree import build_sysfs_tree

VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
MODEL_SCRIPT = Path(__file__).with_name("vllm_model.py")
NCCL_OUTPUT = FIXTURES / "nccl_tests" / "h200_2gpu_2196.txt"
TOKEN = "dashboards-test-token-0123456789"
RATE_INTERVAL = "15s"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed (Debian package)"),
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"vLLM CPU build not installed ({VLLM_PYTHON})"),
]

# Panels that cannot show data on this machine, and why. Every other panel must return series.
NO_GPU = "no GPU on this machine: NVML is absent, the gpu check is SKIPPED and exports no GPU series"
NO_DATA_HERE: dict[str, str] = {
    "GPU utilisation": NO_GPU,
    "GPU memory used": NO_GPU,
    "GPU temperature margin": NO_GPU,
    "GPU temperature": NO_GPU,
    "GPU power draw and limit": NO_GPU,
    "Clock events holding clocks down": NO_GPU,
    "NVLink and GPU health": NO_GPU,
}
# Panels whose data depends on timing or on another part's decisions here: either way is fine.
SOMETIMES_EMPTY: dict[str, str] = {
    "Remediation actions": "only when remediation acted or paged during the run (observe mode pages at most)",
    "Differing facts": "only once both agents published the facts in which their sysfs trees differ",
}
# Metrics with no series on this setup (not in this build yet, or only after an event): listed, not failed.
NOT_IN_THIS_BUILD = {
    # Exported from the first probe timeout on (a series per check and probe that timed out): none did here.
    "dgxdoctor_probe_timeouts_total": "no probe timed out, so the counter has no series yet",
}
# Names of older vLLM releases, read beside their newer names (vLLM 0.32 here exports only the newer ones).
OLDER_VLLM = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:time_per_output_token_seconds_bucket": "vllm:inter_token_latency_seconds_bucket",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if predicate():
                return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class Setup:
    tmp: Path
    prometheus: str = ""
    vllm: str = ""
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)
    kmsg_b: Path | None = None
    sysfs: dict[str, Path] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {n} (exit {p.poll()}):\n{log.read_text()[-2000:]}" for n, p, log in self.procs)

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc, _ in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def query(self, expr: str, instant: bool = True, at: float | None = None) -> dict[str, Any]:
        """Prometheus's answer to ``expr``: instant at ``at`` (default now), or a range over the 2 minutes before
        it in 2 s steps."""
        now = time.time() if at is None else at
        if instant:
            r = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr, "time": now}, timeout=30)
        else:
            params = {"query": expr, "start": now - 120, "end": now, "step": 2}
            r = httpx.get(f"{self.prometheus}/api/v1/query_range", params=params, timeout=30)
        doc: dict[str, Any] = r.json()
        return doc


def _start_vllm(setup: Setup) -> None:
    model = setup.tmp / "model"
    subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}
    env["VLLM_NO_USAGE_STATS"] = "1"
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    # A small cache and at most 4 sequences: requests queue and get preempted, as on a loaded server.
    argv += ["--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "4", "--num-gpu-blocks-override", "12"]
    proc = setup.start("vllm", argv, env)
    (setup.tmp / "vllm.pid").write_text(f"{proc.pid}\n")
    setup.vllm = f"http://127.0.0.1:{port}"


def _agent_config(setup: Setup, node: str, port: int, peer_port: int, tree: str) -> Path:
    sysfs = build_sysfs_tree(setup.tmp / f"sysfs-{node}", tree)
    setup.sysfs[node] = sysfs
    kmsg = setup.tmp / f"kmsg-{node}.log"
    kmsg.write_text("")
    if node == "dgx-b":
        setup.kmsg_b = kmsg
    nccl_command = json.dumps(["cat", str(NCCL_OUTPUT)])
    lines = [
        f'node = "{node}"',
        f'[paths]\nstate_dir = "{setup.tmp / node}"\nsysfs_root = "{sysfs}"\nkmsg_path = "{kmsg}"',
        f'[daemon]\nlisten = "127.0.0.1:{port}"\ntoken = "{TOKEN}"\npeers = ["http://127.0.0.1:{peer_port}"]',
        "peer_timeout_s = 2.0",
        "[checks.peer_compare]\ninterval_s = 2.0",
        "[checks.infiniband]\ninterval_s = 2.0",
        "[checks.xid]\ninterval_s = 2.0",
        "[checks.host]\ninterval_s = 5.0",
        "[checks.drift]\ninterval_s = 10.0",
        f"[checks.nccl]\nenabled = true\ninterval_s = 5.0\ncommand = {nccl_command}\nexpected_busbw_gbps = 300.0",
        # The daemon probes only in a maintenance window, and not while vLLM holds the GPUs: the played-back
        # output uses none, and the window is the whole day.
        'force = true\nmaintenance_windows = ["00:00-24:00"]',
    ]
    if node == "dgx-a":
        lines.append(
            f'[checks.vllm]\ninterval_s = 2.0\nbase_url = "{setup.vllm}"\npid_file = "{setup.tmp / "vllm.pid"}"\n'
            'served_model_name = "tiny"\nstartup_grace_s = 0\ncanary = "never"\nlatency_window_s = 30.0'
        )
    else:
        lines.append("[checks.vllm]\nenabled = false")
    path = setup.tmp / f"{node}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _start_agents(setup: Setup) -> list[str]:
    ports = {"dgx-a": _free_port(), "dgx-b": _free_port()}
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    targets = []
    for node, peer, tree in (("dgx-a", "dgx-b", "dgx_ndr_healthy.txt"), ("dgx-b", "dgx-a", "dgx_ndr_degraded.txt")):
        config = _agent_config(setup, node, ports[node], ports[peer], tree)
        setup.start(node, [sys.executable, "-m", "dgxdoctor", "run", "--config", str(config)], env)
        targets.append(f"127.0.0.1:{ports[node]}")
    return targets


def _rule_files(dest: Path) -> list[str]:
    dest.mkdir()
    files = []
    for entry in resources.files("dgxdoctor.alerts").iterdir():
        if entry.name.endswith((".rules.yml", ".rules.yaml")):
            path = dest / entry.name
            path.write_text(entry.read_text())
            files.append(str(path))
    assert files, "no shipped rule files"
    return files


def _start_prometheus(setup: Setup, agents: list[str]) -> None:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": _rule_files(setup.tmp / "rules"),
        "scrape_configs": [
            {"job_name": "dgxdoctor", "static_configs": [{"targets": agents}]},
            {
                "job_name": "vllm",
                "static_configs": [{"targets": [setup.vllm.removeprefix("http://")], "labels": {"node": "dgx-a"}}],
            },
        ],
    }
    path = setup.tmp / "prometheus.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    port = _free_port()
    prometheus = shutil.which("prometheus")
    assert prometheus
    argv = [prometheus, f"--config.file={path}", f"--storage.tsdb.path={setup.tmp / 'tsdb'}"]
    argv += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    setup.start("prometheus", argv)
    setup.prometheus = f"http://127.0.0.1:{port}"


class Traffic:
    """Grows the data counters of every rail in both sysfs trees (and one error counter on dgx-b) once a second, as
    NCCL traffic and a dirty link would: the throughput and error-rate panels then show real rates."""

    def __init__(self, sysfs: dict[str, Path]) -> None:
        self.files = [
            f
            for root in sysfs.values()
            for f in root.glob("class/infiniband/*/ports/*/counters/port_*_data")
            if f.is_file()
        ]
        self.errors = [
            f for f in sysfs["dgx-b"].glob("class/infiniband/*/ports/*/counters/symbol_error") if f.is_file()
        ]
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _bump(self, path: Path, by: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            path.write_text(f"{int(path.read_text()) + by}\n")

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for path in self.files:
                self._bump(path, 2_500_000_000)  # 10 GB/s in 4-byte words
            for path in self.errors[:1]:
                self._bump(path, 3)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


class Load:
    """``n`` clients sending chat completions one after another (``ignore_eos``: a known token count) until stopped."""

    def __init__(self, url: str, n: int) -> None:
        self._stop = threading.Event()
        self.status: list[int | str] = []
        counter = iter(range(1_000_000))

        def client() -> None:
            with httpx.Client(timeout=120) as http:
                while not self._stop.is_set():
                    # A distinct first word: identical prompts would share KV blocks (prefix caching).
                    body = {
                        "model": "tiny",
                        "messages": [{"role": "user", "content": f"{next(counter)} " + "fox " * 60}],
                        "max_tokens": 200,
                        "ignore_eos": True,
                    }
                    try:
                        self.status.append(http.post(f"{url}/v1/chat/completions", json=body).status_code)
                    except httpx.HTTPError as exc:
                        self.status.append(type(exc).__name__)

        self.threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(130)


def _kernel_lines() -> list[str]:
    """Real kernel log lines: an application XID 13, a fallen-off-the-bus XID 79, an NVSwitch SXID, and another XID 13
    of the same GPU (a counter that grows while Prometheus watches: a series' first sample is no increase)."""
    xid13s = [
        line
        for line in (FIXTURES / "kernel_log" / "gpud_pr46_dmesg_ctime.txt").read_text().splitlines()
        if re.search(r"Xid \(PCI:[^)]*\): 13,", line)
    ]
    # Two different lines of the same GPU: a line read twice is one event, not two.
    xid13, xid13_again = xid13s[0], next(line for line in xid13s if line != xid13s[0])
    xid79 = (FIXTURES / "kernel_log" / "dmesg_ctime_xid79_xid154_node_reboot.txt").read_text().splitlines()[0]
    sxid = (FIXTURES / "kernel_log" / "nvtrust_124_dmesg_sxid.txt").read_text().splitlines()[2]
    assert ": 79," in xid79 and "SXid" in sxid
    return [xid13, xid79, sxid, xid13_again]


def _has_series(answer: dict[str, Any]) -> bool:
    return answer.get("status") == "success" and bool(answer["data"]["result"])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    s = Setup(tmp_path_factory.mktemp("dashboards"))
    traffic = load = None
    try:
        _start_vllm(s)
        agents = _start_agents(s)
        _start_prometheus(s, agents)
        _wait(lambda: httpx.get(f"{s.prometheus}/-/ready", timeout=2).status_code == 200, 60, "Prometheus ready")
        _wait(lambda: httpx.get(f"{s.vllm}/health", timeout=2).status_code == 200, 240, "vLLM healthy")
        traffic = Traffic(s.sysfs)
        load = Load(s.vllm, n=8)
        # Data for every panel that can have it: a latency histogram observed over a rate window, the peers, a
        # rate of the IB counters, the NCCL probe.
        ready = [
            "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[15s]))) > 0",
            "count(dgxdoctor_peer_up == 1) == 2",
            "sum(dgxdoctor_ib_port_xmit_bytes_per_second) > 0",
            "sum(dgxdoctor_nccl_busbw_bytes_per_second) > 0",
        ]
        for expr in ready:
            _wait(lambda e=expr: _has_series(s.query(e)), 180, f"Prometheus to answer {expr}", interval=1.0)
        assert s.kmsg_b is not None
        for line in _kernel_lines():  # apart in time, so the XID counter grows while Prometheus watches
            with s.kmsg_b.open("a") as fh:
                fh.write(line + "\n")
            time.sleep(4)
        xids = 'sum(increase(dgxdoctor_xid_errors_total{node="dgx-b"}[15s])) > 0'
        _wait(lambda: _has_series(s.query(xids)), 60, "an XID increase in Prometheus", interval=1.0)
        yield s
    except BaseException:
        print(s.logs())
        raise
    finally:
        if load is not None:
            load.stop()
        if traffic is not None:
            traffic.stop()
        s.stop()


@dataclass
class Evaluation:
    answers: dict[str, dict[str, Any]]  # where -> Prometheus's answer
    names: dict[str, set[str]]  # where -> metric names the query selects
    produced: set[str]  # every name the scrapes and the loaded rules produce


# Both agents up at their last scrape and dgx-b's XID and SXID counters there: a scrape that failed under load (1 s
# timeout) marks every series of that agent stale until the next one, and an instant query then finds none.
FRESH = [
    'count(up{job="dgxdoctor"} == 1) == 2',
    'max(dgxdoctor_xid_errors_total{node="dgx-b"})',
    'max(dgxdoctor_nvswitch_sxid_errors_total{node="dgx-b"})',
]


def _freshly_scraped(setup: Setup) -> float:
    """A moment at which every ``FRESH`` query had a series: the dashboards are evaluated at that instant."""
    moment: list[float] = []

    def fresh() -> bool:
        at = time.time()
        if all(_has_series(setup.query(expr, at=at)) for expr in FRESH):
            moment.append(at)
            return True
        return False

    _wait(fresh, 60, f"both agents freshly scraped ({', '.join(FRESH)})", interval=1.0)
    return moment[0]


@pytest.fixture(scope="module")
def evaluation(setup: Setup) -> Evaluation:
    """Every dashboard query, substituted as Grafana sends it, answered by Prometheus (range queries as ranges)."""
    scraped = httpx.get(f"{setup.prometheus}/api/v1/label/__name__/values", timeout=30).json()["data"]
    groups = httpx.get(f"{setup.prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    recorded = {r["name"] for r in rules if r["type"] == "recording"}
    alerts = {"ALERTS"} if any(r["type"] == "alerting" for r in rules) else set()
    at = _freshly_scraped(setup)
    answers, names = {}, {}
    for queries in panels_with_queries().values():
        for q in queries:
            expr = substitute(q.expr, RATE_INTERVAL)
            answers[q.where] = setup.query(expr, instant=q.instant, at=at)
            names[q.where] = metric_names(expr)
    return Evaluation(answers, names, set(scraped) | recorded | alerts)


def test_every_query_parses_in_prometheus(evaluation: Evaluation) -> None:
    bad = {w: a.get("error") for w, a in evaluation.answers.items() if a.get("status") != "success"}
    assert not bad, bad


def _unproduced(evaluation: Evaluation, where: str) -> set[str]:
    names = evaluation.names[where]
    missing = names - evaluation.produced
    # An older vLLM generation's name is accepted beside its newer name, which this vLLM must produce.
    return {n for n in missing if not (n in OLDER_VLLM and OLDER_VLLM[n] in names & evaluation.produced)}


def test_every_query_names_only_metrics_that_are_produced(evaluation: Evaluation) -> None:
    """Names come from the real scrapes and the rules Prometheus loaded; a dgxdoctor metric this machine cannot
    produce (no GPU) must at least be one the build declares, on a panel listed with its reason."""
    from dgxdoctor.exporters.metricsdoc import all_specs

    declared = {spec.name for spec, _ in all_specs()}
    report = []
    for where, answer in evaluation.answers.items():
        missing = _unproduced(evaluation, where)
        panel = where.split(" / ")[1]
        later = {n for n in missing if n in NOT_IN_THIS_BUILD}
        no_data_here = {
            n for n in missing - later if n in declared and (panel in NO_DATA_HERE or panel in SOMETIMES_EMPTY)
        }
        unknown = missing - later - no_data_here
        assert not unknown, f"{where} names metrics nothing produces: {sorted(unknown)} in {answer}"
        if later:
            report.append(f"{where}: no series of {sorted(later)}: {[NOT_IN_THIS_BUILD[n] for n in later]}")
    print("\n".join(report))


def test_every_panel_returns_series_or_says_why_not(evaluation: Evaluation) -> None:
    lines, empty, stale = [], [], []
    for (board, panel), queries in panels_with_queries().items():
        series = sum(len(evaluation.answers[q.where]["data"]["result"]) for q in queries)
        later = set().union(*(_unproduced(evaluation, q.where) for q in queries)) & set(NOT_IN_THIS_BUILD)
        if series:
            lines.append(f"{board} / {panel}: {series} series")
            if panel in NO_DATA_HERE:
                stale.append(panel)
        elif later:
            lines.append(f"{board} / {panel}: no data: metric not produced by this build {sorted(later)}")
        elif panel in NO_DATA_HERE:
            lines.append(f"{board} / {panel}: no data: {NO_DATA_HERE[panel]}")
        elif panel in SOMETIMES_EMPTY:
            lines.append(f"{board} / {panel}: no data this time: {SOMETIMES_EMPTY[panel]}")
        else:
            empty.append(f"{board} / {panel}")
    print("\n".join(lines))
    assert not empty, f"panels without data on this setup and without a reason: {empty}"
    assert not stale, f"panels with data now: drop them from NO_DATA_HERE: {stale}"


def test_status_matrix_has_skipped_checks_apart_from_ok(setup: Setup) -> None:
    """The node x check matrix's real answer: the gpu check is SKIPPED here (-1), the peer comparison answers.

    Asked at a moment both agents were freshly scraped: a scrape that timed out under load leaves no series.
    """
    at = _freshly_scraped(setup)
    answer = setup.query('max by (node, check) (dgxdoctor_check_status{node=~".+"})', at=at)
    cells = {(r["metric"]["node"], r["metric"]["check"]): float(r["value"][1]) for r in answer["data"]["result"]}
    assert cells[("dgx-a", "gpu")] == -1 and cells[("dgx-b", "gpu")] == -1, cells
    assert ("dgx-a", "vllm") in cells and ("dgx-b", "peer_compare") in cells


def _legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legend: ``{{label}}`` replaced by the series' label; without a format, the labels themselves."""
    if fmt:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), fmt).strip()
    return " ".join(v for k, v in labels.items() if k not in ("job", "instance", "__name__"))


def _snapshot(board: str, evaluation: Evaluation) -> dict[str, Any]:
    doc = dashboards()[board]
    panels = []
    for panel in doc["panels"]:
        if panel["type"] == "row":
            panels.append({"title": panel["title"], "type": "row", "grid": panel["gridPos"], "series": []})
            continue
        series = []
        for target in panel["targets"]:
            answer = evaluation.answers[f"{board} / {panel['title']} / {target['refId']}"]
            for result in answer["data"]["result"]:
                points = result["values"] if "values" in result else [result["value"]]
                series.append(
                    {
                        "name": _legend(target.get("legendFormat", ""), result["metric"]),
                        "labels": result["metric"],
                        "t": [float(t) for t, _ in points],
                        "v": [float(v) for _, v in points],
                    }
                )
        unit = panel["fieldConfig"]["defaults"].get("unit", "none")
        note = NO_DATA_HERE.get(panel["title"]) or SOMETIMES_EMPTY.get(panel["title"], "")
        panels.append(
            {
                "title": panel["title"],
                "type": panel["type"],
                "unit": unit,
                "note": note,
                "grid": panel["gridPos"],
                "series": series,
            }
        )
    taken = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return {"title": doc["title"], "taken_at": taken, "panels": panels}


def test_overview_picture_from_prometheus_answers(evaluation: Evaluation, tmp_path: Path) -> None:
    """The overview drawn from the answers (docs/dashboards.md's picture: DGXDOCTOR_WRITE_DOCS=1 rewrites it)."""
    pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    from dgxdoctor.dashboards.render import draw

    for board, stem in (("dgxdoctor-overview.json", "overview"), ("dgxdoctor-serving.json", "serving")):
        snapshot = _snapshot(board, evaluation)
        out = tmp_path / f"{stem}.png"
        draw(snapshot, out)
        (tmp_path / f"{stem}-snapshot.json").write_text(json.dumps(snapshot))
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("DGXDOCTOR_WRITE_DOCS") == "1":
            shutil.copy(out, REPO / "docs" / "dashboards" / f"{stem}.png")
