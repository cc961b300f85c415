/**
 * The gateway in this process, on a real port and a database of its own,
 * as `npm run gateway` assembles it (gateway/app.ts), with the route table
 * a test gives. Requests reach it over real HTTP.
 */
import { InFlight } from '../../../src/http/in-flight'
import { createMetrics, primeRoute, type Metrics } from '../../../src/metrics/registry'
import { gatewayFetch, serveGateway } from '../../../src/gateway/app'
import { loadGatewayConfig, type GatewayConfig } from '../../../src/gateway/config'
import { gatewayMetrics } from '../../../src/gateway/metrics'
import { route, type RouteSpec } from '../../../src/gateway/routes'
import { createLogger } from '../../../src/log'
import { createTestDatabase, type TestDatabase } from '../../support/db'
import type { Pools } from '../../../src/store/db'

export interface TestGateway {
  readonly url: string
  readonly db: TestDatabase
  readonly metrics: Metrics
  readonly config: GatewayConfig
  readonly inFlight: InFlight
  /** Log lines written, as JSON text. */
  readonly lines: string[]
  stop(): Promise<void>
}

export interface GatewayOptions {
  readonly upstream: string
  /** The route table; @default POST and PATCH to any path. */
  readonly routes?: readonly RouteSpec[]
  readonly env?: Record<string, string>
  readonly db?: TestDatabase
  /** The pools the gateway uses; @default the test database's. */
  readonly pools?: Pools
}

export async function startGateway(options: GatewayOptions): Promise<TestGateway> {
  const db = options.db ?? await createTestDatabase('gateway')
  const base = loadGatewayConfig({ UPSTREAM_URL: options.upstream, ...options.env })
  const defaults = { upstream: options.upstream, ttlSeconds: base.ttlSeconds, maxBodyBytes: 65_536, maxStoredBytes: 1024 * 1024 }
  const config: GatewayConfig = options.routes
    ? { ...base, routes: options.routes.map((spec, i) => route(spec, defaults, `route ${i + 1}`)) }
    : base
  const metrics = createMetrics(undefined, { ttlSeconds: config.ttlSeconds })
  for (const each of config.routes) primeRoute(metrics, each.name)
  const inFlight = new InFlight()
  const lines: string[] = []
  const log = createLogger({ sink: (line) => { lines.push(line) } })
  const handle = gatewayFetch({ config, pools: options.pools ?? db.pools, metrics, gatewayMetrics: gatewayMetrics(metrics.registry, config.routes.map((r) => r.name)), inFlight, log })
  const server = serveGateway(handle, { hostname: '127.0.0.1', port: 0, log })
  return {
    url: `http://127.0.0.1:${server.port}`,
    db,
    metrics,
    config,
    inFlight,
    lines,
    async stop() {
      await server.stop(true)
      if (!options.db) await db.drop()
    },
  }
}

/** A keyed POST of JSON through real HTTP. */
export function post(url: string, path: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) })
}

/** An answer read whole: status, fields, body text. */
export async function read(response: Response): Promise<{ status: number; headers: Headers; text: string }> {
  return { status: response.status, headers: response.headers, text: await response.text() }
}
