import type postgres from 'postgres'
import { DatabaseUnavailableError, LeaseLostError, SQLSTATE, sqlState } from './errors'
import { guardTransaction } from './transaction-guard'
import type { Clock, Lease, StoredResponse } from './types'

/** The connection the recording step writes through: inside the transaction that completes its key. */
export type TransactionSql = postgres.ReservedSql<Record<string, never>>

/** The recording step: business writes through `tx`, and the answer to store. */
export type Recording = (tx: TransactionSql) => Promise<StoredResponse>

/**
 * The longest a completion may take, counted on our side: the database ends
 * any one statement of ours after 5 s (store/db.ts), so only a connection that
 * went half-open (no answer, no error: a frozen network or a hung server) ever
 * reaches this. The request then answers 503 instead of hanging.
 */
export const COMPLETION_TIMEOUT_MS = 7_000

export interface CompleteOptions extends Clock {
  readonly timeoutMs?: number
}

/**
 * The completing phase: one short transaction that writes the business rows
 * and completes the key, so a stored answer exists only if they committed
 * (No false success, docs/invariants.md), and they commit only if the lease still holds (Fencing).
 *
 * Statements, pipelined on one reserved connection:
 *   round trip 1: BEGIN, then the recording step's writes (e.g. INSERT payment);
 *   round trip 2: SELECT idempotency_complete(...) (the fence: a lease-checked
 *                 UPDATE that raises IK409 if the lease is gone), then COMMIT.
 * When the fence raises, the COMMIT behind it answers ROLLBACK, so the writes
 * vanish with it, and the caller answers lease-lost (409).
 *
 * Locks: the key's row is locked only from the fence to the COMMIT, which
 * travel together: no retry, reclaim or force-expire ever waits on a worker.
 * Nothing here runs while a foreign call is in progress: the caller made the
 * provider call before (atomic phases), with no connection held.
 *
 * A connection lost mid-way is never reused for anything: see
 * transaction-guard.ts. If it goes half-open, the database still ends our
 * transaction (idle_in_transaction_session_timeout) and with it any lock.
 */
export async function complete(pool: postgres.Sql<Record<string, never>>, lease: Lease, record: Recording, options: CompleteOptions = {}): Promise<StoredResponse> {
  let timer: ReturnType<typeof setTimeout> | undefined
  let giveUp: (error: Error) => void = () => undefined
  const timedOut = new Promise<never>((_, reject) => { giveUp = reject })
  timedOut.catch(() => undefined)
  timer = setTimeout(() => giveUp(new DatabaseUnavailableError(new Error('the completing transaction got no answer in time'))), options.timeoutMs ?? COMPLETION_TIMEOUT_MS)

  let reserved: TransactionSql
  try {
    reserved = (await Promise.race([pool.reserve(), timedOut])) as TransactionSql
  } catch (error) {
    clearTimeout(timer)
    throw error instanceof DatabaseUnavailableError ? error : new DatabaseUnavailableError(error)
  }

  let lost = false
  let connection: { onclose?: (() => void) | null; terminate?: () => void } | undefined
  let loseConnection: (error: Error) => void = () => undefined
  const connectionLost = new Promise<never>((_, reject) => { loseConnection = reject })
  connectionLost.catch(() => undefined)
  const tx = guardTransaction(reserved, () => lost)
  const bounded = <T>(promise: Promise<T>): Promise<T> => Promise.race([promise, connectionLost, timedOut])
  let open = false
  try {
    const begin = tx.unsafe('begin', [], {
      onexecute(c: { onclose?: (() => void) | null; terminate?: () => void }) {
        connection = c
        c.onclose = () => { lost = true; loseConnection(new DatabaseUnavailableError(new Error('connection lost during the completing transaction'))) }
        return true
      },
    } as postgres.UnsafeQueryOptions).execute()
    // If BEGIN fails (connection lost), its rejection is seen through the writes;
    // it must not go unhandled, which would exit the process.
    begin.catch(() => undefined)
    open = true

    const response = await bounded(record(tx))
    await bounded(begin)

    const fence = tx`
      select idempotency_complete(${lease.tenant}, ${lease.key}, ${lease.lease}, ${response.status},
                                  ${tx.json(response.headers as postgres.JSONValue)}, ${response.body},
                                  ${options.now ?? null}::timestamptz)`.execute()
    const commit = tx`commit`.execute()
    fence.catch(() => undefined)
    commit.catch(() => undefined)
    const [fenced, committed] = await bounded(Promise.allSettled([fence, commit]))
    open = false
    if (fenced.status === 'rejected') {
      throw sqlState(fenced.reason) === SQLSTATE.LEASE_LOST ? new LeaseLostError() : fenced.reason
    }
    if (committed.status === 'rejected') throw committed.reason
    return response
  } catch (error) {
    if (error instanceof DatabaseUnavailableError && !lost) {
      // Timed out on a connection that answers nothing: never send anything through it again.
      lost = true
      connection?.terminate?.()
    }
    if (open && !lost) await tx`rollback`.catch(() => undefined)
    throw error
  } finally {
    clearTimeout(timer)
    if (connection) connection.onclose = null
    if (!lost) reserved.release()
  }
}
