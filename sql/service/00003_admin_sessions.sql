-- Admin sign-in sessions, kept by the server: a session is open while its row
-- exists and it was used in the last 30 minutes (src/admin/sessions.ts).
-- Signing out or ending a session deletes its row, so its cookie opens
-- nothing any more, on every process at once.
--
-- The cookie carries a random 256-bit session token; only its SHA-256 is
-- stored, so a copy of this table (a backup, a replica) signs nobody in.
-- `id` is the session's public handle on the sessions list.
create table admin_sessions (
  id            bigint      generated always as identity primary key,
  token_hash    bytea       not null unique check (length(token_hash) = 32),
  operator      text        not null check (length(operator) between 1 and 64),
  -- What the operator typed at sign-in for the audit trail, next to the name the token gave.
  note          text        check (length(note) between 1 and 64),
  address       text        not null check (length(address) between 1 and 64),
  started_at    timestamptz not null,
  last_seen_at  timestamptz not null
);

-- Finding the sessions that ended by idling (the clean-up at each sign-in) reads this index.
create index admin_sessions_last_seen on admin_sessions (last_seen_at);
