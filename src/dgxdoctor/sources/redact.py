"""Secrets out of what dgxdoctor reports: a process's argv (vLLM's ``--api-key``), environment values and lines.

Command lines and environments are read from ``/proc`` and shown in findings, ``/state``, ``check --json``, the
open ``/metrics`` and the bundle. Two rules, for two kinds of text:

- Names, by construction (``shown_value``, ``allowed_argv``, ``shown_argv``): an environment value or a flag's
  value is shown only when its name is on an allow list of known-harmless names (``sources/allowlist.py``; vLLM's
  flags from vLLM's own argument parser, ``sources/vllm_flags.py``); every other value is replaced. A kept value
  still loses the credentials of any URL in it (``postgres://u:pa/ss@h`` -> ``postgres://u:<redacted>@h``).
- A name that looks secret is never allowed, whatever the lists say: its words (split on ``-``, ``_`` and ``.``)
  include one of ``SECRET_WORDS`` (``--api-key``, ``--api_key``, ``--hf_token``, ``OPENAI_KEY``,
  ``NCCL_SECRET_X``, ``DB_PASSWORD_FILE``), or it contains one of ``SECRET_PARTS`` (``--hfsecret``,
  ``apikey``). ``--tokenizer`` or ``--max-num-batched-tokens`` are not secret-named.

Free text (log tails, ``ray status``) has no names to go by: the bundle's deny list of secret shapes
(``bundle/redact.py``) covers it, and uses ``secret_name`` for ``NAME=value`` and ``--flag value`` pairs.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence

from dgxdoctor.lazy_re import lazy_compile

REDACTED = "<redacted>"
SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "pass", "pwd", "credential", "credentials", "auth"}
)
# Secret words run together with another word: "hftoken", "OPENAIAPIKEY", "dbpassword".
SECRET_PARTS = ("secret", "passw", "credential", "apikey", "privatekey", "accesskey", "authtoken", "hftoken")
# "--api-key", "HF_TOKEN", "aws.secret_access_key": the words of a flag or variable name.
NAME_SPLIT_RE = lazy_compile(r"[-_.]+")
# A word with "://" in it (a URL, or several run together), found only from a word's start: linear in the text.
URL_WORD_RE = lazy_compile(r"(?<![^\s\"'])[^\s\"']*://[^\s\"']*")
# An environment variable's name (NAME=value arguments of `env NAME=value vllm serve`).
ENV_NAME_RE = lazy_compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A negative number is a value, not a flag ("--seed -1").
NUMBER_RE = lazy_compile(r"^-\d")
DIGEST_HEX = 8
MAX_CACHED_NAME = 64
DIGEST_RE = lazy_compile(r"^sha256:[0-9a-f]{8}$")


def secret_name(name: str) -> bool:
    """Whether a flag or variable named ``name`` holds a secret (see the module docstring)."""
    # The deny list asks for every name=value of a log tail: the usual short names are remembered.
    return _secret_name(name) if len(name) <= MAX_CACHED_NAME else _is_secret_name(name)


@functools.lru_cache(maxsize=4096)
def _secret_name(name: str) -> bool:
    return _is_secret_name(name)


def _is_secret_name(name: str) -> bool:
    low = name.lower()
    return any(word in SECRET_WORDS for word in NAME_SPLIT_RE.split(low)) or any(p in low for p in SECRET_PARTS)


def digest(value: str) -> str:
    """``sha256:1a2b3c4d``: enough to see that two nodes' values differ, not the value."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]


def without_url_credentials(text: str) -> str:
    """Every URL's credentials replaced (RFC 3986 userinfo, and what people write anyway). After the first
    ``://`` of a word: ``user:password@`` loses the password, which runs to the last ``@`` of the word (a password
    with ``/`` or ``@`` in it, not allowed unencoded, is removed whole: ``postgres://u:pa/ss@h`` ->
    ``postgres://u:<redacted>@h``); a user part that stands alone is the credential (``https://TOKEN@github.com``).
    Done per word, without backtracking: a long line of ``a://x:`` costs what its length does."""
    if "://" not in text:
        return text
    return URL_WORD_RE.sub(lambda m: _word_without_credentials(m.group(0)), text)


