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

/**
 * The `job` label of the scrape job that scrapes the service, as in the
 * example config in docs/how-to/monitoring.md. The target-down alert matches it
 * exactly: `up` exists for every target Prometheus scrapes, and an alert on
 * all of them would page this service's owner for other teams' targets.
 * Name your scrape job so, or change this and run `npm run dashboards`.
 */
export const SCRAPE_JOB = 'idempotent-post'

/**
 * Outcomes answered 2xx (201 created, or the first answer replayed) and the
 * one answered 409 because the key is still processing (the metrics
 * contract, docs/reference/metrics.md). The ratio uses idempotency_requests_total, whose every outcome
 * exists at 0 from the start (primeRoute): increase() sees the first 409s
 * after a deploy, which a status series created by its first 409 would lose.
 * `lease_lost` (also a 409) is left out: it is a fenced worker, not a retry
 * that found its key busy, and has its own panel.
 */
export const SUCCESS_OUTCOMES = ['created', 'replayed', 'reclaimed'] as const
export const CONFLICT_OUTCOME = 'in_progress'

/** Titles of the panels the alerts point at (Grafana's __panelId__ is resolved from them). */
export const PANELS = {
  conflictRatio: '409 per 2xx on /api/payments',
  staleByTenant: 'Stale processing keys by tenant',
  duplicatesByTenant: 'Duplicate entities by tenant',
  gaugeRefresh: 'Gauge queries failing',
  targetsUp: 'Scrape targets up',
  serverErrors: '5xx share of API answers',
  ready: 'Database reachable (readiness)',
  refusalsByTenant: 'Refusals by tenant',
  providerInFlight: 'Provider calls in flight',
  purgeOverdue: 'Purge overdue',
} as const

/** The TTL the servers run with (the same on every instance: max). Thresholds and alert texts read it. */
export const TTL = 'max(idempotency_ttl_seconds)'
/** The same, of one scrape job: what the alerts' texts read. */
export function ttlOf(job: string): string {
  return `max(idempotency_ttl_seconds{${jobFilter(job)}})`
}

/** The API routes (the payments API), whose 5xx share pages: not /metrics, /readyz or the admin. */
const API = 'route=~"/api/.*"'
/** The 5xx ratio's window: a minute holds 4 scrapes at 15 s, enough for rate() to be steady. */
export const SERVER_ERRORS_WINDOW = '1m'
/** Fewer 5xx than this in the window never page, whatever the share: one failed payment at night is no outage. */
export const SERVER_ERRORS_MIN = 3

/** `{filter}`, or nothing for a filter of none. */
function matchers(filter: string): string {
  return filter ? `{${filter}}` : ''
}

/** The alerts' filter: this service's scrape job, exactly (another team's `http_requests_total` is not ours). */
export function jobFilter(job: string): string {
  return `job="${job}"`
}

/** `sum(`, or `sum by (a, b) (` when grouped: the dashboards aggregate everything, the alerts keep job (and instance). */
function aggregate(op: 'sum' | 'max', by: readonly string[]): string {
  return by.length ? `${op} by (${by.join(', ')}) (` : `${op}(`
}

export function outcomes(filter: string): string {
  return `sum by (outcome) (rate(idempotency_requests_total{${filter}}[$__rate_interval]))`
}

/** 409 answers per 2xx answer on the idempotent route: retries that found their key still processing. */
export function conflictRatio(filter: string, window: string, by: readonly string[] = []): string {
  const f = filter ? `${filter}, ` : ''
  return `${aggregate('sum', by)}rate(idempotency_requests_total{${f}${PAYMENTS}, outcome="${CONFLICT_OUTCOME}"}[${window}]))`
    + ` / ${aggregate('sum', by)}rate(idempotency_requests_total{${f}${PAYMENTS}, outcome=~"${SUCCESS_OUTCOMES.join('|')}"}[${window}]))`
}

/**
 * 1 per target of the job that Prometheus cannot scrape (`1 - up`, keeping
 * its job and instance labels), or 1 without an instance when the job has no
 * target at all (`absent`: service discovery lost it, or every pod is gone).
 */
export function targetsDown(job: string): string {
  return `(1 - up{job="${job}"}) or absent(up{job="${job}"})`
}

