"""The verdict's rules live in ``diagnosis/rules/``, each registered once in ``RULES``, which ``diagnose`` walks."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing

from evidence_fakes import INPUT_BOUND, summary

from lightning_dataperf.diagnosis import rules
from lightning_dataperf.diagnosis.diagnose import diagnose
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding
from lightning_dataperf.diagnosis.rules import FALLBACK, RULES
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.telemetry.stats import SystemStats


def _is_rule(function: object) -> bool:
    """A rule by its shape: one ``Evidence`` in, ``Finding | None`` out."""
    hints = typing.get_type_hints(function)
    parameters = list(inspect.signature(function).parameters)
    return len(parameters) == 1 and hints.get(parameters[0]) is Evidence and hints.get("return") == Finding | None


def rules_by_module(package=rules) -> dict[str, list[object]]:
    """Every public rule-shaped function defined in a module of ``package``, by module."""
    found: dict[str, list[object]] = {}
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == module.__name__ and not name.startswith("_") and _is_rule(function):
                found.setdefault(info.name, []).append(function)
    return found


def test_every_rule_in_the_rules_folder_is_registered_exactly_once():
    defined = [function for functions in rules_by_module().values() for function in functions]
    registered = [*RULES, FALLBACK]
    assert len(registered) == len(set(registered)), "a rule is registered twice"
    missing = [f"{f.__module__}.{f.__name__}" for f in defined if f not in registered]
    assert not missing, f"rules defined but not in rules.RULES (or FALLBACK): {missing}"
    # and nothing registered from elsewhere: every rule lives in diagnosis/rules/
    assert sorted(f.__qualname__ for f in registered) == sorted(f.__qualname__ for f in defined)
    assert all(f.__module__.startswith(rules.__name__ + ".") for f in registered)


def test_the_check_finds_a_rule_module_left_out_of_the_registry(tmp_path, monkeypatch):
    package = tmp_path / "fake_rules"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text(
        "from lightning_dataperf.diagnosis.evidence import Evidence\n"
        "def spare_cores(evidence: Evidence) -> bool:\n    return True\n"
    )
    (package / "new_rule.py").write_text(
        "from __future__ import annotations\n"
        "from lightning_dataperf.diagnosis.evidence import Evidence\n"
        "from lightning_dataperf.diagnosis.findings import Finding\n"
        "def new_rule(evidence: Evidence) -> Finding | None:\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import fake_rules

    found = rules_by_module(fake_rules)
    assert list(found) == ["fake_rules.new_rule"]  # the helper is no rule; the unregistered rule is seen
    assert [f.__name__ for f in found["fake_rules.new_rule"]] == ["new_rule"]


def test_the_registry_holds_the_rules_in_the_verdicts_order():
    names = [rule.__name__ for rule in RULES]
    assert names == [
        "input_bound",
        "transfer_bound",
        "host_bound",
        "host_gap",
        "straggler",
        "stalls",
        "epoch_start",
        "memory_pressure",
    ]
    assert FALLBACK.__name__ == "compute_bound"
    assert inspect.signature(diagnose).parameters["rules"].default is RULES  # diagnose walks the registry


def test_diagnose_walks_the_rules_in_order_and_ties_keep_it():
    called = []

    def rule(name, share):
        def apply(evidence: Evidence) -> Finding | None:
            called.append(name)
            return Finding(name, name, share, {}, [])

        return apply

    evidence = Evidence(summary(stall=0.0, Compute=0.010, Step=0.010))
    verdict = diagnose(evidence, rules=(rule("b", 0.2), rule("a", 0.3), rule("c", 0.2)))
    assert called == ["b", "a", "c"]
    assert [finding.kind for finding in verdict.findings] == ["a", "b", "c"]


def test_the_default_registry_gives_the_verdict_of_its_rules_in_order():
    """``diagnose(evidence)`` gives what walking ``RULES`` gives, the largest share first."""
    pressed = SystemStats(swap_used_mb=4096.0)
    evidence = Evidence(INPUT_BOUND, LoaderFacts(num_workers=0), system=pressed)
    verdict = diagnose(evidence)
    expected = sorted(
        (finding for rule in RULES if (finding := rule(evidence)) is not None),
        key=lambda finding: finding.share,
        reverse=True,
    )
    assert [f.kind for f in verdict.findings] == [f.kind for f in expected]
    assert verdict.findings[0].kind.startswith("input_bound") and verdict.findings[-1].kind == "memory_pressure"
    # below SIGNIFICANT_SHARE everywhere: the fallback comes first
    quiet = dataclasses.replace(evidence, summary=summary(Compute=0.010, Step=0.010), system=SystemStats())
    assert [f.kind for f in diagnose(quiet).findings] == ["compute_bound"]
