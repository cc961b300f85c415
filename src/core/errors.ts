/** SQLSTATEs the engine reacts to, by name. */
export const SQLSTATE = Object.freeze({
  UNIQUE_VIOLATION: '23505',
  CHECK_VIOLATION: '23514',
  LOCK_NOT_AVAILABLE: '55P03',
  QUERY_CANCELED: '57014',
  SERIALIZATION_FAILURE: '40001',
  DEADLOCK_DETECTED: '40P01',
  ADMIN_SHUTDOWN: '57P01',
  CANNOT_CONNECT_NOW: '57P03',
  UNTRANSLATABLE_CHARACTER: '22P05',
  INVALID_TEXT_REPRESENTATION: '22P02',
  TOO_MANY_CONNECTIONS: '53300',
  PROTOCOL_VIOLATION: '08P01',
  READ_ONLY_SQL_TRANSACTION: '25006',
  /** Raised by idempotency_complete() (sql/engine/00003) when the lease is no longer current. */
  LEASE_LOST: 'IK409',
} as const)

/** Errors with a stable code and the HTTP status they map to. */
export class IdempotencyError extends Error {
  constructor(readonly code: string, readonly status: number, message: string, options?: ErrorOptions) {
    super(message, options)
    this.name = 'IdempotencyError'
  }
}

/** The worker's lease was taken over (reclaimed or force-expired) before it could commit. */
export class LeaseLostError extends IdempotencyError {
  constructor() {
    super('LEASE_LOST', 409, 'the claim on this idempotency key was taken over before this request could commit')
  }
}

/** The database could not be reached or answered too slowly. */
export class DatabaseUnavailableError extends IdempotencyError {
  constructor(cause?: unknown) {
    super('DATABASE_UNAVAILABLE', 503, 'the database is unavailable', { cause })
  }
}

export function sqlState(error: unknown): string | undefined {
  return typeof error === 'object' && error !== null && 'code' in error && typeof error.code === 'string'
    ? error.code
    : undefined
}

/** Codes postgres.js gives to connection-level failures, and SQLSTATEs of a server going away. */
const UNAVAILABLE = new Set([
  'CONNECTION_CLOSED', 'CONNECTION_ENDED', 'CONNECTION_DESTROYED', 'CONNECT_TIMEOUT',
  'ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH',
  SQLSTATE.ADMIN_SHUTDOWN, SQLSTATE.CANNOT_CONNECT_NOW, SQLSTATE.TOO_MANY_CONNECTIONS, '57P02', '08000', '08003', '08006', '08001', '08004',
  // PgBouncer's own refusals ("server login has been failing", query_wait_timeout) come as a
  // protocol violation; a node demoted by a failover refuses writes as read-only. Both pass within
  // seconds, so they are the database being away, not a bug (seen as 500s in test/scale/patroni).
  SQLSTATE.PROTOCOL_VIOLATION, SQLSTATE.READ_ONLY_SQL_TRANSACTION,
])

/**
 * A data exception (22) or an integrity constraint violation (23): an error
 * of some member's row, which running the members one by one pins on that
 * member alone (batcher.ts). A lock timeout or a lost connection is no one
 * member's fault, and is not retried that way.
 */
export function isDataError(error: unknown): boolean {
  const code = sqlState(error)
  return code !== undefined && /^2[23][0-9A-Z]{3}$/.test(code)
}

/**
 * A statement that gave up on a lock (lock_timeout, 55P03), or that
 * PostgreSQL ended to break a deadlock or a serialization conflict: it
 * committed nothing, so a claim or a fenced completion can be sent again; and
 * in a statement of many members it is one member's row that waited, so the
 * others are sent again without it (batcher.ts, lane.ts).
 */
export function isLockFailure(error: unknown): boolean {
  const code = sqlState(error)
  return code === SQLSTATE.LOCK_NOT_AVAILABLE || code === SQLSTATE.DEADLOCK_DETECTED || code === SQLSTATE.SERIALIZATION_FAILURE
}

export function isUnavailable(error: unknown): boolean {
  const code = sqlState(error)
  return (code !== undefined && UNAVAILABLE.has(code)) || error instanceof DatabaseUnavailableError
}

/**
 * A statement of the engine failed for a reason other than the database
 * being away (a lock not obtained in time, a statement cancelled, a
 * constraint): the driver's error is its `cause`, and its SQLSTATE is kept as
 * `sqlState` (its own `code` is the engine's, so nothing mistakes it for the
 * driver's). With DatabaseUnavailableError it is what the engine's statements
 * raise where the plugin calls them (engineError), so a failure is answered
 * by where it happened, not by what its code looks like.
 */
export class DatabaseStatementError extends IdempotencyError {
  readonly sqlState: string | undefined
  constructor(cause: unknown) {
    super('DATABASE_STATEMENT_FAILED', 500, `a statement of the engine failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause })
    this.name = 'DatabaseStatementError'
    this.sqlState = sqlState(cause)
  }
}

/**
 * An error of the engine's statements as the engine's own type: the
 * database being away as DatabaseUnavailableError, any other as
 * DatabaseStatementError, each with the driver's error as its `cause`; one
 * of the engine's own (a lost lease, a timeout already wrapped) as it is.
 */
export function engineError(error: unknown): IdempotencyError {
  if (error instanceof IdempotencyError) return error
  if (isUnavailable(error)) return new DatabaseUnavailableError(error)
  return new DatabaseStatementError(error)
}

/** Errors raised by a statement sent through a handle of the engine's: the transaction it hands a route's recording step. */
const RAISED_BY_ENGINE = new WeakSet<object>()

/** Notes that a statement of the engine's handle raised `error` (transaction-guard.ts), and returns it unchanged. */
export function raisedByEngine<E>(error: E): E {
  if (typeof error === 'object' && error !== null) RAISED_BY_ENGINE.add(error)
  return error
}

/**
 * Whether `error` came from a statement sent through the engine's handle,
 * even when the route's code let it through: the route's failure it is not.
 */
export function isRaisedByEngine(error: unknown): boolean {
  return typeof error === 'object' && error !== null && RAISED_BY_ENGINE.has(error)
}
