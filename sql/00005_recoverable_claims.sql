-- Recoverable claims: the service draws every lease itself (core/lease-id.ts),
-- and each process lists, with its heartbeat, the leases it is working on.
-- A claim whose answer was lost is then known to nobody, and says so: a retry
-- or an operator can take it over at once instead of after the TTL.

-- Leases come from the service (63 random bits). The sequence is gone: after
-- an asynchronous promotion it could hand out a number the old primary had
-- already given, and a worker from before the switch could complete a newer
-- claim of the same key. The default only serves rows written by hand (test
-- factories, an operator's SQL); the engine always sends its own.
alter table idempotency_keys alter column lease set default (random() * 9.2e18)::bigint;
drop sequence idempotency_lease_seq;

-- `leases`: what this process works on, as of its last heartbeat; it covers
-- every claim whose statement began before `leases_as_of` (the beat before:
-- beats are sequential, and a lease is listed from before its claim is sent
-- until its request ends). A key of a live process, claimed before
-- `leases_as_of` and not in `leases`, is worked on by nobody (its claim's
-- answer was lost, or its request ended without releasing it).
alter table idempotency_processes add column leases bigint[] not null default '{}';
alter table idempotency_processes add column leases_as_of timestamptz;
