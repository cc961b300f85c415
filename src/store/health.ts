import postgres from 'postgres'
import { log as processLog, type Logger } from '../log'
import { driverConnection, type ConnectionSettings } from './connection-settings'
import { citusMode, workerReach } from './citus'
import { connectionOf, driverOptions, reconnectBackoff } from './db'

/**
 * 500 ms between probes: an outage is noticed within ~0.5 s (a refused
 * connect fails at once), a stalled write path within PROBE_SLOW_MS + 0.5 s.
 */
const PROBE_INTERVAL_MS = 500
/**
 * A probe unanswered this long marks the database down. Its commit is one
 * WAL flush and, with a synchronous standby, one round trip to it: milliseconds.
 * 2 s (the former rule's two slow probes of 1 s) keeps one slow answer on a
 * saturated machine (a benchmark) from turning traffic away.
 */
const PROBE_SLOW_MS = 2_000
/** A connect that takes longer than this counts as a failure. */
const CONNECT_TIMEOUT_SECONDS = 1

/**
 * The probe is a write, the smallest one there is: a transactional logical
 * decoding message. It needs no table and leaves no row (nothing to vacuum),
 * but it takes a transaction id and writes WAL, so its COMMIT goes down the
 * write path of every request: the WAL flush, and the wait for the
 * synchronous standby's acknowledgement. A read (`select 1`) answered
 * happily while every write hung on a stalled synchronous standby
 * (test/scale/patroni.scale.ts). It also fails on a standby (recovery cannot
 * write), so a connection that landed on one is not ready either.
 *
 * `select txid_current()` would not do: a transaction whose only act is to
 * take a transaction id commits without flushing and without waiting for the
 * standby (PostgreSQL waits only when the transaction wrote WAL before its
 * commit record).
 *
 * Cost per probe (docs/how-to/ha-patroni.md, measured by `npm run bench:scale`): one
 * transaction id, about 100 bytes of WAL, one WAL flush, one standby round
 * trip. At 2 probes a second per process that is 172,800 transaction ids a
 * day per process, against the 2 per payment of the traffic; logical
 * decoding consumers see the messages only if they ask for messages.
 */
const WRITE_PROBE = "select pg_logical_emit_message(true, 'idempotent-post:readiness', '')"
/** Where the role may not call it (42501) or it does not exist (42883): reachability only, said once, loudly. */
const READ_PROBE = 'select 1'
const FALLBACK_CODES = new Set(['42501', '42883'])

/**
 * How long a request that needs the database waits for it to come back
 * before its 503 (server.ts): Patroni's switchover took 2.65 s in the suite's
 * run; the probe notices the new primary within its 0.5 s interval.
 */
export const DATABASE_WAIT_MS = 4_000

/**
 * On a Citus coordinator, how often the workers are checked (store/citus.ts
 * workerReach: a `select 1` on each through the coordinator's connections, on
 * a connection of its own, so a worker slow to refuse never delays the write
 * probe). A stopped worker is named within about this long.
 */
const WORKER_CHECK_INTERVAL_MS = 1_000

export interface DatabaseHealthOptions {
  /** DATABASE_PGBOUNCER=1: no prepared statements, no session settings as startup parameters. @default false */
  readonly pgbouncer?: boolean
  /** @default the process's logger */
  readonly log?: Logger
}

/**
 * Whether the database takes writes, known without asking it on the request
 * path: /readyz answers from it, and while it is false requests that need
 * the database wait for it briefly (a failover's seconds, `whenUp`), then are
 * answered 503 (server.ts), instead of queueing behind reconnects.
 *
 * Why: while the database is away, postgres.js queues every query until a
 * reconnect succeeds, so requests hang instead of failing (test/chaos/
 * postgres-restart.test.ts: POSTs waited up to 3 s, 19 s with postgres.js's
 * default backoff). While a synchronous standby is stalled, every commit
 * waits for it, with no error at all. With this gate, requests are answered
 * 503 within DATABASE_WAIT_MS while the probe fails or hangs, and nothing
 * piles up for longer. The
 * probe has its own connection, so it never queues behind the pools' work,
 * and at most one probe is outstanding: one stuck in a commit is waited on
 * (and judged by its age), not stacked behind.
 */
export class DatabaseHealth {
  readonly #sql: postgres.Sql
  readonly #timer: ReturnType<typeof setInterval>
  readonly #log: Logger
  #up = true
  #waiting: (() => void)[] = []
  #statement = WRITE_PROBE
  /** When the outstanding probe was sent, and its answer. */
  #outstanding: { since: number; answer: Promise<boolean> } | undefined
  /** Asked once, on the probe's connection, before the first probe: whether this is a Citus coordinator. */
  #citus: Promise<void> | undefined
  #workers: { sql: postgres.Sql; timer: ReturnType<typeof setInterval>; checking: boolean } | undefined
  #unreachable: readonly string[] = []
  #allWorkersDown = false
  readonly #settings: ConnectionSettings
  readonly #pgbouncer: boolean
  readonly #applicationName: string

