/**
 * What every request meets before the app, and every answer after it, on a
 * real socket (server.ts's serve): the Host allow-list, which listener
 * serves /metrics and its token, the per-tenant limits on /api, and the
 * headers every answer carries (nosniff; HSTS when the client came over TLS).
 */
import type { TenantRefusals } from './tenant-refusals'
import { EDGE_PROBLEMS } from './edge-problems'
import { timingSafeEqual } from 'node:crypto'
import { isAllowedHost, type AllowedHosts } from './allowed-host'
import { pathnameOf, requestMeta } from './client'
import { problem, problemResponse } from './problem'
import type { TenantLimits } from './rate-limit'
import { tokenDigest } from '../credentials'
import type { FailedCredentials } from './failed-credentials'

export const METRICS_PATH = '/metrics'
/**
 * One year, the usual HSTS lifetime (and what preload lists ask for); no
 * includeSubDomains: the service does not own its domain's other names.
 */
export const HSTS = 'max-age=31536000'

export interface EdgeOptions {
  readonly allowedHosts: AllowedHosts
  /** The Bearer token /metrics needs, if any. */
  readonly metricsToken?: string | undefined
  /**
   * `main`: the service (and /metrics too, unless `metricsElsewhere`);
   * `metrics`: the METRICS_PORT listener, which serves /metrics and nothing else.
   */
  readonly listener: 'main' | 'metrics'
  readonly metricsElsewhere?: boolean
  /** Per-tenant limits on /api, with how a request's tenant is found. */
  readonly limits?: { readonly limits: TenantLimits; readonly tenantOf: (request: Request) => string | undefined; readonly refusals?: TenantRefusals | undefined } | undefined
  /** Wrong API keys and metrics tokens: counted, throttled per address, logged as a summary. */
  readonly failedCredentials?: FailedCredentials | undefined
}

type Handle = (request: Request) => Promise<Response>

export function edgeGuard(options: EdgeOptions, handle: Handle): Handle {
  const metricsDigest = options.metricsToken ? tokenDigest(options.metricsToken) : undefined
  const limited = options.limits?.limits.enabled ? options.limits : undefined

  return async function guarded(request: Request): Promise<Response> {
    const secure = requestMeta(request).secure
    if (!isAllowedHost(request.headers.get('host'), options.allowedHosts))
      return secured(problemResponse(EDGE_PROBLEMS.problem('host-not-allowed')), secure)
    const path = pathnameOf(request)
    const isMetrics = path === METRICS_PATH || path === `${METRICS_PATH}/`
    if (options.listener === 'metrics' ? !isMetrics : isMetrics && options.metricsElsewhere)
      return secured(problemResponse(problem('not-found')), secure)
    const failures = options.failedCredentials
    const presented = request.headers.has('authorization')
    if (isMetrics && metricsDigest) {
      const throttled = presented ? failures?.refusal(request, 'metrics') : undefined
      if (throttled) return secured(throttled, secure)
      if (!hasBearer(request, metricsDigest)) {
        if (presented) failures?.failed(request, 'metrics')
        return secured(problemResponse(problem('unauthorized', 'Send Authorization: Bearer <METRICS_TOKEN>.'), { 'www-authenticate': 'Bearer realm="metrics"' }), secure)
      }
    }

    const isApi = path === '/api' || path.startsWith('/api/')
    if (isApi && presented && failures) {
      const throttled = failures.refusal(request, 'api')
      if (throttled) return secured(withHeaders(throttled, { 'cache-control': 'no-store' }), secure)
      const response = await admitted(request, isApi, secure)
      // The app answers 401 for a key it does not know (or one it cannot parse): a wrong key.
      if (response.status === 401) failures.failed(request, 'api')
      return response
    }
    return admitted(request, isApi, secure)
  }

  /** The request through its tenant's limits (on /api, when enabled), then the app; an /api answer is never stored by a cache. */
  async function admitted(request: Request, isApi: boolean, secure: boolean): Promise<Response> {
    if (!isApi) return admittedByLimits(request, false, secure)
    const response = await admittedByLimits(request, true, secure)
    // Payments and stored answers are one tenant's: no shared or browser cache keeps them (ASVS 8.2.1).
    return response.headers.has('cache-control') ? response : withHeaders(response, { 'cache-control': 'no-store' })
  }

  async function admittedByLimits(request: Request, isApi: boolean, secure: boolean): Promise<Response> {
    const tenant = limited && isApi ? limited.tenantOf(request) : undefined
    if (tenant === undefined) return secured(await handle(request), secure)
    const admission = limited!.limits.admit(tenant)
    if (!admission.ok) {
      limited!.refusals?.refused(request, tenant, admission.reason)
      return secured(admission.response, secure)
    }
    try {
      const response = await handle(request)
      return secured(withHeaders(response, admission.headers), secure)
    } finally {
      admission.release()
    }
  }
}

/** The headers every answer carries. */
export function secured(response: Response, secure: boolean): Response {
  return withHeaders(response, {
    'x-content-type-options': 'nosniff',
    ...(secure ? { 'strict-transport-security': HSTS } : {}),
  })
}

function withHeaders(response: Response, headers: Readonly<Record<string, string>>): Response {
  const names = Object.keys(headers)
  if (names.length === 0) return response
  try {
    for (const name of names) response.headers.set(name, headers[name]!)
    return response
  } catch {
    // Immutable headers (a Response from fetch): a copy with ours.
    const copy = new Response(response.body, response)
    for (const name of names) copy.headers.set(name, headers[name]!)
    return copy
  }
}

function hasBearer(request: Request, digest: Buffer): boolean {
  const match = /^Bearer ([!-~]{1,512})$/i.exec(request.headers.get('authorization')?.trim() ?? '')
  return match !== null && timingSafeEqual(tokenDigest(match[1]!), digest)
}
