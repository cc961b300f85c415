import { Elysia } from 'elysia'
import type { Config } from './config'
import { bearerTenant } from './http/auth'
import { InFlight } from './http/in-flight'
import { observed, routeLabeler } from './http/observe'
import { requestLogger, withRequestIds } from './http/request-id'
import { log as processLog, type Logger } from './log'
import { methodsOf, type PathMethods } from './http/allow'
import { problem, problemResponse } from './http/problem'
import { OPERATIONS_PROBLEMS } from './problems'
import { countAnswer, idempotencyHooks, observePools, observeProvider, observeReadiness, primeRoute, providerCallsInFlight, type Metrics } from './metrics/registry'
import { adminDocument, apiDocs, detail, DOCS_ROUTES, health, problemAnswer, problemAnswers } from './api-docs'
import { EDGE_PROBLEMS } from './http/edge-problems'
import type { ClusterMetrics } from './metrics/cluster'
import { exposition } from './metrics/exposition'
import type { DatabaseGauges } from './metrics/gauges'
import type { Scrapes } from './metrics/scrapes'
import { PAYMENTS_ROUTE, PAYMENTS_ROUTES, paymentsRoutes } from './payments/routes'
import { providerClient, type PaymentProvider } from './provider/client'
import { databaseAnswers, type Pools } from './store/db'
import { DATABASE_WAIT_MS, type DatabaseHealth } from './store/health'

export { DATABASE_WAIT_MS }
import { isUnavailable } from './core/errors'
import { adminApp, adminRoutes, type AdminOptions } from './admin/routes'
import { SignInThrottle } from './http/throttle'
import { clientMeta, pathnameOf, rememberMeta } from './http/client'
import { edgeGuard, secured } from './http/edge'
import { TenantLimits } from './http/rate-limit'
import { FailedCredentials } from './http/failed-credentials'
import { REFUSAL_REASONS, TenantRefusals } from './http/tenant-refusals'
import { docsUi } from './docs-ui'

export interface AppDependencies {
  readonly config: Config
  readonly pools: Pools
  readonly metrics: Metrics
  /** The gauges computed in PostgreSQL, added to /metrics. */
  readonly gauges?: DatabaseGauges
  /** WORKERS>1: /metrics sums the per-process metrics of all workers. */
  readonly cluster?: ClusterMetrics
  readonly inFlight?: InFlight
  /** When /metrics was read: a drain waits for one more read after its last answer (metrics/scrapes.ts). */
  readonly scrapes?: Scrapes
  /** The payment provider; @default a client of config.providerUrl. */
  readonly provider?: PaymentProvider
  /** This process's heartbeat id, the owner of the keys it claims. */
  readonly owner?: () => string | undefined
  /** When given, requests that need the database, while it is known to be away, wait up to DATABASE_WAIT_MS for it (`whenUp`; without it, none) and are then answered 503. */
  readonly health?: Pick<DatabaseHealth, 'up'> & Partial<Pick<DatabaseHealth, 'whenUp' | 'unreachableWorkers'>>
  /** Tests move the engine's clock with this. */
  readonly now?: () => Date | undefined
  /** The per-tenant limits of /api (http/rate-limit.ts). @default from config, one per process */
  readonly limits?: TenantLimits
  /** Where request, operator and error lines go (JSON lines). @default src/log.ts's logger (stdout) */
  readonly log?: Logger
}

const operationsAnswer = problemAnswers(OPERATIONS_PROBLEMS)
/** The edge's refusals (http/edge.ts), which any route may meet: documented on the operations routes, whose other answers are 2xx and 503. */
const edgeAnswer = problemAnswers(EDGE_PROBLEMS)

/** Routes that cannot answer without the database: the API and the admin, but for the runbooks (admin/pages.ts). */
const NEEDS_DATABASE = /^\/(?:api(?:\/|$)|admin(?:$|\/(?!runbooks(?:\/|$))))/

/**
 * The `route` label of http_requests_total: this app's templates (the first
 * match wins); any other path is counted as `other` (http/observe.ts).
 */
export const ROUTE_LABELS: readonly string[] = [
  ...PAYMENTS_ROUTES, '/healthz', '/readyz', '/metrics', ...DOCS_ROUTES, '/docs/*', '/admin/api/*', '/admin/*',
]

