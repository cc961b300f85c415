import { errorText, log as processLog, type Logger } from '../log'

/**
 * postgres.js (3.4.9) runs internal queries nobody awaits: on every new
 * connection the array-type fetch (`fetchArrayTypes()`, its promise dropped:
 * porsager/postgres#1192), and with target_session_attrs the state check. When
 * such a query fails, its rejection has no handler, and Bun (like Node) exits
 * the process on an unhandled rejection.
 *
 * Seen through PgBouncer with its pool held (test/scale/pgbouncer.scale.ts):
 * the new connection's type fetch waited in PgBouncer's queue, PgBouncer ended
 * it with `FATAL query_wait_timeout` (08P01), and the service died while
 * every request had its own error handled. The connection is gone and the
 * pool opens another on the next query, so nothing is left to do but say so:
 * such rejections are logged, not fatal (invariant 9). Any other unhandled
 * rejection keeps its default (it is thrown again, and the process exits).
 */
export function guardDriverRejections(log: Logger = processLog): () => void {
  const onRejection = (reason: unknown) => {
    if (!fromDriver(reason)) throw reason
    log.warn(`database connection lost in a query of the driver's own: ${errorText(reason)}`, { error: reason })
  }
  process.on('unhandledRejection', onRejection)
  return () => { process.off('unhandledRejection', onRejection) }
}

/** Raised by postgres.js's connection code (its PostgresError, or a connection error it made). */
function fromDriver(reason: unknown): boolean {
  if (!(reason instanceof Error)) return false
  const stack = reason.stack ?? ''
  return /[\\/]postgres(@[^\\/]*)?[\\/]src[\\/]connection\.js/.test(stack)
    && (reason.name === 'PostgresError' || /^CONNECTION_|^CONNECT_TIMEOUT$/.test(String((reason as { code?: unknown }).code)))
}
