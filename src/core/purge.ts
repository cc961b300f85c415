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
}

/**
 * Deletes one batch of completed keys past their retention, oldest first;
 * returns how many. Callers loop (with pauses) while a batch comes back full.
 *
 * Concurrency: the rows are picked FOR UPDATE SKIP LOCKED, so several
 * processes purging at once take disjoint batches and never wait on each
 * other, and a row a claim is renewing right now (reclaim.ts renewExpired,
 * NOWAIT) is skipped. A row renewed before we lock it is re-checked under the
 * lock (READ COMMITTED re-evaluates the WHERE): it is processing again and is
 * left alone. Only status = 'done' past retention is ever deleted. Correctness
 * never depends on the purge running: a claim already treats a done key past
 * retention as new.
 */
export async function purgeExpired(sql: Sql, options: PurgeOptions): Promise<number> {
  const rows = await sql`
    with doomed as (
      select tenant, key from idempotency_keys
       where status = 'done'
         and completed_at <= coalesce(${options.now ?? null}::timestamptz, now()) - make_interval(secs => ${options.retentionSeconds})
       order by completed_at
       limit ${options.batchSize ?? PURGE_BATCH_SIZE}
         for update skip locked
    )
    delete from idempotency_keys k using doomed d
     where k.tenant = d.tenant and k.key = d.key and k.status = 'done'`
  return rows.count
}
