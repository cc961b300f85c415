import type { Sql } from './types'

/**
 * Which form the lane's statements take on this database: `statements` (one
 * statement of writable CTEs per batch, claim-sql.ts and completion-sql.ts,
 * sent as it is) or `functions` (the same statement, per tenant, sent through
 * idempotency_on_shard, a function distributed by tenant: sql/engine/00012,
 * lane.ts).
 *
 * Functions where the key table is distributed by Citus: there a statement
 * that inserts in a CTE cannot be routed to one worker, and became subplans
 * sent to every worker with a two-phase commit (issue 47). Statements
 * everywhere else, a Citus coordinator whose tables are still local included:
 * one round trip, no function around it.
 *
 * Detection is this module's until the store's (H1's src/store/citus.ts) is
 * settled: the citus extension, and idempotency_keys distributed by hash.
 *
 * Asked once per pool, on its first claim or completion: a table is
 * distributed online while the service runs only by an operator who then
 * restarts it (docs/explanation/scaling.md).
 */
export type RequestPathForm = 'statements' | 'functions'

const forms = new WeakMap<Sql, Promise<RequestPathForm>>()

export function requestPathForm(sql: Sql): Promise<RequestPathForm> {
  let form = forms.get(sql)
  if (!form) {
    form = detect(sql)
    forms.set(sql, form)
    // A failed look (the database unreachable) is asked again on the next use, not kept.
    form.catch(() => forms.delete(sql))
  }
  return form
}

async function detect(sql: Sql): Promise<RequestPathForm> {
  const [citus] = await sql<{ installed: boolean }[]>`select exists (select 1 from pg_extension where extname = 'citus') as installed`
  if (!citus?.installed) return 'statements'
  // pg_dist_partition exists only with the extension: asked only then.
  const [keys] = await sql<{ distributed: boolean }[]>`
    select exists (select 1 from pg_dist_partition where logicalrelid = 'idempotency_keys'::regclass and partmethod = 'h') as distributed`
  return keys?.distributed ? 'functions' : 'statements'
}

/**
 * A lane statement in the form idempotency_on_shard runs (sql/engine/00012): each
 * table it names as `{{table}}`, which the worker makes the tenant's local
 * shard. The same text as on one PostgreSQL otherwise: one source for both.
 * The key tables, the heartbeat table the claim reads, and every table a
 * completion inserts into (quoted by completion-sql.ts).
 */
export function onShard(statement: string): string {
  return statement
    .replace(/\b(idempotency_keys|idempotency_processing|idempotency_processes|idempotency_answers|idempotency_key_form)\b(?!")/g, '{{$1}}')
    .replace(/insert into "([a-z_][a-z0-9_]*)"/g, 'insert into {{$1}}')
}

/** The call that runs a lane statement on the tenant's worker (one command, committed there once), its rows named by `columns`. */
export const onShardCall = (columns: string) => `select * from idempotency_on_shard($1, $2, $3, $4) as r(${columns})`
