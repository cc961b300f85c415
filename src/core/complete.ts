import type postgres from 'postgres'
import { DatabaseUnavailableError, isUnavailable, LeaseLostError, SQLSTATE, sqlState } from './errors'
import { guardTransaction } from './transaction-guard'
import type { Clock, Lease, StoredResponse } from './types'

/** The connection the recording step writes through: inside the transaction that completes its key. */
export type TransactionSql = postgres.TransactionSql<Record<string, never>>

/** The recording step: business writes through `tx`, and the answer to store. */
export type Recording = (tx: TransactionSql) => Promise<StoredResponse>

/**
 * The longest a completion may take, counted on our side: the database ends
 * any one statement of ours after 5 s, and a transaction idle for 5 s
 * (store/db.ts), so only a connection that went half-open (no answer, no
 * error: a frozen network or a hung server) ever reaches this. The request
 * then answers 503 instead of hanging.
 */
export const COMPLETION_TIMEOUT_MS = 7_000

export interface CompleteOptions extends Clock {
  readonly timeoutMs?: number
}

/**
 * The completing phase: one short transaction that writes the business rows
 * and completes the key, so a stored answer exists only if they committed
 * (No false success, docs/explanation/invariants.md), and they commit only if the lease still holds (Fencing).
 *
 * Statements, on one connection of the work pool (postgres.js `begin`):
 *   BEGIN; the recording step's writes (e.g. INSERT payment);
 *   SELECT idempotency_complete(...) (the fence: a lease-checked UPDATE that
 *   raises IK409 if the lease is gone); COMMIT.
 * When the fence raises, postgres.js rolls back, the writes vanish with it,
 * and the caller answers lease-lost (409).
 *
 * Why `begin` and not a reserved connection that pipelines BEGIN with the
 * writes (one round trip less): postgres.js 3.4.9's `reserve()` never
 * resolves on a new connection when `fetch_types` is off (porsager/postgres
 * #751, #1219; the fix, #1220, is unreleased), and the type query it runs
 * when on has no handler, so a connection reset during it exited the process
 * (#279; store/db.ts turns it off). Routes on the fast path complete with one
 * autocommit statement instead (declarative recording); this form is for
 * writes that need a transaction of their own.
 *
 * Locks: the key's row is locked only from the fence to the COMMIT: no
 * retry, reclaim or force-expire ever waits on a worker for longer. Nothing
 * here runs while a foreign call is in progress: the caller made the provider
 * call before (atomic phases), with no connection held.
 *
 * A connection lost mid-way is never written through again: see
 * transaction-guard.ts. If it goes half-open, the database still ends our
 * transaction (idle_in_transaction_session_timeout) and with it any lock.
 */
export async function complete(pool: postgres.Sql<Record<string, never>>, lease: Lease, record: Recording, options: CompleteOptions = {}): Promise<StoredResponse> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DatabaseUnavailableError(new Error('the completing transaction got no answer in time'))), options.timeoutMs ?? COMPLETION_TIMEOUT_MS)
  })
  // Over (failed, timed out, or done): nothing may reach the connection through `tx` any more.
  let over = false
  const transaction = pool.begin(async (raw) => {
    const tx = guardTransaction(raw as TransactionSql, () => over)
    const response = await record(tx)
    await tx`
      select idempotency_complete(${lease.tenant}, ${lease.key}, ${lease.lease}, ${response.status},
                                  ${tx.json(response.headers as postgres.JSONValue)}, ${response.body},
                                  ${options.now ?? null}::timestamptz)`
    return response
  }) as Promise<StoredResponse>
  // Seen at once, whatever wins the race below: a connection closed under the
  // transaction ends it here, before the recording step can send anything else.
  transaction.catch(() => { over = true })
  try {
    return await Promise.race([transaction, timedOut])
  } catch (error) {
    over = true
    if (sqlState(error) === SQLSTATE.LEASE_LOST) throw new LeaseLostError()
    if (isUnavailable(error)) throw error instanceof DatabaseUnavailableError ? error : new DatabaseUnavailableError(error)
    throw error
  } finally {
    over = true
    clearTimeout(timer)
  }
}
