"""Whether a CUDA out-of-memory happened while vLLM was starting or while it was serving.

The same ``CUDA out of memory`` line has opposite remedies: at start-up (loading weights, profiling, warming up,
capturing CUDA graphs) the model does not fit with these settings (lower the memory utilisation or raise TP); after
a normal start, activations grew with the concurrency (lower --max-num-seqs). The lines around it say which: the
nearest start-up or serving marker, looking first at the line itself, then back, then forward (a worker's
"while processing method load_model" or "EngineCore failed to start" follows the error).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from dgxdoctor.lazy_re import lazy_compile

Phase = Literal["startup", "serving"]

# Traceback frames and log lines printed only while vLLM starts (V0 and V1 names), e.g.
#   File ".../vllm/worker/worker.py", line 179, in determine_num_available_blocks       (vllm-project/vllm#7854)
#   INFO 10-23 19:55:16 model_runner.py:1067] Loading model weights took 19.8557 GB     (vllm-project/vllm#9630)
#   (VllmWorkerProcess pid=195297) ERROR ... Exception in worker VllmWorkerProcess while processing method load_model.
STARTUP_MARKERS = lazy_compile(
    r"\b(?:load_model|load_weights|_initialize_model|profile_run|_dummy_run|_dummy_sampler_run"
    r"|determine_num_available_blocks|determine_available_memory|initialize_cache|_initialize_kv_caches"
    r"|capture_model|init_device|compile_or_warm_up_model|load_single_module)\b"
    r"|Loading (?:model )?weights|Initializing an? (?:V\d )?LLM engine|Starting profile run|Memory profiling"
    r"|warming up|Capturing (?:CUDA graphs?|cudagraphs?)|Engine core initialization failed|failed to start"
)
# Lines printed only once vLLM serves: request logs, throughput lines, the engine loop's frames, e.g.
#   INFO 02-14 08:44:26 engine.py:275] Added request chatcmpl-4fb99a59-...                (vllm-project/vllm#13252)
#   (EngineCore pid=104)   File ".../vllm/v1/engine/core.py", line 1170, in run_busy_loop   (noonghunna/club-3090#58)
SERVING_MARKERS = lazy_compile(
    r"Avg prompt throughput|\"POST /v1/|Application startup complete|Uvicorn running on|Received request"
    r"|Added request|serving_chat|serving_completion|\[serving\.py|\brun_engine_loop\b|\bengine_step\b"
    r"|\bstep_async\b|\b_process_request\b|\brun_asgi\b|\brun_busy_loop\b|\b_process_engine_step\b"
    r"|\bstart_worker_execution_loop\b|\bexecute_model_async\b|Background loop|Engine loop is not running"
    r"|(?i:while (?:serving|inference)|inference requests|running multi requests|concurrent requests)"
)
LOOK_BACK = 400
LOOK_AHEAD = 50


def _marker(line: str) -> Phase | None:
    # Start-up wins on one line: "warming up sampler with 1024 dummy requests" names requests too.
    if STARTUP_MARKERS.search(line):
        return "startup"
    if SERVING_MARKERS.search(line):
        return "serving"
    return None


def oom_phase(lines: Sequence[str], index: int) -> Phase | None:
    """The phase of the out-of-memory at ``lines[index]``; None when nothing around it says."""
    own = _marker(lines[index])
    if own is not None:
        return own
    for line in reversed(lines[max(0, index - LOOK_BACK) : index]):
        found = _marker(line)
        if found is not None:
            return found
    for line in lines[index + 1 : index + 1 + LOOK_AHEAD]:
        found = _marker(line)
        if found is not None:
            return found
    return None
