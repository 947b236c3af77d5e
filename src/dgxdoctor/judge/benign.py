"""Lines that look like a plain failure and are none (judge/uncatalogued.py reads a kernel record at err or above,
an ERROR record of vLLM, as a failure nobody catalogued): kernel records a healthy GPU node logs at ``err`` priority,
and the ERROR records a healthy server logs for a client's mistake. Each entry says why it is benign and where it
was seen (benchmarks/healthy_days.py finds them over hours of real healthy logs); a line is benign only when an
entry's pattern matches its message.

The uncatalogued pass stays whole: an entry names one message, never a family or a level.
"""

from __future__ import annotations

from msgspec import Struct

from dgxdoctor.lazy_re import LazyPattern, lazy_compile


class Benign(Struct, frozen=True):
    name: str
    hint: str  # words every line of the message holds: most lines cost one substring test per entry
    pattern: LazyPattern
    reason: str
    seen: str


KNOWN_BENIGN: tuple[Benign, ...] = (
    Benign(
        "nvrm_loading_banner",
        "NVRM: loading",
        # 3,355,437110,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)
        # [    3.45] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023
        lazy_compile(r"\bNVRM: loading NVIDIA UNIX (?:Open Kernel Module for \w{1,16}|\w{1,16} Kernel Module)\b"),
        "the driver's banner as its module loads: nv.c prints it with NV_DBG_ERRORS so that it always shows, and "
        "the 580 drivers log it at err priority (3) on every healthy boot",
        "tests/fixtures/kernel_log/kmsg_records_h200_580.txt (the H200 test machine's /dev/kmsg, driver 580.159.04); "
        "lookalikes.txt (driver 570.158.01)",
    ),
    Benign(
        "vllm_unknown_model",
        "Error with model ",
        # (APIServer pid=15597) ERROR 12-05 15:10:47 [serving.py:274] Error with model error=ErrorInfo(message='The
        # model `tiny-v2` does not exist. Valid aliases: tiny.', type='NotFoundError', param='model', code=404)
        # ERROR 08-13 16:59:20 [serving_chat.py:140] Error with model object='error' message='The model
        # `meta-llama/Meta-Llama-3-8B-Instruct` does not exist.' type='NotFoundError' param=None code=404
        #                  (vLLM 0.10's ErrorResponse, a vLLM bug report on run_batch: code index id 56716070429)
        lazy_compile(r"\] Error with model .{0,2000}\bcode=4\d\d\)?\s*$"),
        "vLLM's OpenAI-compatible server logs at ERROR each request naming a model it does not serve, then answers it "
        "404 (serving.py `_check_model`: NotFoundError; a LoRA resolver's refusal is a 400): the client's mistake, "
        "the server is fine. A 5xx in the same words still surfaces",
        "benchmarks/healthy_days.py: a healthy vLLM 0.32 CPU server under the client mix of "
        "benchmarks/serve_for_hours.py (requests for `llama-70b`, `gpt-4`, `tiny-v2`), 2026-12-05",
    ),
)


def known_benign(line: str) -> Benign | None:
    """The entry that names ``line`` as benign, or None."""
    return next(
        (entry for entry in KNOWN_BENIGN if entry.hint in line and entry.pattern.search(line) is not None), None
    )
