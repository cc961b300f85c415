import { Counter, Gauge, Registry } from 'prom-client'
import { DEFAULT_DUPLICATE_WINDOW_KEYS, DEFAULT_DUPLICATE_WINDOW_SECONDS, DEFAULT_RETENTION_SECONDS } from '../config/constants'
import { readKeptRetentionSeconds } from '../core/processes'
import type { Sql } from '../core/types'
import { errorText, type Logger } from '../log'
import { ForcedExpirationTally } from './forced-expirations'
import { readDuplicates } from './read-duplicates'
import { readForcedExpirations } from './read-forced-expirations'
import { readProcessingGauges } from './read-processing-gauges'
import { readPurgeOverdue } from './read-purge-overdue'

/** The database queries, refreshed and timed out independently (a slow duplicates scan never blinds the stale-key alert). */
type Query = 'processing' | 'duplicates' | 'forced_expirations' | 'purge'
const QUERIES: readonly Query[] = ['processing', 'duplicates', 'forced_expirations', 'purge']

/**
 * 5 s: Prometheus scrapes every 15 s to 1 min, so a scrape never sees values
 * older than a third of its own interval, while two or three Prometheus
 * replicas plus a curious operator cost the database one query per 5 s per
 * process instead of one per scrape.
 */
export const DEFAULT_GAUGE_CACHE_MS = 5_000
/**
 * 1 s: the query reads two small partial indexes (a few ms with 1M keys, see
 * docs/reference/metrics.md); a second means the database is in trouble, and a
 * scrape must stay well inside Prometheus' default 10 s scrape timeout.
 */
export const DEFAULT_GAUGE_TIMEOUT_MS = 1_000
/**
 * 1 hour: a client that makes a new key per retry repeats the request within
 * seconds to minutes; an hour catches slow retry loops, and the same customer
 * paying the same amount on purpose twice within the hour is rare enough to
 * deserve a look.
 */
export const DUPLICATE_WINDOW_SECONDS = DEFAULT_DUPLICATE_WINDOW_SECONDS
/**
 * 50,000 keys, the newest: the duplicates query reads at most these, so its
 * cost stops following the traffic. Reading the whole hour took about 1 s,
 * its timeout, at 512,000 completions (about 140 payments/s, issue 40);
 * 50,000 take 140-170 ms on 2 cores, and cover the hour up to about 14
 * payments/s, 8 minutes at 100/s, 50 s at 1,000/s: retries with a new key
 * come within seconds to minutes.
 */
export const DUPLICATE_WINDOW_KEYS = DEFAULT_DUPLICATE_WINDOW_KEYS
/**
 * work_mem of the duplicates query only: its aggregate over 41k completions
 * needed 20 MB and spilled to disk in 5 batches under the default 4 MB; its
 * sort of the newest 50,000 keys takes 8 MB. Beyond this it spills again
 * rather than grow: the memory stays bounded, one query per interval.
 */
const DUPLICATES_WORK_MEM = '32MB'

export interface DatabaseGaugesOptions {
  readonly sql: Sql
  readonly ttlSeconds: number
  /** The retention the purge deletes keys past (idempotency_purge_overdue_seconds), or another process's, if longer (core/processes.ts keptRetentionSeconds). @default DEFAULT_RETENTION_SECONDS */
  readonly retentionSeconds?: number
  /** Tenants that always get a series (0 when nothing is wrong), so alerts see a value, not an absence. */
  readonly tenants?: readonly string[]
  /** Refresh from the database at most once per this many ms, however many scrapers ask. @default 5000 */
  readonly cacheMs?: number
  /** Statement timeout of the gauge query; on timeout the last values are served. @default 1000 */
  readonly timeoutMs?: number
  readonly duplicateWindowSeconds?: number
  /** @default DUPLICATE_WINDOW_KEYS */
  readonly duplicateWindowKeys?: number
  /** Tests move the clock with this. @default the database's now() */
  readonly now?: () => Date | undefined
  readonly log?: Logger
}

/**
 * The gauges computed in PostgreSQL. They describe the database, not this
 * process, so they are the same from every worker: they live in a registry of
 * their own that is never summed across processes (see cluster.ts).
 *
 * `refresh()` is single-flight and cached: concurrent scrapes share one query,
 * and a query runs at most once per `cacheMs`. It never throws and never waits
 * longer than the timeout: on failure the previous values stay and
 * `idempotency_gauges_refresh_failed` says so.
 */
