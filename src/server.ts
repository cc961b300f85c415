import { Elysia } from 'elysia'
import type { Config } from './config'
import { bearerTenant } from './http/auth'
import { InFlight } from './http/in-flight'
import { observed } from './http/observe'
import { problem, problemResponse } from './http/problem'
import { countAnswer, idempotencyHooks, primeRoute, type Metrics } from './metrics/registry'
import { apiDocs, detail, DOCS_ROUTES, health, problemAnswer } from './api-docs'
import type { ClusterMetrics } from './metrics/cluster'
import { exposition } from './metrics/exposition'
import type { DatabaseGauges } from './metrics/gauges'
import { PAYMENTS_ROUTE, PAYMENTS_ROUTES, paymentsRoutes } from './payments/routes'
import { providerClient, type PaymentProvider } from './provider/client'
import { benchBaselineRoute } from './payments/bench-baseline'
import { databaseAnswers, type Pools } from './store/db'
import type { DatabaseHealth } from './store/health'
import { isUnavailable } from './core/errors'
import { adminApp, adminRoutes, type AdminOptions } from './admin/routes'

export interface AppDependencies {
  readonly config: Config
  readonly pools: Pools
  readonly metrics: Metrics
  /** The gauges computed in PostgreSQL, added to /metrics. */
  readonly gauges?: DatabaseGauges
  /** WORKERS>1: /metrics sums the per-process metrics of all workers. */
  readonly cluster?: ClusterMetrics
  readonly inFlight?: InFlight
  /** The payment provider; @default a client of config.providerUrl. */
  readonly provider?: PaymentProvider
  /** This process's heartbeat id, the owner of the keys it claims. */
  readonly owner?: () => string | undefined
  /** When given, requests that need the database are answered 503 at once while it is known to be away. */
  readonly health?: DatabaseHealth
  /** Tests move the engine's clock with this. */
  readonly now?: () => Date | undefined
}

/** Routes that cannot answer without the database. */
const NEEDS_DATABASE = /^\/(api|admin)(\/|$)/

/**
 * The `route` label of http_requests_total: this app's templates (the first
 * match wins); any other path is counted as `other` (http/observe.ts).
 */
export const ROUTE_LABELS: readonly string[] = [
  ...PAYMENTS_ROUTES, '/healthz', '/readyz', '/metrics', ...DOCS_ROUTES, '/admin/api/*', '/admin/*',
]

/** The payments service as an Elysia app, without a listening socket (tests call `app.handle`). */
export function buildApp(deps: AppDependencies) {
  const { config, pools, metrics } = deps
  primeRoute(metrics, PAYMENTS_ROUTE)
  const tenant = bearerTenant(config.apiKeys)
  const provider = deps.provider ?? providerFor(config)
  const admin: AdminOptions = {
    pools,
    adminToken: config.adminToken,
    ttlSeconds: config.ttlSeconds,
    retentionSeconds: config.retentionSeconds,
    metrics,
    ...(deps.now ? { now: deps.now } : {}),
  }
  return new Elysia({ name: 'idempotent-post-service' })
    .onError(({ code, error }) => {
      if (code === 'NOT_FOUND') return problemResponse(problem('not-found'))
      if (code === 'PARSE' || code === 'VALIDATION') return problemResponse(problem('invalid-request'))
      if (isUnavailable(error)) return problemResponse(problem('database-unavailable'))
      const status = typeof (error as { status?: unknown }).status === 'number' ? (error as { status: number }).status : 500
      if (status === 413) return problemResponse(problem('body-too-large', `The body must be at most ${config.maxBodyBytes} bytes.`))
      // Any other refusal Elysia raises (none is known today) is a bad request: one code, one status.
      if (status >= 400 && status < 500) return problemResponse(problem('bad-request'))
      console.error('unhandled error:', error instanceof Error ? error.message : error)
      return problemResponse(problem('internal'))
    })
    // Fail fast while the database is away, instead of queueing behind reconnects (store/health.ts).
    .onRequest(({ request }) => {
      if (deps.health && !deps.health.up && NEEDS_DATABASE.test(new URL(request.url).pathname))
        return problemResponse(problem('database-unavailable'))
    })
    // The admin's JSON API is described from an instance of the admin app's own routes (it is only read).
    .use(apiDocs({ admin: adminApp(admin) }))
    .get('/healthz', () => Response.json({ status: 'ok' }), {
      detail: detail({ summary: 'Liveness: 200 while the process runs', tags: ['operations'], security: [], responses: { 200: health('ok') } }),
    })
    // Ready when the write path works (the health probe's own commit, store/health.ts:
    // a stalled synchronous standby hangs every write while reads still answer)
    // and the pool answers. The probe runs on its interval, so a check costs no write.
    .get('/readyz', async () => {
      if (deps.health && !deps.health.up) return problemResponse(problem('not-ready', 'The database does not take writes right now (down, read-only, or waiting for its synchronous standby).'))
      return await databaseAnswers(pools.short) ? Response.json({ status: 'ready' }) : problemResponse(problem('not-ready'))
    }, {
      detail: detail({ summary: 'Readiness: 200 when the database takes writes', tags: ['operations'], security: [], responses: { 200: health('ready'), 503: problemAnswer(['not-ready']) } }),
    })
    .get('/metrics', async () => {
      try {
        const text = await exposition({ registry: metrics.registry, gauges: deps.gauges, cluster: deps.cluster })
        return new Response(text, { headers: { 'content-type': metrics.registry.contentType } })
      } catch (error) {
        // Only the WORKERS>1 aggregation can fail; a gap beats a partial sum (see metrics/cluster.ts).
        console.error('metrics:', error instanceof Error ? error.message : error)
        return problemResponse(problem('metrics-unavailable'))
      }
    }, {
      detail: detail({
        summary: 'Prometheus metrics',
        tags: ['operations'],
        security: [],
        responses: {
          200: { description: 'Prometheus text exposition (prom-client).', content: { 'text/plain': { schema: { type: 'string' } } } },
          503: problemAnswer(['metrics-unavailable'], 'WORKERS>1: the workers\' metrics could not be collected.'),
        },
      }),
    })
    .use(paymentsRoutes({
      pools,
      provider,
      tenant,
      ttlSeconds: config.ttlSeconds,
      retentionSeconds: config.retentionSeconds,
      maxBodyBytes: config.maxBodyBytes,
      hooks: idempotencyHooks(metrics),
      ...(deps.inFlight ? { inFlight: deps.inFlight } : {}),
      ...(deps.owner ? { owner: deps.owner } : {}),
      ...(deps.now ? { now: deps.now } : {}),
    }))
    .use(adminRoutes(admin))
    // `npm run bench` only (BENCH_BASELINE_ROUTE=1): the non-idempotent yardstick route.
    .use(config.benchBaselineRoute
      ? benchBaselineRoute({ pools, provider, tenant, maxBodyBytes: config.maxBodyBytes })
      : new Elysia({ name: 'bench-baseline-off' }))
}

