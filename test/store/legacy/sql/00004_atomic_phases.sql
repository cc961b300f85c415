-- Atomic phases: the key is claimed in one statement, the foreign calls run
-- with no transaction open, and one short transaction completes the key
-- together with the business writes. Nothing holds a row lock across a
-- foreign call any more, so liveness is told by a heartbeat per process and
-- by the request's deadline, not by a held lock.

-- 'released': the request failed, ran into its deadline, or was force-expired.
-- The row stays (rather than being deleted) so that the retry that runs the
-- request again keeps its request_id, and with it the downstream idempotency
-- key: a provider that charged before the failure returns that same charge.
alter table idempotency_keys drop constraint idempotency_keys_status_check;
alter table idempotency_keys add constraint idempotency_keys_status_check
  check (status in ('processing', 'done', 'released'));

-- The logical request this key stands for. Kept across reclaims, releases and
-- force-expires of the same request; new when the key is reused for another
-- request (another fingerprint after a release, or past retention). The
-- downstream idempotency key is derived from (tenant, key, request_id).
alter table idempotency_keys add column request_id uuid not null default gen_random_uuid();

-- The process holding the current lease (idempotency_processes.id); null when
-- nobody holds it (done, released) or the claimer has no heartbeat.
alter table idempotency_keys add column owner uuid;

-- When the key was released. A released key is kept for the retention from
-- this moment, like a completed one from completed_at: counted from the claim
-- instead, a key stuck for longer than the retention would be purged the
-- instant an operator released it, and its retry would get a new downstream
-- key, so a new charge.
alter table idempotency_keys add column released_at timestamptz;
alter table idempotency_keys add constraint released_has_time check ((status = 'released') = (released_at is not null));
create index idempotency_keys_released_at
  on idempotency_keys (released_at) where status = 'released';

-- One row per running server process, its heartbeat written every few
-- seconds: one write per process, never one per key. A key whose owner's
-- heartbeat is recent is being worked on; force-expire leaves it alone until
-- its deadline (the TTL) unless the owner is gone.
create table idempotency_processes (
  id           uuid        primary key,
  pid          integer     not null,
  hostname     text        not null check (length(hostname) between 1 and 255),
  started_at   timestamptz not null default now(),
  heartbeat_at timestamptz not null default now()
);

-- The settings the service runs with, written by every server at start, so
-- operator commands (the CLI) apply the server's TTL and retention instead of
-- whatever their own shell says.
create table idempotency_settings (
  id                smallint    primary key default 1 check (id = 1),
  ttl_seconds       integer     not null check (ttl_seconds >= 1),
  retention_seconds integer     not null check (retention_seconds >= ttl_seconds),
  updated_at        timestamptz not null default now()
);

-- Completes a key, conditional on the lease: the fence and the state change
-- are one statement. Raises IK409 when the lease is no longer current
-- (reclaimed, force-expired, or completed), so that the COMMIT pipelined
-- behind it rolls the business writes back instead of committing them.
-- completed_at is the clock at completion, not the transaction's start: a
-- request that ran long must not be counted past its retention at commit.
create function idempotency_complete(
  p_tenant text, p_key text, p_lease bigint,
  p_status smallint, p_headers jsonb, p_body text, p_now timestamptz
) returns timestamptz language plpgsql as $$
declare
  v_at timestamptz := coalesce(p_now, clock_timestamp());
begin
  update idempotency_keys
     set status = 'done', completed_at = v_at, owner = null,
         response_status = p_status, response_headers = p_headers, response_body = p_body
   where tenant = p_tenant and key = p_key and lease = p_lease and status = 'processing';
  if not found then
    raise exception 'the lease on this idempotency key was lost' using errcode = 'IK409';
  end if;
  return v_at;
end
$$;

-- A charge id comes from the provider, which may be any service: 64
-- characters fitted only our own simulator's ids.
alter table payments drop constraint payments_provider_ref_check;
alter table payments add constraint payments_provider_ref_check check (length(provider_ref) between 1 and 255);
