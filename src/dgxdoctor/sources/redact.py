"""Secrets out of what dgxdoctor reports: a process's argv (vLLM's ``--api-key``), environment values and lines.

Command lines and environments are read from ``/proc`` and shown in findings, ``/state``, ``check --json`` and
the open ``/metrics``. A value is secret when its name says so: the name's words (split on ``-``, ``_`` and
``.``) include one of ``SECRET_WORDS`` (``--api-key``, ``--hf-token``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``);
``--tokenizer`` or ``--max-num-batched-tokens`` are not.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxdoctor.lazy_re import lazy_compile

REDACTED = "<redacted>"
SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "pass", "pwd", "credential", "credentials", "auth"}
)
# "--api-key", "HF_TOKEN", "aws.secret_access_key": the words of a flag or variable name.
NAME_SPLIT_RE = lazy_compile(r"[-_.]+")


def secret_name(name: str) -> bool:
    """Whether a flag or variable named ``name`` holds a secret (see the module docstring)."""
    return any(word in SECRET_WORDS for word in NAME_SPLIT_RE.split(name.lower()))


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """argv with the values of secret-named flags replaced: ``--api-key X`` and ``--api-key=X`` -> ``<redacted>``,
    also ``NAME=X`` arguments (an ``env HF_TOKEN=X vllm serve`` wrapper)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if eq and secret_name(name.lstrip("-")):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and not eq and secret_name(arg.lstrip("-")):
            out.append(arg)
            hide_next = True
        else:
            out.append(arg)
    return tuple(out)


def shown_argv(argv: Sequence[str], limit: int = 120) -> str:
    """A command line to quote in a finding: secrets redacted, cut at ``limit`` characters."""
    return " ".join(redact_argv(argv))[:limit]
