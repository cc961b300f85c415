import { release } from './core/release'
import { ShuttingDownError } from './core/deadline'
import { startHeartbeat } from './core/processes'
import { recordServerSettings, type ServerSettings } from './core/settings'
import { InFlight } from './http/in-flight'
import { createMetrics } from './metrics/registry'
import { ClusterMetrics } from './metrics/cluster'
import { DatabaseGauges } from './metrics/gauges'
import { Scrapes } from './metrics/scrapes'
import { collectProcessMetrics } from './metrics/process'
import { buildApp, serve } from './server'
import { installLastResort } from './last-resort'
import { startRetentionPurge } from './maintenance/retention-purge'
import { openPools } from './store/db'
import { knownVersions } from './store/migrate'
import { DatabaseHealth } from './store/health'
import type { Logger } from './log'
import { watchDurability } from './store/durability'
import type { Config } from './config'
import { isPortTaken, portTaken } from './config/port-taken'

/** How long a shutdown waits for in-flight requests before stopping them. */
export const DRAIN_TIMEOUT_MS = 10_000
/** Stopped requests release their keys in one statement; this is plenty, and the last resort releases them from here. */
export const ABORTED_DRAIN_MS = 3_000
/**
 * At most this long, after the last answer, for Prometheus to read /metrics
 * once more (metrics/scrapes.ts): with the drain's 10 + 3 s it stays within
 * the 30 s a container runtime gives before its SIGKILL.
 */
export const LAST_SCRAPE_WAIT_MS = 15_000
/** How often a worker checks that its supervisor still lives: a SIGKILLed supervisor sends no signal. */
const PARENT_POLL_MS = 500

export interface RunOptions {
  readonly log: Logger
  /** Called with the port actually bound (PORT=0 picks one). */
  readonly onListening?: ((port: number) => void) | undefined
  /** Drain as on SIGTERM when the parent process goes away (WORKERS>1 workers). */
  readonly watchParent?: boolean
  /** The parent to watch: the supervisor's pid, known before this process started (it may be gone already). @default process.ppid */
  readonly parentPid?: number
  /**
   * Aborted (reason: the signal's name) when the process is told to stop:
   * main.ts listens from its first line, so a signal during start-up is not
   * lost. @default SIGTERM or SIGINT from now on
   */
  readonly stop?: AbortSignal
}

/**
 * Starts a listener; a port another process holds is said as the setting to
 * change, with a free port to set instead (main.ts exits 2 naming it).
 */
function listen<T>(variable: 'PORT' | 'METRICS_PORT', host: string, port: number, avoid: readonly number[], start: () => T): T {
  try {
    return start()
  } catch (error) {
    if (!isPortTaken(error)) throw error
    throw portTaken(variable, host, port, avoid)
  }
}

/**
 * A TTL or retention other than the one the last instance started with: a
 * configuration change rolling through the instances. While both run, a key
 * is protected for the shorter retention (the instance with it answers a
 * retry past it as a new request, and its purge deletes the row), and an
 * instance with the longer one may still replay what the other treats as
 * gone; a shorter TTL reclaims sooner. Said once, at start, so the operator
 * finishes the roll (docs/how-to/upgrade.md, "Changing the TTL or the retention").
 */
function warnOnChangedSettings(log: Logger, previous: ServerSettings | undefined, config: Config): void {
  if (!previous) return
  const changes = [
    ...(previous.retentionSeconds !== config.retentionSeconds ? [`IDEMPOTENCY_RETENTION_SECONDS ${previous.retentionSeconds} -> ${config.retentionSeconds}`] : []),
    ...(previous.ttlSeconds !== config.ttlSeconds ? [`IDEMPOTENCY_TTL_SECONDS ${previous.ttlSeconds} -> ${config.ttlSeconds}`] : []),
  ]
  if (changes.length === 0) return
  log.warn(`settings differ from those the last instance started with (recorded ${previous.updatedAt.toISOString()}): ${changes.join(', ')}; ` +
    'while instances run with both, a key is protected for the shorter retention, and may be reclaimed after the shorter TTL: roll the change through every instance (docs/how-to/upgrade.md)',
  { previous_retention_seconds: previous.retentionSeconds, previous_ttl_seconds: previous.ttlSeconds })
}

/**
 * Serves until SIGTERM or SIGINT, then drains: stop accepting work, let
 * in-flight requests finish (or, past the deadline, roll them back and
 * release their keys), let Prometheus read the last counters, close the
 * pools. A clean stop leaves no key in processing.
 */
