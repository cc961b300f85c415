import type { Metrics } from '../metrics/registry'

/**
 * Route templates for the `route` label. Paths are client-chosen: mapping
 * them to a fixed set keeps a hostile client from creating series at will.
 */
const ROUTES: readonly [RegExp, string][] = [
  [/^\/api\/payments$/, '/api/payments'],
  [/^\/api\/payments\/[^/]+$/, '/api/payments/:id'],
  [/^\/metrics$/, '/metrics'],
  [/^\/healthz$/, '/healthz'],
  [/^\/readyz$/, '/readyz'],
  [/^\/admin\/api\//, '/admin/api'],
  [/^\/admin(\/|$)/, '/admin'],
]

const METHODS = new Set(['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'])

export function routeLabel(pathname: string): string {
  for (const [pattern, label] of ROUTES) if (pattern.test(pathname)) return label
  return 'other'
}

/** Wraps a fetch handler so every answer is counted and timed, 4xx from auth and validation included. */
export function observed(metrics: Metrics, fetch: (request: Request) => Promise<Response>) {
  return async function observedFetch(request: Request): Promise<Response> {
    const started = performance.now()
    const response = await fetch(request)
    const labels = {
      method: METHODS.has(request.method) ? request.method : 'OTHER',
      route: routeLabel(new URL(request.url).pathname),
      status: String(response.status),
    }
    metrics.httpRequests.inc(labels)
    metrics.httpDuration.observe(labels, (performance.now() - started) / 1000)
    return response
  }
}
