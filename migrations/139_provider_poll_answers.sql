-- Migration 139 — provider_poll_answers: recent poll answers per provider, for the not-found breaker.
--
-- A wrong token, account or base path makes every poll of one provider answer "not found". Each
-- reconcile run is its own process, so the count of recent not-found answers per provider lives
-- here, where every run sees it. Rows older than the breaker's window are deleted as new ones come.
--
-- recon:replaces sha256:08c5e1211b36bc19487ccf0808e55b5cecfa893ad59635ae5cd0dbdb75dc9c7d
--   (the first shipped text, without the squawk comments)
--
-- squawk-ignore-file prefer-identity -- column types as first shipped: changing them would change what applied databases hold
-- squawk-ignore-file require-concurrent-index-creation, require-timeout-settings -- its indexes are on the table this same transaction creates: nobody else can hold or wait for a lock on it

CREATE TABLE IF NOT EXISTS provider_poll_answers (
  id        bigserial PRIMARY KEY,
  provider  text NOT NULL,
  not_found boolean NOT NULL,
  at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS provider_poll_answers_provider_at_idx ON provider_poll_answers (provider, at);