def _word_without_credentials(word: str) -> str:
    start = word.index("://") + 3
    rest = word[start:]
    user_end = next((i for i, c in enumerate(rest) if c in "/@:"), len(rest))
    if user_end < len(rest) and rest[user_end] == ":":
        at = rest.rfind("@")
        if at > user_end + 1:
            return f"{word[:start]}{rest[: user_end + 1]}{REDACTED}{rest[at:]}"
    elif user_end < len(rest) and rest[user_end] == "@" and user_end > 0:
        return f"{word[:start]}{REDACTED}{rest[user_end:]}"
    return word


def shown_value(name: str, value: str, allowed: Callable[[str], bool]) -> str:
    """``value`` (URL credentials removed) when ``name`` is allowed and not secret-named, else ``<redacted>``."""
    if allowed(name) and not secret_name(name):
        return without_url_credentials(value)
    return REDACTED


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """argv with the values of secret-named flags replaced: ``--api-key X`` and ``--api-key=X`` -> ``<redacted>``,
    also ``NAME=X`` arguments (an ``env HF_TOKEN=X vllm serve`` wrapper) and URL credentials. Deny rules only: for
    a command whose every other value matters (the bench baseline's ``vllm bench serve`` line); findings and the
    bundle show argv through ``allowed_argv``."""
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
            out.append(without_url_credentials(arg))
    return tuple(out)


def shown_argv(argv: Sequence[str], limit: int = 120) -> str:
    """A command line to quote in a finding, cut at ``limit`` characters: flag values by ``allowed_argv`` with the
    shipped list of vLLM's flags (a check does not start vLLM's parser), the interpreter's and Ray's."""
    from dgxdoctor.sources.allowlist import OTHER_FLAGS, env_allowed
    from dgxdoctor.sources.vllm_flags import shipped_flags

    return " ".join(allowed_argv(argv, {**OTHER_FLAGS, **shipped_flags()}, env_allowed))[:limit]


def flag_key(flag: str) -> str:
    """The name a parser knows a flag by: vLLM's FlexibleArgumentParser (and Ray's C++ flags) accept ``_`` for
    ``-`` after the leading dashes: ``--api_key`` is ``--api-key``."""
    dashes = len(flag) - len(flag.lstrip("-"))
    return flag[:dashes] + flag[dashes:].replace("_", "-")


def _is_flag(arg: str) -> bool:
    return arg.startswith("-") and arg != "-" and not NUMBER_RE.match(arg)


def allowed_argv(argv: Sequence[str], flags: Mapping[str, bool], env_allowed: Callable[[str], bool]) -> list[str]:
    """argv with every flag value replaced unless the flag is in ``flags`` (flag -> whether it takes a value) and
    not secret-named; ``NAME=value`` words by ``env_allowed``; other words (the program, a subcommand, the model
    path) kept without URL credentials. A flag that is not known is taken to own the word after it."""
    out = [without_url_credentials(argv[0])] if argv else []
    i = 1
    while i < len(argv):
        arg = argv[i]
        i += 1
        if _is_flag(arg):
            name, eq, value = arg.partition("=")
            key = flag_key(name)
            keep = key in flags and not secret_name(name)
            if eq:
                out.append(f"{name}={without_url_credentials(value) if keep else REDACTED}")
                continue
            out.append(arg)
            if flags.get(key) is not False and i < len(argv) and not _is_flag(argv[i]):
                out.append(without_url_credentials(argv[i]) if keep else REDACTED)
                i += 1
            continue
        name, eq, value = arg.partition("=")
        if eq and ENV_NAME_RE.match(name):
            out.append(f"{name}={shown_value(name, value, env_allowed)}")
        else:
            out.append(without_url_credentials(arg))
    return out
