-- @online
-- The answer's location derived from its body (issue 40), first step: every
-- reader of an answer can rebuild it; nothing stores it apart yet.
--
-- A created resource's answer names it twice: `location: /api/payments/<id>`
-- and the id that opens its JSON body. The header is 65 of the 440 B a
-- completed key's answer takes. An answer whose location is exactly the key's
-- path, a slash and the body's opening id (`{"id":"<id>"`) can store its
-- headers without it, marked by a `+` before the JSON; a reader puts it back
-- (src/core/key-states.ts answerHeadersStored and answerHeadersRead). Any
-- other location (absolute, another path, an id with an escape) is stored as
-- it came.
--
-- Here: the flag that says whether completions do so (false until the
-- contract step 00025 sets it, once no process is left that reads answers
-- without rebuilding the location), and the readers and writer that live in
-- the database: the transactional completion and the operators' view, as the
-- engine's statements read and write (test/core/answers-apart.test.ts
-- compares them).
--
-- Online: a column with a constant default on a one-row table, a function and
-- a view replaced with the same signature and columns; the release before
-- never meets a `+` while the flag is false.
alter table idempotency_key_form add column if not exists location_derived boolean not null default false;

create or replace function idempotency_complete(
  p_tenant text, p_key text, p_lease bigint,
  p_status smallint, p_headers jsonb, p_body text, p_now timestamptz
) returns timestamptz language plpgsql as $$
declare
  v_at timestamptz := coalesce(p_now, clock_timestamp());
  v_stale_at timestamptz;
  v_request_id uuid;
  v_path text;
  v_headers jsonb := p_headers;
  v_mark text := '';
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
  select request_id, path into v_request_id, v_path from idempotency_keys where tenant = p_tenant and key = p_key;
  -- As src/core/key-states.ts answerHeadersStored writes them.
  if coalesce((select f.location_derived from idempotency_key_form f where f.id = 1), false)
     and p_headers->>'location' = v_path || '/' || substring(p_body from '^\{"id":"([^"\\]+)"') then
    v_headers := p_headers - 'location';
    v_mark := '+';
  end if;
  insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
  values (p_tenant, v_request_id, v_at, p_status,
          v_mark || (case when v_headers->>'content-type' = 'application/json' then v_headers - 'content-type'
                          when v_headers ? 'content-type' then v_headers
                          else v_headers || '{"content-type": null}' end)::text,
          p_body);
  return v_at;
end
$$;

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
       coalesce(k.response_headers, (case when left(a.response_headers, 1) = '+'
         then (case when substr(a.response_headers, 2)::jsonb ? 'content-type' then jsonb_strip_nulls(substr(a.response_headers, 2)::jsonb)
                    else substr(a.response_headers, 2)::jsonb || '{"content-type": "application/json"}' end)
              || jsonb_build_object('location', k.path || '/' || substring(a.response_body from '^\{"id":"([^"\\]+)"'))
         else (case when a.response_headers::jsonb ? 'content-type' then jsonb_strip_nulls(a.response_headers::jsonb)
                    else a.response_headers::jsonb || '{"content-type": "application/json"}' end) end)) as response_headers,
       coalesce(k.response_body, a.response_body) as response_body,
       k.digest is not null as apart
  from idempotency_keys k
  left join idempotency_processing e on k.digest is not null and e.tenant = k.tenant and e.key = k.key and e.lease is not null
  left join idempotency_answers a on k.digest is not null and a.tenant = k.tenant and a.request_id = k.request_id;
