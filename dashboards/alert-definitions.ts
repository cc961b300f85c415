/**
 * The alerts, written once and rendered both as Grafana rules and as
 * Prometheus rules (alerts.ts), with their timing defaults and the links every
 * alert carries: its runbook section in docs/how-to/on-call.md and the admin page.
 */
import { DEFAULT_METRICS_CACHE_MS, DEFAULT_TTL_SECONDS } from '../src/config'
import { executionBudgetMs } from '../src/core/policy'
import { DATABASE_WAIT_MS } from '../src/store/health'
import { PANELS, SCRAPE_JOB, conflictRatio, duplicateEntities, gaugesRefreshFailed, jobFilter, notReady, providerOldestCall, purgeOverdue, providerSlowThresholdExpr, serverErrorRatio, SERVER_ERRORS_MIN, SERVER_ERRORS_WINDOW, staleKeys, targetsDown, tenantRefusals, unlessNotReady } from './queries'
import { runbookUrl, type BuildSettings } from './settings'

/**
 * 30 s, for the Prometheus rule group (its `interval:` overrides the global
 * evaluation_interval, whose default is 1 m) and the Grafana rule group alike.
 * It is a term of the stale-key detection time below; the rules are five
 * cheap instant queries.
 */
export const EVALUATION_INTERVAL_SECONDS = 30
/** What the detection time assumes of your scrape config: the 15 s of the example in docs/how-to/monitoring.md. */
export const ASSUMED_SCRAPE_INTERVAL_SECONDS = 15
/** Alertmanager's and Grafana's default `group_wait`: the wait between firing and the first notification. */
export const ASSUMED_GROUP_WAIT_SECONDS = 30
/**
 * 30 s, two evaluations in a row: a stale key is already past the TTL (its
 * worker is over its deadline, which Bounded processing (docs/explanation/invariants.md) bounds to the TTL plus a few
 * seconds), so `for` only has to ride out that grace and a retry that
 * reclaims the key in the meantime, not to prove the worker dead.
 */
export const STALE_KEYS_FOR_SECONDS = 30

export interface DetectionTime {
  readonly ttlSeconds: number
  readonly cacheSeconds: number
  readonly scrapeSeconds: number
  readonly evaluationSeconds: number
  readonly forSeconds: number
  readonly groupWaitSeconds: number
  /** Worker dead → alert firing in Prometheus or Grafana, at worst. */
  readonly firingSeconds: number
  /** … → first notification sent, at worst. */
  readonly notifiedSeconds: number
}

/**
 * The longest a stale key can go unnoticed, counted from its worker's death,
 * each term at its worst: the key becomes stale at most TTL after the worker
 * died (it was claimed no later than that); /metrics may serve a value the
 * cache computed up to `cache` earlier; the next scrape comes within `scrape`;
 * the next evaluation within `evaluation`; it fires `for` later; the
 * notification leaves after `group_wait`. (The scrape itself, a few ms, is
 * left out.)
 */
