"""Whether an error line is the echo of an intended stop, not a failure.

vLLM 0.32 stopped by SIGINT or SIGTERM (``systemctl stop``, Ctrl-C) logs its shutdown steps, then the API server's
output handler reports ``EngineDeadError`` for the engine it has just stopped (captured on the CPU test machine:
tests/fixtures/corpus/healthy/captured_vllm_0.32_cpu_start_serve_stop.txt). Ray 2.60's raylet stopped by SIGTERM
(``ray stop``, ``systemctl stop``) logs ``received SIGTERM`` and its graceful shutdown, then, at ERROR, that it
"exited immediately because one Ray agent failed" when its dashboard agent ends with it, exit code 0
(tests/fixtures/corpus/healthy/ray_2.60_raylet_sigterm_stop.txt, from benchmarks/healthy_days.py). A paste of a whole
log that ends with a clean stop must read neither as an engine that died nor as a failure nobody catalogued.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxdoctor.lazy_re import lazy_compile

# (EngineCore pid=16702) INFO 11-30 16:11:51 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGINT
# (APIServer pid=16074) INFO 11-30 16:11:51 [launcher.py:254] [shutdown] API server: shutdown triggered
# [2026-12-05 16:35:33,431 I 15610 15610] (raylet) main.cc:1174: received SIGTERM. Existing local drain request = None
# [2026-12-05 16:35:33,431 I 15610 15610] (raylet) main.cc:481: Raylet graceful shutdown triggered with death info:
#   reason: EXPECTED_TERMINATION
SHUTDOWN_STARTED = lazy_compile(
    r"\[shutdown\] (?:EngineCore: trigger received signal=SIG(?:INT|TERM)|API server: shutdown)"
    r"|\(raylet\) main\.cc:\d+: (?:received SIGTERM\.|Raylet graceful shutdown triggered with death info: reason: "
    r"EXPECTED_TERMINATION)"
)
# Words every line the pattern matches holds: most windows cost two substring tests.
_HINTS = ("[shutdown] ", "(raylet) main.cc:")
LOOK_BACK = 60


def intended_stop_before(lines: Sequence[str], index: int) -> bool:
    """True when a requested shutdown began in the ``LOOK_BACK`` lines before ``lines[index]``: one search of the
    lines joined (the pattern is literal text, which never spans a line break), not one a line."""
    text = "\n".join(lines[max(0, index - LOOK_BACK) : index])
    return any(hint in text for hint in _HINTS) and SHUTDOWN_STARTED.search(text) is not None