/**
 * The share of API answers that are 5xx, over `window`, when at least
 * SERVER_ERRORS_MIN of them are (`and` keeps the ratio's value; matched on
 * the `by` labels, or on none when all is summed).
 */
export function serverErrorRatio(window: string, filter = '', by: readonly string[] = []): string {
  const f = filter ? `${filter}, ` : ''
  const errors = `http_requests_total{${f}${API}, status=~"5.."}`
  return `${aggregate('sum', by)}rate(${errors}[${window}])) / ${aggregate('sum', by)}rate(http_requests_total{${f}${API}}[${window}]))`
    + ` and${by.length ? '' : ' on()'} ${aggregate('sum', by)}increase(${errors}[${window}])) >= ${SERVER_ERRORS_MIN}`
}

/**
 * `ratio`, left out for an instance that lost its database at any moment of
 * `window`: one outage pages once, as IdempotencyNotReady, and the 5xx of
 * its minute (the window still holds them after the database is back) page
 * nobody a second time. A 60 s outage used to page "server errors" as well,
 * and that alert stayed firing 67 s after the outage ended.
 */
export function unlessNotReady(ratio: string, filter: string, window: string): string {
  return `${ratio} unless on(job, instance) min_over_time(idempotency_ready${matchers(filter)}[${window}]) == 0`
}

/** 1 per instance that does not reach its database (idempotency_ready 0), 0 for one that does. */
export function notReady(filter: string, by: readonly string[] = ['instance']): string {
  return `${aggregate('max', by)}1 - idempotency_ready${matchers(filter)})`
}

export function latencyQuantile(quantile: number, filter: string): string {
  return `histogram_quantile(${quantile}, sum by (le) (rate(http_request_duration_seconds_bucket{${filter}, ${PAYMENTS}}[$__rate_interval])))`
}

export function staleKeys(filter: string, by: readonly string[] = ['tenant']): string {
  return `${aggregate('max', by)}idempotency_stale_processing_keys${matchers(filter)})`
}

export function oldestProcessingAge(filter: string): string {
  return `max(idempotency_oldest_processing_age_seconds${matchers(filter)})`
}

export function duplicateEntities(filter: string, by: readonly string[] = ['tenant']): string {
  return `${aggregate('max', by)}idempotency_duplicate_entities${matchers(filter)})`
}

/** How long past its retention the next key the purge deletes has waited (the same from every instance: max). */
export function purgeOverdue(filter: string, by: readonly string[] = []): string {
  return `${aggregate('max', by)}idempotency_purge_overdue_seconds${matchers(filter)})`
}

export function gaugesRefreshFailed(filter: string, by: readonly string[] = ['query']): string {
  return `${aggregate('max', by)}idempotency_gauges_refresh_failed${matchers(filter)})`
}

/** Age of the oldest provider call in progress, per `by`: a hung provider, before its calls reach their deadline. */
export function providerOldestCall(filter: string, by: readonly string[] = ['instance']): string {
  return `${aggregate('max', by)}idempotency_provider_oldest_call_seconds${matchers(filter)})`
}

/**
 * The provider alert's threshold per `by` (job and instance), from the TTL
 * each instance runs with: `share` of it (the deadline) less `headroom` (a
 * scrape, an evaluation, slack), clamped to [min, max] seconds
 * (alert-definitions.ts providerSlowThreshold computes the same).
 */
export function providerSlowThresholdExpr(filter: string, by: readonly string[], share: number, headroom: number, min: number, max: number): string {
  return `clamp(${aggregate('max', by)}idempotency_ttl_seconds${matchers(filter)}) * ${share} - ${headroom}, ${min}, ${max})`
}

/** Requests refused at their tenant's limits (429), per second, by tenant (and `by`). */
export function tenantRefusals(filter: string, window: string, by: readonly string[] = ['tenant', 'reason']): string {
  return `${aggregate('sum', by)}rate(http_tenant_refusals_total${matchers(filter)}[${window}]))`
}

/** Forced expirations come from the audit trail, the same from every instance: max, not sum. */
export function forcedExpirations(filter: string): string {
  return `max by (outcome) (rate(idempotency_forced_expirations_total{${filter}}[$__rate_interval]))`
}
