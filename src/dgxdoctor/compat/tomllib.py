"""``tomllib`` (3.11+), else its backport ``tomli`` (the same parser, a conditional dependency on 3.10)."""

import sys

if sys.version_info >= (3, 11):
    from tomllib import TOMLDecodeError, loads
else:
    from tomli import TOMLDecodeError, loads

__all__ = ["TOMLDecodeError", "loads"]
