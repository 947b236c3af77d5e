"""Whether an "engine dead" line is the echo of an intended stop, not a failure.

vLLM 0.32 stopped by SIGINT or SIGTERM (``systemctl stop``, Ctrl-C) logs its shutdown steps, then the API server's
output handler reports ``EngineDeadError`` for the engine it has just stopped (captured on the CPU test machine:
tests/fixtures/corpus/healthy/captured_vllm_0.32_cpu_start_serve_stop.txt). A paste of a whole log that ends
with a clean stop must not read as an engine that died.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxdoctor.lazy_re import lazy_compile

# (EngineCore pid=16702) INFO 11-30 16:11:51 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGINT
# (APIServer pid=16074) INFO 11-30 16:11:51 [launcher.py:254] [shutdown] API server: shutdown triggered
SHUTDOWN_STARTED = lazy_compile(
    r"\[shutdown\] (?:EngineCore: trigger received signal=SIG(?:INT|TERM)|API server: shutdown)"
)
LOOK_BACK = 60


def intended_stop_before(lines: Sequence[str], index: int) -> bool:
    """True when a requested shutdown began in the ``LOOK_BACK`` lines before ``lines[index]``: one search of the
    lines joined (the pattern is literal text, which never spans a line break), not one a line."""
    text = "\n".join(lines[max(0, index - LOOK_BACK) : index])
    return "[shutdown] " in text and SHUTDOWN_STARTED.search(text) is not None