export type App = ReturnType<typeof buildApp>

function providerFor(config: Config): PaymentProvider {
  // main.ts starts the simulator and sets PAYMENT_PROVIDER_URL before any server runs.
  if (!config.providerUrl) throw new Error('PAYMENT_PROVIDER_URL is not set: no payment provider to call')
  return providerClient(config.providerUrl)
}

/**
 * Bun's own cap on a body, far above ours: Bun answers a bare 413 by itself
 * above it, and we want our problem+json 413. Nothing is buffered past our
 * limit anyway (http/body.ts stops reading there).
 */
const BUN_BODY_CAP_BYTES = 1024 * 1024 * 1024

/** The same request with an absolute URL and a Host header. */
function withOrigin(request: Request, origin: string): Request {
  const headers = new Headers(request.headers)
  headers.set('host', new URL(origin).host)
  const hasBody = request.method !== 'GET' && request.method !== 'HEAD'
  return new Request(new URL(request.url, origin), { method: request.method, headers, ...(hasBody ? { body: request.body, duplex: 'half' } : {}) } as RequestInit)
}

export function serve(app: App, deps: AppDependencies, options: { reusePort?: boolean } = {}) {
  const answer = observed(ROUTE_LABELS, countAnswer(deps.metrics), (request) => app.handle(request))
  // Every request is counted from its acceptance until answered: a shutdown
  // closes the pools only after the last one (lifecycle.ts).
  const handle = deps.inFlight
    ? async (request: Request) => {
      const done = deps.inFlight!.track(request)
      try {
        return await answer(request)
      } finally {
        done()
      }
    }
    : answer
  // An HTTP/1.0 request may come without Host (legal there; HAProxy's default
  // health check is one): Bun then gives only the path as its URL, which no
  // URL parser takes. It is served with the address we listen on as its origin.
  const fetch = (request: Request, server: Bun.Server<unknown>) => request.headers.has('host')
    ? handle(request)
    : handle(withOrigin(request, `http://${server.hostname?.includes(':') ? `[${server.hostname}]` : server.hostname}:${server.port}`))
  return Bun.serve({
    hostname: deps.config.host,
    port: deps.config.port,
    reusePort: options.reusePort ?? false,
    maxRequestBodySize: BUN_BODY_CAP_BYTES,
    fetch,
    error(error) {
      console.error('server error:', error.message)
      return problemResponse(problem('internal'))
    },
  })
}
