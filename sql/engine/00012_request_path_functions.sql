-- @online
-- The lane's claim and declarative completion on Citus, in one command to one worker (issue 47).
--
-- On plain PostgreSQL the lane sends each batch as one statement of writable
-- CTEs (core/claim-sql.ts, core/completion-sql.ts). On Citus such a statement
-- cannot reach one worker: its router planner refuses INSERT in a CTE (the
-- claim inserts the key and its processing entry, the completion the route's
-- rows), so every CTE became a subplan whose result went to every worker, with
-- a two-phase commit on each (17 remote commands for one claim), and its CTEs
-- no longer shared one snapshot (the completion's `before` was read after its
-- UPDATE: every completed key stayed on the processing list).
--
-- idempotency_on_shard runs THE SAME statement, sent as its text, on the
-- tenant's worker: distributed by p_tenant and called outside a transaction
-- block, the call is sent to the worker of that tenant's shard as one command
-- and commits there once (no 2PC). There each table the statement names as
-- {{table}} becomes the local shard of the tenant's (lane.ts writes the names
-- so), and the statement runs as on one PostgreSQL: one snapshot for its CTEs,
-- the planner's plan, no volatile-function rules. A plan is prepared once per
-- statement and shard in each worker session (the coordinator keeps its
-- connections to the workers), as the lane prepares it on one PostgreSQL.
--
-- A shard not here (moved by a rebalance between the coordinator's routing and
-- this call) is refused with 40001, a serialization failure: nothing was
-- written, and the lane sends the member again, alone, to the shard's new
-- worker (core/batcher.ts isolate, core/recovery.ts).
--
-- Created everywhere (migrations are one list); distributed, and called, only
-- where citus is (core/citus-form.ts).

-- The local shard of `p_table` that holds p_tenant's rows: a table distributed by
-- tenant and colocated with idempotency_keys, or a reference table (every node has its one shard);
-- its metadata locked for the transaction, as Citus locks it to write it.
create function idempotency_local_shard(p_table regclass, p_tenant text) returns text
language plpgsql as $$
declare
  v_shard bigint;
  v_method char;
begin
  select partmethod into v_method from pg_dist_partition where logicalrelid = p_table;
  if v_method = 'h' then
    v_shard := get_shard_id_for_distribution_column(p_table, p_tenant);
  elsif v_method = 'n' then
    select shardid into v_shard from pg_dist_shard where logicalrelid = p_table;
  else
    raise exception 'table % is neither distributed by tenant nor a reference table', p_table using errcode = '0A000';
  end if;
  -- The lock Citus's own executor takes before it writes a shard (ShareLock, 5, on its metadata): a shard
  -- move's last step takes it exclusively on every node, so no write of ours lands after the move copied the shard.
  perform lock_shard_metadata(5, array[v_shard]);
  if not exists (select 1 from pg_dist_placement where shardid = v_shard and groupid = (select groupid from pg_dist_local_group)) then
    raise exception 'the shard of tenant % of % is not on this node (moved)', p_tenant, p_table using errcode = '40001';
  end if;
  return shard_name(p_table, v_shard);
end
$$;

-- Runs p_statement (its tables named {{table}}) with its parameters $1 and $2
-- (text, or null when the statement has one), on p_tenant's shards of this
-- node: its rows, as the caller's column list names them.
create function idempotency_on_shard(p_tenant text, p_statement text, p_1 text, p_2 text) returns setof record
language plpgsql as $$
declare
  v_table text;
  v_text text := p_statement;
  v_name text;
begin
  -- In one order (by name), as each shard's lock is taken here.
  for v_table in select distinct m[1] from regexp_matches(p_statement, '\{\{([a-z_][a-z0-9_]*)\}\}', 'g') m order by 1 loop
    v_text := replace(v_text, '{{' || v_table || '}}', idempotency_local_shard(v_table::regclass, p_tenant));
  end loop;
  v_name := 'idempotency_' || md5(v_text);
  if not exists (select 1 from pg_prepared_statements where name = v_name) then
    execute format('prepare %I (text, text) as %s', v_name, v_text);
  end if;
  return query execute format('execute %I (%L, %L)', v_name, p_1, p_2);
end
$$;

-- Distributed where the key table is (00011), nowhere else. Two steps: pg_dist_partition
-- exists only with citus, and one condition naming it would fail to plan without it.
do $$
begin
  if not exists (select 1 from pg_extension where extname = 'citus') then
    return;
  end if;
  if exists (select 1 from pg_dist_partition where logicalrelid = 'idempotency_keys'::regclass) then
    perform create_distributed_function('idempotency_on_shard(text, text, text, text)', 'p_tenant', colocate_with => 'idempotency_keys');
    perform create_distributed_function('idempotency_local_shard(regclass, text)');
  end if;
end
$$;
