-- @online
-- Fewer bytes per key (issue 40): a completion clears the route's summary
-- (src/core/completion-sql.ts, and idempotency_complete below). A summary
-- tells an operator what a request in flight or released was (a stuck key's
-- customer and amount); once the request completed, its answer says that. A
-- payment's completed row is 605 B instead of 676 (row and line pointer,
-- bench/key-bytes.ts). The fillfactor stays: an app on the plugin whose claims
-- carry no summary has no bytes to win there, and its completions need the
-- room (the engine's own rows: 88 % heap-only at 35 against 100 % at 32). The
-- payments service, whose claims carry one, fills its pages further
-- (sql/service/00007).
--
-- Online: the release before keeps the summary of the keys it completes, and
-- never read a completed key's; its calls of idempotency_complete (same
-- signature) clear it from now on.

-- The transactional completion (core/complete.ts), as in 00005 with the summary cleared.
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
     set status = 'done', completed_at = v_at, owner = null, stale_at = null, summary = null,
         response_status = p_status, response_headers = p_headers, response_body = p_body
   where tenant = p_tenant and key = p_key;
  delete from idempotency_processing where stale_at = v_stale_at and tenant = p_tenant and key = p_key;
  return v_at;
end
$$;
