import { recovering, type RetryCause } from '../core/recovery'

/**
 * A read's time to run again after the connection under it failed: past a
 * database restart the pool may still hand out a connection whose socket died
 * with the old server, and a failover takes a couple of seconds; a read
 * changes nothing, so it may simply run again (core/recovery.ts). Within the
 * claim's own bound, so a read answers no later than a payment would.
 */
export const READ_RECOVERY_MS = 5_000

/**
 * Runs an idempotent read, again (backing off, with jitter) while its
 * connection fails under it, for up to READ_RECOVERY_MS. Only reads: a write
 * whose answer was lost may have happened, and must not be sent twice
 * (claims and completions recover by their lease instead).
 */
export function retryRead<T>(read: () => Promise<T>, onRetry?: (cause: RetryCause) => void): Promise<T> {
  return recovering('read', read, { until: performance.now() + READ_RECOVERY_MS, ...(onRetry ? { onRetry: (_kind, cause) => onRetry(cause) } : {}) })
}
