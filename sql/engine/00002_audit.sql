-- The operators' audit trail: every force-expiration and purge, who asked and what happened.
-- The engine's: the operations write it in the very statement that acts
-- (src/core/force-expire.ts, expire-stale.ts), on any database the engine
-- runs on, so the CLI records its actions on a plugin user's database too.
create table idempotency_audit (
  id          bigint      generated always as identity primary key,
  at          timestamptz not null default now(),
  actor       text        not null check (length(actor) between 1 and 128),
  action      text        not null check (length(action) between 1 and 64),
  tenant      text        check (length(tenant) between 1 and 64),
  key         text        check (length(key) between 1 and 255),
  outcome     text        not null check (length(outcome) between 1 and 64),
  detail      jsonb
);

create index idempotency_audit_at on idempotency_audit (at desc, id desc);
