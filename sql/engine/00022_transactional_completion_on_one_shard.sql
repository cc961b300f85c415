-- @online
-- The transactional completion (core/complete.ts) of a key of the new form
-- (00020) inserts its answer by value, not by INSERT ... SELECT.
--
-- On Citus the INSERT ... SELECT from the key table was not routed to the
-- tenant's shard as one command: it reached the tenant's worker on a second
-- connection within the transaction, which then committed in two phases
-- (test/citus/request-path.test.ts: PREPARE TRANSACTION for each transactional
-- completion). Read first, then a plain INSERT: each statement is routed by
-- its tenant, as the old form's are. On one PostgreSQL nothing changes but a
-- statement's split.
--
-- Online: a function replaced (CREATE OR REPLACE: a call that runs keeps the
-- definition it started with); the release before calls it with the same
-- arguments and gets the same answer.
create or replace function idempotency_complete(
  p_tenant text, p_key text, p_lease bigint,
  p_status smallint, p_headers jsonb, p_body text, p_now timestamptz
) returns timestamptz language plpgsql as $$
declare
  v_at timestamptz := coalesce(p_now, clock_timestamp());
  v_stale_at timestamptz;
  v_request_id uuid;
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
  select request_id into v_request_id from idempotency_keys where tenant = p_tenant and key = p_key;
  insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
  values (p_tenant, v_request_id, v_at, p_status,
          -- As src/core/key-states.ts answerHeadersStored writes them.
          (case when p_headers->>'content-type' = 'application/json' then p_headers - 'content-type'
                when p_headers ? 'content-type' then p_headers
                else p_headers || '{"content-type": null}' end)::text,
          p_body);
  return v_at;
end
$$;
