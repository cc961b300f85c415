import type { Config } from './config'
import { release } from './core/release'
import { InFlight } from './http/in-flight'
import { createMetrics } from './metrics/registry'
import { buildApp, serve } from './server'
import { openPools } from './store/db'

/** How long a shutdown waits for in-flight requests before releasing their keys. */
const DRAIN_TIMEOUT_MS = 10_000

export interface RunOptions {
  readonly log: (line: string) => void
  readonly onListening?: (() => void) | undefined
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
  const inFlight = new InFlight()
  const deps = { config, pools, metrics, inFlight }
  const app = buildApp(deps)
  const server = serve(app, deps, { reusePort: config.workers > 1 })
  log(`listening on ${server.hostname}:${server.port} (pid ${process.pid})`)
  options.onListening?.()

  const signal = await new Promise<string>((resolve) => {
    process.once('SIGTERM', () => resolve('SIGTERM'))
    process.once('SIGINT', () => resolve('SIGINT'))
  })
  // A second signal during the drain must not kill us half-way.
  const ignore = () => log('already draining')
  process.on('SIGTERM', ignore).on('SIGINT', ignore)
  log(`${signal}: draining ${inFlight.size} in-flight request(s)`)
  const stopped = server.stop(false)
  const drained = await inFlight.drained(DRAIN_TIMEOUT_MS)
  if (!drained) {
    const leftover = inFlight.leases
    log(`drain deadline passed: rolling back and releasing ${leftover.length} key(s)`)
    await pools.work.end({ timeout: 0 })
    for (const lease of leftover) await release(pools.short, lease).catch(() => undefined)
  }
  await Promise.race([stopped, Bun.sleep(1_000)])
  await pools.close()
  log('pools closed')
  return 0
}