export function staleKeyDetection(ttlSeconds = DEFAULT_TTL_SECONDS): DetectionTime {
  const terms = {
    ttlSeconds,
    cacheSeconds: DEFAULT_METRICS_CACHE_MS / 1000,
    scrapeSeconds: ASSUMED_SCRAPE_INTERVAL_SECONDS,
    evaluationSeconds: EVALUATION_INTERVAL_SECONDS,
    forSeconds: STALE_KEYS_FOR_SECONDS,
    groupWaitSeconds: ASSUMED_GROUP_WAIT_SECONDS,
  }
  const firingSeconds = terms.ttlSeconds + terms.cacheSeconds + terms.scrapeSeconds + terms.evaluationSeconds + terms.forSeconds
  return { ...terms, firingSeconds, notifiedSeconds: firingSeconds + terms.groupWaitSeconds }
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

/**
 * 1 refusal per second, over 5 minutes, for 10: a tenant held at its limits
 * for that long sends more than its share all along (a retry loop without
 * backoff, a batch job, or growth the limits were not set for). A burst
 * refused for a few seconds is what the limits are for, and pages nobody.
 */
export const TENANT_REFUSALS_THRESHOLD = 1

/**
 * An hour, for 15 minutes: a purge that keeps up deletes a key within a run
 * of its retention (a minute by default, or at once in a backlog), so an hour
 * past it means no purge is running, its runs fail, or it clears less than
 * arrives. 15 minutes rides out a backlog the purge is clearing (a retention
 * just shortened: 10 M keys at 5,000 keys/s take half an hour, so that one
 * fires, and says so). The table grows meanwhile; nothing is wrong for
 * clients (a key past retention is new to a claim), so a ticket.
 */
export const PURGE_OVERDUE_THRESHOLD_SECONDS = 3_600

/**
 * IdempotencyProviderSlow must fire before the first request that waits on a
 * hung provider reaches its deadline, by construction, whatever the TTL. It
 * fires at the first evaluation after the first scrape that reads the oldest
 * call over its threshold: at worst threshold + a scrape + an evaluation
 * after the call started (the gauge is read at each scrape, never cached).
 * The request's deadline is the TTL less a tenth (less at most 2 s:
 * core/policy.ts executionBudgetMs; 28 s with the default 30 s TTL), counted
 * from its claim, a few milliseconds before its provider call starts. So the
 * threshold is what the deadline leaves after a scrape, an evaluation and a
 * second of slack (the claim before the call, the scrape's own duration),
 * capped at PROVIDER_SLOW_SECONDS and floored at PROVIDER_SLOW_MIN_SECONDS:
 *
 *   threshold = clamp(0.9 × TTL − (scrape 15 s + evaluation 5 s + slack 1 s), 1 s, 5 s)
 *
 * computed by the rule itself from the instance's idempotency_ttl_seconds
 * (providerSlowThresholdExpr). With the default TTL: min(5, 27 − 21) = 5 s,
 * firing at most 5 + 15 + 5 = 25 s into a hang, before the 28 s deadline.
 * It holds for every TTL of 25 s and more with 15 s scrapes; below, the
 * floor applies and the scrape interval must shrink (providerSlowDetection).
 */
/** The cap: a payment provider answers in well under a second or two; a call in progress for 5 s is a provider that hangs. */
export const PROVIDER_SLOW_SECONDS = 5
/** The floor: a second, so that a busy instance's every call in flight does not page when the TTL leaves no room. */
export const PROVIDER_SLOW_MIN_SECONDS = 1
/** The deadline as the rule reckons it, a share of the TTL: the service's own (policy.ts) is never earlier for a TTL of 2 s or more. */
export const PROVIDER_DEADLINE_SHARE_OF_TTL = 0.9
/**
 * 5 s: the provider alert's own rule group (Prometheus `interval:`), so that
 * its evaluation term is 5 s, not the 30 s of the other alerts. One cheap
 * instant query.
 */
export const PROVIDER_EVALUATION_INTERVAL_SECONDS = 5
/**
 * 10 s: the same group in Grafana, whose alerting evaluates at most every
 * 10 s by default (`[unified_alerting] min_interval`; a group's interval must
 * be a multiple of it). The Grafana copy's construction therefore needs 10 s
 * scrapes (GRAFANA_PROVIDER_SCRAPE_INTERVAL_SECONDS).
 */
export const GRAFANA_PROVIDER_EVALUATION_INTERVAL_SECONDS = 10
/** The scrape interval the Grafana copy of the provider alert needs to fire before the deadline (10 + 10 + 5 + 1 < 27). */
export const GRAFANA_PROVIDER_SCRAPE_INTERVAL_SECONDS = 10
/** Slack for what the three terms leave out: the claim before the provider call starts, the scrape's own duration, evaluation jitter. */
export const PROVIDER_SLOW_SLACK_SECONDS = 1
/** What the threshold leaves before the deadline: a scrape (the documented 15 s), an evaluation of the provider group, the slack. */
export const PROVIDER_SLOW_HEADROOM_SECONDS = ASSUMED_SCRAPE_INTERVAL_SECONDS + PROVIDER_EVALUATION_INTERVAL_SECONDS + PROVIDER_SLOW_SLACK_SECONDS

/** The threshold for a server running with `ttlSeconds`: what the rule computes from idempotency_ttl_seconds. */
export function providerSlowThreshold(ttlSeconds: number): number {
  return Math.min(PROVIDER_SLOW_SECONDS, Math.max(PROVIDER_SLOW_MIN_SECONDS, PROVIDER_DEADLINE_SHARE_OF_TTL * ttlSeconds - PROVIDER_SLOW_HEADROOM_SECONDS))
}

export interface ProviderDetection {
  readonly ttlSeconds: number
  /** When the first request waiting on the hung call is stopped (core/policy.ts), from its claim. */
  readonly deadlineSeconds: number
  readonly thresholdSeconds: number
  readonly scrapeSeconds: number
  readonly evaluationSeconds: number
  readonly slackSeconds: number
  /** Call started → alert firing, at worst (slack included). */
  readonly firingSeconds: number
  /** What is left before the deadline when it fires at worst: positive when the construction holds. */
  readonly marginSeconds: number
}

/**
 * The longest from a provider call's start (it hangs from there) to
 * IdempotencyProviderSlow firing, each term at its worst: the oldest call
 * passes the threshold just after a scrape; the next scrape reads it; the
 * next evaluation fires (no `for`); plus the slack. Against the deadline of
 * the request making the call. Prometheus: 15 s scrapes, the group's 5 s;
 * Grafana: 10 s scrapes, its 10 s.
 */
export function providerSlowDetection(ttlSeconds = DEFAULT_TTL_SECONDS, system: 'prometheus' | 'grafana' = 'prometheus'): ProviderDetection {
  const terms = {
    ttlSeconds,
    deadlineSeconds: executionBudgetMs(ttlSeconds) / 1000,
    thresholdSeconds: providerSlowThreshold(ttlSeconds),
    scrapeSeconds: system === 'prometheus' ? ASSUMED_SCRAPE_INTERVAL_SECONDS : GRAFANA_PROVIDER_SCRAPE_INTERVAL_SECONDS,
    evaluationSeconds: system === 'prometheus' ? PROVIDER_EVALUATION_INTERVAL_SECONDS : GRAFANA_PROVIDER_EVALUATION_INTERVAL_SECONDS,
    slackSeconds: PROVIDER_SLOW_SLACK_SECONDS,
  }
  const firingSeconds = terms.thresholdSeconds + terms.scrapeSeconds + terms.evaluationSeconds + terms.slackSeconds
  return { ...terms, firingSeconds, marginSeconds: terms.deadlineSeconds - firingSeconds }
}

/**
 * 30 s, for the two outage alerts (5xx ratio, readiness): two evaluations in
 * a row, so a database restart or a fail-over of a few seconds does not page,
 * while a real outage pages within 2 minutes of its start (outageDetection).
 */
export const OUTAGE_FOR_SECONDS = 30
/**
 * 0.05: one API answer in twenty a 5xx, over a minute. A healthy service
 * answers 5xx only for provider refusals (a fraction of a per cent); an outage
 * of the database or the provider makes it most of them at once.
 */
export const SERVER_ERRORS_THRESHOLD = 0.05
/**
 * A stopped database is noticed by the health probe (store/health.ts) within
 * 0.5 s when it refuses connections, and within 3 s when it hangs (two slow
 * probes of 1 s, 0.5 s apart); /readyz and idempotency_ready then say so.
 */
export const HEALTH_NOTICE_SECONDS = 3
/** The promise the outage alerts keep: paged within 2 minutes of the outage's start. */
export const OUTAGE_PAGE_WITHIN_SECONDS = 120

export interface OutageDetection {
  readonly noticeSeconds: number
  readonly scrapeSeconds: number
  readonly evaluationSeconds: number
  readonly forSeconds: number
  readonly groupWaitSeconds: number
  readonly firingSeconds: number
  readonly notifiedSeconds: number
}

/**
 * The longest from a database outage's start to the page, each term at its
 * worst: the probe notices; the next scrape reads idempotency_ready 0 (it is
 * read at each scrape, never cached); the next evaluation; `for`; the
 * group_wait of Alertmanager or Grafana. The 5xx alert takes as long once
 * requests fail: they fail within a few seconds of the outage (SPEC).
 */
export function outageDetection(): OutageDetection {
  const terms = {
    noticeSeconds: HEALTH_NOTICE_SECONDS,
    scrapeSeconds: ASSUMED_SCRAPE_INTERVAL_SECONDS,
    evaluationSeconds: EVALUATION_INTERVAL_SECONDS,
    forSeconds: OUTAGE_FOR_SECONDS,
    groupWaitSeconds: ASSUMED_GROUP_WAIT_SECONDS,
  }
  const firingSeconds = terms.noticeSeconds + terms.scrapeSeconds + terms.evaluationSeconds + terms.forSeconds
  return { ...terms, firingSeconds, notifiedSeconds: firingSeconds + terms.groupWaitSeconds }
}

/** How each alerting system writes the alert's value and the server's TTL in a template. */
export interface Dialect {
  /** `$value` (Prometheus), `$values.B.Value` (Grafana). */
  readonly value: string
  /** The TTL in seconds, from idempotency_ttl_seconds (a query in Prometheus, query T in Grafana). */
  readonly ttl: string
}

export interface AlertDefinition {
  readonly uid: string
  /** Also the heading of its runbook section in docs/how-to/on-call.md. */
  readonly name: string
  /** The measured expression, without the comparison. */
  readonly expr: string
  readonly threshold: number
  /**
   * A threshold per series instead of `threshold` (which is then 0): PromQL
   * matched `on` these labels, e.g. one computed from each instance's TTL.
   * The Prometheus rule is `expr > on (...) thresholdExpr`; Grafana's query A
   * is that comparison, and its condition `> 0` (the values left are over it).
   */
  readonly perSeriesThreshold?: { readonly expr: string; readonly on: readonly string[] }
  /** The rule group it is evaluated in: the provider alert has its own, faster one (RULE_GROUPS). @default 'main' */
  readonly group?: RuleGroupName
  /** How long the condition must hold (Prometheus `for`). */
  readonly for: string
  readonly severity: 'page' | 'ticket'
  /** Title of the dashboard panel that shows what it measures (Grafana's __panelId__). */
  readonly panel: string
  /** The admin page to open, from the service's root: a Go template over the alert's labels. */
  readonly adminPath: string
  /** `value` is the template expression of the alert's value: `$value` (Prometheus), `$values.B.Value` (Grafana). */
  readonly summary: (value: string) => string
  /** `ttl`: a template that prints the server's TTL in seconds (Dialect.ttl). */
  readonly description: (value: string, ttl: string) => string
  /** Its text names the TTL: Grafana then also queries idempotency_ttl_seconds (query T). */
  readonly usesTtl?: boolean
  /** Grafana, when the query returns no series. @default 'OK' (no series: the target-down alert's business) */
  readonly noData?: 'OK' | 'Alerting'
}

/**
 * The rule groups and how often each is evaluated, in Prometheus and in
 * Grafana: `main` every 30 s (EVALUATION_INTERVAL_SECONDS), `provider` (the
 * provider alert alone) every 5 s, 10 s in Grafana (its least).
 */
export const RULE_GROUPS = {
  main: { name: 'idempotency', prometheusSeconds: EVALUATION_INTERVAL_SECONDS, grafanaSeconds: EVALUATION_INTERVAL_SECONDS },
  provider: { name: 'idempotency-provider', prometheusSeconds: PROVIDER_EVALUATION_INTERVAL_SECONDS, grafanaSeconds: GRAFANA_PROVIDER_EVALUATION_INTERVAL_SECONDS },
} as const
export type RuleGroupName = keyof typeof RULE_GROUPS

/**
 * `expr > threshold`, with `expr` in parentheses when it has a set operator (`>` binds tighter than `or`);
 * `expr > on (labels) thresholdExpr` for a per-series threshold.
 */
export function comparison(expr: string, threshold: number, perSeries?: AlertDefinition['perSeriesThreshold']): string {
  const left = /\b(or|and|unless)\b/.test(expr) ? `(${expr})` : expr
  return perSeries ? `${left} > on (${perSeries.on.join(', ')}) ${perSeries.expr}` : `${left} > ${threshold}`
}

/** The runbook anchor in docs/how-to/on-call.md: GitHub's slug of the section heading, which is the alert's name. */
export function runbookAnchor(alertName: string): string {
  return alertName.toLowerCase()
}

/** What every alert says and links to, in either system's template dialect. */
export function alertAnnotations(alert: AlertDefinition, settings: BuildSettings, dialect: Dialect): Record<string, string> {
  const runbook = runbookUrl(settings, alert.name)
  const admin = `${settings.adminUrl}${alert.adminPath}`
  return {
    summary: alert.summary(dialect.value),
    // Which service and instance: one Alertmanager often serves several teams.
    description: `${alert.description(dialect.value, dialect.ttl)}\nJob: {{ $labels.job }}{{ with $labels.instance }}, instance {{ . }}{{ end }}\nAdmin page: ${admin}\nRunbook: ${runbook}`,
    runbook_url: runbook,
    admin_url: admin,
  }
}

const TENANT = '{{ $labels.tenant }}'

/**
 * The alerts of the service scraped as `job`. Each reads that job only and
 * keeps it as a label, with the instance wherever one instance is the cause
 * (5xx, readiness, a failing gauge query, a target down); the database's
 * facts (stale keys, duplicates, the 409 ratio of all instances) are one per
 * job and tenant, whichever instance reports them.
 */
export function alertsFor(job: string): readonly AlertDefinition[] {
  const ours = jobFilter(job)
  return [
  {
    uid: 'idem-stale-processing-keys',
    name: 'IdempotencyStaleProcessingKeys',
    expr: staleKeys(ours, ['job', 'tenant']),
    threshold: 0,
    for: `${STALE_KEYS_FOR_SECONDS}s`,
    severity: 'page',
    panel: PANELS.staleByTenant,
    // Tenant names are letters, digits, _ . - (config.ts): safe in a query string as they are.
    adminPath: `/admin?tenant=${TENANT}&stale=1`,
    summary: (v) => `Tenant ${TENANT}: {{ ${v} }} idempotency key(s) stuck in processing`,
    usesTtl: true,
    description: (v, ttl) => `{{ ${v} }} key(s) of tenant ${TENANT} have been in processing for longer than the TTL (${ttl}), and no retry has reclaimed them: their worker most likely died mid-request, and their clients do not know whether the payment went through. Open the admin page filtered on this tenant's stale keys, open each key, and force-expire it; the page refuses if a worker still holds it.`,
  },
  {
    uid: 'idem-conflict-ratio',
    name: 'IdempotencyConflictRatioHigh',
    expr: conflictRatio(ours, '5m', ['job']),
    threshold: CONFLICT_RATIO_THRESHOLD,
    for: '10m',
    severity: 'ticket',
    panel: PANELS.conflictRatio,
    adminPath: '/admin?stale=1',
    summary: (v) => `409 "still processing" answers are {{ ${v} | humanizePercentage }} of 2xx on /api/payments`,
    description: (v) => `For 10 minutes, retries that found their key still processing have been {{ ${v} | humanizePercentage }} of successful answers on /api/payments (threshold ${CONFLICT_RATIO_THRESHOLD * 100}%): processing got slow (keys held longer than clients wait), keys are stranded, or a client retries one key in a tight loop.`,
  },
  {
    uid: 'idem-duplicate-entities',
    name: 'IdempotencyDuplicateEntities',
    expr: duplicateEntities(ours, ['job', 'tenant']),
    threshold: 0,
    // 1 m: the gauge is computed once per scrape cache interval; one minute
    // rides out a single odd scrape without delaying a real finding much.
    for: '1m',
    severity: 'ticket',
    panel: PANELS.duplicatesByTenant,
    adminPath: `/admin?tenant=${TENANT}`,
    summary: (v) => `Tenant ${TENANT}: {{ ${v} }} request(s) completed again under a new idempotency key`,
    description: (v) => `In the recent window (METRICS_DUPLICATE_WINDOW_SECONDS, an hour by default) {{ ${v} }} completion(s) of tenant ${TENANT} repeat an earlier request (same route and body) under a different key: that client makes a new key per retry, so idempotency cannot protect it from paying twice.`,
  },
  {
    uid: 'idem-purge-overdue',
    name: 'IdempotencyPurgeBehind',
    expr: purgeOverdue(ours, ['job']),
    threshold: PURGE_OVERDUE_THRESHOLD_SECONDS,
    for: '15m',
    severity: 'ticket',
    panel: PANELS.purgeOverdue,
    adminPath: '/admin/confirm/purge',
    summary: (v) => `The retention purge of job {{ $labels.job }} is {{ ${v} | humanizeDuration }} behind`,
    description: (v) => `For 15 minutes the next key the retention purge deletes has waited over ${PURGE_OVERDUE_THRESHOLD_SECONDS / 3600} hour past its retention (now {{ ${v} | humanizeDuration }}): no process runs the purge, the purging process's runs fail, or it clears less than arrives. The key table grows meanwhile; clients see nothing (a key past retention is new to a claim). The purging process logs why ("retention purge failed"); the admin page's purge deletes them now.`,
  },
  {
    uid: 'idem-gauges-refresh-failed',
    name: 'IdempotencyGaugesRefreshFailing',
    expr: gaugesRefreshFailed(ours, ['job', 'instance', 'query']),
    threshold: 0,
    // 10 m: a slow database for a scrape or two is not news; ten minutes of
    // stale gauges means the stale-key and duplicate alerts may be blind.
    for: '10m',
    severity: 'ticket',
    panel: PANELS.gaugeRefresh,
    adminPath: '/admin',
    summary: () => 'The {{ $labels.query }} database gauges of {{ $labels.instance }} are not refreshing',
    description: (v) => `The {{ $labels.query }} query behind /metrics on {{ $labels.instance }} has failed or timed out for 10 minutes (idempotency_gauges_refresh_failed = {{ ${v} }}): its gauges show old values, and the alerts built on them may be blind.`,
  },
  {
    uid: 'idem-target-down',
    name: 'IdempotencyTargetDown',
    expr: targetsDown(job),
    threshold: 0,
    // 2 m: eight failed scrapes at 15 s. A restart (a deploy, the WORKERS
    // supervisor replacing a worker) misses one or two; longer is an outage.
    for: '2m',
    severity: 'page',
    panel: PANELS.targetsUp,
    adminPath: '/admin',
    noData: 'Alerting',
    summary: () => 'Prometheus cannot scrape {{ with $labels.instance }}{{ . }}{{ else }}any target{{ end }} of job {{ $labels.job }}',
    description: (v) => `{{ with $labels.instance }}Target {{ . }} has failed every scrape{{ else }}Job {{ $labels.job }} has had no scrape target at all{{ end }} for 2 minutes (value {{ ${v} }}): the service is down, hung or unreachable from Prometheus, and every other alert is blind for it.`,
  },
  {
    uid: 'idem-server-errors',
    name: 'IdempotencyServerErrorsHigh',
    expr: unlessNotReady(serverErrorRatio(SERVER_ERRORS_WINDOW, ours, ['job', 'instance']), ours, SERVER_ERRORS_WINDOW),
    threshold: SERVER_ERRORS_THRESHOLD,
    for: `${OUTAGE_FOR_SECONDS}s`,
    severity: 'page',
    panel: PANELS.serverErrors,
    adminPath: '/admin',
    summary: (v) => `{{ ${v} | humanizePercentage }} of API answers of {{ $labels.instance }} are 5xx`,
    description: (v) => `For ${OUTAGE_FOR_SECONDS} s, {{ ${v} | humanizePercentage }} of the answers on /api/... of {{ $labels.instance }} (job {{ $labels.job }}) have been 5xx (threshold ${SERVER_ERRORS_THRESHOLD * 100}%, over ${SERVER_ERRORS_WINDOW}, at least ${SERVER_ERRORS_MIN} of them): payments are failing. 502 means the payment provider, 504 requests running into their deadline, 503 a database that fails statements while it answers the probe (an instance that lost its database within the minute pages as IdempotencyNotReady instead, once). The service's log has one line per failed request, with its request id.`,
  },
  {
    uid: 'idem-provider-slow',
    name: 'IdempotencyProviderSlow',
    expr: providerOldestCall(ours, ['job', 'instance']),
    threshold: 0,
    perSeriesThreshold: {
      expr: providerSlowThresholdExpr(ours, ['job', 'instance'], PROVIDER_DEADLINE_SHARE_OF_TTL, PROVIDER_SLOW_HEADROOM_SECONDS, PROVIDER_SLOW_MIN_SECONDS, PROVIDER_SLOW_SECONDS),
      on: ['job', 'instance'],
    },
    group: 'provider',
    for: '0s',
    severity: 'page',
    panel: PANELS.providerInFlight,
    adminPath: '/admin/released?reason=deadline',
    summary: (v) => `A payment provider call of {{ $labels.instance }} has been waiting {{ ${v} | humanizeDuration }}`,
    description: (v) => `The oldest call to the payment provider in progress on {{ $labels.instance }} started {{ ${v} | humanizeDuration }} ago, over its threshold (the TTL less a tenth, less ${PROVIDER_SLOW_HEADROOM_SECONDS} s, between ${PROVIDER_SLOW_MIN_SECONDS} and ${PROVIDER_SLOW_SECONDS} s: ${providerSlowThreshold(DEFAULT_TTL_SECONDS)} s with a ${DEFAULT_TTL_SECONDS} s TTL), so it pages before the first request waiting on it reaches its deadline: the provider hangs or is very slow. Requests waiting on it end at their deadline with 504 and their keys are released (the provider may have charged: the admin lists them after their deadline, with the downstream key to ask it with).`,
  },
  {
    uid: 'idem-tenant-held',
    name: 'IdempotencyTenantHeldAtLimit',
    expr: tenantRefusals(ours, '5m', ['job', 'tenant']),
    threshold: TENANT_REFUSALS_THRESHOLD,
    for: '10m',
    severity: 'ticket',
    panel: PANELS.refusalsByTenant,
    adminPath: `/admin?tenant=${TENANT}`,
    summary: (v) => `Tenant ${TENANT} is refused {{ ${v} | humanize }} request(s)/s at its limits`,
    description: (v) => `For 10 minutes, {{ ${v} | humanize }} request(s) per second of tenant ${TENANT} have been refused with 429 at its limits (TENANT_RATE_LIMIT, TENANT_MAX_IN_FLIGHT), summed over the instances: it sends more than its share (a retry loop without backoff, a batch job, or growth). Its refused requests were stored nowhere; its clients retry after Retry-After.`,
  },
  {
    uid: 'idem-not-ready',
    name: 'IdempotencyNotReady',
    expr: notReady(ours, ['job', 'instance']),
    threshold: 0,
    for: `${OUTAGE_FOR_SECONDS}s`,
    severity: 'page',
    panel: PANELS.ready,
    adminPath: '/admin',
    summary: () => '{{ $labels.instance }} cannot reach its database',
    description: (v) => `For ${OUTAGE_FOR_SECONDS} s, {{ $labels.instance }} has not reached PostgreSQL (value {{ ${v} }}: idempotency_ready is 0, GET /readyz answers 503): every payment request there waits up to ${DATABASE_WAIT_MS / 1000} s for it, then is answered 503, and /metrics shows the database gauges' last values. The process itself is up (its target is scraped).`,
  },
]
}

/** The alerts of the default scrape job (SCRAPE_JOB): what the committed rule files hold. */
export const ALERTS: readonly AlertDefinition[] = alertsFor(SCRAPE_JOB)
