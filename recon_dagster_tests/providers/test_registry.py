"""The provider registry is the one list of providers: every derived list agrees with it, a
provider's spec is whole, and a provider's name stays inside its own package.

Where a provider may be named outside ``recon_dagster/providers/<name>/`` (CONTRIBUTING.md,
"Adding a provider"): the registry line; the deployment's run-queue limits (dagster.yaml and its
two renderings under deploy/, checked against the spec here); the import-linter independence
contract in pyproject.toml (checked here too). Code that must name a provider for a reason of its
own (the app's LoRA feature is Replicate's; the demo's incident is KIE's; the sandbox's built-in
shapes of the four older providers) is counted below against a ceiling that may only go down.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from recon_dagster import config
from recon_dagster.core.kinds import KINDS, provider_names, provider_specs
from recon_dagster.providers.parse import provider_parser
from recon_dagster.providers.resource import ProvidersResource, resource_class
from recon_dagster.sandbox.plugins import plugins
from recon_dagster_tests.core.test_settings_home import _docstrings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "recon_dagster"
PROVIDERS = PACKAGE / "providers"

# The modules outside a provider's package allowed to name it, each with why it must (comments and
# docstrings aside). A provider added through the kit is named only by the registry. The four that
# predate it are also named where a feature is about that provider itself; the lists are exact (a
# module that stops naming its provider must leave the list), so they can only shrink.
_COMMON = (
    "recon_dagster/providers/registry.py",  # the one list
    "recon_dagster/providers/__init__.py",  # public import paths of the resource classes
    "recon_dagster/config/groups/accounts.py",  # its own RECON_* spend tolerance
    "recon_dagster/defs/spend/assets.py",  # spend reconciliation: one asset per billing API
)
ALLOWED: dict[str, frozenset[str]] = {
    "kie": frozenset(
        (*_COMMON, "recon_dagster/cli/demo.py", "recon_dagster/reconcile/spend.py")
    ),  # the demo's incident; its credit-balance rule
    "replicate": frozenset(
        (
            *_COMMON,
            "recon_dagster/config/groups/provider_io.py",  # its own RECON_REPLICATE_CANCEL_AFTER_S
            "recon_dagster/reconcile/spend.py",  # its compute-seconds rule
            # the app's LoRA feature: its characters.replicate_training_id column
            "recon_dagster/cli/demo.py",
            "recon_dagster/db/jobs.py",
            "recon_dagster/defs/lora/cohort.py",
            "recon_dagster/reconcile/finalize.py",
            "recon_dagster/reconcile/lora.py",
            "recon_dagster/reconcile/plan.py",
            "recon_dagster/reconcile/shadow.py",
        )
    ),
    "elevenlabs": frozenset((*_COMMON, "recon_dagster/reconcile/spend_usage.py")),  # its characters rule
    "anthropic": frozenset(
        (
            *_COMMON,
            "recon_dagster/reconcile/spend_usage.py",  # its tokens rule and reporting delay
            # its usage report is read with its own admin key, hourly as well as daily
            "recon_dagster/definitions.py",
            "recon_dagster/defs/spend/definitions.py",
            "recon_dagster/defs/spend/hourly.py",
            "recon_dagster/defs/spend/schedules.py",
        )
    ),
}
KIT_MAX_PLACES = 3
DEPLOYMENT = ("dagster.yaml", "deploy/dagster-k8s.yaml", "deploy/helm/values.yaml")


def _words(text: str) -> list[str]:
    """Lower-case words of an identifier or a string: split at case changes and non-letters."""
    return [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", text)]


def _names(words: list[str], name: str) -> bool:
    """Whether ``name`` is one word, or several consecutive ones (``Eleven`` ``Labs``)."""
    return any(
        "".join(words[i:j]) == name
        for i in range(len(words))
        for j in range(i + 1, min(i + 4, len(words)) + 1)
    )


def _texts(source: str) -> list[str]:
    """Every identifier, imported module and string constant of a module (docstrings aside; the
    parser drops comments)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append(node.id)
        elif isinstance(node, ast.Attribute):
            out.append(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.alias):
            out.extend(filter(None, (node.name, node.asname)))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append(node.name)
        elif isinstance(node, ast.arg) or isinstance(node, ast.keyword) and node.arg:
            out.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            out.append(node.value)
    return out


