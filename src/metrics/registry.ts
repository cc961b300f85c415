import { Counter, Gauge, Histogram, Registry } from 'prom-client'
import { OUTCOMES, RELEASE_REASONS, RETRY_CAUSES, STATEMENT_KINDS, type IdempotencyHooks } from '../http/outcomes'
import type { AnswerEvent } from '../http/observe'
import type { ProviderCallEvent, ProviderCallOutcome } from '../provider/client'
import type { PoolUsage } from '../store/pool-usage'
import { CREDENTIAL_AREAS } from '../http/failed-credentials'
import { executionBudgetMs } from '../core/policy'

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
  /** Wrong API keys (`api`) and metrics tokens (`metrics`) presented (http/failed-credentials.ts). */
  readonly authFailures: Counter<'area'>
  /** Requests of a tenant refused by its limits (http/tenant-refusals.ts). */
  readonly tenantRefusals: Counter<'tenant' | 'reason'>
  readonly httpDuration: Histogram<'method' | 'route' | 'status'>
  readonly idempotencyDuration: Histogram<'route' | 'outcome'>
  readonly reclaims: Counter<'route'>
  readonly leasesLost: Counter<'route'>
  readonly releases: Counter<'route' | 'reason'>
  readonly statementRetries: Counter<'route' | 'statement' | 'cause'>
  readonly purgedKeys: Counter
  readonly deadlines: Counter<'route'>
  readonly providerDuration: Histogram<'outcome'>
  readonly ttl: Gauge
  readonly ready: Gauge
  readonly providerInFlight: Gauge
  readonly providerOldestCall: Gauge
  readonly poolInUse: Gauge<'pool'>
  readonly poolWaiting: Gauge<'pool'>
  readonly poolMax: Gauge<'pool'>
}

/** Every outcome of one HTTP call to the payment provider (provider/client.ts), each with a series from the start. */
export const PROVIDER_OUTCOMES: readonly ProviderCallOutcome[] = ['ok', 'failed', 'lost', 'deadline', 'aborted']

/**
 * Seconds, for the provider call: from a few ms (the simulator, a fast
 * provider) to the TTL (30 s), where the deadline ends the call; 2.5-10 s
 * separate a slow provider from a stalled one.
 */
export const PROVIDER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30]

/**
 * PROVIDER_BUCKETS with bounds around the request's deadline (the TTL less a
 * tenth): a call stopped at a 27 s deadline fell in the 20-30 s bucket and
 * read 29.9 s at p99; with bounds at 0.9, 0.97 and 1.02 of the deadline
 * (and at the TTL) it reads as what it was.
 */
export function providerBuckets(ttlSeconds: number): number[] {
  const deadline = executionBudgetMs(ttlSeconds) / 1000
  const near = [0.9, 0.97, 1.02].map((share) => Number((deadline * share).toFixed(3)))
  return [...new Set([...PROVIDER_BUCKETS, ...near, ttlSeconds])].filter((bound) => bound <= Math.max(30, ttlSeconds)).sort((a, b) => a - b)
}

export function createMetrics(registry: Registry = new Registry(), options: { ttlSeconds?: number } = {}): Metrics {
  const registers = [registry]
  const metrics: Metrics = {
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
    tenantRefusals: new Counter({
      name: 'http_tenant_refusals_total',
      help: 'API requests refused by their tenant\'s limits (429), by tenant (those of API_KEYS) and reason: rate_limited (TENANT_RATE_LIMIT), too_many_in_flight (TENANT_MAX_IN_FLIGHT).',
      labelNames: ['tenant', 'reason'],
      registers,
    }),
    authFailures: new Counter({
      name: 'http_auth_failures_total',
      help: 'Wrong credentials presented, by area: api (an API key), metrics (the metrics token). Admin sign-in failures are logged by the admin.',
      labelNames: ['area'],
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
      help: 'Keys given back after a failed execution, so that a retry runs again, by reason: failed, deadline (the provider may have charged), shutdown.',
      labelNames: ['route', 'reason'],
      registers,
    }),
    statementRetries: new Counter({
      name: 'idempotency_statement_retries_total',
      help: 'Statements sent again after the one under them failed (its connection, or a row lock another session held), within the request\'s deadline, by statement (claim, completion, release, read) and cause (terminated, connection_lost, refused, read_only, pooler, timeout, locked).',
      labelNames: ['route', 'statement', 'cause'],
      registers,
    }),
    deadlines: new Counter({
      name: 'idempotency_deadline_exceeded_total',
      help: 'Requests that ran into their deadline (the TTL less a margin) and were stopped: answered 504, their key released.',
      labelNames: ['route'],
      registers,
    }),
    providerDuration: new Histogram({
      name: 'idempotency_provider_request_duration_seconds',
      help: 'Each HTTP call to the payment provider, by outcome: ok, failed (an answer refusing or unusable), lost (no answer), deadline (stopped by the request\'s deadline), aborted (stopped by a shutdown).',
      labelNames: ['outcome'],
      buckets: options.ttlSeconds === undefined ? PROVIDER_BUCKETS : providerBuckets(options.ttlSeconds),
      registers,
    }),
    ttl: new Gauge({
      name: 'idempotency_ttl_seconds',
      help: 'The TTL this server runs with (IDEMPOTENCY_TTL_SECONDS): dashboards and alerts take their thresholds from it.',
      // WORKERS>1: every worker has the same value; the sum of them would not be a TTL.
      aggregator: 'max',
      registers,
    }),
    ready: new Gauge({
      name: 'idempotency_ready',
      help: '1 while this process reaches the database (what GET /readyz answers 200 for), 0 while it does not.',
      aggregator: 'min',
      registers,
    }),
    providerInFlight: new Gauge({
      name: 'idempotency_provider_calls_in_flight',
      help: 'HTTP calls to the payment provider in progress now.',
      registers,
    }),
    providerOldestCall: new Gauge({
      name: 'idempotency_provider_oldest_call_seconds',
      help: 'Age of the oldest HTTP call to the payment provider in progress now (0 when none): a hung provider shows here long before its calls end at their deadline.',
      registers,
    }),
    poolInUse: new Gauge({
      name: 'idempotency_db_pool_connections_in_use',
      help: 'Connections of a database pool running a statement or transaction of ours now, by pool (short: claims, replays, reads; work: completing transactions).',
      labelNames: ['pool'],
      registers,
    }),
    poolWaiting: new Gauge({
      name: 'idempotency_db_pool_waiting',
      help: 'Statements and transactions waiting for a connection of the pool now, by pool.',
      labelNames: ['pool'],
      registers,
    }),
    poolMax: new Gauge({
      name: 'idempotency_db_pool_connections_max',
      help: 'The size of each database pool (connections per process).',
      labelNames: ['pool'],
      registers,
    }),
    purgedKeys: new Counter({
      name: 'idempotency_purged_keys_total',
      help: 'Completed keys deleted after their retention ended.',
      registers,
    }),
  }
  // From the start, so the first wrong key of a deploy is seen by rate() (see primeRoute).
  for (const area of CREDENTIAL_AREAS) metrics.authFailures.inc({ area }, 0)
  return metrics
}

