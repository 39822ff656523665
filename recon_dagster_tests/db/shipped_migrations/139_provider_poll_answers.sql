-- Migration 139 — provider_poll_answers: recent poll answers per provider, for the not-found breaker.
--
-- A wrong token, account or base path makes every poll of one provider answer "not found". Each
-- reconcile run is its own process, so the count of recent not-found answers per provider lives
-- here, where every run sees it. Rows older than the breaker's window are deleted as new ones come.

CREATE TABLE IF NOT EXISTS provider_poll_answers (
  id        bigserial PRIMARY KEY,
  provider  text NOT NULL,
  not_found boolean NOT NULL,
  at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS provider_poll_answers_provider_at_idx ON provider_poll_answers (provider, at);