def places(name: str) -> list[str]:
    """The Python modules outside ``providers/<name>/`` that name the provider ``name``."""
    own = PROVIDERS / name
    return [
        str(path.relative_to(ROOT))
        for path in sorted(PACKAGE.rglob("*.py"))
        if own not in path.parents and any(_names(_words(t), name) for t in _texts(path.read_text()))
    ]


def test_the_name_count_sees_code_and_strings_but_not_comments_docstrings_or_lookalikes() -> None:
    source = (
        '"""kie in a docstring."""\n'
        "# replicate in a comment\n"
        "from recon_dagster.providers.fal.spec import SPEC\n"
        "x = ElevenLabsResource\n"
        'y = {"model": "anthropic-sync"}\n'
        "z = false_cookiejar\n"
    )
    words = [_words(t) for t in _texts(source)]
    assert [
        n for n in ("kie", "replicate", "fal", "elevenlabs", "anthropic") if any(_names(w, n) for w in words)
    ] == [
        "fal",
        "elevenlabs",
        "anthropic",
    ]


@pytest.mark.parametrize("name", provider_names())
def test_a_provider_is_named_in_few_places_outside_its_package(name: str) -> None:
    found = places(name)
    assert "recon_dagster/providers/registry.py" in found
    if name not in ALLOWED:
        assert len(found) <= KIT_MAX_PLACES, (
            f"{name} is named in {len(found)} modules outside its package: {found}"
        )
        return
    assert sorted(set(found) - ALLOWED[name]) == [], f"{name} is named where it need not be"
    assert sorted(ALLOWED[name] - set(found)) == [], f"{name} no longer named there: shrink ALLOWED"


def test_the_fifth_provider_is_named_only_in_the_registry() -> None:
    assert places("fal") == ["recon_dagster/providers/registry.py"]


def test_the_independence_contract_lists_every_registered_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    independent = next(c for c in contracts if c["type"] == "independence")
    assert independent["modules"] == [f"recon_dagster.providers.{n}" for n in provider_names()]
    packages = sorted(p.name for p in PROVIDERS.iterdir() if (p / "spec.py").is_file())
    assert packages == sorted(provider_names())


@pytest.mark.parametrize("path", DEPLOYMENT)
def test_the_deployments_run_queue_limits_are_the_registrys(path: str) -> None:
    text = (ROOT / path).read_text()
    limits = [
        (x["key"], x["value"], x["limit"])
        for x in _tag_limits(yaml.safe_load(text))
        if x["key"] in ("recon/provider", "recon/provider_lane")
    ]
    expected = []
    for spec in provider_specs():
        expected.append(("recon/provider", spec.name, spec.run_queue.provider_runs))
        if spec.run_queue.batch_runs is not None:
            expected.append(("recon/provider_lane", f"{spec.name}/batch", spec.run_queue.batch_runs))
    assert sorted(limits) == sorted(expected)


def _tag_limits(doc: object) -> list[dict[str, object]]:
    """The first ``tag_concurrency_limits`` / ``tagConcurrencyLimits`` list anywhere in a YAML tree."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("tag_concurrency_limits", "tagConcurrencyLimits") and isinstance(value, list):
                return value
            found = _tag_limits(value)
            if found:
                return found
    return []


@pytest.mark.parametrize("spec", provider_specs(), ids=lambda s: s.name)
def test_every_spec_is_whole(spec) -> None:
    assert spec.kinds and all(k.provider == spec.name and k.name in KINDS for k in spec.kinds)
    cls = resource_class(spec)
    assert spec.name == cls.PROVIDER
    assert spec.name in ProvidersResource.model_fields
    if spec.polled:
        assert provider_parser(spec.name) is not None
    else:
        assert spec.parser is None
    for var in (spec.settings.base_url_env, spec.settings.key_env, config.limit_name(spec.name)):
        assert var in config.SETTINGS, var
    assert config.SETTINGS[spec.settings.key_env].secret
    for case in spec.demo:
        assert KINDS[case.kind].provider == spec.name
    if spec.sandbox is not None:
        assert spec.name in plugins()
    for kind in spec.kinds:
        if kind.is_async and kind.media_url_ttl is not None:
            assert kind.stale_threshold <= kind.media_url_ttl / 2, kind.name
