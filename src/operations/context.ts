import type { Sql } from '../core/types'
import type { Logger } from '../log'

/**
 * What every operation runs with. The TTL and retention are the server's:
 * its config in the server, the settings row it recorded in the CLI
 * (core/settings.ts), never an operator's shell.
 */
export interface OperationsContext {
  readonly sql: Sql
  readonly ttlSeconds: number
  readonly retentionSeconds: number
  /** Tests move the clock with this. @default the database's now() */
  readonly now?: (() => Date | undefined) | undefined
  /** Counts the keys a manual purge deletes (the server's registry; the CLI has none). */
  readonly purgedKeys?: { inc(value: number): void } | undefined
  /**
   * Where each action (force-expire, expire-stale, purge) writes its one line:
   * the admin passes the request's logger (its request id on the line), the
   * CLI one that writes to stderr. @default src/log.ts's logger
   */
  readonly log?: Logger | undefined
}

/** Input an operation refuses (a malformed filter, cursor or lease): callers answer 400 or exit 2. */
export class OperationInputError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'OperationInputError'
  }
}
