"""Every check's settings are typed by the check base (``Check[SettingsModel]``): one ``__init__`` takes them, no
check re-narrows them or keeps a second alias, and nobody reads them with ``getattr`` defaults that drift from the
model. The layers that need only a settings table (remediation) import it without loading every check."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import get_args

import pytest

from conftest import fresh_python
from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.config import parse_config

SRC = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"
CHECKS = SRC / "checks"

# What the untyped protocol needed in every check, and readers outside it: each a drifting second home.
UNTYPED = {
    "own_settings(": "narrows its settings itself (the base's __init__ does)",
    "self.settings: CheckSettings": "types its settings as the base model",
    "settings_model: ClassVar": "declares its model twice (the type argument of Check[...] is the one)",
    "self.cfg": "keeps a second name for its settings",
    "self._cfg": "keeps a second name for its settings",
    "self._settings": "keeps a second name for its settings",
}
GETATTR_SETTINGS = re.compile(r"getattr\((self\.settings|settings|[\w.]*check_settings\()")


def test_no_check_narrows_or_aliases_its_settings() -> None:
    found = [
        f"{path.name}: {why} ({marker})"
        for path in sorted(CHECKS.glob("*.py"))
        if path.name != "base.py"
        for marker, why in UNTYPED.items()
        if marker in path.read_text(encoding="utf-8")
    ]
    assert found == []


def test_no_type_ignore_in_checks_or_the_config_accessors() -> None:
    files = [*sorted(CHECKS.glob("*.py")), SRC / "config.py"]
    found = [
        f"{p.name}:{n}" for p in files for n, line in enumerate(p.read_text().splitlines(), 1) if "ignore[" in line
    ]
    assert found == []


def test_nobody_reads_check_settings_with_getattr_defaults() -> None:
    """``config.settings_of(name, Model)`` is the typed read; diagnose's analyzers take typed thresholds."""
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if GETATTR_SETTINGS.search(line)
    ]
    assert found == []


def _init_of(cls: type) -> ast.FunctionDef | None:
    tree = ast.parse(Path(sys.modules[cls.__module__].__file__ or "").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return item
    return None


@pytest.mark.parametrize("factory", ALL_CHECKS, ids=lambda f: f.name)
def test_a_check_with_state_of_its_own_calls_the_base_init_first(factory: type[Check]) -> None:
    init = _init_of(factory)
    if init is None:
        return  # the base's __init__ is all it needs
    first = ast.unparse(init.body[0])
    assert first == "super().__init__(settings, env)", f"{factory.__name__}.__init__ starts with {first!r}"


@pytest.mark.parametrize("factory", ALL_CHECKS, ids=lambda f: f.name)
def test_each_check_is_generic_in_its_declared_model(factory: type[Check], tmp_path: Path) -> None:
    declared = [get_args(base)[0] for base in getattr(factory, "__orig_bases__", ()) if get_args(base)]
    assert declared == [factory.settings_model], f"{factory.__name__} should subclass Check[<its settings model>]"
    assert issubclass(factory.settings_model, CheckSettings) and factory.settings_model is not CheckSettings
    config = parse_config({"paths": {"state_dir": str(tmp_path)}})
    check = factory(config.check_settings(factory.name), config.environment())
    assert type(check.settings) is factory.settings_model
    assert check.env.state_dir == tmp_path


def test_a_table_of_the_wrong_check_is_refused() -> None:
    gpu, nccl = (f for f in ALL_CHECKS if f.name == "gpu"), (f for f in ALL_CHECKS if f.name == "nccl")
    config = parse_config({})
    with pytest.raises(TypeError, match="gpu check needs GpuSettings, got NcclSettings"):
        next(gpu)(config.check_settings("nccl"), config.environment())
    assert next(nccl).settings_model.__name__ == "NcclSettings"


def test_config_reads_a_check_table_typed() -> None:
    from dgxdoctor.checks.ray import RaySettings

    config = parse_config({"checks": {"ray": {"ray_command": "/opt/ray/bin/ray"}}})
    assert config.settings_of("ray", RaySettings).ray_command == "/opt/ray/bin/ray"
    with pytest.raises(TypeError):
        config.settings_of("vllm", RaySettings)
    with pytest.raises(KeyError, match="no check named 'gpus'"):
        config.check_settings("gpus")


REMEDIATION = sorted(p.stem for p in (SRC / "remediation").glob("*.py") if p.stem != "__init__")


def test_remediation_imports_no_check() -> None:
    """The guard needs its own settings table, not every check (config.py above checks/ loaded 76 modules)."""
    code = (
        "import importlib, sys\n"
        f"for name in {REMEDIATION!r}:\n"
        "    importlib.import_module('dgxdoctor.remediation.' + name)\n"
        "import dgxdoctor.config, dgxdoctor.settings.daemon, dgxdoctor.settings.alerts\n"
        "print(sorted(m for m in sys.modules if m.startswith('dgxdoctor.checks')))\n"
    )
    assert fresh_python(code).strip() == "[]"


def test_the_type_argument_is_the_settings_model() -> None:
    from typing import ClassVar

    from dgxdoctor.environment import Environment
    from dgxdoctor.result import CheckResult, Status

    class WideSettings(CheckSettings):
        width: int = 3

    class Wide(Check[WideSettings]):
        name: ClassVar[str] = "wide"

        def run(self) -> CheckResult:
            return CheckResult(self.name, Status.OK, f"width {self.settings.width}")

    class Narrower(Wide):  # a subclass that names a model of its own keeps it
        settings_model = CheckSettings

    assert Wide.settings_model is WideSettings and Narrower.settings_model is CheckSettings
    assert Wide(WideSettings(width=5), Environment()).run().summary == "width 5"
    with pytest.raises(TypeError, match="wide check needs WideSettings"):
        Wide(CheckSettings(), Environment())


def test_diagnose_judges_with_the_checks_thresholds_and_their_defaults() -> None:
    """The analyzers read [checks.*] through typed thresholds, and without a config judge with the checks' defaults
    (they took getattr(settings, "min_fraction", 0.7) and the like, a second copy of each default)."""
    from dgxdoctor.checks.infiniband import InfinibandSettings
    from dgxdoctor.checks.nccl import NcclSettings
    from dgxdoctor.checks.ray import RaySettings
    from dgxdoctor.commands.diagnose import thresholds
    from dgxdoctor.diagnose.registry import Thresholds

    assert thresholds(parse_config({})) == Thresholds()
    defaults = Thresholds()
    assert defaults.nccl_min_fraction == NcclSettings().min_fraction
    assert (defaults.ray_expected_nodes, defaults.ray_expected_gpus) == (
        RaySettings().expected_nodes,
        RaySettings().expected_gpus,
    )
    assert defaults.ib_min_rate_gbps == InfinibandSettings().min_rate_gbps
    config = parse_config(
        {
            "checks": {
                "infiniband": {"min_rate_gbps": 400},
                "nccl": {"expected_busbw_gbps": 380, "min_fraction": 0.8},
                "ray": {"expected_nodes": 4, "expected_gpus": 32},
            }
        }
    )
    assert thresholds(config) == Thresholds(400, 380, 0.8, 4, 32)
