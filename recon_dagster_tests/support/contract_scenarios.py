"""Plays ``contract/scenarios.json`` (format: ``contract/README.md``) on real PostgreSQL, two ways.

``SqlClient`` calls the ``recon.*`` functions directly, each call its own transaction, as a
worker in another language would. ``LibraryClient`` plays the same calls through the Python worker
library (``make_on_task_created``, ``run_or_resume``, ``mark_provider_call_start``, the account
limiter) and turns what it returns or raises into the answer the function would give, so one
table of expectations holds for both.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from recon_dagster.db import contract, ledger
from recon_dagster.providers.limits import AccountLimiter, AccountLimits, Budget, TokenRefused
from recon_dagster.providers.status import AmbiguousCreateError, ProviderHTTPError
from recon_dagster.reconcile.app_worker import (
    CreateMayExist,
    JobNoLongerInFlight,
    JobNotFound,
    TaskAlreadyPersisted,
    TaskCreatedRecorder,
    make_on_task_created,
    mark_provider_call_start,
    open_create,
    run_or_resume,
)

SCENARIOS = Path(__file__).resolve().parents[2] / "contract" / "scenarios.json"


def load() -> list[dict[str, Any]]:
    return list(json.loads(SCENARIOS.read_text())["scenarios"])


def fill(value: Any, names: Mapping[str, Any]) -> Any:
    """``value`` with ``{var}`` replaced; a string that is exactly one ``{var}`` becomes its value."""
    if isinstance(value, str):
        if value.startswith("{") and value.endswith("}") and value[1:-1] in names:
            return names[value[1:-1]]
        for k, v in names.items():
            value = value.replace("{" + k + "}", str(v))
        return value
    if isinstance(value, list):
        return [fill(v, names) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, names) for k, v in value.items()}
    return value


class Client:
    """One way of making the contract's calls; ``process`` switches the calling process."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def call(self, function: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def crash(self) -> None:
        """The worker died: whatever it held in memory is gone."""

    def process(self, name: str) -> None:
        """Calls from now on come from process ``name``."""


def _fingerprinted(args: dict[str, Any]) -> dict[str, Any]:
    """The client's side of create_intent: the fingerprint of the payload (docs/app-contract.md)."""
    args = dict(args)
    if "payload" in args:
        args["fingerprint"] = ledger.fingerprint(args.pop("payload"))
    return args


class SqlClient(Client):
    def call(self, function: str, args: dict[str, Any]) -> dict[str, Any]:
        args = _fingerprinted(args)
        with self.engine.begin() as conn:
            return contract.call(conn, function, **{k: _sql_value(v) for k, v in args.items()})


def _sql_value(v: Any) -> Any:
    return str(v) if isinstance(v, uuid.UUID) else v


