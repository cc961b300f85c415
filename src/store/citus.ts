/**
 * Citus (distributed PostgreSQL): whether this database is a Citus
 * coordinator with our tables distributed, moving a database that was
 * migrated before citus was added onto its workers online, and which workers
 * the coordinator cannot reach (readiness, store/health.ts).
 *
 * The layout (sql/engine/00011 and 00020, sql/service/00006): by tenant, co-located,
 * idempotency_keys, idempotency_processing, idempotency_audit, idempotency_answers and payments;
 * reference tables idempotency_processes, idempotency_settings and idempotency_key_form; on the
 * coordinator alone idempotency_secrets and admin_sessions.
 */
import postgres from 'postgres'
import { driverConnection, type ConnectionSettings } from './connection-settings'
import { MIGRATION_LOCK_ID, takeMigrationLock } from './migrate'

type Sql = postgres.Sql | postgres.TransactionSql

/** Distributed by tenant, co-located with the first (the order they are distributed in). */
export const DISTRIBUTED_TABLES = ['idempotency_keys', 'idempotency_processing', 'idempotency_audit', 'idempotency_answers', 'payments'] as const
/** A copy on every node: read by statements routed to a worker. */
export const REFERENCE_TABLES = ['idempotency_settings', 'idempotency_processes', 'idempotency_key_form'] as const

/**
 * - none: no citus extension (plain PostgreSQL);
 * - local: citus is there but idempotency_keys is a local table of the
 *   coordinator (migrated before citus was added: `npm run migrate -- --distribute`);
 * - distributed: the layout above.
 */
export type CitusMode = 'none' | 'local' | 'distributed'

export async function citusMode(sql: Sql): Promise<CitusMode> {
  const [citus] = await sql<{ found: boolean }[]>`select exists (select 1 from pg_extension where extname = 'citus') as found`
  if (!citus!.found) return 'none'
  // Apart from the check above: pg_dist_partition does not exist where citus is not.
  const [keys] = await sql<{ found: boolean }[]>`
    select exists (select 1 from pg_dist_partition where logicalrelid = to_regclass('idempotency_keys')) as found`
  return keys!.found ? 'distributed' : 'local'
}

/** Whether the engine's tables are distributed by Citus here (the request path and operators' work take their Citus forms). */
export async function isCitus(sql: Sql): Promise<boolean> {
  return await citusMode(sql) === 'distributed'
}

export interface DistributeResult {
  /** Tables distributed or made reference tables by this run, in order. */
  readonly tables: readonly string[]
  /** Functions made known to Citus by this run (on every node; by p_tenant where it is the first argument). */
  readonly functions: readonly string[]
}

/**
 * Distributes a migrated database that still has local tables on a Citus
 * coordinator (citus added after it was migrated), online: each table by
 * `create_distributed_table_concurrently`, which copies its rows while
 * writes go on and blocks them only for the switch at the end; so it runs
 * outside any transaction, and needs `wal_level = logical` on the
 * coordinator. The small tables become reference tables (a copy, under
 * their lock for the few rows they hold). Every function of the schema is
 * then made on every node, and one whose first argument is `p_tenant` (the
 * request path's, sql/engine/00012) distributed by it, beside the keys.
 *
 * Between one table's switch and the next, a statement joining the two
 * (keys and their processing list) fails: a few milliseconds per table,
 * answered 500 or 503 to the requests caught in them, never a wrong row.
 *
 * Safe to run again (distributed tables are passed over), and under the
 * migration runner's lock, so no migration runs beside it.
 */
