import { Counter, Histogram, type Registry } from 'prom-client'

/**
 * The gateway's own metrics, beside the engine's (idempotency_requests_total
 * and the rest, labelled with the route's name): the upstream as a
 * dependency, the answers it gave that were not stored, and the keys held on
 * an unknown outcome (each one waits for its TTL or an operator).
 */
export interface GatewayMetrics {
  /** One forward, by route and outcome: answered, not_sent, unknown, deadline. */
  readonly upstream: Histogram<'route' | 'outcome'>
  /** Upstream answers given to the client but not stored (the key released): too_large, status_4xx, status_5xx, completion_failed. */
  readonly unstored: Counter<'route' | 'reason'>
  /** Keys left in processing on an unknown outcome (route rule `hold`). */
  readonly held: Counter<'route'>
}

export const UPSTREAM_OUTCOMES = ['answered', 'not_sent', 'unknown', 'deadline'] as const
export const UNSTORED_REASONS = ['too_large', 'status_4xx', 'status_5xx', 'completion_failed'] as const

export function gatewayMetrics(registry: Registry, routes: readonly string[]): GatewayMetrics {
  const registers = [registry]
  const metrics: GatewayMetrics = {
    upstream: new Histogram({
      name: 'idempotency_gateway_upstream_duration_seconds',
      help: 'Claimed requests forwarded to the upstream, by route and outcome (answered, not_sent, unknown, deadline).',
      labelNames: ['route', 'outcome'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers,
    }),
    unstored: new Counter({
      name: 'idempotency_gateway_unstored_answers_total',
      help: 'Upstream answers passed to the client but not stored, so the key was released: too_large, status_4xx, status_5xx, completion_failed.',
      labelNames: ['route', 'reason'],
      registers,
    }),
    held: new Counter({
      name: 'idempotency_gateway_held_keys_total',
      help: 'Keys held in processing after an unknown upstream outcome (route rule hold): retries get 409 until the TTL or an operator.',
      labelNames: ['route'],
      registers,
    }),
  }
  // From 0, so an alert's increase() sees the first one.
  for (const route of routes) {
    for (const reason of UNSTORED_REASONS) metrics.unstored.inc({ route, reason }, 0)
    metrics.held.inc({ route }, 0)
  }
  return metrics
}
