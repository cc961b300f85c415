import { DatabaseUnavailableError, isUnavailable, raisedByEngine } from './errors'

interface QueryInternals {
  handler: (query: unknown) => void
  reject: (error: unknown) => void
}

/**
 * Wraps a postgres.js reserved connection (or transaction handle) so that
 * queries made through it after its connection was lost never reach a
 * connection.
 *
 * Why: when the connection under a transaction is lost (database restart,
 * killed backend) while the handler is busy elsewhere (waiting on the payment
 * provider), postgres.js 3.4 still sends the handler's next query to the same
 * connection object. That object is either closed, and the write crashes the
 * whole process from a timer ("null is not an object (evaluating
 * 'socket.write')"), or already reconnected for another request, so the stale
 * INSERT would run in someone else's session, outside the transaction that
 * completes its key: a payment with no stored answer, paid again by the retry.
 * Found by test/chaos/postgres-restart.test.ts (the service process died).
 *
 * Errors of its statements are noted as the engine's (errors.ts,
 * raisedByEngine), whatever the route's code does with them.
 *
 * The handle is over when `isOver()` says so (the owner learns of the close
 * from the connection, see complete.ts) or as soon as a query through it fails
 * for a lost connection.
 */
export function guardTransaction<Handle extends object>(tx: Handle, isOver: () => boolean): Handle {
  let lost = false
  const guard = <Q>(query: Q): Q => {
    const internals = query as unknown as Partial<QueryInternals>
    if (!(query instanceof Promise) || typeof internals.handler !== 'function' || typeof internals.reject !== 'function') return query
    const { handler, reject } = internals as QueryInternals
    // Every error of a statement sent through here is noted as the engine's: a route's recording step that lets it
    // through fails for the database (a retry, 503, the lock-timeout answer), not as the route's own failure.
    internals.reject = (error) => {
      if (isUnavailable(error)) lost = true
      reject(raisedByEngine(error))
    }
    internals.handler = (self) => (lost || isOver() ? reject(raisedByEngine(new DatabaseUnavailableError(new Error('the connection under this transaction was lost')))) : handler(self))
    return query
  }
  return new Proxy(tx, {
    apply: (target, self, args) => guard(Reflect.apply(target as (...a: unknown[]) => unknown, self, args)),
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver)
      if ((property === 'unsafe' || property === 'file') && typeof value === 'function')
        return (...args: unknown[]) => guard((value as (...a: unknown[]) => unknown).apply(target, args))
      // A savepoint's statements go through a handle of its own (`tx.savepoint(async (sp) => ...)`): guarded alike.
      if (property === 'savepoint' && typeof value === 'function')
        return (...args: unknown[]) => (value as (...a: unknown[]) => unknown).apply(target, args.map((arg) =>
          typeof arg === 'function' ? (inner: object) => (arg as (sql: object) => unknown)(guardTransaction(inner, isOver)) : arg))
      return value
    },
  })
}
