"""Secrets never enter a bundle: every text file passes through ``Redactor`` before it is written.

What is removed: the values this agent knows are secret (the daemon token, vLLM's API key, Ray's auth token),
``Authorization`` headers, ``KEY=value`` / ``"key": "value"`` pairs whose key names a secret (``HF_TOKEN``,
``AWS_SECRET_ACCESS_KEY``, ``*_PASSWORD``, ``api_key`` ...), secret-shaped command-line flags (``--api-key X``),
well-known token formats (Hugging Face ``hf_``, AWS ``AKIA``, GitHub ``ghp_``, OpenAI ``sk-``, PEM private keys)
and the password of ``scheme://user:password@host`` URLs. A value is replaced by ``<redacted>``; the key stays, so
a reader still sees that it was set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MARK = "<redacted>"
# Shorter "secrets" would redact ordinary words; the config requires 16 characters for the token anyway.
MIN_KNOWN_SECRET = 8

# Authorization: Bearer 3q2+7w==   /   authorization: Basic b3A6dG9rZW4=   (RFC 9110 credentials)
AUTH_HEADER = re.compile(r"(?i)(authorization\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+)[^\s\"',]+")
# HF_TOKEN=hf_abc   AWS_SECRET_ACCESS_KEY: x   "api_key": "x"   db_password = 'x'   (env files, TOML, JSON, YAML)
# The key must END with the secret word: "tokenizer" and "max_tokens" are not secrets.
SECRET_KEY = (
    r"[A-Za-z0-9_.-]*(?:token|secret|password|passwd|pwd|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|account[_-]?key|secret[_-]?key|credentials?|auth[_-]?key|session[_-]?key)"
)
KEY_VALUE = re.compile(
    rf"(?i)(?<![A-Za-z0-9])([\"']?{SECRET_KEY}[\"']?\s*[=:]\s*)(?!(?:null|true|false|none)\b)"
    rf"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;&}}\]]+)"
)
# vllm serve --api-key sk-x   ray start --redis-password=x   huggingface-cli login --token hf_x
FLAG = re.compile(r"(?i)(--(?:api-key|token|hf-token|password|redis-password|secret|auth-token)(?:=|\s+))(\S+)")
# postgres://admin:hunter2@db:5432/x   https://user:pw@proxy:3128   (RFC 3986 userinfo)
URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@\"']*:)([^\s@/\"']+)(@)")
# hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 (Hugging Face), AKIAIOSFODNN7EXAMPLE (AWS key id), ghp_... (GitHub),
# sk-... (OpenAI-style API keys), xoxb-... (Slack)
TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|(?:AKIA|ASIA)[A-Z0-9]{16}|gh[pousr]_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,})\b"
)
# -----BEGIN RSA PRIVATE KEY----- ... -----END RSA PRIVATE KEY----- (RFC 7468), GCP service account JSON keys too
PEM_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL)


def _keep_quotes(match: re.Match[str]) -> str:
    value = match.group(2)
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return f"{match.group(1)}{value[0]}{MARK}{value[0]}"
    return f"{match.group(1)}{MARK}"


class Redactor:
    def __init__(self, known: Iterable[str | None] = ()) -> None:
        # Longest first: a secret that contains another is removed whole.
        self.known = sorted({k for k in known if k and len(k) >= MIN_KNOWN_SECRET}, key=len, reverse=True)

    def text(self, text: str) -> str:
        for secret in self.known:
            text = text.replace(secret, MARK)
        text = PEM_KEY.sub(MARK, text)
        text = AUTH_HEADER.sub(lambda m: m.group(1) + MARK, text)
        text = FLAG.sub(lambda m: m.group(1) + MARK, text)
        text = URL_PASSWORD.sub(lambda m: m.group(1) + MARK + m.group(3), text)
        text = KEY_VALUE.sub(_keep_quotes, text)
        return TOKEN_SHAPES.sub(MARK, text)

    def data(self, raw: bytes) -> bytes:
        """Bytes as UTF-8 text (undecodable bytes replaced: a secret cannot hide behind one), redacted."""
        return self.text(raw.decode("utf-8", errors="replace")).encode("utf-8")
