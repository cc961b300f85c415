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

/** The TTL and retention an operator names on the command line (`idem --ttl-seconds 30 --retention-seconds 86400`). */
export interface GivenSettings {
  readonly ttlSeconds?: number | undefined
  readonly retentionSeconds?: number | undefined
}

export interface OperatorSettings {
  readonly ttlSeconds: number
  readonly retentionSeconds: number
  /** Where they come from: the server's record, or the operator's own words. */
  readonly source: 'recorded' | 'given'
}

/**
 * The TTL and retention operator commands apply. The service records its own
 * at every start (core/settings.ts) and those win; an app built on the
 * plugin records none, so there its operator must say them, both, as the
 * app runs with them. Never a default: a guessed retention shorter than the
 * app's purges keys it still replays, and the next retry pays again. A value
 * given where a record exists must agree with it.
 */
export function operatorSettings(recorded: { ttlSeconds: number; retentionSeconds: number } | undefined, given: GivenSettings): OperatorSettings {
  if (recorded) {
    for (const [flag, mine, theirs] of [['--ttl-seconds', given.ttlSeconds, recorded.ttlSeconds], ['--retention-seconds', given.retentionSeconds, recorded.retentionSeconds]] as const)
      if (mine !== undefined && mine !== theirs)
        throw new OperationInputError(`${flag} ${mine} disagrees with the ${theirs} the server recorded in this database; leave it out (the server's value applies)`)
    return { ttlSeconds: recorded.ttlSeconds, retentionSeconds: recorded.retentionSeconds, source: 'recorded' }
  }
  if (given.ttlSeconds === undefined || given.retentionSeconds === undefined)
    throw new OperationInputError('no server has recorded its TTL and retention in this database (an app on the plugin does not): '
      + 'give the ones your app runs with, both, e.g. --ttl-seconds 30 --retention-seconds 86400 (the plugin\'s defaults); '
      + 'or start the payments service on it once')
  if (given.retentionSeconds < given.ttlSeconds)
    throw new OperationInputError(`--retention-seconds (${given.retentionSeconds}) must be at least --ttl-seconds (${given.ttlSeconds})`)
  return { ttlSeconds: given.ttlSeconds, retentionSeconds: given.retentionSeconds, source: 'given' }
}
