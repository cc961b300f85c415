/**
 * The service in this test process: the app `src/server.ts` builds, on a test
 * database, charging through a provider simulator of the test's. For tests of
 * the HTTP contract, where no process boundary is under test: no process to
 * spawn (about 0.4 s each), no port unless a test asks for one.
 *
 * What this does not run is src/lifecycle.ts (the heartbeat, the settings row,
 * the gauges, the purge, the drain): tests of those start a real process
 * (startServer in server.ts).
 */
import { loadConfig } from '../../src/config'
import { createMetrics, type Metrics } from '../../src/metrics/registry'
import { buildApp, serve, serviceFetch, type App, type AppDependencies } from '../../src/server'
import type { TestDatabase } from './db'
import { NO_TENANT_LIMITS } from './process'
import type { Logger } from '../../src/log'
import { ADMIN_TOKEN, API_KEYS, startProvider, type ProviderFaults, type ProviderHandle } from './server'

/** The origin of requests sent with `handle`: any will do, nothing listens there. */
export const IN_PROCESS_ORIGIN = 'http://service.test'

export interface InProcessService {
  /** The origin for requests sent with `handle` (IN_PROCESS_ORIGIN). */
  readonly url: string
  readonly app: App
  readonly metrics: Metrics
  readonly provider: ProviderHandle
  /** One request through the service's fetch (serviceFetch: request ids, HTTP metrics, the app): no socket, no process. */
  handle(request: Request): Promise<Response>
  /** `fetch` for a path of this service, through `handle`. */
  fetch(path: string, init?: RequestInit): Promise<Response>
  /**
   * Serves the same app on a real socket in this process, as the service
   * does (`serve()` of src/server.ts: Bun's HTTP parser and body cap, the
   * Host check, the HTTP metrics), on a free port; returns its URL, for
   * `fetch` or raw sockets. `handle` still bypasses it.
   */
  listen(): string
  stop(): Promise<void>
}

export interface AppOptions {
  /** Configuration as the service's environment has it (e.g. MAX_BODY_BYTES); API keys and admin token as in startServer. */
  readonly env?: Record<string, string>
  /** Charge through this provider (stopped by its owner); else one is started with `faults`, and stopped with the app. */
  readonly provider?: ProviderHandle
  readonly faults?: ProviderFaults
  /** Where the app's lines go (tests collect them). @default the process logger (stdout) */
  readonly log?: Logger
  /** The database gate (store/health.ts); `{ up: false }` answers 503 at once as while the database is away. */
  readonly health?: AppDependencies['health']
}

export async function startApp(db: TestDatabase, options: AppOptions = {}): Promise<InProcessService> {
  const provider = options.provider ?? await startProvider(options.faults)
  const config = loadConfig({
    API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', HOST: '127.0.0.1', PORT: '0', TEST_ALLOW_PORT_0: '1',
    DATABASE_URL: db.url, PAYMENT_PROVIDER_URL: provider.url, ...NO_TENANT_LIMITS, ...options.env,
  })
  const deps: AppDependencies = {
    config, pools: db.pools, metrics: createMetrics(),
    ...(options.log ? { log: options.log } : {}), ...(options.health ? { health: options.health } : {}),
  }
  const app = buildApp(deps)
  let server: ReturnType<typeof serve> | undefined
  // As serve() answers: request ids and the edge's log line around the HTTP metrics around the app.
  const handle = serviceFetch(app, deps)
  return {
    url: IN_PROCESS_ORIGIN,
    app,
    metrics: deps.metrics,
    provider,
    handle,
    fetch: (path, init) => handle(new Request(`${IN_PROCESS_ORIGIN}${path}`, init)),
    listen() {
      server ??= serve(app, deps)
      return `http://127.0.0.1:${server.port}`
    },
    async stop() {
      await server?.stop(true)
      if (!options.provider) await provider.stop()
    },
  }
}
