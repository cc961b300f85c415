import pRetry from 'p-retry'
import { DatabaseUnavailableError, isLockFailure, isUnavailable, SQLSTATE, sqlState } from './errors'

/**
 * In-request recovery: a statement whose connection failed under it (a reset,
 * a terminated backend, a pooler's refusal, a primary demoted by a failover)
 * is run again on a fresh connection, within the request's deadline, where
 * that is safe. Each kind is safe for its own reason:
 *
 * - `claim`: sent again with the same lease. It either committed (the row is
 *   then ours: claim.ts recognises its own lease) or it did not (it runs).
 * - `completion`: fenced by the lease. Before sending it again the key is
 *   read: done under our lease means the lost attempt committed; processing
 *   under our lease means it did not; anything else is a lost lease.
 * - `release`: conditional on our lease and `processing`: a second run of a
 *   committed one changes nothing.
 * - `read`: changes nothing.
 *
 * A claim or a completion that gave up on its key's row, locked by another
 * session (lock_timeout, a deadlock, a serialization failure), committed
 * nothing either, and is run again the same way, alone in its statement from
 * then on (claim.ts, http/completion.ts), cause `locked`: a lock that clears
 * before the deadline costs the client nothing (invariant 15).
 *
 * The provider call is never in here: it has its own retries, under its own
 * downstream key (provider/client.ts).
 *
 * Tried from outside before (a loop terminating half the service's backends
 * every 150–400 ms for 12 s): 1,735 of 3,273 answers were 503, every key
 * still with one payment and one charge (test/chaos/terminate-loop.test.ts).
 */
export type StatementKind = 'claim' | 'completion' | 'release' | 'read'
export const STATEMENT_KINDS: readonly StatementKind[] = ['claim', 'completion', 'release', 'read']

/** Why a statement was run again (a bounded label). */
export type RetryCause = 'terminated' | 'connection_lost' | 'refused' | 'read_only' | 'pooler' | 'timeout' | 'locked'
export const RETRY_CAUSES: readonly RetryCause[] = ['terminated', 'connection_lost', 'refused', 'read_only', 'pooler', 'timeout', 'locked']

const REFUSED = new Set([SQLSTATE.CANNOT_CONNECT_NOW, SQLSTATE.TOO_MANY_CONNECTIONS, 'ECONNREFUSED', 'CONNECT_TIMEOUT', 'ENOTFOUND', 'EHOSTUNREACH', '08001', '08004'])

export function retryCause(error: unknown): RetryCause {
  const code = sqlState(error) ?? sqlState((error as { cause?: unknown } | null)?.cause)
  if (code === SQLSTATE.ADMIN_SHUTDOWN || code === '57P02') return 'terminated'
  if (code === SQLSTATE.READ_ONLY_SQL_TRANSACTION) return 'read_only'
  if (isLockFailure(error)) return 'locked'
  if (code === SQLSTATE.PROTOCOL_VIOLATION) return 'pooler'
  if (code !== undefined && REFUSED.has(code)) return 'refused'
  if (code === undefined && error instanceof DatabaseUnavailableError) return 'timeout'
  return 'connection_lost'
}

export interface Recovery {
  /** performance.now() past which no attempt starts: the request's deadline for this statement. */
  readonly until: number
  /** Ends the waiting between attempts at once (a queued claim taken out, a shutdown): rejects with its reason. */
  readonly signal?: AbortSignal | undefined
  /** Told of each retry, before its backoff: the metric. */
  readonly onRetry?: ((kind: StatementKind, cause: RetryCause) => void) | undefined
}

/**
 * 20 ms doubling to 400 ms, randomised 1–2× (p-retry's jitter, as for the
 * provider): a terminated backend is replaced on the next attempt, so the
 * first retry comes at once; a failover takes seconds, and the doubling keeps
 * a process of waiting requests from hammering the new primary's first
 * connections in lockstep. A library rather than a loop of our own: p-retry
 * already carries the provider's retries, with the signal and the time bound.
 */
const BACKOFF = Object.freeze({ minTimeout: 20, factor: 2, maxTimeout: 400, randomize: true })

/**
 * Runs `attempt` (given its number, from 1), again while it fails with an
 * unavailable database (or what `retryable` accepts) and `recovery.until`
 * has not passed; the last failure is thrown as it came. Without `recovery`,
 * one attempt.
 */
export async function recovering<T>(kind: StatementKind, attempt: (attemptNumber: number) => Promise<T>, recovery: Recovery | undefined,
  retryable: (error: unknown, attemptNumber: number) => boolean = isUnavailable): Promise<T> {
  if (!recovery) return attempt(1)
  // The first attempt runs bare: p-retry's machinery (its options, timers and signal listeners) costs
  // every fresh request some microseconds, for a fault most requests never meet.
  try {
    return await attempt(1)
  } catch (error) {
    if (!retryable(error, 1) || performance.now() >= recovery.until || recovery.signal?.aborted) throw error
    counted(recovery, kind, error)
  }
  await Bun.sleep(BACKOFF.minTimeout * (1 + Math.random()))
  const left = recovery.until - performance.now()
  if (left <= 0) return attempt(2)
  return pRetry((attemptNumber) => attempt(attemptNumber + 1), {
    ...BACKOFF,
    retries: 1_000, // bounded by the time
    maxRetryTime: left,
    ...(recovery.signal ? { signal: recovery.signal } : {}),
    shouldRetry: ({ error, attemptNumber }) => {
      if (!retryable(error, attemptNumber + 1) || performance.now() >= recovery.until) return false
      counted(recovery, kind, error)
      return true
    },
  })
}

function counted(recovery: Recovery, kind: StatementKind, error: unknown): void {
  try {
    recovery.onRetry?.(kind, retryCause(error))
  } catch {
    // counting never changes a request
  }
}
