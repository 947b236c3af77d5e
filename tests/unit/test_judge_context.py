"""The lines around a match decide its reading: OOM at start-up or while serving; an engine stopped on purpose."""

from __future__ import annotations

import pytest

from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.judge.oom import oom_phase
from dgxdoctor.judge.shutdown import intended_stop_before

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB."


@pytest.mark.parametrize(
    ("before", "after", "phase"),
    [
        # vllm-project/vllm#7854: the V0 memory profiling calls execute_model; the nearer frame is profile_run
        (
            ['  File "vllm/worker/model_runner.py", line 940, in profile_run', "    self.execute_model(...)"],
            [],
            "startup",
        ),
        # vllm-project/vllm#13252: requests were served
        (['INFO:172.16.18.69:52036- "POST /v1/chat/completions HTTP/1.1" 200 OK'], [], "serving"),
        # a whole log: loaded, then served, then the OOM
        (["INFO Loading model weights took 15.2 GB", "INFO Avg prompt throughput: 1.0 tokens/s"], [], "serving"),
        # vllm-project/vllm#14095: the worker's "while processing method load_model" follows the error
        ([], ["ERROR Exception in worker VllmWorkerProcess while processing method load_model."], "startup"),
        ([], [], None),
    ],
)
def test_oom_phase(before: list[str], after: list[str], phase: str | None) -> None:
    lines = [*before, OOM, *after]
    assert oom_phase(lines, len(before)) == phase


def test_warming_up_names_startup_though_it_speaks_of_requests() -> None:
    line = "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests."
    assert oom_phase([line], 0) == "startup"


def test_engine_dead_after_a_requested_shutdown_is_no_finding() -> None:
    stop = (
        "(EngineCore pid=16702) INFO 11-30 16:11:51 [core.py:1454] [shutdown] EngineCore: trigger received "
        "signal=SIGINT"
    )
    dead = "(APIServer pid=16074) ERROR 11-30 16:11:51 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: x"
    assert intended_stop_before([stop, dead], 1)
    assert not intended_stop_before([dead], 0)
    (alone,) = diagnose(dead + "\n")
    assert [f.code for f in alone.findings] == ["VLLM_ENGINE_DEAD"]
    (stopped,) = diagnose(stop + "\n" + dead + "\n")
    assert stopped.findings == ()
