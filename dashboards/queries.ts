/**
 * The PromQL shared by the dashboard, the Grafana alert rules and the
 * Prometheus rule file: one definition, three outputs (see build.ts).
 *
 * Aggregation rules, which hold with WORKERS>1 and with several replicas:
 * - per-process counters and histograms: `sum(rate(...))` over instances (with
 *   WORKERS>1 one scrape already sums the workers, see src/metrics/cluster.ts);
 * - database gauges: the same value from every instance, so `max`, never `sum`
 *   (two replicas would double the stranded keys otherwise).
 */

/** Label filter for the dashboard's job and instance variables. */
export const SELECTED = 'job=~"$job", instance=~"$instance"'

const PAYMENTS = 'route="/api/payments"'

export function outcomes(filter: string): string {
  return `sum by (outcome) (rate(idempotency_requests_total{${filter}}[$__rate_interval]))`
}

/** 409 answers per 2xx answer on the idempotent route: retries that hit an in-flight key, and lost leases. */
export function conflictRatio(filter: string, window: string): string {
  const f = filter ? `${filter}, ` : ''
  return `sum(rate(http_requests_total{${f}${PAYMENTS}, status="409"}[${window}])) / sum(rate(http_requests_total{${f}${PAYMENTS}, status=~"2.."}[${window}]))`
}

export function latencyQuantile(quantile: number, filter: string): string {
  return `histogram_quantile(${quantile}, sum by (le) (rate(http_request_duration_seconds_bucket{${filter}, ${PAYMENTS}}[$__rate_interval])))`
}

export function staleKeys(filter: string): string {
  return `max by (tenant) (idempotency_stale_processing_keys{${filter}})`
}

export function oldestProcessingAge(filter: string): string {
  return `max(idempotency_oldest_processing_age_seconds{${filter}})`
}

export function duplicateEntities(filter: string): string {
  return `max by (tenant) (idempotency_duplicate_entities{${filter}})`
}

export function gaugesRefreshFailed(filter: string): string {
  return `max(idempotency_gauges_refresh_failed{${filter}})`
}

/** An alert, written once and rendered both as a Grafana rule and as a Prometheus rule. */
export interface AlertDefinition {
  readonly uid: string
  readonly name: string
  /** The measured expression, without the comparison. */
  readonly expr: string
  readonly threshold: number
  /** How long the condition must hold (Prometheus `for`). */
  readonly for: string
  readonly severity: 'page' | 'ticket'
  readonly summary: string
  readonly description: string
}

/**
 * 0.1: one 409 per ten successes. A client retries after its own timeout
 * (seconds), while a payment completes in milliseconds plus the provider, so
 * a healthy service answers a few 409s per thousand (a double-tap, a retry
 * racing a slow provider call). Ten per cent sustained for 10 minutes means
 * processing got slow (keys held longer than clients wait), keys are stranded
 * (every retry of a stuck key is a 409 until the TTL), or a client hammers a
 * key in a loop. All three need a human; a 1% threshold would page on a single
 * impatient client at low traffic.
 */
export const CONFLICT_RATIO_THRESHOLD = 0.1

export const ALERTS: readonly AlertDefinition[] = [
  {
    uid: 'idem-stale-processing-keys',
    name: 'IdempotencyStaleProcessingKeys',
    expr: 'max by (tenant) (idempotency_stale_processing_keys)',
    threshold: 0,
    // 5 m: longer than any honest request (the TTL is 30 s by default), so
    // only keys that nobody reclaims (no retry came) keep it true that long.
    for: '5m',
    severity: 'page',
    summary: 'Idempotency keys stuck in processing',
    description: 'Keys in processing past their TTL for 5 minutes: their worker died and no retry reclaimed them. Check /admin and force-expire them if their workers are gone.',
  },
  {
    uid: 'idem-conflict-ratio',
    name: 'IdempotencyConflictRatioHigh',
    expr: conflictRatio('', '5m'),
    threshold: CONFLICT_RATIO_THRESHOLD,
    for: '10m',
    severity: 'ticket',
    summary: 'Too many 409 answers per success on /api/payments',
    description: 'More than one 409 per ten 2xx answers for 10 minutes: processing is slow, keys are stranded, or a client retries a key in a tight loop.',
  },
  {
    uid: 'idem-duplicate-entities',
    name: 'IdempotencyDuplicateEntities',
    expr: 'max by (tenant) (idempotency_duplicate_entities)',
    threshold: 0,
    // 1 m: the gauge is computed once per scrape cache interval; one minute
    // rides out a single odd scrape without delaying a real finding much.
    for: '1m',
    severity: 'ticket',
    summary: 'The same request completed under different idempotency keys',
    description: 'Within the last hour a client sent the same request (tenant, route, body) under new keys and it completed more than once: that client makes a new key per retry, so idempotency cannot protect it.',
  },
  {
    uid: 'idem-gauges-refresh-failed',
    name: 'IdempotencyGaugesRefreshFailing',
    expr: 'max(idempotency_gauges_refresh_failed)',
    threshold: 0,
    // 10 m: a slow database for a scrape or two is not news; ten minutes of
    // stale gauges means the stale-key and duplicate alerts above are blind.
    for: '10m',
    severity: 'ticket',
    summary: 'The database gauges at /metrics are not refreshing',
    description: 'The gauge query failed or timed out for 10 minutes; stale-key and duplicate gauges show old values.',
  },
]
