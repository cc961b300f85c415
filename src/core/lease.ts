import type postgres from 'postgres'
import { LeaseLostError, SQLSTATE, sqlState } from './errors'
import { release } from './release'
import type { Clock, Lease, Sql, StoredResponse } from './types'

export type TransactionSql = postgres.TransactionSql<Record<string, never>>

/** The work done under a lease: business writes through `tx`, and the answer to store. */
export type LeasedWork = (tx: TransactionSql) => Promise<StoredResponse>

/**
 * Runs `work` while holding `lease`, and completes the key in the same
 * transaction as the work's writes: a stored answer exists only if they
 * committed (invariant 2), and they commit only if the lease still holds
 * (invariant 4).
 *
 * Concurrency: the first statement locks the key row FOR UPDATE and is sent
 * pipelined with the work's first queries (no extra round trip). Holding that
 * lock is how a worker shows it is alive: reclaim and force-expire use NOWAIT
 * and give up on a locked row, so a slow worker is never robbed mid-flight. A
 * claim's INSERT ... ON CONFLICT DO NOTHING does not wait on a FOR UPDATE lock,
 * so retries are still answered at once. The completing UPDATE comes last, just
 * before COMMIT, so the row is never held by an UPDATE while the work runs (a
 * conflicting INSERT would wait on that). If our lock is refused or the lease
 * changed, someone took the key over: everything rolls back.
 *
 * On any failure of `work` the transaction rolls back and the key is released
 * at once, so a retry may run again (invariant 3).
 */
export async function runWithLease(txPool: postgres.Sql<Record<string, never>>, releasePool: Sql, lease: Lease, work: LeasedWork, clock: Clock = {}): Promise<StoredResponse> {
  try {
    return await txPool.begin(async (tx) => {
      const fence = tx<{ lease: string }[]>`
        select lease from idempotency_keys
         where tenant = ${lease.tenant} and key = ${lease.key} and status = 'processing'
           for update nowait`
        .execute()
        .then((rows) => ({ rows, error: undefined }), (error: unknown) => ({ rows: [], error }))
      let response: StoredResponse
      try {
        response = await work(tx)
      } catch (error) {
        await assertHeld(await fence) // a lost lease explains any error that follows it
        throw error
      }
      await assertHeld(await fence)
      await tx`
        update idempotency_keys
           set status = 'done', completed_at = coalesce(${clock.now ?? null}::timestamptz, now()),
               response_status = ${response.status}, response_headers = ${tx.json(response.headers as postgres.JSONValue)},
               response_body = ${response.body}
         where tenant = ${lease.tenant} and key = ${lease.key} and lease = ${lease.lease}`
      return response
    })
  } catch (error) {
    if (!(error instanceof LeaseLostError)) await release(releasePool, lease).catch(() => undefined)
    throw error
  }

  function assertHeld(fence: { rows: { lease: string }[]; error: unknown }): void {
    if (fence.error !== undefined) {
      if (sqlState(fence.error) === SQLSTATE.LOCK_NOT_AVAILABLE) throw new LeaseLostError()
      throw fence.error
    }
    if (fence.rows[0]?.lease !== lease.lease) throw new LeaseLostError()
  }
}
