/**
 * The gateway as a fetch handler: its own few paths under `/_gateway/`
 * (liveness, readiness, Prometheus metrics), every other request to the
 * exchange (claimed, or forwarded untouched). No Elysia router in front: the
 * gateway serves any path and method the upstream does, and nothing of ours
 * may answer for them. Answers from the upstream pass as they are (no request
 * id stamped on them, no problem body rewritten); the gateway's own problems
 * carry the request id of its log lines.
 */
import type { Metrics } from '../metrics/registry'
import { countAnswer } from '../metrics/registry'
import { exposition } from '../metrics/exposition'
import type { DatabaseGauges } from '../metrics/gauges'
import { InFlight } from '../http/in-flight'
import { problem, problemResponse } from '../http/problem'
import { databaseAnswers, type Pools } from '../store/db'
import type { GatewayConfig } from './config'
import { gatewayExchange, type Client } from './exchange'
import type { GatewayMetrics } from './metrics'
import { idempotencyHooks } from '../metrics/registry'
import { routeFor } from './routes'
import type { Logger } from '../log'

/** The gateway's own paths: chosen so no real API is likely to have them; everything else is the upstream's. */
export const GATEWAY_PREFIX = '/_gateway/'

export interface GatewayDependencies {
  readonly config: GatewayConfig
  readonly pools: Pools
  readonly metrics: Metrics
  readonly gatewayMetrics: GatewayMetrics
  readonly gauges?: DatabaseGauges | undefined
  readonly inFlight?: InFlight | undefined
  readonly owner?: (() => string | undefined) | undefined
  readonly log?: Logger | undefined
  /** @default 10000; 0 turns the replay cache off. */
  readonly replayCacheEntries?: number | undefined
}

export function gatewayFetch(deps: GatewayDependencies): (request: Request, client: Client) => Promise<Response> {
  const { config, metrics, inFlight } = deps
  const exchange = gatewayExchange({
    pools: deps.pools,
    routes: config.routes,
    defaultUpstream: config.defaultUpstream,
    retentionSeconds: config.retentionSeconds,
    tenantHeader: config.tenantHeader,
    requireKey: config.requireKey,
    unreplayedHeaders: config.unreplayedHeaders,
    inFlight,
    owner: deps.owner,
    hooks: idempotencyHooks(metrics),
    metrics: deps.gatewayMetrics,
    log: deps.log,
    replayCacheEntries: deps.replayCacheEntries,
  })
  const onAnswer = countAnswer(metrics)

  async function own(path: string): Promise<Response> {
    if (path === `${GATEWAY_PREFIX}healthz`) return Response.json({ status: 'ok' })
    if (path === `${GATEWAY_PREFIX}readyz`) {
      if (inFlight?.draining) return problemResponse(problem('shutting-down', 'This gateway is draining.'))
      return await databaseAnswers(deps.pools.short) ? Response.json({ status: 'ready' }) : problemResponse(problem('database-unavailable'))
    }
    if (path === `${GATEWAY_PREFIX}metrics`)
      return new Response(await exposition({ registry: metrics.registry, gauges: deps.gauges }), { headers: { 'content-type': metrics.registry.contentType } })
    return problemResponse(problem('not-found'))
  }

  return async function gateway(request, client) {
    const started = performance.now()
    const done = inFlight?.track(request)
    const path = new URL(request.url).pathname
    let response: Response | undefined
    try {
      response = path.startsWith(GATEWAY_PREFIX) ? await own(path) : await exchange(request, client)
      return response
    } finally {
      done?.()
      const method = request.method.toUpperCase()
      const route = path.startsWith(GATEWAY_PREFIX) ? path : (routeFor(config.routes, method, path)?.name ?? 'passthrough')
      onAnswer({ method, route, status: response?.status ?? 500, seconds: (performance.now() - started) / 1000 })
    }
  }
}

/** Bun's own body cap, far above any route's: the exchange answers 413 itself (as server.ts). */
const BUN_BODY_CAP_BYTES = 1024 * 1024 * 1024

/** Listens with `handle`: each request with its client's address and Host, for `Forwarded`. */
export function serveGateway(handle: (request: Request, client: Client) => Promise<Response>, options: { hostname: string; port: number; log?: Logger | undefined }) {
  return Bun.serve({
    hostname: options.hostname,
    port: options.port,
    maxRequestBodySize: BUN_BODY_CAP_BYTES,
    fetch(request, server) {
      return handle(request, { client: server.requestIP(request)?.address, host: request.headers.get('host') ?? undefined, proto: 'http' })
    },
    error(error) {
      options.log?.error('server error', { error })
      return problemResponse(problem('internal'))
    },
  })
}
