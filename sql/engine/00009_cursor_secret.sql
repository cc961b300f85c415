-- @online
-- The secret the admin's list cursors are signed with (src/operations/cursor.ts).
-- The admin page and its JSON API on every instance and the CLI (another
-- process, maybe on another machine, run against an app's database too) must
-- all sign and check the same cursors, and this database is the one thing
-- they all reach: no per-process secret works, and a configured one would be
-- one more secret to hand every operator's shell. 32 random bytes, made by
-- the first list that needs them; deleting the row rotates them (cursors given
-- out before are refused, the list starts again). Whoever can read this row
-- can read every key it guards anyway.
--
-- Online: a new table the release before never reads.
create table idempotency_secrets (
  purpose text primary key check (length(purpose) between 1 and 64),
  secret bytea not null check (length(secret) >= 32),
  created_at timestamptz not null default now()
);
