"""Secrets never enter a bundle: every text file passes through ``Redactor`` before it is written.

This is the deny list, for free text (log tails, ``ray status``, the kernel log, the documents): what has no names
to go by. Process environments and command lines are redacted by construction before they get here (an allow list
of harmless names, ``sources/redact.py``), and then pass through this too.

What is removed: the values this agent knows are secret (the daemon token, vLLM's API key, Ray's auth token),
``Authorization`` headers, ``KEY=value`` / ``"key": "value"`` pairs whose key names a secret (``redact.secret_name``:
``HF_TOKEN``, ``OPENAI_KEY``, ``NCCL_SECRET_X``, ``DB_PASSWORD_FILE``, ``api_key`` ...), the value of a
secret-named flag (``--api-key X``, ``--api_key X``, ``--hf_token=X``), well-known token formats (Hugging Face
``hf_``, AWS ``AKIA``, GitHub ``ghp_``, OpenAI ``sk-``, PEM private keys) and the password of
``scheme://user:password@host`` URLs (up to the last ``@``: ``postgres://u:pa/ss@h``; a user part standing alone,
``https://TOKEN@host``, is the credential). A value is replaced by
``<redacted>``; the key stays, so a reader still sees that it was set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from dgxdoctor.sources.redact import secret_name, without_url_credentials

MARK = "<redacted>"
# Shorter "secrets" would redact ordinary words; the config requires 16 characters for the token anyway.
MIN_KNOWN_SECRET = 8

# Authorization: Bearer 3q2+7w==   /   authorization: Basic b3A6dG9rZW4=   (RFC 9110 credentials)
AUTH_HEADER = re.compile(r"(?i)(authorization\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+)[^\s\"',]+")
# HF_TOKEN=hf_abc   OPENAI_KEY: x   "api_key": "x"   db_password = 'x'   (env files, TOML, JSON, YAML): every
# name and separator is looked at, its value replaced when the name is secret (redact.secret_name: "tokenizer" and
# "max_tokens" are not). Only the name is matched, never its value: "env: HF_TOKEN=x" must find HF_TOKEN too.
NAME_SEP = re.compile(r"(?<![A-Za-z0-9_.-])([\"']?)([A-Za-z_][A-Za-z0-9_.-]*)\1\s*[=:]\s*")
VALUE = re.compile(r"(?i)(?!(?:null|true|false|none)\b)(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;&}\]]+)")
# A bare "key" is the field name of dgxdoctor's own documents (the compared metric), not a credential.
NOT_SECRET_KEYS = frozenset({"key"})
# vllm serve --api-key sk-x   --api_key x   ray start --redis-password=x   huggingface-cli login --token hf_x
FLAG = re.compile(r"(?<![A-Za-z0-9_-])(--?([A-Za-z][A-Za-z0-9_-]*)(?:=|[ \t]+))(?!-)(\S+)")
# hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 (Hugging Face), AKIAIOSFODNN7EXAMPLE (AWS key id), ghp_... (GitHub),
# sk-... (OpenAI-style API keys), xoxb-... (Slack)
TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|(?:AKIA|ASIA)[A-Z0-9]{16}|gh[pousr]_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,})\b"
)
# -----BEGIN RSA PRIVATE KEY----- ... -----END RSA PRIVATE KEY----- (RFC 7468), GCP service account JSON keys too
PEM_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL)


def _key_values(text: str) -> str:
    out: list[str] = []
    pos = 0
    for m in NAME_SEP.finditer(text):
        name = m.group(2)
        if m.start() < pos or name.lower() in NOT_SECRET_KEYS or not secret_name(name):
            continue
        value = VALUE.match(text, m.end())
        if value is None:
            continue
        v = value.group(1)
        quoted = len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'"
        out += [text[pos : m.end()], f"{v[0]}{MARK}{v[0]}" if quoted else MARK]
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def _flag(match: re.Match[str]) -> str:
    return match.group(1) + MARK if secret_name(match.group(2)) else match.group(0)


class Redactor:
    def __init__(self, known: Iterable[str | None] = ()) -> None:
        # Longest first: a secret that contains another is removed whole.
        self.known = sorted({k for k in known if k and len(k) >= MIN_KNOWN_SECRET}, key=len, reverse=True)

    def text(self, text: str) -> str:
        for secret in self.known:
            text = text.replace(secret, MARK)
        text = PEM_KEY.sub(MARK, text)
        text = AUTH_HEADER.sub(lambda m: m.group(1) + MARK, text)
        text = FLAG.sub(_flag, text)
        text = without_url_credentials(text)  # postgres://u:pa/ss@h -> postgres://u:<redacted>@h
        text = _key_values(text)
        return TOKEN_SHAPES.sub(MARK, text)

    def data(self, raw: bytes) -> bytes:
        """Bytes as UTF-8 text (undecodable bytes replaced: a secret cannot hide behind one), redacted."""
        return self.text(raw.decode("utf-8", errors="replace")).encode("utf-8")
