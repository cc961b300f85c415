/**
 * The Alertmanager side of the alerts (issue 43): how a firing rule of
 * prometheus-rules.yml reaches a person. Built from the same definitions
 * (alertsFor): the severities route, the alert names inhibit, the job scopes
 * both. Written to dashboards/alertmanager.yml by `npm run dashboards`.
 *
 * The file is a whole Alertmanager configuration that `amtool check-config`
 * accepts, but what it carries for an existing Alertmanager is one sub-route
 * (jobRoute: matched on the job, with a route per severity), the inhibit
 * rules (inhibitRules) and the two receivers, whose webhook URLs are
 * placeholders the operator replaces (RECEIVER_PLACEHOLDERS).
 */
import { alertsFor, providerSlowDetection, type AlertDefinition } from './alert-definitions'
import { DEFAULT_SETTINGS, type BuildSettings } from './settings'

type Severity = AlertDefinition['severity']

/** The receiver of each severity: the names the operator's tree refers to. */
export const RECEIVERS: Readonly<Record<Severity, string>> = { page: 'idempotency-page', ticket: 'idempotency-ticket' }
/** Alerts no route of ours matches (other jobs): dropped in the file as shipped; a merged tree has its own root. */
export const UNROUTED_RECEIVER = 'unrouted'
/**
 * Where each receiver sends until the operator fills it in: a host under the
 * reserved `.invalid` TLD never resolves, so an unfilled file loses its
 * notifications loudly (Alertmanager logs each failed send) instead of
 * sending them somewhere.
 */
export const RECEIVER_PLACEHOLDERS: Readonly<Record<Severity, string>> = {
  page: 'https://replace-me.invalid/idempotent-post/page',
  ticket: 'https://replace-me.invalid/idempotent-post/ticket',
}

/**
 * 1 s: Alertmanager's default is 30 s, which would deliver the provider page
 * after the deadline it warns about. The page's construction
 * (providerSlowDetection) fires at worst 26 s into a hang with the documented
 * 15 s scrapes, against a 28 s deadline: 2 s of margin, of which the
 * group_wait takes one. One second still gathers what one rule evaluation
 * sends (Prometheus posts an evaluation's alerts in one batch); alerts that
 * fire at different evaluations are kept to one notification by the
 * inhibitions, not by waiting.
 */
export const PAGE_GROUP_WAIT_SECONDS = 1
/**
 * 10 s: how long a page group waits before telling of a change (an alert
 * joining, or resolving). Alertmanager's default, 5 m, told of a resolved
 * outage five minutes late; a group is one instance (or one job's database
 * outage), so it changes rarely, and 10 s keeps a resolution inside 30 s of
 * the fix once Prometheus has seen it.
 */
export const PAGE_GROUP_INTERVAL_SECONDS = 10
/** 1 h: a page still firing is sent again every hour (default 4 h), so an unacknowledged page is not forgotten. */
export const PAGE_REPEAT_INTERVAL = '1h'
/**
 * Tickets are batched: a ticket group (one alert of one job) waits a minute
 * for the tenants or instances that trip together (every ticket has a `for`
 * of a minute or more), tells of changes at most every 30 minutes, and
 * repeats daily. Nobody is woken for them.
 */
export const TICKET_GROUP_WAIT = '1m'
export const TICKET_GROUP_INTERVAL = '30m'
export const TICKET_REPEAT_INTERVAL = '24h'

/** A page is one instance's (labels the instance-scoped alerts carry); the job's facts (stale keys by tenant) group by job. */
export const PAGE_GROUP_BY = ['job', 'instance'] as const
/**
 * One database serves every instance of a job: its outage makes each of them
 * not ready, or down when one is restarted meanwhile (the service refuses to
 * start without its database). These pages group by job, so one outage is one
 * notification whatever the number of instances.
 */
export const OUTAGE_ALERTS = ['IdempotencyNotReady', 'IdempotencyTargetDown'] as const
export const OUTAGE_GROUP_BY = ['job'] as const
/** A ticket per alert and job, listing its tenants or instances. */
export const TICKET_GROUP_BY = ['job', 'alertname'] as const

/** One inhibition: while a `source` alert fires, the `targets` with the same `equal` labels are not notified. */
export interface Inhibition {
  readonly sources: readonly string[]
  readonly targets: readonly string[]
  readonly equal: readonly string[]
  /** Why the source explains the target. */
  readonly why: string
}

/**
 * Each rule names a cause (the source) and what it makes fire (the targets).
 * An inhibited alert is not notified while its source fires, and not when it
 * resolves either; once the source resolves, a target still firing is
 * notified on its own (it was not that cause after all).
 */
export const INHIBITIONS: readonly Inhibition[] = [
  {
    sources: ['IdempotencyTargetDown', 'IdempotencyNotReady'],
    targets: ['IdempotencyServerErrorsHigh', 'IdempotencyProviderSlow'],
    equal: ['job', 'instance'],
    why: 'an instance that is down or cannot reach its database already paged: its error-rate and latency pages say the same',
  },
  {
    sources: ['IdempotencyNotReady'],
    targets: ['IdempotencyTargetDown'],
    equal: ['job'],
    why: 'while an instance of the job cannot reach the database, an instance of the job that is down is the same outage (the service cannot start without its database); one still down after the database is back pages then',
  },
  {
    sources: ['IdempotencyTargetDown', 'IdempotencyNotReady'],
    targets: ['IdempotencyGaugesRefreshFailing'],
    equal: ['job', 'instance'],
    why: 'the gauge queries of an instance without its database fail: the page is the cause of the ticket',
  },
  {
    sources: ['IdempotencyStaleProcessingKeys', 'IdempotencyProviderSlow'],
    targets: ['IdempotencyConflictRatioHigh'],
    equal: ['job'],
    why: 'stranded keys and a hanging provider hold keys in processing, and every retry of one is a 409: the page is the cause of the ticket',
  },
]

