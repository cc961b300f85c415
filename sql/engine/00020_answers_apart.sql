-- @online
-- @no-transaction
-- The answer apart from its key (issue 40; docs/explanation/scaling.md, "The
-- next layout"), first step: the tables and columns of the key's new form.
-- Keys keep being claimed in the old form until a later contract step switches
-- idempotency_key_form to 'new'.
--
-- A completion in the old form updates the key's row: it grows from about
-- 340 B (claimed) to 680 (with its answer), and the page must keep room for
-- both versions, so the key table is filled to a third and costs 1,300 B a
-- completed key at 10 M keys (BENCHMARKS.md). In the new form the key row is
-- written once, at the claim, and never grows:
--
-- - the key row (idempotency_keys) holds what names the request: tenant, key,
--   method, path, fingerprint, request_id, attempts, created_at, and the lease
--   (written at the claim and by a take-over, never by a completion). Its
--   fingerprint is its 32 bytes (digest), not hex: that is how a statement
--   tells the new form. Its status is null while the request is in flight or
--   done; a release writes 'released' and moves the lease's time, summary and
--   HTTP request id from the entry onto the row, for operators;
-- - the processing entry (idempotency_processing) carries the request in
--   flight: its lease (the fence), the lease's time, owner, summary and HTTP
--   request id. A completion deletes it under its lease and inserts the answer
--   in the same statement; a take-over updates it under the lease it saw;
-- - the answer (idempotency_answers), keyed by tenant and the key's request id.
--
-- Status is where the key's rows are: an entry, processing; an answer, done;
-- 'released' on the key row, released (src/core/key-states.ts).
--
-- Online: a new table, nullable columns, NOT NULL dropped from three columns the
-- release before always writes, a check added NOT VALID and then validated, a unique index built concurrently on the
-- processing list (a few hundred rows). The release before never meets a key
-- of the new form: the form is switched only by a contract step, once no such
-- process lives. Each statement can run again (@no-transaction).

create table if not exists idempotency_answers (
  tenant           text        not null,
  request_id       uuid        not null,
  completed_at     timestamptz not null,
  response_status  smallint    not null check (response_status between 100 and 599),
  -- The headers as JSON text (jsonb costs a dozen bytes more on a two-header object),
  -- without content-type when it is application/json (src/core/key-states.ts).
  response_headers text        not null,
  response_body    text        not null,
  primary key (tenant, request_id)
);
-- The purge's walk, oldest answers first: answers are inserted in completion
-- order, so a block range index finds them at a few bytes per thousand keys
-- (a B-tree took 13-21 B a key, bench/key-layouts.ts).
create index if not exists idempotency_answers_completed_at on idempotency_answers using brin (completed_at);

alter table idempotency_processing add column if not exists lease bigint;
alter table idempotency_processing add column if not exists owner uuid;
alter table idempotency_processing add column if not exists summary jsonb;
alter table idempotency_processing add column if not exists http_request_id text;
-- A new-form key finds its entry by its name (its row has no stale_at). Only
-- the new form's entries: an old-form entry is found by its key's stale_at, and
-- one left behind by a failure must not refuse the key's next claim.
create unique index concurrently if not exists idempotency_processing_key on idempotency_processing (tenant, key) where lease is not null;

alter table idempotency_keys alter column locked_at drop not null;
alter table idempotency_keys alter column status drop not null;
-- The new form's fingerprint as its 32 bytes, not 64 hex characters: 32 B a key less.
alter table idempotency_keys add column if not exists digest bytea;
alter table idempotency_keys alter column fingerprint drop not null;
do $$
begin
  if not exists (select 1 from pg_constraint where conrelid = 'idempotency_keys'::regclass and conname = 'idempotency_keys_one_fingerprint') then
    alter table idempotency_keys add constraint idempotency_keys_one_fingerprint
      check ((fingerprint is null) <> (digest is null) and (digest is null or length(digest) = 32)) not valid;
  end if;
end
$$;
alter table idempotency_keys validate constraint idempotency_keys_one_fingerprint;

-- The form new claims take: one row, 'old' until the contract step.
create table if not exists idempotency_key_form (
  id   smallint primary key default 1 check (id = 1),
  form text     not null check (form in ('old', 'new'))
);
insert into idempotency_key_form (id, form) values (1, 'old') on conflict (id) do nothing;

-- A key's state in either form, with the old form's columns (src/core/key-states.ts
-- KEY_STATES, whose text this is): for operators' queries by hand and for tools.
-- The engine's own statements name the subquery, not this view (on Citus they
-- run on a worker's shards, which a view would hide).
create or replace view idempotency_key_states as
select k.tenant, k.key, k.method, k.path, coalesce(k.fingerprint, encode(k.digest, 'hex')) as fingerprint,
       case when k.digest is null or k.status is not null then k.status
            when a.request_id is not null then 'done'
            else 'processing' end as status,
       k.lease, k.attempts, k.request_id, k.created_at, k.released_at, k.release_reason,
       coalesce(k.locked_at, e.locked_at, k.created_at) as locked_at,
       coalesce(k.stale_at, e.stale_at) as stale_at,
       coalesce(k.owner, e.owner) as owner,
       coalesce(k.summary, e.summary) as summary,
       coalesce(k.http_request_id, e.http_request_id) as http_request_id,
       coalesce(k.completed_at, a.completed_at) as completed_at,
       coalesce(k.response_status, a.response_status) as response_status,
       coalesce(k.response_headers, (case when a.response_headers::jsonb ? 'content-type' then jsonb_strip_nulls(a.response_headers::jsonb)
        else a.response_headers::jsonb || '{"content-type": "application/json"}' end)) as response_headers,
       coalesce(k.response_body, a.response_body) as response_body,
       k.digest is not null as apart
  from idempotency_keys k
  left join idempotency_processing e on k.digest is not null and e.tenant = k.tenant and e.key = k.key and e.lease is not null
  left join idempotency_answers a on k.digest is not null and a.tenant = k.tenant and a.request_id = k.request_id;

-- On a Citus coordinator whose key table is distributed (sql/engine/00011):
-- the answers beside their keys, the form on every node.
do $$
begin
  if not exists (select 1 from pg_extension where extname = 'citus') then
    return;
  end if;
  if not exists (select 1 from pg_dist_partition where logicalrelid = 'idempotency_keys'::regclass) then
    return;
  end if;
  if not exists (select 1 from pg_dist_partition where logicalrelid = 'idempotency_answers'::regclass) then
    perform create_distributed_table('idempotency_answers', 'tenant', colocate_with => 'idempotency_keys');
  end if;
  if not exists (select 1 from pg_dist_partition where logicalrelid = 'idempotency_key_form'::regclass) then
    perform create_reference_table('idempotency_key_form');
  end if;
end
$$;

-- The transactional completion (core/complete.ts) in both forms: the old as
-- in 00017; the new deletes the key's entry under its lease (the fence, as
-- the statement form in core/completion-sql.ts) and inserts the answer.
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
  if found then
    update idempotency_keys
       set status = 'done', completed_at = v_at, owner = null, stale_at = null, summary = null,
           response_status = p_status, response_headers = p_headers, response_body = p_body
     where tenant = p_tenant and key = p_key;
    delete from idempotency_processing where stale_at = v_stale_at and tenant = p_tenant and key = p_key;
    return v_at;
  end if;
  delete from idempotency_processing where tenant = p_tenant and key = p_key and lease = p_lease;
  if not found then
    raise exception 'the lease on this idempotency key was lost' using errcode = 'IK409';
  end if;
  insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
  select p_tenant, k.request_id, v_at, p_status,
         -- As src/core/key-states.ts answerHeadersStored writes them.
         (case when p_headers->>'content-type' = 'application/json' then p_headers - 'content-type'
               when p_headers ? 'content-type' then p_headers
               else p_headers || '{"content-type": null}' end)::text,
         p_body
    from idempotency_keys k where k.tenant = p_tenant and k.key = p_key;
  return v_at;
end
$$;
