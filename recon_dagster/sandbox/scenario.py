"""How a sandbox task behaves: the ``Scenario`` and the pure decisions taken from it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from recon_dagster.core.kinds import get_kind
from recon_dagster.sandbox import plugins

OUTCOMES = ("succeed", "fail", "run_forever")
MEDIA_KINDS = ("image", "video", "audio", "weights", "text")
MALFORMED_KINDS = ("truncated", "not_json", "unknown_state", "missing_state")

# A family's natural media kind, its documented failure values (a scenario picks one with
# ``fail_state``; the first is the default) and a provider's own names for the fields it alone
# reads all come from the providers' plugins (``plugins.py``).


def fail_states(family: str) -> tuple[str, ...]:
    """The documented failure values of ``family`` (none for a family without a plugin)."""
    found = plugins.family(family)
    return found.fail_states if found is not None else ()


def _json_names() -> dict[str, str]:
    """Attribute -> JSON name, for the fields a provider names."""
    return {attribute: name for name, attribute in plugins.scenario_fields().items()}


class ScenarioError(ValueError):
    """A scenario that cannot be honoured, with what was wrong in the message."""


@dataclass
class Scenario:
    """What an upstream task (or a sync call) does when our clients talk to it.

    Counts are per task for polls (``rate_limit_first``/``server_error_first`` apply to the task's
    API requests: polls and ElevenLabs audio fetches). For sync kinds, which have no task, they
    apply to the calls of that kind under this scenario. ``create_*`` fields inject failures into
    the create requests of a kind under this scenario.
    """

    outcome: Literal["succeed", "fail", "run_forever"] = "succeed"
    polls_before_done: int = 1
    rate_limit_first: int = 0
    server_error_first: int = 0
    latency_s: float | None = None
    malformed: bool = False
    malformed_kind: str = "truncated"
    media_status: int = 200
    data_removed: bool = False
    expired: bool = False
    media_kind: str | None = None
    media_size: int = 64 * 1024
    media_count: int = 1
    # Serve media with chunked transfer encoding and no Content-Length (size caps must still hold).
    media_no_length: bool = False
    # Kept with the task (admin task info) for tests to compare; no documented poll body carries a
    # cost, so it is not rendered into provider responses.
    cost_usd: float | None = None
    error_message: str | None = None
    # A documented failure value for the family (``fail_states``); None picks the first.
    fail_state: str | None = None
    # Luma: report success as successFlag 4 (generation succeeded, callback failed).
    luma_callback_failed: bool = False
    # Suno: report success as CALLBACK_EXCEPTION with every track (KIE's callback to the app
    # failed; the music exists).
    suno_callback_failed: bool = False
    retry_after_s: int = 1
    # Status of injected server errors; None: 503 for Replicate, 500 elsewhere.
    server_error_status: int | None = None
    # A provider that reports errors inside an HTTP 200 body (KIE's envelope ``code``): send the
    # injected 429/5xx that way. Its JSON name is the provider's (``plugins.scenario_fields``).
    http200_errors: bool = False
    # KIE market: running polls already carry a filled resultJson (as a documented example does).
    early_result: bool = False
    # Replicate predictions: ``output`` is one URL string instead of a list.
    output_as_string: bool = False
    create_rate_limit_first: int = 0
    create_server_error_first: int = 0
    # The first N creates register the task upstream, then drop the connection unanswered.
    create_lost_response_first: int = 0
    # Answer every create with this provider error status (e.g. 402 insufficient credits).
    create_reject_status: int | None = None
    # Polls answered by a gateway that echoes the credential it was sent, raw and URL-encoded
    # (KIE: HTTP 200 with code 401 in the envelope; others: HTTP 401).
    echo_key: bool = False
    # With echo_key: HTTP 500 whose JSON body spells the key with \uXXXX escapes and \/, and
    # carries it base64'd in a Basic credential (a gateway dumping its request, escaped).
    echo_key_escaped: bool = False
    # Poll bodies / media bodies sent one byte every this many seconds (a slow-drip server).
    poll_drip_s: float | None = None
    media_drip_s: float | None = None
    # Polls answered with a gzip body that decodes to this many bytes (a decompression bomb).
    poll_gzip_bytes: int = 0
    # Poll answers gzip-compressed (Content-Encoding: gzip), as a CDN in front of a provider does.
    gzip_polls: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ScenarioError`` naming the first field that is out of range."""
        if self.outcome not in OUTCOMES:
            raise ScenarioError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        for name in (
            "polls_before_done",
            "rate_limit_first",
            "server_error_first",
            "media_size",
            "media_count",
            "retry_after_s",
            "create_rate_limit_first",
            "create_server_error_first",
            "create_lost_response_first",
            "poll_gzip_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ScenarioError(f"{name} must be a non-negative integer, got {value!r}")
        if self.media_count < 1:
            raise ScenarioError("media_count must be at least 1")
        if self.latency_s is not None and (not isinstance(self.latency_s, int | float) or self.latency_s < 0):
            raise ScenarioError(f"latency_s must be a non-negative number, got {self.latency_s!r}")
        for name in ("poll_drip_s", "media_drip_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or value <= 0):
                raise ScenarioError(f"{name} must be a positive number, got {value!r}")
        if self.malformed_kind not in MALFORMED_KINDS:
            raise ScenarioError(
                f"malformed_kind must be one of {MALFORMED_KINDS}, got {self.malformed_kind!r}"
            )
        if self.media_kind is not None and self.media_kind not in MEDIA_KINDS:
            raise ScenarioError(f"media_kind must be one of {MEDIA_KINDS}, got {self.media_kind!r}")
        for name in ("media_status", "server_error_status", "create_reject_status"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or not 100 <= value <= 599):
                raise ScenarioError(f"{name} must be an HTTP status code, got {value!r}")

    def check_for_kind(self, kind: str) -> str:
        """Validate the family-specific fields against ``kind``; returns the kind's family."""
        family = get_kind(kind).family
        if self.fail_state is not None:
            allowed = fail_states(family)
            if self.fail_state not in allowed:
                raise ScenarioError(
                    f"fail_state {self.fail_state!r} is not a failure value of {kind} "
                    f"(allowed: {', '.join(allowed) or 'none'})"
                )
        return family

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the inverse of ``from_dict``)."""
        names = _json_names()
        return {names.get(k, k): v for k, v in asdict(self).items()}

    def key(self) -> str:
        """A stable identity, used to count create/sync attempts made under one scenario."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Scenario:
        """Build from JSON fields; unknown names are an error listing the known ones."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ScenarioError(f"a scenario must be a JSON object, got {type(data).__name__}")
        names = _json_names()
        known = {names.get(f.name, f.name) for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ScenarioError(
                f"unknown scenario field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        try:
            field_names = plugins.scenario_fields()
            return cls(**{field_names.get(k, k): v for k, v in data.items()})
        except TypeError as exc:
            raise ScenarioError(f"bad scenario: {exc}") from None


# --- pure decisions -------------------------------------------------------------------------

Injection = Literal["rate_limited", "server_error", "answer"]


def injected(n: int, rate_limit_first: int, server_error_first: int) -> Injection:
    """What the n-th (0-based) request of a series gets: 429s first, then 5xx, then an answer."""
    if n < rate_limit_first:
        return "rate_limited"
    if n < rate_limit_first + server_error_first:
        return "server_error"
    return "answer"


Phase = Literal["running", "succeeded", "failed"]


def poll_phase(answered: int, scenario: Scenario) -> Phase:
    """The phase of a task at its ``answered``-th (0-based) answered poll."""
    if scenario.outcome == "run_forever" or answered < scenario.polls_before_done:
        return "running"
    return "succeeded" if scenario.outcome == "succeed" else "failed"


CreateAction = Literal["rate_limited", "server_error", "rejected", "lost", "create"]


def create_action(n: int, scenario: Scenario) -> CreateAction:
    """What the n-th (0-based) create request under ``scenario`` gets."""
    first = injected(n, scenario.create_rate_limit_first, scenario.create_server_error_first)
    if first != "answer":
        return first
    if scenario.create_reject_status is not None:
        return "rejected"
    offset = scenario.create_rate_limit_first + scenario.create_server_error_first
    if n < offset + scenario.create_lost_response_first:
        return "lost"
    return "create"


def media_kind_for(family: str, scenario: Scenario) -> str:
    """The scenario's media kind, or the family's natural one."""
    return scenario.media_kind or plugins.family_of(family).media_kind
