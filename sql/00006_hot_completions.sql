-- Completions as heap-only (HOT) updates, and a deadline on every claim.
--
-- A completion changes status, completed_at, owner and the stored answer. An
-- UPDATE is HOT (no new index entries, the old version pruned in its page)
-- only if no indexed column changes, predicates of partial indexes included,
-- and the page has room. The partial indexes on status ('processing', 'done',
-- 'released') made every completion a full update: 10,803 updates and 0 HOT
-- after a benchmark, each leaving dead entries in three indexes of the
-- largest table. So idempotency_keys keeps only its primary key and an index
-- on created_at (written at claim, never at completion), and the keys in
-- processing are listed in a small table of their own.

-- The per-row deadline: when a processing key's lease becomes stale. Written
-- at claim (locked_at + the route's TTL), so the gauges, the admin and the CLI
-- judge staleness with no settings of their own, and a route may have a TTL of
-- its own. Null once the key is done or released.
alter table idempotency_keys add column stale_at timestamptz;
update idempotency_keys k
   set stale_at = k.locked_at + make_interval(secs => coalesce((select ttl_seconds from idempotency_settings), 30))
 where k.status = 'processing';
alter table idempotency_keys add constraint processing_has_deadline check ((status = 'processing') = (stale_at is not null));

-- Why a key was released (failed, deadline, shutdown, lost_claim,
-- force_expired): a release after the deadline may follow a charge the
-- provider made late, and operators look those up by their downstream key.
alter table idempotency_keys add column release_reason text
  check (release_reason in ('failed', 'deadline', 'shutdown', 'lost_claim', 'force_expired'));
-- A small summary of the request, chosen by its route and stored with the
-- claim (customer and amount for a payment), so an operator can tell what a
-- stuck or released request was without its body (only its fingerprint is kept).
alter table idempotency_keys add column summary jsonb
  check (summary is null or (jsonb_typeof(summary) = 'object' and length(summary::text) <= 1024));

-- The keys in processing, by deadline: in-flight and stranded requests only
-- (a few hundred, however many completed keys wait for their retention). A row
-- exists exactly while its key is processing, under that key's stale_at; the
-- engine writes both in the same statement (claim, reclaim, completion,
-- release, force-expire). Its primary key is the only index: the stale scans
-- (gauges, admin, expire-stale) read it in order, and every writer knows the
-- key's stale_at, so it also finds the row to delete.
create table idempotency_processing (
  stale_at  timestamptz not null,
  tenant    text        not null,
  key       text        not null,
  locked_at timestamptz not null,
  primary key (stale_at, tenant, key)
) with (
  -- Every row is deleted within seconds of its insert: vacuum it after a
  -- thousand dead rows, not after 20 % of a table that is mostly dead.
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_scale_factor = 0,
  autovacuum_vacuum_insert_threshold = 1000
);
insert into idempotency_processing (stale_at, tenant, key, locked_at)
select stale_at, tenant, key, locked_at from idempotency_keys where status = 'processing';

-- Writes that do not keep the list themselves (a hand-written fix, a test's
-- factory, a process of the previous release during a rolling upgrade) are
-- kept consistent by these triggers: a processing key inserted without a
-- deadline gets one (the recorded TTL, else 30 s) and its entry; a key whose
-- status or locked_at is changed without its stale_at gets both mended; a
-- processing key deleted loses its entry. The engine's own statements write
-- stale_at and the entry themselves, so the WHEN clauses keep these triggers
-- from ever running for them: no function call on the hot path.
create function idempotency_keys_keep_listed() returns trigger language plpgsql as $$
begin
  if tg_op in ('UPDATE', 'DELETE') and old.status = 'processing' then
    delete from idempotency_processing where stale_at = old.stale_at and tenant = old.tenant and key = old.key;
  end if;
  if tg_op = 'DELETE' then
    return old;
  end if;
  if new.status = 'processing' then
    new.stale_at := new.locked_at + make_interval(secs => coalesce((select ttl_seconds from idempotency_settings), 30));
    insert into idempotency_processing (stale_at, tenant, key, locked_at) values (new.stale_at, new.tenant, new.key, new.locked_at);
  else
    new.stale_at := null;
  end if;
  return new;
end
$$;
create trigger idempotency_keys_listed_on_insert before insert on idempotency_keys
  for each row when (new.status = 'processing' and new.stale_at is null)
  execute function idempotency_keys_keep_listed();
create trigger idempotency_keys_listed_on_update before update of status, locked_at, stale_at on idempotency_keys
  for each row when ((old.status = 'processing' or new.status = 'processing')
                     and new.stale_at is not distinct from old.stale_at
                     and (new.status is distinct from old.status or new.locked_at is distinct from old.locked_at))
  execute function idempotency_keys_keep_listed();
create trigger idempotency_keys_listed_on_delete after delete on idempotency_keys
  for each row when (old.status = 'processing')
  execute function idempotency_keys_keep_listed();

drop index idempotency_keys_processing;
drop index idempotency_keys_done_completed_at;
drop index idempotency_keys_released_at;

-- The retention purge and the duplicate-entity gauge read keys by age. A key
-- completes or is released after it was created, so every key past its
-- retention is among those created before the cut-off: a range of this index.
create index idempotency_keys_created_at on idempotency_keys (created_at);

-- Room for the completed version of each row in its own page (HOT needs it):
-- a claimed payment key is about a third of its completed size (653 bytes
-- measured; the stored answer is most of it), so pages filled by claims to
-- 30 % are about full once their keys complete, and the completed table is
-- no larger than with the default. Measured, 4,000 payments at 64 concurrent:
-- fillfactor 30: 100 % of completions HOT; 45: 71 %; 60: 45 %.
alter table idempotency_keys set (fillfactor = 30);

-- The transactional form of the completion (core/complete.ts) keeps its
-- fence function; it now also ends the key's deadline and leaves the
-- processing list. The statement form (core/complete-rows.ts) does the same
-- in SQL of its own.
create or replace function idempotency_complete(
  p_tenant text, p_key text, p_lease bigint,
  p_status smallint, p_headers jsonb, p_body text, p_now timestamptz
) returns timestamptz language plpgsql as $$
declare
  v_at timestamptz := coalesce(p_now, clock_timestamp());
  v_stale_at timestamptz;
begin
  select stale_at into v_stale_at from idempotency_keys
   where tenant = p_tenant and key = p_key and lease = p_lease and status = 'processing'
     for update;
  if not found then
    raise exception 'the lease on this idempotency key was lost' using errcode = 'IK409';
  end if;
  update idempotency_keys
     set status = 'done', completed_at = v_at, owner = null, stale_at = null,
         response_status = p_status, response_headers = p_headers, response_body = p_body
   where tenant = p_tenant and key = p_key;
  delete from idempotency_processing where stale_at = v_stale_at and tenant = p_tenant and key = p_key;
  return v_at;
end
$$;