class LibraryClient(Client):
    """The same calls through the Python library's public pieces."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        self.recorders: dict[str, TaskCreatedRecorder] = {}
        self.limiters: dict[tuple[str, str], AccountLimiter] = {}
        self.current = "main"

    def crash(self) -> None:
        self.recorders.clear()

    def process(self, name: str) -> None:
        self.current = name

    def limiter(self, account: str) -> AccountLimiter:
        key = (self.current, account)
        if key not in self.limiters:
            with self.engine.connect() as conn:
                slots = conn.execute(
                    sa.text("SELECT count(*) FROM provider_limit_slots WHERE account = :a"), {"a": account}
                ).scalar_one()
            # The scenario's rows are the account's budget: the limiter is told they are in place
            # (any budget makes it draw on them; one token per statement at these rates).
            limits = AccountLimits(
                account, reads=Budget(1, 3600), creates=Budget(1, 3600), concurrency=slots or None
            )
            limiter = AccountLimiter(limits, lambda: self.engine)
            limiter._ready = True
            self.limiters[key] = limiter
        return self.limiters[key]

    def call(self, function: str, args: dict[str, Any]) -> dict[str, Any]:
        handler: Callable[[dict[str, Any]], dict[str, Any]] = getattr(self, f"_{function}")
        try:
            return handler(args)
        except JobNotFound:
            return {"next": "stop", "reason": "job_not_found"}
        except JobNoLongerInFlight as ended:
            return {"next": "stop", "reason": "job_not_in_flight", "status": ended.status}
        except TaskAlreadyPersisted as dup:
            return {"next": "resume", "reason": "task_already_persisted", "task_id": dup.persisted}

    def _resume_point(self, args: dict[str, Any]) -> dict[str, Any]:
        class Resumer:
            def resume(self, kind: str, task_id: str) -> Any:
                return {"next": "resume", "kind": kind, "task_id": task_id}

        def create(_cb: Any) -> Any:
            return {"next": "create"}

        try:
            answer: dict[str, Any] = run_or_resume(
                args["job"], "replicate-prediction", create, providers=Resumer(), engine=self.engine
            )  # type: ignore[assignment]
        except CreateMayExist:
            # resume_point answered create; run_or_resume went on to open_create (the table's
            # next step plays it) and was told to wait for the sweep.
            return {"next": "create"}
        return answer

    def _open_create(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            open_create(args["job"], engine=self.engine)
        except CreateMayExist as held:
            found = self._create(uuid.UUID(held.create_id))
            assert found is not None
            reason = "create_may_exist" if held.task_id is None else "task_not_on_row"
            answer = {
                "next": "wait_for_sweep", "reason": reason, "create_id": held.create_id,
                "seq": found.seq, "state": found.state,
            }  # fmt: skip
            return answer if held.task_id is None else {**answer, "task_id": held.task_id}
        return {"next": "create"}

    def _mark_call_start(self, args: dict[str, Any]) -> dict[str, Any]:
        mark_provider_call_start(args["job"], args["kind"], engine=self.engine)
        return {"next": "call"}

    def _create_intent(self, args: dict[str, Any]) -> dict[str, Any]:
        # The step is create_intent alone: the table plays open_create as its own step (a recorder
        # made on its own asks it in before_send, run_or_resume before it).
        recorder = TaskCreatedRecorder(uuid.UUID(str(args["job"])), args["kind"], self.engine, opened=True)
        payload = args.get("payload", {})
        marker = recorder.before_send(args["provider"], args["kind"], payload, args.get("marker_sent", True))
        assert recorder.intent is not None
        self.recorders[str(recorder.intent.id)] = recorder
        return {
            "next": "send",
            "create_id": str(recorder.intent.id),
            "seq": recorder.intent.seq,
            "marker": marker,
        }

    def _create_task(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ledger's half of the library's answer (``TaskCreatedRecorder`` writes it, then
        the row through attach_task): a worker killed between the two leaves this."""
        with self.engine.begin() as conn:
            found = ledger.record_task(
                conn, uuid.UUID(str(args["job"])), provider=args["provider"], kind=args["kind"],
                task_id=args["task_id"], create=uuid.UUID(str(args["create"])),
            )  # fmt: skip
        return {"next": "attach", "create_id": str(found.id)}

    def _create_answered(self, args: dict[str, Any]) -> dict[str, Any]:
        recorder = self.recorders.get(str(args.get("create"))) or make_on_task_created(
            args["job"], args["kind"], engine=self.engine
        )
        try:
            recorder(args["task_id"])
        except ValueError:
            return {"next": "fix_call", "reason": "invalid_task_id"}
        return {"next": "poll", "task_id": args["task_id"]}

    def _create_lost(self, args: dict[str, Any]) -> dict[str, Any]:
        create = uuid.UUID(str(args["create"]))
        recorder = self.recorders.get(str(create))
        error: BaseException = (
            AmbiguousCreateError(str(args.get("detail", "")))
            if args["state"] == "ambiguous"
            else ProviderHTTPError("replicate-prediction", 422, str(args.get("detail", "")))
        )
        before = self._state(create)
        if recorder is None:  # a retried handler's worker no longer holds it: the ledger's own call
            with self.engine.begin() as conn:
                ledger.record_outcome(conn, create, ledger.CreateState(args["state"]), str(error))
        else:
            recorder.unanswered(error)
        return {"next": "done", "written": before == "sending" and self._state(create) == args["state"]}

    def _create(self, create: uuid.UUID) -> ledger.Create | None:
        with self.engine.connect() as conn:
            return ledger.by_ids(conn, [create]).get(create)

    def _state(self, create: uuid.UUID) -> str | None:
        found = self._create(create)
        return None if found is None else found.state

    def _take_token(self, args: dict[str, Any]) -> dict[str, Any]:
        max_wait = args.get("max_wait_s")
        try:
            wait = self.limiter(args["account"]).take_token(args["bucket"] == "create", max_wait)
        except TokenRefused as refused:
            blocked = max_wait is not None and refused.blocked_s > max_wait
            return {
                "next": "not_sent",
                "reason": "blocked_by_retry_after" if blocked else "token_wait",
                "retry_in_s": refused.next_s,
            }
        return {"next": "send", "wait_s": wait}

    def _token_blocked(self, args: dict[str, Any]) -> dict[str, Any]:
        left = self.limiter(args["account"])._blocked_s(args["bucket"] == "create")
        return {"next": "queue_again" if left > 0 else "send", "blocked_s": left}

    def _record_retry_after(self, args: dict[str, Any]) -> dict[str, Any]:
        self.limiter(args["account"]).block_for(float(args["seconds"]))
        return {"next": "wait"}

    def _take_slot(self, args: dict[str, Any]) -> dict[str, Any]:
        held = self.limiter(args["account"]).take_slot(args["kind"])
        if held is None:
            return {"next": "ask_again", "reason": "slot_wait"}
        return {"next": "send", "slot": held[0], "holder": held[1]}

    def _renew_slots(self, args: dict[str, Any]) -> dict[str, Any]:
        self.limiter(args["account"]).renew(args["holders"])
        with self.engine.connect() as conn:
            renewed = conn.execute(
                sa.text(
                    "SELECT count(*) FROM provider_limit_slots WHERE account = :a AND holder = ANY(:h) "
                    "AND expires_at > clock_timestamp() + interval '60 seconds'"
                ),
                {"a": args["account"], "h": list(args["holders"])},
            ).scalar_one()
        return {"next": "done", "renewed": renewed}

    def _release_slot(self, args: dict[str, Any]) -> dict[str, Any]:
        limiter = self.limiter(args["account"])
        with self.engine.connect() as conn:
            held = conn.execute(
                sa.text(
                    "SELECT count(*) FROM provider_limit_slots WHERE account = :a AND slot = :s AND holder = :h"
                ),
                {"a": args["account"], "s": args["slot"], "h": args["holder"]},
            ).scalar_one()
        limiter.release(int(args["slot"]), str(args["holder"]))
        return {"next": "done", "released": held == 1}


