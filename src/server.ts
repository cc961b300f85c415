import { Elysia } from 'elysia'
import type { Config } from './config'
import { bearerTenant } from './http/auth'
import { InFlight } from './http/in-flight'
import { observed } from './http/observe'
import { problemResponse, problems, type Problem } from './http/problem'
import { primeRoute, type Metrics } from './metrics/registry'
import type { ClusterMetrics } from './metrics/cluster'
import { exposition } from './metrics/exposition'
import type { DatabaseGauges } from './metrics/gauges'
import { PAYMENTS_ROUTE, paymentsRoutes } from './payments/routes'
import { providerClient, type PaymentProvider } from './provider/client'
import { benchBaselineRoute } from './payments/bench-baseline'
import { databaseAnswers, type Pools } from './store/db'
import type { DatabaseHealth } from './store/health'
import { isUnavailable } from './core/errors'
import { adminRoutes } from './admin/routes'

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

/** The payments service as an Elysia app, without a listening socket (tests call `app.handle`). */
export function buildApp(deps: AppDependencies) {
  const { config, pools, metrics } = deps
  primeRoute(metrics, PAYMENTS_ROUTE)
  const tenant = bearerTenant(config.apiKeys)
  const provider = deps.provider ?? providerFor(config)
  return new Elysia({ name: 'idempotent-post-service' })
    .onError(({ code, error }) => {
      if (code === 'NOT_FOUND') return problemResponse(problems.notFound())
      if (code === 'PARSE' || code === 'VALIDATION') return problemResponse(problems.badRequest('invalid-request', 'The request could not be read.'))
      if (isUnavailable(error)) return problemResponse(problems.unavailable(), { 'retry-after': '2' })
      const status = typeof (error as { status?: unknown }).status === 'number' ? (error as { status: number }).status : 500
      if (status === 413) return problemResponse(problems.tooLarge(config.maxBodyBytes))
      if (status >= 400 && status < 500) {
        const problem: Problem = { code: 'bad-request', status, title: 'Bad request' }
        return problemResponse(problem)
      }
      console.error('unhandled error:', error instanceof Error ? error.message : error)
      return problemResponse(problems.internal())
    })
    // Fail fast while the database is away, instead of queueing behind reconnects (store/health.ts).
    .onRequest(({ request }) => {
      if (deps.health && !deps.health.up && NEEDS_DATABASE.test(new URL(request.url).pathname))
        return problemResponse(problems.unavailable(), { 'retry-after': '2' })
    })
    .get('/healthz', () => Response.json({ status: 'ok' }))
    .get('/readyz', async () =>
      (deps.health?.up ?? true) && (await databaseAnswers(pools.short))
        ? Response.json({ status: 'ready' })
        : problemResponse({ code: 'not-ready', status: 503, title: 'Not ready', detail: 'The database does not answer.' }, { 'retry-after': '2' }))
    .get('/metrics', async () => {
      try {
        const text = await exposition({ registry: metrics.registry, gauges: deps.gauges, cluster: deps.cluster })
        return new Response(text, { headers: { 'content-type': metrics.registry.contentType } })
      } catch (error) {
        // Only the WORKERS>1 aggregation can fail; a gap beats a partial sum (see metrics/cluster.ts).
        console.error('metrics:', error instanceof Error ? error.message : error)
        return problemResponse({ code: 'metrics-unavailable', status: 503, title: 'Metrics unavailable', detail: 'The workers\' metrics could not be collected; retry.' })
      }
    })
    .use(paymentsRoutes({
      pools,
      provider,
      tenant,
      ttlSeconds: config.ttlSeconds,
      retentionSeconds: config.retentionSeconds,
      maxBodyBytes: config.maxBodyBytes,
      metrics,
      ...(deps.inFlight ? { inFlight: deps.inFlight } : {}),
      ...(deps.owner ? { owner: deps.owner } : {}),
      ...(deps.now ? { now: deps.now } : {}),
    }))
    .use(adminRoutes({
      pools,
      adminToken: config.adminToken,
      ttlSeconds: config.ttlSeconds,
      retentionSeconds: config.retentionSeconds,
      metrics,
      ...(deps.now ? { now: deps.now } : {}),
    }))
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

export function serve(app: App, deps: AppDependencies, options: { reusePort?: boolean } = {}) {
  const handle = observed(deps.metrics, (request) => app.handle(request))
  // An HTTP/1.0 request may come without Host; Bun then cannot build its URL
  // (reading request.url throws), so it is refused before anything reads it.
  const fetch = (request: Request) => request.headers.has('host')
    ? handle(request)
    : problemResponse({ code: 'missing-host', status: 400, title: 'Bad request', detail: 'Send a Host header.' })
  return Bun.serve({
    hostname: deps.config.host,
    port: deps.config.port,
    reusePort: options.reusePort ?? false,
    maxRequestBodySize: BUN_BODY_CAP_BYTES,
    fetch,
    error(error) {
      console.error('server error:', error.message)
      return problemResponse(problems.internal())
    },
  })
}
