"""``mlxlink -d <dev> -p <port> -m -c`` (NVIDIA MFT): a port's module temperature and effective BER.

The tool prints sections of ``Key : Value`` lines (MFT's mlxlink utility documentation; the layout as in the
"Using mlxlink to inspect the status of NVIDIA CX-6 NIC and optical modules" walk-through)::

    Operational Info
    ----------------
    State                           : Active
    Speed                           : IB-NDR
    Physical Counters and BER Info
    ------------------------------
    Effective Physical Errors       : 0
    Effective Physical BER          : 15E-255
    Raw Physical BER                : 3E-10
    Module Info
    -----------
    Temperature [C]                 : 45 [-5..75]

``15E-255`` is mlxlink's way of writing "no error seen" (the smallest value it prints). A field it could not read
is ``N/A``: absent here, never zero.
"""

from __future__ import annotations

import re

from msgspec import Struct

from dgxdoctor.lazy_re import lazy_compile

# Effective Physical BER          : 15E-255
EFFECTIVE_BER_RE = lazy_compile(
    r"^\s*Effective Physical BER\s*:\s*(?P<mant>\d{1,4}(?:\.\d{1,6})?)E(?P<exp>[-+]?\d{1,4})\s*$", re.M
)
# Temperature [C]                 : 45 [-5..75]        (the module's; the ASIC's is under "Device Info")
MODULE_TEMP_RE = lazy_compile(r"^\s*Temperature \[C\]\s*:\s*(?P<temp>-?\d{1,4}(?:\.\d{1,3})?)\b", re.M)
SECTION_RE = lazy_compile(r"^(?P<name>[A-Z][A-Za-z ]{2,60}?)\s*\n-{4,}\s*$", re.M)


class MlxlinkFormatError(ValueError):
    """Output without any section mlxlink prints."""


class MlxlinkPort(Struct, frozen=True):
    effective_ber: float | None
    module_temperature_c: float | None


def parse_mlxlink(text: str) -> MlxlinkPort:
    if SECTION_RE.search(text) is None:
        raise MlxlinkFormatError(f"not mlxlink output (no 'Section' over '----'): {text.strip()[:120]!r}")
    module = text[text.find("Module Info") :] if "Module Info" in text else ""
    ber = EFFECTIVE_BER_RE.search(text)
    temp = MODULE_TEMP_RE.search(module)
    return MlxlinkPort(
        effective_ber=float(f"{ber['mant']}e{ber['exp']}") if ber else None,
        module_temperature_c=float(temp["temp"]) if temp else None,
    )