# --- the world around the calls ------------------------------------------------------------------


def given(engine: sa.Engine, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario's starting rows; the refs' names (job ids, account names)."""
    names: dict[str, Any] = {}
    user = uuid.uuid4()
    with engine.begin() as conn:
        for ref, job in (spec.get("jobs") or {}).items():
            job_id = uuid.uuid4()
            conn.execute(
                sa.text("INSERT INTO jobs (id, user_id, job_type, status) VALUES (:id, :u, :t, :s)"),
                {"id": str(job_id), "u": str(user), "t": job["job_type"], "s": job["status"]},
            )
            names[ref] = str(job_id)
        for ref, account in (spec.get("accounts") or {}).items():
            name = f"{ref}-{uuid.uuid4().hex[:12]}"
            conn.execute(sa.text("INSERT INTO provider_limit_accounts (account) VALUES (:a)"), {"a": name})
            for bucket, b in (account.get("buckets") or {}).items():
                conn.execute(
                    sa.text(
                        "INSERT INTO provider_limit_buckets (account, bucket, rate_per_s, burst, tokens) "
                        "VALUES (:a, :b, :r, :burst, :burst)"
                    ),
                    {"a": name, "b": bucket, "r": b["rate_per_s"], "burst": b["burst"]},
                )
            conn.execute(
                sa.text(
                    "INSERT INTO provider_limit_slots (account, slot) SELECT :a, g FROM generate_series(0, :n - 1) g"
                ),
                {"a": name, "n": int(account.get("slots", 0))},
            )
            names[ref] = name
    return names


def play(engine: sa.Engine, client: Client, scenario: Mapping[str, Any]) -> list[str]:
    """Play one scenario; every expectation it misses, as lines (empty: it holds)."""
    refs = given(engine, scenario.get("given") or {})
    saved: dict[str, Any] = {}
    misses: list[str] = []
    for i, step in enumerate(scenario["steps"]):
        names = {**refs, **saved}
        if "call" in step:
            answer = client.call(step["call"], fill(step.get("args") or {}, names))
            for key, want in fill(step.get("expect") or {}, names).items():
                if answer.get(key) != want:
                    misses.append(
                        f"step {i} {step['call']}: {key} is {answer.get(key)!r}, expected {want!r} ({answer})"
                    )
            for var, key in (step.get("save") or {}).items():
                saved[var] = answer.get(key)
        elif "crash" in step:
            saved.clear()
            client.crash()
        elif "sweep" in step:
            with engine.begin() as conn:
                conn.execute(
                    sa.text("UPDATE jobs SET status = :s, updated_at = now() WHERE id = :id"),
                    {"s": step["status"], "id": refs[step["sweep"]]},
                )
        elif "process" in step:
            client.process(step["process"])
        elif "provider" not in step:
            raise ValueError(f"step {i} of {scenario['name']!r} is of no known kind: {step}")
    return misses + check_rows(engine, scenario.get("rows") or {}, refs)


def check_rows(engine: sa.Engine, rows: Mapping[str, Any], refs: Mapping[str, Any]) -> list[str]:
    misses: list[str] = []
    rows = fill(rows, refs)
    with engine.connect() as conn:
        for ref, want in (rows.get("jobs") or {}).items():
            got = dict(
                conn.execute(
                    sa.text(
                        "SELECT status, provider_kind, provider_task_id, "
                        "provider_call_started_at IS NOT NULL AS call_started FROM jobs WHERE id = :id"
                    ),
                    {"id": refs[ref]},
                )
                .mappings()
                .one()
            )
            misses += [
                f"jobs[{ref}].{k} is {got[k]!r}, expected {v!r}" for k, v in want.items() if got[k] != v
            ]
        for ref, want in (rows.get("upstream_creates") or {}).items():
            got = [dict(r) for r in conn.execute(
                sa.text("SELECT * FROM upstream_creates WHERE job_id = :id ORDER BY seq"), {"id": refs[ref]}
            ).mappings()]  # fmt: skip
            if len(got) != len(want):
                misses.append(f"upstream_creates[{ref}]: {len(got)} rows, expected {len(want)}")
            for g, w in zip(got, want, strict=False):
                misses += [f"upstream_creates[{ref}] seq {g['seq']}: {k} is {g[k]!r}, expected {v!r}"
                           for k, v in w.items() if g[k] != v]  # fmt: skip
        for ref, want in (rows.get("credit_anomalies") or {}).items():
            got = sorted(conn.execute(
                sa.text("SELECT reason FROM credit_anomalies WHERE job_id = :id"), {"id": refs[ref]}
            ).scalars())  # fmt: skip
            if got != sorted(want):
                misses.append(f"credit_anomalies[{ref}] are {got}, expected {sorted(want)}")
        for ref, buckets in (rows.get("buckets") or {}).items():
            for bucket, want in buckets.items():
                tokens = conn.execute(
                    sa.text("SELECT tokens FROM provider_limit_buckets WHERE account = :a AND bucket = :b"),
                    {"a": refs[ref], "b": bucket},
                ).scalar_one()
                if tokens > want["tokens_at_most"]:
                    misses.append(
                        f"buckets[{ref}].{bucket} has {tokens} tokens, expected <= {want['tokens_at_most']}"
                    )
        for ref, want in (rows.get("accounts") or {}).items():
            got = dict(conn.execute(
                sa.text("SELECT retry_afters, blocked_until > now() AS blocked FROM provider_limit_accounts "
                        "WHERE account = :a"), {"a": refs[ref]},
            ).mappings().one())  # fmt: skip
            misses += [
                f"accounts[{ref}].{k} is {got[k]!r}, expected {v!r}" for k, v in want.items() if got[k] != v
            ]
        for ref, want in (rows.get("slots") or {}).items():
            held = conn.execute(
                sa.text(
                    "SELECT count(*) FROM provider_limit_slots WHERE account = :a AND holder IS NOT NULL "
                    "AND expires_at > clock_timestamp()"
                ),
                {"a": refs[ref]},
            ).scalar_one()
            if held != want["held"]:
                misses.append(f"slots[{ref}]: {held} held, expected {want['held']}")
    return misses
