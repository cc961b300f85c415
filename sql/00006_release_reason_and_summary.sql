-- What an operator needs about a request that went wrong, without an extra
-- round trip on the fresh path.

-- Why the key was given back (core/release.ts): 'failed', 'deadline' (the
-- request ran into its deadline: a provider call in flight may still have
-- charged), 'shutdown' (a draining server stopped it). Null for keys released
-- by an operator (the audit trail says who and why) and before this
-- migration. Meaningful while status = 'released'; a retry that takes the key
-- again leaves it, and the admin reads it only for released keys.
alter table idempotency_keys add column release_reason text
  check (release_reason in ('failed', 'deadline', 'shutdown'));

-- The route-chosen summary of the request (payments: customer, amount,
-- currency), written by the claim's own INSERT, so the key's admin page can
-- say what a stuck or released request was before any payment exists.
-- Client-chosen text: bounded here, escaped where shown.
alter table idempotency_keys add column summary jsonb
  check (summary is null or (jsonb_typeof(summary) = 'object' and length(summary::text) <= 1024));

-- The admin's "released after their deadline" list, newest first: few rows
-- (they leave it when a retry takes the key), so a small partial index.
create index idempotency_keys_released_deadline
  on idempotency_keys (released_at desc, tenant, key) where status = 'released' and release_reason = 'deadline';
