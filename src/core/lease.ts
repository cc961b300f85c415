import type postgres from 'postgres'
import { DatabaseUnavailableError, LeaseLostError, SQLSTATE, sqlState } from './errors'
import { release } from './release'
import { guardTransaction } from './transaction-guard'
import type { Clock, Lease, Sql, StoredResponse } from './types'

/** The connection a handler writes through: inside the transaction that completes its key. */
export type TransactionSql = postgres.ReservedSql<Record<string, never>>

/** The work done under a lease: business writes through `tx`, and the answer to store. */
export type LeasedWork = (tx: TransactionSql) => Promise<StoredResponse>

/**
 * Runs `work` while holding `lease`, and completes the key in the same
 * transaction as the work's writes: a stored answer exists only if they
 * committed (invariant 2), and they commit only if the lease still holds
 * (invariant 4).
 *
 * Concurrency: the transaction's first statement locks the key row FOR UPDATE
 * and checks the lease, before `work` runs, so no side effect (the provider
 * call) ever starts under a lost claim. It waits (bounded by lock_timeout)
 * rather than NOWAIT: whoever else locks a processing row holds it for one
 * statement (a reclaimer, a force-expire, or the purge, whose SKIP LOCKED
 * scan briefly locks a row it re-checks and skips), and the lease read after
 * the wait says whether the key is still ours. NOWAIT here turned the purge's
 * passing lock into false "lease lost" answers that stranded the key for a
 * TTL (test/maintenance/retention-purge.test.ts). Holding that lock is how a
 * worker shows it is alive: reclaim and force-expire use NOWAIT and give up on
 * a locked row, so a slow worker is never robbed mid-flight. A claim's
 * INSERT ... ON CONFLICT DO NOTHING does not wait on a FOR UPDATE lock, so
 * retries are still answered at once. The completing UPDATE comes last, just
 * before COMMIT: a conflicting INSERT would wait on an uncommitted UPDATE.
 *
 * Round trips: BEGIN is pipelined with the fence, and the completing UPDATE
 * with COMMIT, on a reserved connection (postgres.js's `begin` awaits each of
 * them alone): 2 round trips plus the work's own, instead of 4. A pipelined
 * COMMIT after a failed UPDATE answers ROLLBACK without an error, so success
 * is only believed when the UPDATE itself succeeded and changed our row.
 *
 * On any failure of `work` the transaction rolls back and the key is released
 * at once, so a retry may run again (invariant 3).
 */
export async function runWithLease(workPool: postgres.Sql<Record<string, never>>, releasePool: Sql, lease: Lease, work: LeasedWork, clock: Clock = {}): Promise<StoredResponse> {
  const reserved = (await workPool.reserve()) as TransactionSql
  // If the connection is lost mid-work, nothing may be sent through it again,
  // nor may it go back to the pool: see transaction-guard.ts.
  let lost = false
  let connection: { onclose?: (() => void) | null } | undefined
  let loseConnection: (error: Error) => void = () => undefined
  // Settles only if the connection goes away; then the request answers at once
  // (503) instead of after the provider call, e.g. at a shutdown's drain deadline.
  const connectionLost = new Promise<never>((_, reject) => { loseConnection = reject })
  connectionLost.catch(() => undefined)
  const tx = guardTransaction(reserved, () => lost)
  let open = false
  try {
    const begin = tx.unsafe('begin', [], {
      onexecute(c: { onclose?: (() => void) | null }) {
        connection = c
        c.onclose = () => { lost = true; loseConnection(new DatabaseUnavailableError(new Error('connection lost during the transaction'))) }
        return true
      },
    } as postgres.UnsafeQueryOptions).execute()
    const fence = tx<{ lease: string }[]>`
      select lease from idempotency_keys
       where tenant = ${lease.tenant} and key = ${lease.key} and status = 'processing'
         for update`.execute()
    // If BEGIN fails (connection lost), the fence is never awaited; its
    // rejection must not go unhandled, which exits the process (seen in
    // test/chaos/postgres-restart.test.ts: "write CONNECTION_CLOSED", exit 1).
    fence.catch(() => undefined)
    open = true
    await begin
    const rows = await fence.catch((error: unknown) => {
      throw sqlState(error) === SQLSTATE.LOCK_NOT_AVAILABLE ? new LeaseLostError() : error
    })
    if (rows[0]?.lease !== lease.lease) throw new LeaseLostError()

    const response = await Promise.race([work(tx), connectionLost])

    const completed = tx`
      update idempotency_keys
         set status = 'done', completed_at = coalesce(${clock.now ?? null}::timestamptz, now()),
             response_status = ${response.status}, response_headers = ${tx.json(response.headers as postgres.JSONValue)},
             response_body = ${response.body}
       where tenant = ${lease.tenant} and key = ${lease.key} and lease = ${lease.lease}`.execute()
    const commit = tx`commit`.execute()
    const [updated] = await Promise.all([completed, commit])
    open = false
    // Unreachable while we hold the row lock; checked so a bug can never pass for success.
    if (updated.count !== 1) throw new LeaseLostError()
    return response
  } catch (error) {
    if (open) await tx`rollback`.catch(() => undefined)
    if (!(error instanceof LeaseLostError)) await release(releasePool, lease).catch(() => undefined)
    throw error
  } finally {
    if (connection) connection.onclose = null
    if (!lost) reserved.release()
  }
}