/** The payments service as an Elysia app, without a listening socket (tests call `app.handle`). */
export function buildApp(deps: AppDependencies) {
  const { config, pools, metrics } = deps
  const log = deps.log ?? processLog
  primeRoute(metrics, PAYMENTS_ROUTE)
  // Every configured tenant's refusals from 0: an alert's increase() sees the first ones.
  for (const tenant of new Set(config.apiKeys.values())) for (const reason of REFUSAL_REASONS) metrics.tenantRefusals.inc({ tenant, reason }, 0)
  metrics.ttl.set(config.ttlSeconds)
  if (pools.usage) observePools(metrics, pools.usage, pools.workerUsage)
  observeReadiness(metrics, () => deps.health?.up ?? true)
  const tenant = tenantOfService(deps)
  const provider = deps.provider ?? providerFor(config, metrics)
  const adminBase: AdminOptions = {
    pools,
    tenantsHeld: () => tenantRefusalsOf(deps).held(),
    operators: config.operators,
    throttle: new SignInThrottle(),
    ttlSeconds: config.ttlSeconds,
    retentionSeconds: config.retentionSeconds,
    metrics,
    log,
    ...(deps.now ? { now: deps.now } : {}),
  }
  // The admin JSON API is described from an instance of the admin app's own routes (it is only read).
  let adminApiDocument: object | undefined
  const admin: AdminOptions = { ...adminBase, openApiDocument: () => (adminApiDocument ??= adminDocument(adminApp(adminBase))) }
  // The methods each path is served with (http/allow.ts), from this app's routes once all are added.
  let served: ((pathname: string) => PathMethods) | undefined
  let routes: () => readonly { method: string; path: string }[] = () => []
  const methods = (request: Request) => (served ??= methodsOf(routes()))(new URL(request.url).pathname)
  const app = new Elysia({ name: 'idempotent-post-service' })
    .onError(({ code, error, request }) => {
      if (code === 'NOT_FOUND') {
        // A path we serve, with a method we do not: 405 and what it takes (RFC 9110); an unknown path stays 404.
        const { allow, any } = methods(request)
        return allow.length && !any
          ? problemResponse(problem('method-not-allowed', `${request.method} is not served here; Allow: ${allow.join(', ')}.`), { allow: allow.join(', ') })
          : problemResponse(problem('not-found'))
      }
      if (code === 'PARSE' || code === 'VALIDATION') return problemResponse(problem('invalid-request'))
      if (isUnavailable(error)) return problemResponse(problem('database-unavailable'))
      const status = typeof (error as { status?: unknown }).status === 'number' ? (error as { status: number }).status : 500
      if (status === 413) return problemResponse(problem('body-too-large', `The body must be at most ${config.maxBodyBytes} bytes.`))
      // Any other refusal Elysia raises (none is known today) is a bad request: one code, one status.
      if (status >= 400 && status < 500) return problemResponse(problem('bad-request'))
      requestLogger(request, {}, log).error('unhandled error', { error })
      return problemResponse(problem('internal'))
    })
    // While the database is away, wait for it briefly (a failover takes a couple of seconds), then
    // answer 503, instead of queueing behind reconnects (store/health.ts).
    .onRequest(async ({ request }) => {
      const health = deps.health
      if (!health || health.up || !NEEDS_DATABASE.test(pathnameOf(request))) return
      if (!health.whenUp || !(await health.whenUp(DATABASE_WAIT_MS))) return problemResponse(problem('database-unavailable'))
    })
    // OPTIONS says what a path takes (RFC 9110 §9.3.7); paths an `.all` route takes (the admin) answer for
    // themselves. (A HEAD is answered by Elysia as its GET, without the body.)
    .onRequest(({ request }) => {
      if (request.method !== 'OPTIONS') return
      const { allow, any } = methods(request)
      if (!any && allow.length) return new Response(null, { status: 204, headers: { allow: allow.join(', ') } })
    })
    .use(apiDocs({ ttlSeconds: config.ttlSeconds, retentionSeconds: config.retentionSeconds }))
    .use(docsUi())
    .get('/healthz', () => Response.json({ status: 'ok' }), {
      detail: detail({ summary: 'Liveness: 200 while the process runs', tags: ['operations'], security: [], responses: { 200: health('ok'), 421: edgeAnswer(['host-not-allowed']) } }),
    })
    // Ready when the write path works (the health probe's own commit, store/health.ts:
    // a stalled synchronous standby hangs every write while reads still answer)
    // and the pool answers. The probe runs on its interval, so a check costs no write.
    .get('/readyz', async () => {
      // At once on SIGTERM, before anything else: a load balancer takes this server out while it finishes its requests.
      if (deps.inFlight?.draining) return problemResponse(OPERATIONS_PROBLEMS.problem('draining'))
      if (deps.health && !deps.health.up) return problemResponse(OPERATIONS_PROBLEMS.problem('not-ready', 'The database does not take writes right now (down, read-only, or waiting for its synchronous standby).'))
      if (!await databaseAnswers(pools.short)) return problemResponse(OPERATIONS_PROBLEMS.problem('not-ready'))
      // Citus: a worker the coordinator cannot reach fails its tenants only; this server still serves the others (store/health.ts).
      const unreachable = deps.health?.unreachableWorkers ?? []
      return Response.json(unreachable.length ? { status: 'ready', unreachable_workers: unreachable } : { status: 'ready' })
    }, {
      detail: detail({ summary: 'Readiness: 200 when the database takes writes', tags: ['operations'], security: [], responses: { 200: health('ready'), 421: edgeAnswer(['host-not-allowed']), 503: operationsAnswer(['not-ready', 'draining']) } }),
    })
    .get('/metrics', async () => {
      try {
        const text = await exposition({ registry: metrics.registry, gauges: deps.gauges, cluster: deps.cluster })
        deps.scrapes?.seen()
        return new Response(text, { headers: { 'content-type': metrics.registry.contentType } })
      } catch (error) {
        // Only the WORKERS>1 aggregation can fail; a gap beats a partial sum (see metrics/cluster.ts).
        log.error('metrics: the workers\' metrics could not be collected', { error })
        return problemResponse(OPERATIONS_PROBLEMS.problem('metrics-unavailable'))
      }
    }, {
      detail: detail({
        summary: 'Prometheus metrics',
        tags: ['operations'],
        security: [],
        responses: {
          200: { description: 'Prometheus text exposition (prom-client).', content: { 'text/plain': { schema: { type: 'string' } } } },
          401: problemAnswer(['unauthorized'], 'With METRICS_TOKEN set: no or a wrong `Authorization: Bearer <METRICS_TOKEN>`.'),
          421: edgeAnswer(['host-not-allowed']),
          429: edgeAnswer(['credentials-throttled']),
          503: operationsAnswer(['metrics-unavailable'], 'WORKERS>1: the workers\' metrics could not be collected.'),
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
      replayCacheEntries: config.replayCacheEntries,
      hooks: idempotencyHooks(metrics),
      log,
      ...(deps.inFlight ? { inFlight: deps.inFlight } : {}),
      ...(deps.owner ? { owner: deps.owner } : {}),
      ...(deps.now ? { now: deps.now } : {}),
    }))
    .use(adminRoutes(admin))
  routes = () => app.routes
  return app
}

export type App = ReturnType<typeof buildApp>

function providerFor(config: Config, metrics: Metrics): PaymentProvider {
  // main.ts starts the simulator and sets PAYMENT_PROVIDER_URL before any server runs.
  if (!config.providerUrl) throw new Error('PAYMENT_PROVIDER_URL is not set: no payment provider to call')
  return providerClient(config.providerUrl, { observe: observeProvider(metrics), begin: providerCallsInFlight(metrics) })
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

export interface ServeOptions {
  readonly reusePort?: boolean
  /** `metrics`: the METRICS_PORT listener (on METRICS_HOST), serving /metrics only. @default 'main' */
  readonly listener?: 'main' | 'metrics'
}

/**
 * The app as the service answers: request ids (and the one line for a failure
 * nobody logged) around the HTTP metrics, around the edge guard (host
 * allow-list, /metrics placement and token, tenant limits, nosniff and HSTS:
 * http/edge.ts), around the app. serve() runs this; in-process tests call it
 * instead of app.handle to get the same answers. Every request is counted in
 * flight from its acceptance until answered, as the app sees it (the plugin
 * counts the same object once): a shutdown closes the pools only after the
 * last one (lifecycle.ts).
 */
export function serviceFetch(app: App, deps: AppDependencies, listener: 'main' | 'metrics' = 'main'): (request: Request) => Promise<Response> {
  const { config, inFlight } = deps
  const handled = inFlight
    ? async (request: Request) => {
      const done = inFlight.track(request)
      try {
        return await app.handle(request)
      } finally {
        done()
      }
    }
    : (request: Request) => app.handle(request)
  const guarded = edgeGuard({
    allowedHosts: config.allowedHosts,
    metricsToken: config.metricsToken,
    listener,
    metricsElsewhere: config.metricsPort !== undefined,
    limits: { limits: deps.limits ?? new TenantLimits({ rate: config.tenantRateLimit, burst: config.tenantRateBurst, maxInFlight: config.tenantMaxInFlight }), tenantOf: tenantOfService(deps), refusals: tenantRefusalsOf(deps) },
    failedCredentials: failedCredentialsOf(deps),
  }, handled)
  const counted = observed(ROUTE_LABELS, countAnswer(deps.metrics), guarded)
  return withRequestIds(counted, { routeOf: routeLabeler(ROUTE_LABELS), log: deps.log })
}

/** One tenant lookup per service: the edge's limits and the routes share each request's answer (one digest per request). */
const tenantLookups = new WeakMap<AppDependencies, (request: Request) => string | undefined>()
function tenantOfService(deps: AppDependencies): (request: Request) => string | undefined {
  let found = tenantLookups.get(deps)
  if (!found) tenantLookups.set(deps, (found = bearerTenant(deps.config.apiKeys)))
  return found
}

/** One record of refused tenants per service: the edge writes it, the admin page reads it. */
const tenantRefusals = new WeakMap<AppDependencies, TenantRefusals>()
function tenantRefusalsOf(deps: AppDependencies): TenantRefusals {
  let found = tenantRefusals.get(deps)
  if (!found) tenantRefusals.set(deps, (found = new TenantRefusals(deps.metrics.tenantRefusals, deps.log)))
  return found
}

/** One record of wrong credentials per service, whichever of its listeners they come to. */
const failedCredentials = new WeakMap<AppDependencies, FailedCredentials>()
function failedCredentialsOf(deps: AppDependencies): FailedCredentials {
  let found = failedCredentials.get(deps)
  if (!found) failedCredentials.set(deps, (found = new FailedCredentials(deps.metrics.authFailures, deps.log, deps.config.authFailuresPerMinute)))
  return found
}

export function serve(app: App, deps: AppDependencies, options: ServeOptions = {}) {
  const { config } = deps
  const listener = options.listener ?? 'main'
  const handle = serviceFetch(app, deps, listener)
  // An HTTP/1.0 request may come without Host (legal there; HAProxy's default
  // health check is one): Bun then gives only the path as its URL, which no
  // URL parser takes. It is served with the address we listen on as its origin.
  const fetch = (request: Request, server: Bun.Server<unknown>) => {
    const served = request.headers.has('host')
      ? request
      : withOrigin(request, `http://${server.hostname?.includes(':') ? `[${server.hostname}]` : server.hostname}:${server.port}`)
    // Who is asking, found once (http/client.ts): the socket's address, or a trusted proxy's word for it, when first asked.
    rememberMeta(served, clientMeta(served, () => server.requestIP(request)?.address, config.trustProxy))
    return handle(served)
  }
  return Bun.serve({
    hostname: listener === 'metrics' ? config.metricsHost : config.host,
    port: listener === 'metrics' ? config.metricsPort ?? 0 : config.port,
    reusePort: options.reusePort ?? false,
    maxRequestBodySize: BUN_BODY_CAP_BYTES,
    fetch,
    error(error) {
      (deps.log ?? processLog).error('server error', { error })
      return secured(problemResponse(problem('internal')), false)
    },
  })
}
