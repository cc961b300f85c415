import type { Config } from './config'
import { release } from './core/release'
import { InFlight } from './http/in-flight'
import { createMetrics } from './metrics/registry'
import { ClusterMetrics } from './metrics/cluster'
import { DatabaseGauges } from './metrics/gauges'
import { collectProcessMetrics } from './metrics/process'
import { buildApp, serve } from './server'
import { startRetentionPurge } from './maintenance/retention-purge'
import { openPools } from './store/db'
import { DatabaseHealth } from './store/health'

/** How long a shutdown waits for in-flight requests before releasing their keys. */
const DRAIN_TIMEOUT_MS = 10_000
/** How often a worker checks that its supervisor still lives: a SIGKILLed supervisor sends no signal. */
const PARENT_POLL_MS = 500

export interface RunOptions {
  readonly log: (line: string) => void
  /** Called with the port actually bound (PORT=0 picks one). */
  readonly onListening?: ((port: number) => void) | undefined
  /** Drain as on SIGTERM when the parent process goes away (WORKERS>1 workers). */
  readonly watchParent?: boolean
}

/**
 * Serves until SIGTERM or SIGINT, then drains: stop accepting, let in-flight
 * requests finish (or, past the deadline, roll them back and release their
 * keys), close the pools. A clean stop leaves no key in processing.
 */
export async function runServer(config: Config, databaseUrl: string, options: RunOptions): Promise<number> {
  const { log } = options
  const pools = openPools(databaseUrl, { applicationName: `idempotent-post:${process.pid}` })
  const metrics = createMetrics()
  collectProcessMetrics(metrics.registry)
  const gauges = new DatabaseGauges({ sql: pools.short, ttlSeconds: config.ttlSeconds, tenants: [...new Set(config.apiKeys.values())], cacheMs: config.metricsCacheMs, log })
  const cluster = config.workers > 1 && ClusterMetrics.available() ? new ClusterMetrics(metrics.registry) : undefined
  const inFlight = new InFlight()
  const health = new DatabaseHealth(databaseUrl, `idempotent-post:${process.pid}:health`)
  const deps = { config, pools, metrics, gauges, inFlight, health, ...(cluster ? { cluster } : {}) }
  const app = buildApp(deps)
  const server = serve(app, deps, { reusePort: config.workers > 1 })
  log(`listening on ${server.hostname}:${server.port} (pid ${process.pid})`)
  const purge = startRetentionPurge({ sql: pools.short, retentionSeconds: config.retentionSeconds, intervalMs: config.purgeIntervalMs, metrics, log })
  options.onListening?.(server.port ?? config.port)

  let parentWatch: ReturnType<typeof setInterval> | undefined
  const signal = await new Promise<string>((resolve) => {
    process.once('SIGTERM', () => resolve('SIGTERM'))
    process.once('SIGINT', () => resolve('SIGINT'))
    if (options.watchParent) {
      const parent = process.ppid
      parentWatch = setInterval(() => { if (process.ppid !== parent) resolve('supervisor gone') }, PARENT_POLL_MS)
    }
  })
  clearInterval(parentWatch)
  // A second signal during the drain must not kill us half-way.
  const ignore = () => log('already draining')
  process.on('SIGTERM', ignore).on('SIGINT', ignore)
  log(`${signal}: draining ${inFlight.size} in-flight request(s)`)
  const stopped = server.stop(false)
  await purge.stop()
  const drained = await inFlight.drained(DRAIN_TIMEOUT_MS)
  if (!drained) {
    const leftover = inFlight.leases
    log(`drain deadline passed: rolling back and releasing ${leftover.length} key(s)`)
    await pools.work.end({ timeout: 0 })
    for (const lease of leftover) await release(pools.short, lease).catch(() => undefined)
  }
  await Promise.race([stopped, Bun.sleep(1_000)])
  await Promise.all([pools.close(), health.close()])
  log('pools closed')
  return 0
}
