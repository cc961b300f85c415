-- @online
-- @no-transaction
-- A payment's primary key is (tenant, id), here and on plain PostgreSQL alike,
-- so that Citus can distribute payments by tenant beside their keys (issue 47):
-- every unique constraint of a distributed table must hold its column.
--
-- Online: the new key's index is built CONCURRENTLY (payments is the largest
-- table after the keys; a plain build would hold off every payment for its
-- whole length), then swapped in under the table's lock for a catalog change
-- only. The release before never names the key; it inserts and reads as before.
-- Each statement runs on its own (the runner's @no-transaction), so each can
-- run again after a failure part-way: an index a failed build left invalid is
-- dropped first.
do $$
begin
  if exists (select 1 from pg_index where indexrelid = to_regclass('payments_tenant_id') and not indisvalid) then
    drop index payments_tenant_id;
  end if;
end
$$;
create unique index concurrently if not exists payments_tenant_id on payments (tenant, id);
alter table payments drop constraint payments_pkey, add constraint payments_pkey primary key using index payments_tenant_id;

-- On a Citus coordinator whose engine tables were distributed (engine 00011),
-- payments joins them, co-located: a payment is written on its key's shard.
-- Distributed here only while empty (a new database); `idem distribute` moves
-- a table with rows online (docs/how-to/citus.md).
do $$
begin
  -- Apart: a condition naming pg_dist_partition is refused where citus is not.
  if not exists (select 1 from pg_extension where extname = 'citus') then
    return;
  end if;
  if exists (select 1 from pg_dist_partition where logicalrelid = 'idempotency_keys'::regclass)
     and not exists (select 1 from pg_dist_partition where logicalrelid = 'payments'::regclass)
     and not exists (select 1 from payments) then
    perform create_distributed_table('payments', 'tenant', colocate_with => 'idempotency_keys');
  end if;
end
$$;
