import { Counter, Histogram, Registry } from 'prom-client'
import { OUTCOMES, type IdempotencyHooks } from '../http/outcomes'
import type { AnswerEvent } from '../http/observe'

export { OUTCOMES, type Outcome } from '../http/outcomes'

/**
 * Seconds. A replay or 409 takes well under a millisecond of our time plus one
 * round trip; a fresh payment a few milliseconds plus the provider; the top
 * buckets catch provider stalls up to the TTL.
 */
export const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]

/** The product's metrics, in a registry of their own (tests and several apps never collide). */
export interface Metrics {
  readonly registry: Registry
  readonly idempotencyRequests: Counter<'route' | 'outcome'>
  readonly httpRequests: Counter<'method' | 'route' | 'status'>
  readonly httpDuration: Histogram<'method' | 'route' | 'status'>
  readonly idempotencyDuration: Histogram<'route' | 'outcome'>
  readonly reclaims: Counter<'route'>
  readonly leasesLost: Counter<'route'>
  readonly releases: Counter<'route'>
  readonly purgedKeys: Counter
}

export function createMetrics(registry: Registry = new Registry()): Metrics {
  const registers = [registry]
  return {
    registry,
    idempotencyRequests: new Counter({
      name: 'idempotency_requests_total',
      help: 'Idempotent requests by outcome.',
      labelNames: ['route', 'outcome'],
      registers,
    }),
    httpRequests: new Counter({
      name: 'http_requests_total',
      help: 'Every HTTP answer, by method, route template and status.',
      labelNames: ['method', 'route', 'status'],
      registers,
    }),
    httpDuration: new Histogram({
      name: 'http_request_duration_seconds',
      help: 'Time from request to answer, by method, route template and status.',
      labelNames: ['method', 'route', 'status'],
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    idempotencyDuration: new Histogram({
      name: 'idempotency_request_duration_seconds',
      help: 'Time spent on an idempotent request, by outcome.',
      labelNames: ['route', 'outcome'],
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    reclaims: new Counter({
      name: 'idempotency_reclaims_total',
      help: 'Stale processing keys taken over by a retry after their worker was gone.',
      labelNames: ['route'],
      registers,
    }),
    leasesLost: new Counter({
      name: 'idempotency_lease_lost_total',
      help: 'Workers that found their claim taken over at commit time; their writes were rolled back.',
      labelNames: ['route'],
      registers,
    }),
    releases: new Counter({
      name: 'idempotency_releases_total',
      help: 'Keys given back after their handler failed, so that a retry runs again.',
      labelNames: ['route'],
      registers,
    }),
    purgedKeys: new Counter({
      name: 'idempotency_purged_keys_total',
      help: 'Completed keys deleted after their retention ended.',
      registers,
    }),
  }
}

/**
 * The answers of an idempotent POST route (the README's HTTP API) whose
 * http_requests_total series exist from the start: the dashboards' "HTTP
 * answers by status" and any status ratio see the first 409 or 5xx after a
 * deploy. Others (a 502 from a proxy, say) appear on first use.
 */
export const PRIMED_STATUSES = ['201', '400', '401', '409', '413', '415', '422', '500', '503', '504'] as const

/**
 * Gives every outcome of `route`, and its usual HTTP statuses, a 0 sample
 * before the first request, so that rate() and increase() see the first
 * increment (a series that appears at 1 has no earlier sample to subtract, so
 * that request would be lost to them: after every deploy, the first 409s).
 */
export function primeRoute(metrics: Metrics, route: string, method = 'POST'): void {
  for (const outcome of OUTCOMES) metrics.idempotencyRequests.inc({ route, outcome }, 0)
  for (const status of PRIMED_STATUSES) metrics.httpRequests.inc({ method, route, status }, 0)
  metrics.reclaims.inc({ route }, 0)
  metrics.leasesLost.inc({ route }, 0)
  metrics.releases.inc({ route }, 0)
}

/** The plugin's hooks, counted into `metrics` (the plugin knows no metrics library). */
export function idempotencyHooks(metrics: Metrics): IdempotencyHooks {
  return {
    onOutcome({ route, outcome, seconds }) {
      metrics.idempotencyRequests.inc({ route, outcome })
      metrics.idempotencyDuration.observe({ route, outcome }, seconds)
    },
    onReclaim: ({ route }) => metrics.reclaims.inc({ route }),
    onLeaseLost: ({ route }) => metrics.leasesLost.inc({ route }),
    onRelease: ({ route }) => metrics.releases.inc({ route }),
  }
}

/** http_requests_total and its histogram, fed by http/observe.ts. */
export function countAnswer(metrics: Metrics) {
  return function onAnswer({ method, route, status, seconds }: AnswerEvent): void {
    const labels = { method, route, status: String(status) }
    metrics.httpRequests.inc(labels)
    metrics.httpDuration.observe(labels, seconds)
  }
}