  constructor(database: string | ConnectionSettings, applicationName = 'idempotent-post:health', options: DatabaseHealthOptions = {}) {
    const pgbouncer = options.pgbouncer ?? false
    this.#log = options.log ?? processLog
    const settings = connectionOf(database)
    this.#settings = settings
    this.#pgbouncer = pgbouncer
    this.#applicationName = applicationName
    this.#sql = postgres(driverConnection(settings).url, {
      ...(driverOptions(settings, pgbouncer) as object),
      max: 1,
      connect_timeout: CONNECT_TIMEOUT_SECONDS,
      backoff: reconnectBackoff,
      idle_timeout: 0,
      fetch_types: false,
      onnotice: () => undefined,
      // PgBouncer refuses startup parameters; the probe's age bounds it anyway.
      // A commit waiting for its standby is not ended by statement_timeout (PostgreSQL turns it off to commit).
      connection: pgbouncer ? { application_name: applicationName } : { application_name: applicationName, statement_timeout: PROBE_SLOW_MS },
    })
    this.#timer = setInterval(() => void this.probe(), PROBE_INTERVAL_MS)
  }

  /**
   * False after a failed probe, or while one has gone unanswered for
   * PROBE_SLOW_MS; true again once one succeeds. On a Citus coordinator also
   * false while no worker answers (no tenant can be served); one worker down
   * leaves it true, the others' tenants are served (unreachableWorkers names it).
   */
  get up(): boolean {
    return this.#up && !this.#allWorkersDown
  }

  /** On a Citus coordinator, the workers (host:port) it could not reach at the last check; empty elsewhere. */
  get unreachableWorkers(): readonly string[] {
    return this.#unreachable
  }

  /**
   * Resolves true as soon as the database is up (at once when it is), false
   * when `timeoutMs` passes first: a request that came during a failover or a
   * restart waits for it, briefly, instead of being refused at once.
   */
  whenUp(timeoutMs: number): Promise<boolean> {
    if (this.#up) return Promise.resolve(true)
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => {
        this.#waiting = this.#waiting.filter((waiter) => waiter !== done)
        resolve(false)
      }, timeoutMs)
      const done = () => {
        clearTimeout(timer)
        resolve(true)
      }
      this.#waiting.push(done)
    })
  }

  #set(up: boolean): void {
    this.#up = up
    if (this.up) for (const resolve of this.#waiting.splice(0)) resolve()
  }

  /** Once: on a Citus coordinator, starts checking its workers; elsewhere nothing more (one query at the first probe). */
  #lookForCitus(): Promise<void> {
    this.#citus ??= citusMode(this.#sql).then((mode) => {
      if (mode === 'none') return
      const sql = postgres(driverConnection(this.#settings).url, {
        ...(driverOptions(this.#settings, this.#pgbouncer) as object),
        max: 1, connect_timeout: CONNECT_TIMEOUT_SECONDS, idle_timeout: 0, fetch_types: false, onnotice: () => undefined,
        connection: { application_name: `${this.#applicationName}:workers` },
      })
      const workers = { sql, timer: setInterval(() => void this.#checkWorkers(), WORKER_CHECK_INTERVAL_MS), checking: false }
      this.#workers = workers
      void this.#checkWorkers()
    }, () => { this.#citus = undefined }) // the database away: asked again at the next probe
    return this.#citus
  }

  async #checkWorkers(): Promise<void> {
    const workers = this.#workers
    if (!workers || workers.checking) return
    workers.checking = true
    try {
      const reach = await workerReach(workers.sql)
      const unreachable = reach.filter((worker) => !worker.reachable).map((worker) => worker.node)
      if (unreachable.join() !== this.#unreachable.join())
        this.#log.warn(unreachable.length ? `citus: worker(s) unreachable from the coordinator: ${unreachable.join(', ')}` : 'citus: every worker reachable again', { unreachable_workers: unreachable })
      this.#unreachable = unreachable
      this.#allWorkersDown = reach.length > 0 && unreachable.length === reach.length
    } catch {
      // The coordinator itself away: the write probe says so.
    } finally {
      workers.checking = false
      this.#set(this.#up)
    }
  }

  /** Probes once (or judges the outstanding probe by its age); the result becomes `up`. */
  async probe(): Promise<boolean> {
    if (!this.#citus) await this.#lookForCitus().catch(() => undefined)
    const outstanding = this.#outstanding
    if (outstanding) {
      if (performance.now() - outstanding.since >= PROBE_SLOW_MS) this.#set(false)
      return this.#up
    }
    const since = performance.now()
    const answer = this.#sql.unsafe(this.#statement).then(() => true, (error: unknown) => this.#failed(error))
    this.#outstanding = { since, answer }
    let timer: ReturnType<typeof setTimeout> | undefined
    const slow = new Promise<'slow'>((resolve) => { timer = setTimeout(() => resolve('slow'), PROBE_SLOW_MS) })
    const result = await Promise.race([answer, slow]).finally(() => clearTimeout(timer))
    if (result === 'slow') {
      this.#set(false)
      // The probe stays outstanding until it is answered (its commit may be waiting for a standby).
      void answer.then((ok) => { this.#set(ok); this.#outstanding = undefined })
      return false
    }
    this.#set(result)
    this.#outstanding = undefined
    return result
  }

  #failed(error: unknown): boolean {
    const code = (error as { code?: unknown }).code
    if (this.#statement === WRITE_PROBE && typeof code === 'string' && FALLBACK_CODES.has(code)) {
      this.#statement = READ_PROBE
      this.#log.warn('readiness probes with a read: the write probe is refused, so /readyz cannot see a stalled write path (docs/how-to/ha-patroni.md)', { error, probe: WRITE_PROBE })
    }
    return false
  }

  async close(): Promise<void> {
    clearInterval(this.#timer)
    if (this.#workers) clearInterval(this.#workers.timer)
    await Promise.all([this.#sql.end({ timeout: 1 }), this.#workers?.sql.end({ timeout: 1 })])
  }
}
