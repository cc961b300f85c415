-- The duplicate-entities gauge groups recent completions by request; this
-- index lets it read only the recent window of completed keys.
create index idempotency_keys_done_request
  on idempotency_keys (completed_at, tenant, path, fingerprint) where status = 'done';
