-- @online
-- Every audit row names its tenant, and on Citus the engine's tables are
-- distributed by tenant (issue 47).
--
-- Citus shards a table by one column, and every unique constraint must hold
-- it: the audit's primary key becomes (tenant, id), here and on plain
-- PostgreSQL alike, so both run one schema. An entry about no single tenant
-- (the manual purge, an expire-stale over every tenant) names ALL_TENANTS,
-- '*' (core/audit.ts), which reads back as no tenant. A release before this
-- one still writes such entries with a NULL tenant: the trigger names them,
-- so it keeps working on this schema. The table holds operators' actions (a
-- row per forced key at most): the new primary key is built under its lock in
-- milliseconds, as 00005 argued for admin_sessions.
create function idempotency_audit_all_tenants() returns trigger language plpgsql as $$
begin
  new.tenant := '*';
  return new;
end
$$;
create trigger idempotency_audit_all_tenants before insert on idempotency_audit
  for each row when (new.tenant is null) execute function idempotency_audit_all_tenants();
update idempotency_audit set tenant = '*' where tenant is null;
alter table idempotency_audit alter column tenant set not null;
alter table idempotency_audit drop constraint idempotency_audit_pkey, add primary key (tenant, id);
-- The trail is listed newest first by id (operations/audit.ts), which the old primary key served.
create index idempotency_audit_id on idempotency_audit (id);

-- Where the citus extension is (a coordinator), the tables become Citus
-- tables; elsewhere nothing more happens.
--
-- By tenant, co-located (each tenant's keys, processing entries, audit and,
-- in the service's line, payments on one shard, so that a request's
-- statements reach one worker): idempotency_keys, idempotency_processing,
-- idempotency_audit.
--
-- Reference tables (a copy on every node, read locally by a statement routed
-- to a worker): idempotency_processes, which the claim reads on the worker to
-- tell whether a key's owner lives (policy.ts workedOn), and
-- idempotency_settings, which the listing trigger of 00005 reads there.
-- A write to a reference table needs every node: the heartbeat fails while a
-- node is down, so liveness is judged against the freshest heartbeat of all,
-- not the clock (core/processes.ts).
--
-- Kept on the coordinator: idempotency_secrets (the admin's cursors, read
-- alone), so nothing a worker does decides whether an operator can list.
--
-- Distributed here only while the tables are empty (a new database: at once).
-- A database that was migrated before citus was added to it keeps its tables
-- local until `idem distribute` moves them online
-- (create_distributed_table_concurrently, docs/how-to/citus.md).
do $$
begin
  -- Apart: a condition naming pg_dist_partition is refused where citus is not.
  if not exists (select 1 from pg_extension where extname = 'citus') then
    return;
  end if;
  if exists (select 1 from pg_dist_partition where logicalrelid = 'idempotency_keys'::regclass)
     or exists (select 1 from idempotency_keys) or exists (select 1 from idempotency_audit) then
    return;
  end if;
  -- The listing triggers of 00005 and the audit's above: each acts on its own shard's row.
  perform set_config('citus.enable_unsafe_triggers', 'on', true);
  perform create_reference_table('idempotency_settings');
  perform create_reference_table('idempotency_processes');
  perform create_distributed_table('idempotency_keys', 'tenant');
  perform create_distributed_table('idempotency_processing', 'tenant', colocate_with => 'idempotency_keys');
  perform create_distributed_table('idempotency_audit', 'tenant', colocate_with => 'idempotency_keys');
end
$$;
