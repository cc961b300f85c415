import { Elysia } from 'elysia'
import type { Config } from './config'
import { bearerTenant } from './http/auth'
import { InFlight } from './http/in-flight'
import { observed } from './http/observe'
import { problemResponse, problems, type Problem } from './http/problem'
import type { Metrics } from './metrics/registry'
import { paymentsRoutes } from './payments/routes'
import { createProvider, type Charge } from './payments/provider'
import { databaseAnswers, type Pools } from './store/db'
import { isUnavailable } from './core/errors'

export interface AppDependencies {
  readonly config: Config
  readonly pools: Pools
  readonly metrics: Metrics
  readonly inFlight?: InFlight
  readonly charge?: Charge
  /** Tests move the engine's clock with this. */
  readonly now?: () => Date | undefined
}

/** The payments service as an Elysia app, without a listening socket (tests call `app.handle`). */
export function buildApp(deps: AppDependencies) {
  const { config, pools, metrics } = deps
  const charge = deps.charge ?? createProvider({ delayMs: config.providerDelayMs, failureRate: config.providerFailureRate })
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
    .get('/healthz', () => Response.json({ status: 'ok' }))
    .get('/readyz', async () =>
      (await databaseAnswers(pools.short))
        ? Response.json({ status: 'ready' })
        : problemResponse({ code: 'not-ready', status: 503, title: 'Not ready', detail: 'The database does not answer.' }, { 'retry-after': '2' }))
    .get('/metrics', async () => new Response(await metrics.registry.metrics(), { headers: { 'content-type': metrics.registry.contentType } }))
    .use(paymentsRoutes({
      pools,
      charge,
      tenant: bearerTenant(config.apiKeys),
      ttlSeconds: config.ttlSeconds,
      retentionSeconds: config.retentionSeconds,
      maxBodyBytes: config.maxBodyBytes,
      metrics,
      ...(deps.inFlight ? { inFlight: deps.inFlight } : {}),
      ...(deps.now ? { now: deps.now } : {}),
    }))
}

export type App = ReturnType<typeof buildApp>

/** Bun's own body cap, well above ours so that our 413 (problem+json) answers first. */
export function bunBodyCap(maxBodyBytes: number): number {
  return Math.max(maxBodyBytes * 4, 1024 * 1024)
}

export function serve(app: App, deps: AppDependencies, options: { reusePort?: boolean } = {}) {
  const fetch = observed(deps.metrics, (request) => app.handle(request))
  return Bun.serve({
    hostname: deps.config.host,
    port: deps.config.port,
    reusePort: options.reusePort ?? false,
    maxRequestBodySize: bunBodyCap(deps.config.maxBodyBytes),
    fetch,
    error(error) {
      console.error('server error:', error.message)
      return problemResponse(problems.internal())
    },
  })
}