export class DatabaseGauges {
  readonly registry = new Registry()
  /** Queries sent to the database so far (tests check the single-flight with it). */
  queries = 0
  private readonly stale: Gauge<'tenant'>
  private readonly oldest: Gauge
  private readonly duplicates: Gauge<'tenant'>
  private readonly duplicateWindow: Gauge
  private readonly purgeOverdue: Gauge
  private readonly forcedExpirations: Counter<'outcome'>
  private readonly forcedTally = new ForcedExpirationTally()
  private readonly failed: Gauge<'query'>
  private readonly lastSuccess: Gauge<'query'>
  private readonly duration: Gauge<'query'>
  private lastStarted = Number.NEGATIVE_INFINITY
  private inFlight: Promise<void> | undefined
  private readonly running = new Set<Query>()

  constructor(private readonly options: DatabaseGaugesOptions) {
    const registers = [this.registry]
    this.stale = new Gauge({
      name: 'idempotency_stale_processing_keys',
      help: 'Keys in processing whose lease is older than the TTL, per tenant: their worker is probably gone. Global (same from every process): aggregate with max, not sum.',
      labelNames: ['tenant'],
      registers,
    })
    this.oldest = new Gauge({
      name: 'idempotency_oldest_processing_age_seconds',
      help: 'Age of the oldest processing key\'s lease, 0 when none. Global: aggregate with max.',
      registers,
    })
    this.duplicates = new Gauge({
      name: 'idempotency_duplicate_entities',
      help: 'Completions in the recent window (idempotency_duplicate_window_seconds) that repeat the same request (tenant, route, body) under another key: a client making a new key per retry. Global: aggregate with max.',
      labelNames: ['tenant'],
      registers,
    })
    this.duplicateWindow = new Gauge({
      name: 'idempotency_duplicate_window_seconds',
      help: 'The seconds of completions idempotency_duplicate_entities covered at its last refresh: METRICS_DUPLICATE_WINDOW_SECONDS, or less where they hold more than METRICS_DUPLICATE_WINDOW_KEYS keys. Global: aggregate with min.',
      registers,
    })
    this.purgeOverdue = new Gauge({
      name: 'idempotency_purge_overdue_seconds',
      help: 'How long past its retention the next key the purge deletes has waited, 0 when none: the purge is behind or stopped where this grows. Global: aggregate with max.',
      registers,
    })
    // A counter read from the database (see forced-expirations.ts): the audit
    // trail is append-only, so the value only grows, across restarts too.
    this.forcedExpirations = new Counter({
      name: 'idempotency_forced_expirations_total',
      help: 'Operator force-expirations of processing keys by outcome, from the audit trail: admin page, JSON API and CLI alike. Global (same from every process): aggregate with max, not sum.',
      labelNames: ['outcome'],
      registers,
    })
    this.failed = new Gauge({
      name: 'idempotency_gauges_refresh_failed',
      help: '1 when the last refresh of a database gauge query failed or timed out: its gauges show older values.',
      labelNames: ['query'],
      registers,
    })
    this.lastSuccess = new Gauge({
      name: 'idempotency_gauges_last_success_timestamp_seconds',
      help: 'When a database gauge query last succeeded (Unix seconds).',
      labelNames: ['query'],
      registers,
    })
    this.duration = new Gauge({
      name: 'idempotency_gauges_refresh_duration_seconds',
      help: 'How long the last run of a database gauge query took.',
      labelNames: ['query'],
      registers,
    })
    for (const query of QUERIES) {
      this.failed.set({ query }, 0)
      this.lastSuccess.set({ query }, 0)
      this.duration.set({ query }, 0)
    }
    this.stale.reset()
    this.duplicates.reset()
    this.oldest.set(0)
    this.duplicateWindow.set(options.duplicateWindowSeconds ?? DUPLICATE_WINDOW_SECONDS)
    this.zeroTenants(this.stale)
    this.zeroTenants(this.duplicates)
  }