/**
 * The answers of an idempotent POST route (docs/reference/http-api.md) whose
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
  for (const reason of RELEASE_REASONS) metrics.releases.inc({ route, reason }, 0)
  for (const statement of STATEMENT_KINDS) for (const cause of RETRY_CAUSES) metrics.statementRetries.inc({ route, statement, cause }, 0)
  metrics.deadlines.inc({ route }, 0)
}

/**
 * The provider calls in progress, read at each scrape: how many, and how old
 * the oldest is. A histogram sees a call only when it ends, at its deadline
 * for a hung provider; these see it while it hangs. `now` (milliseconds) is
 * the clock of the ages: tests move it.
 */
export function providerCallsInFlight(metrics: Metrics, now: () => number = () => performance.now()): () => () => void {
  const started = new Set<{ at: number }>()
  setCollect(metrics.providerInFlight, () => metrics.providerInFlight.set(started.size))
  setCollect(metrics.providerOldestCall, () => {
    let oldest = Number.POSITIVE_INFINITY
    for (const call of started) oldest = Math.min(oldest, call.at)
    metrics.providerOldestCall.set(started.size === 0 ? 0 : (now() - oldest) / 1000)
  })
  return () => {
    const call = { at: now() }
    started.add(call)
    return () => { started.delete(call) }
  }
}

/** The provider client's calls, timed by outcome; every outcome starts at 0 (an alert on the first deadline sees it). */
export function observeProvider(metrics: Metrics): (event: ProviderCallEvent) => void {
  for (const outcome of PROVIDER_OUTCOMES) metrics.providerDuration.zero({ outcome })
  return ({ outcome, seconds }) => metrics.providerDuration.observe({ outcome }, seconds)
}

/**
 * The pools' usage and the database's reachability, read at each scrape
 * (nothing to keep in step). On Citus also each worker's pool (store/db.ts
 * openPools), as `worker host:port`, from the scrape after it opened.
 */
export function observePools(metrics: Metrics, usage: { readonly short: PoolUsage; readonly work: PoolUsage }, workers: ReadonlyMap<string, PoolUsage> = new Map()): void {
  const pools = () => [...Object.entries(usage), ...[...workers].map(([worker, counter]) => [`worker ${worker}`, counter] as const)]
  const collect = (gauge: Gauge<'pool'>, read: (counter: PoolUsage) => number) => setCollect(gauge, () => { for (const [pool, counter] of pools()) gauge.set({ pool }, read(counter)) })
  collect(metrics.poolMax, (counter) => counter.max)
  collect(metrics.poolInUse, (counter) => counter.inUse)
  collect(metrics.poolWaiting, (counter) => counter.waiting)
}

/** idempotency_ready from `up()` at each scrape (store/health.ts's probe: it answers without a query). */
export function observeReadiness(metrics: Metrics, up: () => boolean): void {
  setCollect(metrics.ready, () => metrics.ready.set(up() ? 1 : 0))
}

/** prom-client calls a metric's `collect` before each exposition (getMetricsAsJSON too: WORKERS>1 sees it). */
function setCollect(metric: Gauge<string>, collect: () => void): void {
  (metric as unknown as { collect?: () => void }).collect = collect
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
    onRelease: ({ route, reason }) => metrics.releases.inc({ route, reason }),
    onDeadline: ({ route }) => metrics.deadlines.inc({ route }),
    onRetry: ({ route, statement, cause }) => metrics.statementRetries.inc({ route, statement, cause }),
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
