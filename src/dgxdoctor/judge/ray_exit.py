"""Whether the GCS's report of a worker's exit is Ray's own teardown of an actor, not a worker that died.

When a driver kills an actor (``ray.kill``) or ends (its job finishes and the GCS destroys the actors it owns), the
GCS logs ``Destroying actor, force_kill=1`` for the actor, then reports the exit of the worker process that held it.
That report may say ``exit_type = SYSTEM_ERROR`` ("Worker exits unexpectedly by a signal ... The process receives
a SIGTERM": the raylet's SIGTERM raced the worker's own exit), which RAY_WORKER_DIED names. Seen over a healthy Ray
head in benchmarks/healthy_days.py (tests/fixtures/corpus/healthy/ray_2.60_gcs_actor_killed_job_finished.txt). A
worker that dies by itself is reported before any ``Destroying actor`` of its actor: that stays RAY_WORKER_DIED.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxdoctor.lazy_re import lazy_compile

# [2026-12-05 15:28:26,822 W 15295 15295] (gcs_server) gcs_worker_manager.cc:70: Reporting worker exit, worker id =
#   b272...c497, node id = c4ee...df70, address = 192.0.2.2, exit_type = SYSTEM_ERROR, exit_detail = ...
# [2026-12-05 15:28:26,823 W 15295 15295] (gcs_server) gcs_actor_manager.cc:1233: Worker b272...c497 on node
#   c4ee...df70 exits, type=SYSTEM_ERROR, has creation_task_exception = 0 worker_id=b272...c497
WORKER_EXIT = lazy_compile(
    r"Reporting worker exit, worker id = (?P<a>[0-9a-f]{16,64})|Worker (?P<b>[0-9a-f]{16,64}) on node \S{1,80} exits,"
)
# [2026-12-05 15:28:24,144 I 15295 15295] (gcs_server) gcs_actor_scheduler.cc:424: Submitting actor creation task to
#   worker. actor_id=ffab...0000 worker_id=b272...c497 node_id=c4ee...df70 job_id=0d000000
ACTOR_ON_WORKER = lazy_compile(r"actor_id=(?P<actor>[0-9a-f]{16,64}) worker_id=(?P<worker>[0-9a-f]{16,64})")
# [2026-12-05 15:28:26,759 I 15295 15295] (gcs_server) gcs_actor_manager.cc:1007: Destroying actor, force_kill=1,
#   timeout_ms=-1 job_id=0d000000 actor_id=ffab...0000
DESTROYING = lazy_compile(r"Destroying actor, force_kill=\d[^\n]{0,200}? actor_id=(?P<actor>[0-9a-f]{16,64})")
# The scanner's window holds this many lines before a match (judge.scan.LOOK_BACK).
LOOK_BACK = 400


def requested_exit_before(lines: Sequence[str], index: int) -> bool:
    """True when ``lines[index]`` reports a worker's exit and the lines before it show the GCS destroying the actor
    that worker held (the actor placed on it, then ``Destroying actor`` for that actor)."""
    found = WORKER_EXIT.search(lines[index])
    if found is None:
        return False
    worker = found["a"] or found["b"]
    text = "\n".join(lines[max(0, index - LOOK_BACK) : index])
    if "Destroying actor" not in text or worker not in text:
        return False
    held = {m["actor"] for m in ACTOR_ON_WORKER.finditer(text) if m["worker"] == worker}
    return any(m["actor"] in held for m in DESTROYING.finditer(text))
