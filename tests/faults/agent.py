"""``dgxdoctor run`` for the fault matrix, with the NVML seam filled: the H200 capture (tests/fixtures/nvml), whose
every read blocks while the file named by ``DGXDOCTOR_NVML_HANG`` exists, as NVML does when a GPU falls off the bus.
``DGXDOCTOR_NVML_UTIL`` (a percent) sets every GPU's utilisation (a rank spinning in a collective, or one stopped).

Usage: ``python agent.py CONFIG`` with ``tests`` and this checkout's ``src`` on PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from dgxdoctor.config import load_config
from dgxdoctor.daemon import logconfig
from dgxdoctor.daemon.service import Daemon
from fake_nvml import FakeNvml, load_capture

HANG = Path(os.environ.get("DGXDOCTOR_NVML_HANG", "/nonexistent"))
CAPTURE = load_capture("h200-2gpu-580.159.04.json")
if "DGXDOCTOR_NVML_UTIL" in os.environ:
    for _gpu in CAPTURE["gpus"]:
        _gpu["utilization_gpu_percent"] = int(os.environ["DGXDOCTOR_NVML_UTIL"])


class SwitchedNvml(FakeNvml):
    def _value(self, value: Any) -> Any:
        while HANG.exists():  # a hung driver call: returns only once the fault is lifted
            time.sleep(0.1)
        return super()._value(value)


def main(config_path: Path) -> None:
    config = load_config(config_path)
    logconfig.configure(config.daemon.log_level)
    daemon = Daemon(config, config_path)
    daemon.env = replace(daemon.env, nvml_factory=lambda: SwitchedNvml(CAPTURE))
    loop = asyncio.new_event_loop()
    code = loop.run_until_complete(daemon.serve())
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
