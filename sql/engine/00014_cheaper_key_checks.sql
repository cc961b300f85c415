-- @online
-- @no-transaction
-- The same two checks, written so PostgreSQL evaluates them in a fraction of
-- the time (issue 40). A CHECK runs on every INSERT and UPDATE of the row: a
-- claim's and its completion's. A regular expression with a counted repeat
-- is run by a DFA whose states are built anew for each value, one per
-- position: `^[0-9a-f]{64}$` took 5.8 us a row, the same test as a length and
-- `^[0-9a-f]+$` 0.2 us (100,000 fingerprints, PostgreSQL 15); `^[A-Z]{1,16}$`
-- 0.9 against 0.3. That was 6 % of PostgreSQL's samples under the bench's 200 ms
-- cell (perf: the regex executor's `miss`). Each new test accepts exactly the
-- values the old one did.
--
-- Online: the release before writes values both accept. Each statement runs on
-- its own (the runner's @no-transaction), and each can run again after a
-- failure part-way: the new checks are added NOT VALID (a catalog change under
-- the table's lock for milliseconds, no row read), then validated under a lock
-- no read or write waits on, then the old ones dropped; at every point at least
-- one of each pair holds. Apart, not one ALTER TABLE: Citus refuses ADD
-- CONSTRAINT beside other subcommands.
do $$
begin
  if not exists (select 1 from pg_constraint where conrelid = 'idempotency_keys'::regclass and conname = 'idempotency_keys_fingerprint_hex') then
    alter table idempotency_keys add constraint idempotency_keys_fingerprint_hex
      check (length(fingerprint) = 64 and fingerprint ~ '^[0-9a-f]+$') not valid;
  end if;
  if not exists (select 1 from pg_constraint where conrelid = 'idempotency_keys'::regclass and conname = 'idempotency_keys_method_letters') then
    alter table idempotency_keys add constraint idempotency_keys_method_letters
      check (length(method) <= 16 and method ~ '^[A-Z]+$') not valid;
  end if;
end
$$;
alter table idempotency_keys validate constraint idempotency_keys_fingerprint_hex;
alter table idempotency_keys validate constraint idempotency_keys_method_letters;
alter table idempotency_keys drop constraint if exists idempotency_keys_fingerprint_check;
alter table idempotency_keys drop constraint if exists idempotency_keys_method_check;
