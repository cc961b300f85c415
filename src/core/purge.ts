import { requestPathForm } from './citus-form'
import { answeredExpired, expired, releasedExpired, retentionCandidate, type Instant } from './policy'
import type { Clock, Sql } from './types'

/**
 * Rows per DELETE. 500 rows take ~5 ms here: short enough that the locks it
 * holds never show up in claim latency, big enough that a backlog of a
 * million expired keys clears in a few minutes of batches.
 */
export const PURGE_BATCH_SIZE = 500

export interface PurgeOptions extends Clock {
  readonly retentionSeconds: number
  /** @default PURGE_BATCH_SIZE */
  readonly batchSize?: number | undefined
  /**
   * Only keys created at or after this: where the previous batch of the same
   * run ended (PurgeBatch.through). Deleted keys stay in the created_at index
   * until vacuum passes, and a batch that starts at the oldest walks all of
   * them again: at 1.8 M purged keys not yet vacuumed, 62 ms a batch (8,437
   * buffers) against 3.2 ms (294) with the bound (bench/day-purge-plan.ts,
   * 10 M keys, BENCHMARKS.md). A key skipped while locked is older than the
   * bound; the next run, which starts without one, gets it.
   */
  readonly from?: Date | undefined
}

export interface PurgeBatch {
  readonly deleted: number
  /** The newest created_at among the keys deleted: the next batch's `from`. Null when none were, or where batches are per tenant (Citus). */
  readonly through: Date | null
}

/**
 * Deletes one batch of completed and released keys past their retention,
 * oldest first; returns how many. Callers loop (with pauses) while a batch
 * comes back full. A released key is kept that long so that a retry of its
 * request keeps the same downstream key (release.ts).
 *
 * Concurrency: the rows are picked FOR UPDATE SKIP LOCKED, so several
 * processes purging at once take disjoint batches and never wait on each
 * other, and a row a claim is renewing right now (reclaim.ts renewExpired,
 * NOWAIT) is skipped. A row renewed before we lock it is re-checked under the
 * lock (READ COMMITTED re-evaluates the WHERE): it is processing again and is
 * left alone. Only done and released keys past retention (policy.ts) are ever deleted. Correctness
 * never depends on the purge running: a claim already treats a done key past
 * retention as new.
 */
export async function purgeExpired(sql: Sql, options: PurgeOptions): Promise<number> {
  return (await purgeExpiredBatch(sql, options)).deleted
}

/** purgeExpired, with where the batch ended (a run's next batch starts there: PurgeOptions.from). */
export async function purgeExpiredBatch(sql: Sql, options: PurgeOptions): Promise<PurgeBatch> {
  const limit = options.batchSize ?? PURGE_BATCH_SIZE
  if (await requestPathForm(sql) === 'statements') return purgeBatch(sql, options, limit)
  // Distributed by tenant (Citus): FOR UPDATE is refused across shards ("could not run distributed query with
  // FOR UPDATE/SHARE commands", the purge failed every minute). So the batch is made of one statement per
  // tenant that has keys past retention, each routed to that tenant's shard and run there as above; the
  // tenants are found by a read without locks over every shard (the same created_at range). No `from`
  // bound there: a batch reaches some tenants only, and a bound past the others' oldest keys would skip them.
  const tenants = await sql<{ tenant: string }[]>`
    select k.tenant from idempotency_keys k
     where ${purgeable(sql, options.now ?? null, options.retentionSeconds)}
     group by k.tenant
     limit ${limit}`
  let deleted = 0
  for (const { tenant } of tenants) {
    if (deleted >= limit) break
    deleted += (await purgeBatch(sql, { ...options, tenant, from: undefined }, limit - deleted)).deleted
  }
  return { deleted, through: null }
}

/** One batch, of every tenant or of `tenant` only (then on Citus one shard's statement). */
async function purgeBatch(sql: Sql, options: PurgeOptions & { tenant?: string }, limit: number): Promise<PurgeBatch> {
  const now = options.now ?? null
  // One range of idempotency_keys_created_at, oldest first: a key past its
  // retention was created before the cut-off (policy.ts), done or released.
  // Deleted by the ctid of the version we locked (locked, it cannot move):
  // measured against deleting by the primary key, 75-100k rows/s instead of
  // 52-64k on 1M keys here, and against the layout before (partial indexes on
  // completed_at and released_at) 59-91k.
  //
  // A key of the new form (sql/engine/00020) is done by its answer, which
  // leaves with it (policy.ts answeredExpired). The conditions are on the row
  // we lock: a take-over that committed before the lock is re-checked on its
  // new version (a renewal's created_at is the renewal's instant, a retake's
  // status no longer 'released').
  const ofTenant = (alias: string) => options.tenant === undefined ? sql`` : sql`and ${sql(alias)}.tenant = ${options.tenant}`
  const rows = await sql`
    with gone as (
      select k.ctid from idempotency_keys k
       where ${purgeable(sql, now, options.retentionSeconds, options.tenant)}
         ${ofTenant('k')}
         ${options.from === undefined ? sql`` : sql`and k.created_at >= ${options.from}`}
       order by k.created_at
       limit ${limit}
         for update of k skip locked
    ),
    deleted as (
      delete from idempotency_keys k
       using gone
       where k.ctid = gone.ctid and (k.status in ('done', 'released') or k.digest is not null)
         ${ofTenant('k')}
      returning k.tenant, k.request_id, k.created_at, k.digest is not null as apart
    ),
    answers_gone as (
      delete from idempotency_answers a using deleted d
       where d.apart and a.tenant = d.tenant and a.request_id = d.request_id ${ofTenant('a')}
    )
    select created_at from deleted`
  // A millisecond before the newest: a Date holds milliseconds, created_at microseconds.
  let newest = Number.NEGATIVE_INFINITY
  for (const { created_at } of rows) newest = Math.max(newest, (created_at as Date).getTime())
  return { deleted: rows.count, through: rows.count > 0 ? new Date(newest - 1) : null }
}

/** Key row `k` (idempotency_keys) that the purge deletes: past its retention, done (in either form) or released; of `tenant` where given (Citus). */
function purgeable(sql: Sql, now: Instant, retentionSeconds: number, tenant?: string) {
  return sql`${retentionCandidate(sql, now, retentionSeconds)}
         and (${expired(sql, now, retentionSeconds)} or ${releasedExpired(sql, now, retentionSeconds)} or ${answeredExpired(sql, now, retentionSeconds, tenant)})`
}
