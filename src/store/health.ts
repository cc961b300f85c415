import postgres from 'postgres'
import { driverOptions, reconnectBackoff } from './db'

/**
 * 500 ms between probes: an outage is noticed within ~0.5 s (a refused
 * connect fails at once), and 2 `select 1` a second cost nothing.
 */
const PROBE_INTERVAL_MS = 500
/** A probe slower than this counts as a failure: the database is there but not answering. */
const PROBE_TIMEOUT_MS = 1_000
/**
 * A refused or broken connection marks the database down at once; slowness
 * only after 2 probes in a row, so that one slow answer on a saturated
 * machine (a benchmark) does not turn traffic away.
 */
const SLOW_PROBES_TO_FAIL = 2

/**
 * Whether the database answers, known without asking it on the request path.
 *
 * Why: while the database is away, postgres.js queues every query until a
 * reconnect succeeds, so requests hang instead of failing. Measured in
 * test/chaos/postgres-restart.test.ts: during a 3 s outage POSTs waited up to
 * 3 s (19 s with postgres.js's default backoff) and the backlog delayed
 * recovery. With this gate, requests are answered 503 at once while the last
 * probe failed, and nothing piles up. The probe has its own connection, so it
 * never queues behind the pools' work.
 */
export class DatabaseHealth {
  readonly #sql: postgres.Sql
  readonly #timer: ReturnType<typeof setInterval>
  #up = true
  #probing = false
  #slowInARow = 0

  constructor(url: string, applicationName = 'idempotent-post:health', options: { pgbouncer?: boolean } = {}) {
    const pgbouncer = options.pgbouncer ?? false
    this.#sql = postgres(url, {
      ...driverOptions(url, pgbouncer),
      max: 1,
      connect_timeout: PROBE_TIMEOUT_MS / 1000,
      backoff: reconnectBackoff,
      idle_timeout: 0,
      fetch_types: false,
      onnotice: () => undefined,
      // PgBouncer refuses statement_timeout as a startup parameter; the probe's own race below bounds it anyway.
      connection: pgbouncer ? { application_name: applicationName } : { application_name: applicationName, statement_timeout: PROBE_TIMEOUT_MS },
    })
    this.#timer = setInterval(() => void this.probe(), PROBE_INTERVAL_MS)
  }

  /** False after a failed probe, until one succeeds. */
  get up(): boolean {
    return this.#up
  }

  /** Asks the database once; the result becomes `up`. */
  async probe(): Promise<boolean> {
    if (this.#probing) return this.#up
    this.#probing = true
    let timer: ReturnType<typeof setTimeout> | undefined
    try {
      const timeout = new Promise<'slow'>((resolve) => { timer = setTimeout(() => resolve('slow'), PROBE_TIMEOUT_MS) })
      const result = await Promise.race([this.#sql`select 1`.then(() => 'ok' as const, () => 'failed' as const), timeout])
      this.#slowInARow = result === 'slow' ? this.#slowInARow + 1 : 0
      this.#up = result === 'ok' || (result === 'slow' && this.#slowInARow < SLOW_PROBES_TO_FAIL)
      return this.#up
    } finally {
      clearTimeout(timer)
      this.#probing = false
    }
  }

  async close(): Promise<void> {
    clearInterval(this.#timer)
    await this.#sql.end({ timeout: 1 })
  }
}