export async function distributeOnline(database: string | ConnectionSettings, options: { log?: (line: string) => void } = {}): Promise<DistributeResult> {
  const log = options.log ?? (() => undefined)
  const { url, options: where } = driverConnection(database)
  const sql = postgres(url, { ...(where as object), max: 1, fetch_types: false, onnotice: () => undefined, connect_timeout: 10 })
  try {
    if (await citusMode(sql) === 'none') throw new Error('this database has no citus extension: create it on the coordinator first (docs/how-to/citus.md)')
    await takeMigrationLock(sql)
    try {
      // The listing triggers (sql/engine/00005) and the audit's (00011) each act on their own shard's row.
      await sql`set citus.enable_unsafe_triggers = on`
      const tables: string[] = []
      for (const table of REFERENCE_TABLES) {
        if (await citusTable(sql, table)) continue
        log(`${table}: reference table`)
        await sql`select create_reference_table(${table})`
        tables.push(table)
      }
      for (const table of DISTRIBUTED_TABLES) {
        if (!await exists(sql, table) || await citusTable(sql, table)) continue
        log(`${table}: distributing by tenant, online`)
        if (table === DISTRIBUTED_TABLES[0]) await sql`select create_distributed_table_concurrently(${table}, 'tenant')`
        else await sql`select create_distributed_table_concurrently(${table}, 'tenant', colocate_with => ${DISTRIBUTED_TABLES[0]})`
        tables.push(table)
      }
      // The schema's own functions (not an extension's), not yet known to Citus: those taking p_tenant first run
      // where that tenant's shard is; the others are made on every node (the request path's call them there).
      const functions: string[] = []
      const candidates = await sql<{ signature: string; byTenant: boolean }[]>`
        select p.oid::regprocedure::text as signature, coalesce(p.proargnames[1] = 'p_tenant', false) as "byTenant" from pg_proc p
         where p.pronamespace = 'public'::regnamespace and p.prokind = 'f'
           and not exists (select 1 from pg_depend d where d.classid = 'pg_proc'::regclass and d.objid = p.oid and d.deptype = 'e')
           and not exists (select 1 from pg_dist_object o where o.classid = 'pg_proc'::regclass and o.objid = p.oid)
         order by 2, 1`
      for (const { signature, byTenant } of candidates) {
        log(`${signature}: ${byTenant ? 'distributed by p_tenant' : 'made on every node'}`)
        if (byTenant) await sql`select create_distributed_function(${signature}, 'p_tenant', colocate_with => ${DISTRIBUTED_TABLES[0]})`
        else await sql`select create_distributed_function(${signature})`
        functions.push(signature)
      }
      return { tables, functions }
    } finally {
      await sql`select pg_advisory_unlock(${MIGRATION_LOCK_ID})`.catch(() => undefined)
    }
  } finally {
    await sql.end({ timeout: 5 })
  }
}

const exists = async (sql: Sql, table: string): Promise<boolean> =>
  (await sql<{ found: boolean }[]>`select to_regclass(${table}) is not null as found`)[0]!.found

const citusTable = async (sql: Sql, table: string): Promise<boolean> =>
  (await sql<{ found: boolean }[]>`select exists (select 1 from pg_dist_partition where logicalrelid = to_regclass(${table})) as found`)[0]!.found

export interface WorkerReach {
  /** host:port as the coordinator knows it (pg_dist_node). */
  readonly node: string
  readonly reachable: boolean
}

/**
 * A worker this slow to answer counts as unreachable: a stopped one refuses
 * at once, a hung host would hold the check for citus.node_connection_timeout
 * (30 s by default).
 */
export const WORKER_CHECK_TIMEOUT_MS = 1_000

/**
 * Every active primary worker and whether the coordinator reaches it now: a
 * `select 1` run on each through the coordinator's own connections
 * (run_command_on_workers, which reports a node it cannot reach instead of
 * failing). Empty where this is no Citus coordinator.
 */
export async function workerReach(sql: postgres.Sql): Promise<WorkerReach[]> {
  if (await citusMode(sql) === 'none') return []
  return sql.begin(async (tx) => {
    await tx.unsafe(`set local citus.node_connection_timeout = ${WORKER_CHECK_TIMEOUT_MS}`)
    const rows = await tx<{ node: string; success: boolean }[]>`
      select w.nodename || ':' || w.nodeport as node, w.success from run_command_on_workers('select 1') w
       order by w.nodename, w.nodeport`
    return rows.map((row) => ({ node: row.node, reachable: row.success }))
  })
}
