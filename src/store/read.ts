import { isUnavailable } from '../core/errors'

/**
 * Runs an idempotent read, and once more if it failed for a lost connection.
 *
 * Why: after a database restart the pool may still hand out a connection
 * whose socket died with the old server; the first query on it fails
 * (CONNECTION_CLOSED) although the database is back and /readyz says so.
 * postgres.js reconnects on the next query, so one retry answers the read
 * instead of a 503. Only reads: a write whose answer was lost may have
 * happened, and must not be sent twice.
 */
export async function retryRead<T>(read: () => Promise<T>): Promise<T> {
  try {
    return await read()
  } catch (error) {
    if (!isUnavailable(error)) throw error
    return read()
  }
}