/** `name="value"`, as Alertmanager matchers are written; values of ours need no escaping (settings.ts). */
const matcher = (name: string, value: string) => `${name}="${value}"`
const oneOf = (names: readonly string[]) => (names.length === 1 ? matcher('alertname', names[0]!) : `alertname=~"${names.join('|')}"`)

/** The alerts of `job` and their severities; every name an inhibition or route uses must be one of them. */
function knownAlerts(job: string): Map<string, Severity> {
  const known = new Map(alertsFor(job).map((alert) => [alert.name, alert.severity]))
  for (const name of [...OUTAGE_ALERTS, ...INHIBITIONS.flatMap((rule) => [...rule.sources, ...rule.targets])])
    if (!known.has(name)) throw new Error(`dashboards/alertmanager.ts names ${name}, which is no alert of alert-definitions.ts`)
  return known
}

/**
 * The sub-route of `job`, to put under the root of any Alertmanager tree:
 * matched on the job, then a route per severity. Its own receiver catches an
 * alert of the job with no known severity, as a ticket.
 */
export function jobRoute(job: string) {
  const known = knownAlerts(job)
  const severities = new Set(known.values())
  if (!severities.has('page') || !severities.has('ticket') || severities.size !== 2) throw new Error(`expected pages and tickets, got ${[...severities].join(', ')}`)
  const page = {
    matchers: [matcher('severity', 'page')],
    receiver: RECEIVERS.page,
    group_by: [...PAGE_GROUP_BY],
    group_wait: `${PAGE_GROUP_WAIT_SECONDS}s`,
    group_interval: `${PAGE_GROUP_INTERVAL_SECONDS}s`,
    repeat_interval: PAGE_REPEAT_INTERVAL,
    // Inherits the page timings and receiver; only the grouping differs.
    routes: [{ matchers: [oneOf(OUTAGE_ALERTS)], group_by: [...OUTAGE_GROUP_BY] }],
  }
  const ticket = {
    matchers: [matcher('severity', 'ticket')],
    receiver: RECEIVERS.ticket,
    group_by: [...TICKET_GROUP_BY],
    group_wait: TICKET_GROUP_WAIT,
    group_interval: TICKET_GROUP_INTERVAL,
    repeat_interval: TICKET_REPEAT_INTERVAL,
  }
  return {
    matchers: [matcher('job', job)],
    receiver: RECEIVERS.ticket,
    group_by: [...TICKET_GROUP_BY],
    group_wait: TICKET_GROUP_WAIT,
    group_interval: TICKET_GROUP_INTERVAL,
    repeat_interval: TICKET_REPEAT_INTERVAL,
    routes: [page, ticket],
  }
}

/** The inhibit rules of `job`: both sides matched on it, so a merged tree's other jobs are never inhibited by ours. */
export function inhibitRules(job: string) {
  knownAlerts(job)
  return INHIBITIONS.map((rule) => ({
    source_matchers: [matcher('job', job), oneOf(rule.sources)],
    target_matchers: [matcher('job', job), oneOf(rule.targets)],
    equal: [...rule.equal],
  }))
}

/** The receivers, each a webhook with resolutions sent too; `urls` replaces the placeholders (the drills' own webhook). */
export function receivers(urls: Readonly<Record<Severity, string>> = RECEIVER_PLACEHOLDERS) {
  return [
    { name: UNROUTED_RECEIVER },
    ...(['page', 'ticket'] as const).map((severity) => ({ name: RECEIVERS[severity], webhook_configs: [{ url: urls[severity], send_resolved: true }] })),
  ]
}

/** The whole configuration, as dashboards/alertmanager.yml holds it. */
export function alertmanagerConfig(settings: BuildSettings = DEFAULT_SETTINGS) {
  if (PAGE_GROUP_WAIT_SECONDS > providerSlowDetection().marginSeconds)
    throw new Error(`the page group_wait (${PAGE_GROUP_WAIT_SECONDS} s) is longer than the provider page's margin before the deadline (${providerSlowDetection().marginSeconds} s)`)
  return {
    route: { receiver: UNROUTED_RECEIVER, routes: [jobRoute(settings.job)] },
    inhibit_rules: inhibitRules(settings.job),
    receivers: receivers(),
  }
}

/** What the generated file says before its YAML: what to fill in, and how to merge it (the longer text: docs/how-to/monitoring.md). */
export const ALERTMANAGER_HEADER = `# Alertmanager routing for the alerts of prometheus-rules.yml (same job, same names).
# Fill in: the two webhook URLs under receivers (replace-me.invalid never resolves), or swap
# webhook_configs for your pager's and your ticket system's (pagerduty_configs, email_configs, ...);
# keep send_resolved: true.
# Merge into an existing Alertmanager: copy route.routes[0] (matched on the job) under your root
# route, first, and copy inhibit_rules and the two receivers; the rest here is a stand-alone root.
`