  /** Brings the gauges up to date, at most once per cacheMs; resolves within the timeout. */
  async refresh(): Promise<void> {
    const cacheMs = this.options.cacheMs ?? DEFAULT_GAUGE_CACHE_MS
    if (!this.inFlight && performance.now() - this.lastStarted >= cacheMs) {
      this.lastStarted = performance.now()
      this.inFlight = this.query().finally(() => { this.inFlight = undefined })
    }
    if (!this.inFlight) return
    // The statement timeout ends the query; this deadline also covers a
    // connection that cannot even be opened (a scrape must not hang on it).
    const deadline = (this.options.timeoutMs ?? DEFAULT_GAUGE_TIMEOUT_MS) + 250
    let timer: ReturnType<typeof setTimeout> | undefined
    const late = new Promise<'late'>((resolve) => { timer = setTimeout(() => resolve('late'), deadline) })
    try {
      if ((await Promise.race([this.inFlight, late])) === 'late') for (const query of this.running) this.failed.set({ query }, 1)
    } finally {
      clearTimeout(timer)
    }
  }

  private async query(): Promise<void> {
    this.queries++
    const now = this.options.now?.()
    const window = this.options.duplicateWindowSeconds ?? DUPLICATE_WINDOW_SECONDS
    await Promise.all([
      this.run('processing', (tx) => readProcessingGauges(tx, now), ({ staleByTenant, oldestAgeSeconds }) => {
        this.replace(this.stale, staleByTenant)
        this.oldest.set(oldestAgeSeconds)
      }),
      this.run('duplicates', (tx) => readDuplicates(tx, window, this.options.ttlSeconds, this.options.duplicateWindowKeys ?? DUPLICATE_WINDOW_KEYS, now), ({ byTenant, coveredSeconds }) => {
        this.replace(this.duplicates, byTenant)
        this.duplicateWindow.set(coveredSeconds)
      }, DUPLICATES_WORK_MEM),
      this.readForcedExpirations(),
      this.run('purge', async (tx) => readPurgeOverdue(tx, await readKeptRetentionSeconds(tx, this.options.retentionSeconds ?? DEFAULT_RETENTION_SECONDS), now), (overdue) => this.purgeOverdue.set(overdue)),
    ])
  }

  private readForcedExpirations(): Promise<void> {
    const range = this.forcedTally.range()
    return this.run('forced_expirations', (tx) => readForcedExpirations(tx, range), (read) => {
      const totals = this.forcedTally.apply(range, read)
      this.forcedExpirations.reset()
      // Absent while catching up after a start: a partial count would read as an increase.
      for (const [outcome, n] of totals ?? []) this.forcedExpirations.inc({ outcome }, n)
    })
  }

  /** Runs one gauge query under the statement timeout; on failure its gauges keep their last values. */
  private async run<T>(query: Query, read: (tx: Sql) => Promise<T>, apply: (result: T) => void, workMem?: string): Promise<void> {
    const started = performance.now()
    this.running.add(query)
    try {
      apply(await withStatementTimeout(this.options.sql, this.options.timeoutMs ?? DEFAULT_GAUGE_TIMEOUT_MS, read, workMem))
      this.failed.set({ query }, 0)
      this.lastSuccess.set({ query }, Date.now() / 1000)
    } catch (error) {
      this.failed.set({ query }, 1)
      this.options.log?.warn(`database gauges: ${query} query failed (${errorText(error)}); serving its last values`, { query, error })
    } finally {
      this.running.delete(query)
      this.duration.set({ query }, (performance.now() - started) / 1000)
    }
  }

  /** Replaces a per-tenant gauge at once (synchronously, so no scrape sees half an update). */
  private replace(gauge: Gauge<'tenant'>, byTenant: ReadonlyMap<string, number>): void {
    gauge.reset()
    this.zeroTenants(gauge)
    for (const [tenant, value] of byTenant) gauge.set({ tenant }, value)
  }

  private zeroTenants(gauge: Gauge<'tenant'>): void {
    for (const tenant of this.options.tenants ?? []) gauge.set({ tenant }, 0)
  }
}

/** Runs `work` in a transaction whose statements are cancelled after `ms` (SQLSTATE 57014). */
async function withStatementTimeout<T>(sql: Sql, ms: number, work: (tx: Sql) => Promise<T>, workMem?: string): Promise<T> {
  if (!('begin' in sql)) throw new Error('database gauges need a pool, not a transaction')
  return (await sql.begin(async (tx) => {
    await tx`select set_config('statement_timeout', ${String(ms)}, true)`
    if (workMem) await tx`select set_config('work_mem', ${workMem}, true)`
    return await work(tx)
  })) as T
}
