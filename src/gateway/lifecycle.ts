/**
 * The gateway's serving life, as lifecycle.ts is the service's: the pools,
 * the metrics, the heartbeat, the retention purge and the listener, then on
 * the stop signal the drain: no new claim (503, nothing forwarded), the
 * requests in flight finish (or, past DRAIN_TIMEOUT_MS, are stopped: their
 * forward is aborted and the key follows its route's unknown-outcome rule),
 * then the listener, the heartbeat and the pools close.
 */
import { ShuttingDownError } from '../core/deadline'
import { startHeartbeat } from '../core/processes'
import { recordServerSettings } from '../core/settings'
import { InFlight } from '../http/in-flight'
import { installLastResort } from '../last-resort'
import type { Logger } from '../log'
import { startRetentionPurge } from '../maintenance/retention-purge'
import { DatabaseGauges } from '../metrics/gauges'
import { collectProcessMetrics } from '../metrics/process'
import { createMetrics, primeRoute } from '../metrics/registry'
import { openPools } from '../store/db'
import { knownVersions } from '../store/migrate'
import { gatewayFetch, serveGateway } from './app'
import type { GatewayConfig } from './config'
import { gatewayMetrics } from './metrics'

/**
 * The service's drain bounds (src/lifecycle.ts), not imported from there: that module loads the whole
 * payments app. 10 s for requests in flight, then 3 s for the stopped ones to settle: within the 30 s a
 * container runtime gives before its SIGKILL.
 */
const DRAIN_TIMEOUT_MS = 10_000
const ABORTED_DRAIN_MS = 3_000

export interface GatewayRunOptions {
  readonly log: Logger
  /** Aborted when the process is told to stop (main.ts listens from its first line). */
  readonly stop: AbortSignal
  readonly onListening?: (port: number) => void
}

export async function runGateway(config: GatewayConfig, databaseUrl: string, options: GatewayRunOptions): Promise<number> {
  const { log } = options
  const pools = openPools(databaseUrl, { applicationName: `idempotent-post-gateway:${process.pid}`, pgbouncer: config.database.databasePgbouncer })
  const metrics = createMetrics(undefined, { ttlSeconds: config.ttlSeconds })
  collectProcessMetrics(metrics.registry)
  const names = [...new Set(config.routes.map((route) => route.name))]
  for (const route of config.routes) primeRoute(metrics, route.name, route.methods[0])
  const removeLastResort = installLastResort(metrics.registry)
  const inFlight = new InFlight()
  const gauges = new DatabaseGauges({ sql: pools.short, ttlSeconds: config.ttlSeconds, retentionSeconds: config.retentionSeconds, log })
  // Operator commands apply the server's TTL and retention (core/settings.ts).
  await recordServerSettings(pools.short, config, (line) => log.warn(line))
  const heartbeat = await startHeartbeat(pools.short, { log: (line) => log.warn(line), leases: () => inFlight.leaseIds(), schemaKnown: knownVersions(), purges: true, retentionSeconds: config.retentionSeconds })
  const handle = gatewayFetch({ config, pools, metrics, gatewayMetrics: gatewayMetrics(metrics.registry, names), gauges, inFlight, owner: () => heartbeat.id, log })
  const server = serveGateway(handle, { hostname: config.host, port: config.port, log })
  const purge = startRetentionPurge({ sql: pools.short, retentionSeconds: config.retentionSeconds, processId: heartbeat.id, onPurged: (deleted) => metrics.purgedKeys.inc(deleted), log })
  log.info(`gateway listening on ${server.hostname}:${server.port} (pid ${process.pid})`, {
    host: server.hostname, port: server.port, routes: config.routes.map((route) => ({ name: route.name, methods: route.methods, upstream: route.upstream, unknown: route.unknown, ttl_seconds: route.ttlSeconds })),
  })
  options.onListening?.(server.port ?? config.port)

  const signal = await new Promise<string>((resolve) => {
    if (options.stop.aborted) resolve(String(options.stop.reason))
    else options.stop.addEventListener('abort', () => resolve(String(options.stop.reason)), { once: true })
  })
  // From here no new claim starts (503, nothing forwarded); what is in flight is waited for.
  inFlight.drain()
  log.info(`${signal}: draining ${inFlight.size} in-flight request(s)`, { signal, in_flight: inFlight.size })
  await purge.stop()
  if (!(await inFlight.drained(DRAIN_TIMEOUT_MS))) {
    // Each stopped forward is an unknown outcome: its route holds or releases the key (exchange.ts).
    log.warn(`drain deadline passed: stopping ${inFlight.size} request(s)`, { in_flight: inFlight.size })
    inFlight.abortAll(new ShuttingDownError())
    await inFlight.drained(ABORTED_DRAIN_MS)
  }
  await Promise.race([server.stop(false), Bun.sleep(1_000)])
  await heartbeat.stop()
  await pools.close()
  log.info('pools closed')
  removeLastResort()
  return 0
}