export async function runServer(config: Config, databaseUrl: string, options: RunOptions): Promise<number> {
  const { log } = options
  // The operator's database as the start check resolved it (TLS included), the embedded one by its URL (store/connection-settings.ts).
  const database = databaseUrl === config.databaseUrl ? config.databaseConnection ?? databaseUrl : databaseUrl
  const pools = openPools(database, { applicationName: `idempotent-post:${process.pid}`, pgbouncer: config.databasePgbouncer })
  const metrics = createMetrics(undefined, { ttlSeconds: config.ttlSeconds })
  collectProcessMetrics(metrics.registry)
  const removeLastResort = installLastResort(metrics.registry)
  const gauges = new DatabaseGauges({ sql: pools.short, ttlSeconds: config.ttlSeconds, retentionSeconds: config.retentionSeconds, tenants: [...new Set(config.apiKeys.values())], cacheMs: config.metricsCacheMs, duplicateWindowSeconds: config.duplicateWindowSeconds, duplicateWindowKeys: config.duplicateWindowKeys, log })
  const cluster = config.workers > 1 && ClusterMetrics.available() ? new ClusterMetrics(metrics.registry) : undefined
  const inFlight = new InFlight()
  const health = new DatabaseHealth(database, `idempotent-post:${process.pid}:health`, { pgbouncer: config.databasePgbouncer })
  // Warns at start (and exports a gauge) when commits are acknowledged before any standby has them.
  const durability = watchDurability({ sql: pools.short, registry: metrics.registry, singleNode: config.databaseUrl === undefined })
  // Operator commands apply the server's TTL and retention, never their shell's (core/settings.ts).
  const previous = await recordServerSettings(pools.short, config, (line) => log.warn(line))
  warnOnChangedSettings(log, previous, config)
  // One heartbeat row for this process: how force-expire tells a live owner from a dead one.
  // It lists the leases this process works on (per-request liveness, core/processes.ts).
  const heartbeat = await startHeartbeat(pools.short, { log: (line) => log.warn(line), leases: () => inFlight.leaseIds(), schemaKnown: knownVersions(), purges: true, retentionSeconds: config.retentionSeconds })
  const scrapes = new Scrapes()
  const deps = { config, pools, metrics, gauges, inFlight, health, scrapes, owner: () => heartbeat.id, ...(cluster ? { cluster } : {}) }
  const app = buildApp(deps)
  // A free port suggested for a taken one is none of the others this start takes.
  const ours = [config.port, config.providerPort, config.embeddedPort, ...(config.metricsPort ? [config.metricsPort] : [])]
  const server = listen('PORT', config.host, config.port, ours, () => serve(app, deps, { reusePort: config.workers > 1 }))
  // METRICS_PORT: /metrics on a listener of its own (and not on PORT), e.g. one only the monitoring network reaches.
  const metricsServer = config.metricsPort !== undefined
    ? listen('METRICS_PORT', config.metricsHost, config.metricsPort, ours, () => serve(app, deps, { reusePort: config.workers > 1, listener: 'metrics' }))
    : undefined
  log.info(`listening on ${server.hostname}:${server.port} (pid ${process.pid})${metricsServer ? `, metrics on ${metricsServer.hostname}:${metricsServer.port}` : ''}`,
    { host: server.hostname, port: server.port, ttl_seconds: config.ttlSeconds, workers: config.workers })
  const purge = startRetentionPurge({ sql: pools.short, retentionSeconds: config.retentionSeconds, intervalMs: config.purgeIntervalMs, processId: heartbeat.id, onPurged: (deleted) => metrics.purgedKeys.inc(deleted), log })
  options.onListening?.(server.port ?? config.port)

  let parentWatch: ReturnType<typeof setInterval> | undefined
  const signal = await new Promise<string>((resolve) => {
    const { stop } = options
    if (stop) {
      if (stop.aborted) resolve(String(stop.reason))
      else stop.addEventListener('abort', () => resolve(String(stop.reason)), { once: true })
    } else {
      process.once('SIGTERM', () => resolve('SIGTERM'))
      process.once('SIGINT', () => resolve('SIGINT'))
    }
    if (options.watchParent) {
      const parent = options.parentPid ?? process.ppid
      parentWatch = setInterval(() => { if (process.ppid !== parent) resolve('supervisor gone') }, PARENT_POLL_MS)
    }
  })
  clearInterval(parentWatch)
  // A second signal during the drain must not kill us half-way (with `stop`, main.ts's handlers stay to the end).
  const ignore = () => log.info('already draining')
  if (!options.stop) process.on('SIGTERM', ignore).on('SIGINT', ignore)
  // From here no new claim starts (503, nothing stored), /readyz says
  // "draining"; every request accepted so far is counted, claimed or not,
  // and waited for. The listener that serves /metrics stays open until its
  // last read after the last answer: the API's own closes now when /metrics
  // has a port of its own, else it stays too and refuses new work with 503s.
  inFlight.drain()
  log.info(`${signal}: draining ${inFlight.size} in-flight request(s)`, { signal, in_flight: inFlight.size })
  const apiStopped = metricsServer ? server.stop(false) : undefined
  await purge.stop()
  const drained = await inFlight.drained(DRAIN_TIMEOUT_MS)
  if (!drained) {
    // Each stopped request releases its own key (http/idempotency.ts); a
    // completion already committing finishes first (it takes milliseconds).
    log.warn(`drain deadline passed: stopping ${inFlight.size} request(s) and releasing their keys`, { in_flight: inFlight.size })
    inFlight.abortAll(new ShuttingDownError())
    if (!(await inFlight.drained(ABORTED_DRAIN_MS))) {
      for (const lease of inFlight.leases) await release(pools.short, lease, 'shutdown').catch(() => undefined)
    }
  }
  // Every answer is written and counted: one more scrape reads the last counters.
  const patience = scrapes.patienceMs(LAST_SCRAPE_WAIT_MS)
  if (patience > 0) {
    const scraped = await scrapes.next(LAST_SCRAPE_WAIT_MS)
    log.info(scraped ? 'metrics read after the last answer' : `no metrics read within ${Math.round(patience)} ms of the last answer: stopping without`, { scraped })
  }
  // Then the listeners, the heartbeat and the pools go, after the last handler returned.
  durability.stop()
  const stopped = Promise.all([apiStopped ?? server.stop(false), metricsServer?.stop(false)])
  await Promise.race([stopped, Bun.sleep(1_000)])
  await heartbeat.stop()
  await Promise.all([pools.close(), health.close()])
  log.info('pools closed')
  removeLastResort()
  return 0
}
