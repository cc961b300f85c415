import * as common from '@grafana/grafana-foundation-sdk/common'
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard'
import * as prometheus from '@grafana/grafana-foundation-sdk/prometheus'
import * as stat from '@grafana/grafana-foundation-sdk/stat'
import * as timeseries from '@grafana/grafana-foundation-sdk/timeseries'
import { CONFLICT_RATIO_THRESHOLD, OUTAGE_FOR_SECONDS, PROVIDER_DEADLINE_SHARE_OF_TTL, PROVIDER_SLOW_HEADROOM_SECONDS, PROVIDER_SLOW_MIN_SECONDS, PROVIDER_SLOW_SECONDS, PURGE_OVERDUE_THRESHOLD_SECONDS, SERVER_ERRORS_THRESHOLD, STALE_KEYS_FOR_SECONDS, TENANT_REFUSALS_THRESHOLD } from './alert-definitions'
import {
  PANELS, SELECTED, TTL, conflictRatio, duplicateEntities, forcedExpirations, gaugesRefreshFailed, purgeOverdue,
  latencyQuantile, notReady, oldestProcessingAge, outcomes, providerOldestCall, providerSlowThresholdExpr, serverErrorRatio, staleKeys, tenantRefusals,
} from './queries'
import { DEFAULT_SETTINGS, type BuildSettings } from './settings'

/** The dashboard's uid: Grafana alerts link to it (__dashboardUid__). */
export const DASHBOARD_UID = 'idempotent-post'

/** Every query goes to the datasource the user picks in the `datasource` variable. */
const DATASOURCE = { type: 'prometheus', uid: '${datasource}' }

function query(expr: string, legend: string, refId = 'A') {
  return new prometheus.DataqueryBuilder().datasource(DATASOURCE).expr(expr).legendFormat(legend).refId(refId)
}

function thresholds(...steps: [number | null, string][]) {
  return new dashboard.ThresholdsConfigBuilder()
    .mode(dashboard.ThresholdsMode.Absolute)
    .steps(steps.map(([value, color]) => ({ value, color })))
}

function graph(title: string, description: string, unit: string, width = 12) {
  return new timeseries.PanelBuilder()
    .title(title).description(description).datasource(DATASOURCE)
    .unit(unit).height(8).span(width)
    .fillOpacity(10).lineWidth(1)
    .legend(new common.VizLegendOptionsBuilder().displayMode(common.LegendDisplayMode.List).placement(common.LegendPlacement.Bottom).showLegend(true))
}

function single(title: string, description: string, unit: string, expr: string, legend: string, warnAt: number, width = 8) {
  return new stat.PanelBuilder()
    .title(title).description(description).datasource(DATASOURCE)
    .unit(unit).height(6).span(width)
    .colorMode(common.BigValueColorMode.Background)
    .graphMode(common.BigValueGraphMode.Area)
    .reduceOptions(new common.ReduceDataOptionsBuilder().calcs(['lastNotNull']).values(false))
    .thresholds(thresholds([null, 'green'], [warnAt, 'red']))
    .withTarget(query(expr, legend))
}

/**
 * The red step of a panel's thresholds taken from a query of the panel
 * (Grafana's "Config from query results"): the TTL the servers export, so
 * the oldest-age stat turns red where keys turn stale, whatever TTL runs.
 * The config query (B) is consumed by the transformation, never shown.
 */
function thresholdFromQuery(configRefId: string) {
  return { id: 'configFromData', options: { configRefId, mappings: [{ fieldName: 'Value', handlerKey: 'threshold1' }] } }
}

/** A link in the dashboard's header. */
function headerLink(title: string, url: string, tooltip: string) {
  return new dashboard.DashboardLinkBuilder(title).type(dashboard.DashboardLinkType.Link).url(url).tooltip(tooltip).targetBlank(true).icon('external link')
}

/** p50 and p99 of a histogram by one label. */
function quantilesBy(metric: string, label: string, filter: string) {
  return [0.5, 0.99].map((q, i) => query(`histogram_quantile(${q}, sum by (le, ${label}) (rate(${metric}_bucket{${filter}}[$__rate_interval])))`, `p${q * 100} {{${label}}}`, String.fromCharCode(65 + i)))
}

export function buildDashboard(settings: BuildSettings = DEFAULT_SETTINGS): dashboard.Dashboard {
  const datasource = new dashboard.DatasourceVariableBuilder('datasource').label('Data source').type('prometheus')
  const job = new dashboard.QueryVariableBuilder('job').label('Job')
    .datasource(DATASOURCE).query('label_values(idempotency_gauges_refresh_failed, job)')
    .refresh(dashboard.VariableRefresh.OnTimeRangeChanged).sort(dashboard.VariableSort.AlphabeticalAsc)
    .multi(true).includeAll(true).allValue('.*')
    // Opens on the service's own job (dashboards/settings.ts), as the alerts read it.
    .current({ selected: true, text: [settings.job], value: [settings.job] })
  const instance = new dashboard.QueryVariableBuilder('instance').label('Instance')
    .datasource(DATASOURCE).query('label_values(idempotency_gauges_refresh_failed{job=~"$job"}, instance)')
    .refresh(dashboard.VariableRefresh.OnTimeRangeChanged).sort(dashboard.VariableSort.AlphabeticalAsc)
    .multi(true).includeAll(true).allValue('.*')

  const built = new dashboard.DashboardBuilder('Idempotent POST')
    .uid(DASHBOARD_UID)
    .description('Idempotency keys on PostgreSQL: request outcomes, conflicts, latency, stranded keys, duplicate entities, maintenance.')
    .tags(['idempotency', 'postgresql', 'bun'])
    .refresh('30s')
    .time({ from: 'now-3h', to: 'now' })
    .timezone('browser')
    .tooltip(dashboard.DashboardCursorSync.Crosshair)
    .withVariable(datasource).withVariable(job).withVariable(instance)
    // The service's own pages: where the alerts lead (one setting, dashboards/settings.ts).
    .link(headerLink('Admin: stuck keys', `${settings.adminUrl}/admin`, 'Keys in processing, stale first: force-expire, audit trail'))
    .link(headerLink('Admin: released after their deadline', `${settings.adminUrl}/admin/released?reason=deadline`, 'Requests stopped at their deadline: the provider may have charged; their downstream keys'))
    .link(headerLink('Runbooks', `${settings.adminUrl}/admin/runbooks`, 'One page per alert, served by the service'))

    .withRow(new dashboard.RowBuilder('Requests'))
    .withPanel(graph('Requests by outcome', 'Idempotent requests per second by outcome: created, replayed, in_progress (409), mismatch (422), invalid (400), reclaimed, failed (5xx, key released), lease_lost.', 'reqps')
      .stacking(new common.StackingConfigBuilder().mode(common.StackingMode.Normal))
      .withTarget(query(outcomes(SELECTED), '{{outcome}}')))
    .withPanel(graph(PANELS.conflictRatio, `Retries answered 409 because their key was still processing (outcome in_progress), per request answered 2xx (created, replayed, reclaimed). The alert fires above ${CONFLICT_RATIO_THRESHOLD} for 10 minutes.`, 'percentunit')
      .thresholdsStyle(new common.GraphThresholdsStyleConfigBuilder().mode(common.GraphThresholdsStyleMode.Line))
      .thresholds(thresholds([null, 'green'], [CONFLICT_RATIO_THRESHOLD, 'red']))
      .withTarget(query(conflictRatio(SELECTED, '$__rate_interval'), '409 / 2xx')))
    .withPanel(graph('Latency p50 / p99 (POST /api/payments)', 'From request to answer, replays and 409s included; the provider call dominates fresh payments.', 's')
      .withTarget(query(latencyQuantile(0.5, SELECTED), 'p50', 'A'))
      .withTarget(query(latencyQuantile(0.99, SELECTED), 'p99', 'B')))
    .withPanel(graph('Idempotent request duration by outcome', 'idempotency_request_duration_seconds: time spent per idempotent request, p50 and p99 by outcome (a replay or a 409 takes a round trip; created and reclaimed include the provider call).', 's')
      .withTarget(quantilesBy('idempotency_request_duration_seconds', 'outcome', `${SELECTED}, route="/api/payments"`)[0]!)
      .withTarget(quantilesBy('idempotency_request_duration_seconds', 'outcome', `${SELECTED}, route="/api/payments"`)[1]!))
    .withPanel(graph(PANELS.serverErrors, `5xx answers per answer on /api/...: the paging alert fires above ${SERVER_ERRORS_THRESHOLD} for ${OUTAGE_FOR_SECONDS} s (with at least a few failures). 503: the database; 502: the provider; 504: deadlines.`, 'percentunit')
      .min(0)
      .thresholdsStyle(new common.GraphThresholdsStyleConfigBuilder().mode(common.GraphThresholdsStyleMode.Line))
      .thresholds(thresholds([null, 'green'], [SERVER_ERRORS_THRESHOLD, 'red']))
      .withTarget(query(`sum(rate(http_requests_total{${SELECTED}, route=~"/api/.*", status=~"5.."}[$__rate_interval])) / sum(rate(http_requests_total{${SELECTED}, route=~"/api/.*"}[$__rate_interval]))`, '5xx / all', 'A'))
      // The alert leaves out an instance that lost its database within its minute (that outage pages as readiness).
      .withTarget(query(`count(min_over_time(idempotency_ready{${SELECTED}}[1m]) == 0) or vector(0)`, 'instances that lost their database within the minute', 'B')))
    .withPanel(graph(PANELS.refusalsByTenant, `Requests refused with 429 at their tenant's limits, per second, by tenant and reason (rate_limited: TENANT_RATE_LIMIT; too_many_in_flight: TENANT_MAX_IN_FLIGHT). The ticket alert fires above ${TENANT_REFUSALS_THRESHOLD}/s for a tenant for 10 minutes.`, 'reqps')
      .withTarget(query(tenantRefusals(SELECTED, '$__rate_interval'), '{{tenant}}: {{reason}}')))
    .withPanel(graph(PANELS.targetsUp, 'Per target: 1 when Prometheus\'s last scrape of it succeeded, 0 when it failed. The target-down alert fires after 2 minutes at 0, or when the job has no target at all.', 'none')
      .min(0).max(1)
      .withTarget(query(`up{${SELECTED}}`, '{{instance}}')))

    .withRow(new dashboard.RowBuilder('Keys (computed in PostgreSQL, the same from every instance)'))
    .withPanel(single('Stale processing keys', `Keys in processing past the TTL: their worker is probably gone and no retry reclaimed them. The alert fires after ${STALE_KEYS_FOR_SECONDS} s.`, 'none', `sum(${staleKeys(SELECTED)})`, 'stale', 1))
    .withPanel(single('Oldest processing age', 'Age of the oldest lease in processing; it turns red at the TTL the servers run with (idempotency_ttl_seconds), where a key is stale.', 's', oldestProcessingAge(SELECTED), 'oldest', 1e9, 6)
      .withTarget(query(TTL.replace('idempotency_ttl_seconds', `idempotency_ttl_seconds{${SELECTED}}`), 'TTL', 'B').instant())
      .withTransformation(thresholdFromQuery('B')))
    .withPanel(single('TTL', 'IDEMPOTENCY_TTL_SECONDS as the servers run with it (idempotency_ttl_seconds): the longest a request may process.', 's', TTL.replace('idempotency_ttl_seconds', `idempotency_ttl_seconds{${SELECTED}}`), 'TTL', 1e9, 2))
    .withPanel(single('Duplicate entities (last hour)', 'Completions that repeat the same request under another key: a client makes a new key per retry.', 'none', `sum(${duplicateEntities(SELECTED)})`, 'duplicates', 1))
    .withPanel(graph(PANELS.staleByTenant, 'Per tenant, so the owner of stuck keys is visible.', 'none')
      .withTarget(query(staleKeys(SELECTED), '{{tenant}}')))
    .withPanel(graph(PANELS.duplicatesByTenant, 'Per tenant: which client retries with new keys.', 'none')
      .withTarget(query(duplicateEntities(SELECTED), '{{tenant}}')))

    .withRow(new dashboard.RowBuilder('Dependencies: the payment provider and the database'))
    .withPanel(graph('Provider call latency by outcome', 'idempotency_provider_request_duration_seconds: every HTTP call to the payment provider, p50 and p99 by outcome (ok, failed, lost: no answer, deadline: stopped by the request\'s deadline).', 's')
      .withTarget(quantilesBy('idempotency_provider_request_duration_seconds', 'outcome', SELECTED)[0]!)
      .withTarget(quantilesBy('idempotency_provider_request_duration_seconds', 'outcome', SELECTED)[1]!))
    .withPanel(graph('Provider calls by outcome', 'Calls per second to the payment provider by outcome. Lost answers are retried with the same key; a deadline may have charged (see the admin\'s released-after-deadline list).', 'reqps')
      .stacking(new common.StackingConfigBuilder().mode(common.StackingMode.Normal))
      .withTarget(query(`sum by (outcome) (rate(idempotency_provider_request_duration_seconds_count{${SELECTED}}[$__rate_interval]))`, '{{outcome}}')))
    .withPanel(graph(PANELS.providerInFlight, `Calls to the payment provider in progress now, and the age of the oldest, per instance: a hung provider shows here while it hangs (the histogram only when its calls end at their deadline). The paging alert fires when the oldest passes its threshold (C, from each instance's TTL: the TTL less a tenth, less ${PROVIDER_SLOW_HEADROOM_SECONDS} s, between ${PROVIDER_SLOW_MIN_SECONDS} and ${PROVIDER_SLOW_SECONDS} s), before the first request waiting on it reaches its deadline.`, 'none')
      .withTarget(query(`sum by (instance) (idempotency_provider_calls_in_flight{${SELECTED}})`, 'in flight: {{instance}}', 'A'))
      .withTarget(query(providerOldestCall(SELECTED), 'oldest (s): {{instance}}', 'B'))
      .withTarget(query(providerSlowThresholdExpr(SELECTED, ['instance'], PROVIDER_DEADLINE_SHARE_OF_TTL, PROVIDER_SLOW_HEADROOM_SECONDS, PROVIDER_SLOW_MIN_SECONDS, PROVIDER_SLOW_SECONDS), 'alert threshold (s): {{instance}}', 'C')))
    .withPanel(graph('Deadlines and releases by reason', 'Requests that ran into their deadline, and keys released by reason: after their deadline (the provider may have charged: the admin lists them with their downstream keys), after a failure, by a shutdown.', 'ops')
      .withTarget(query(`sum(rate(idempotency_deadline_exceeded_total{${SELECTED}}[$__rate_interval]))`, 'deadline hit', 'A'))
      .withTarget(query(`sum by (reason) (rate(idempotency_releases_total{${SELECTED}}[$__rate_interval]))`, 'released: {{reason}}', 'B')))
    .withPanel(graph('Database pools: connections in use and waiting', 'Per pool (short: claims, replays, reads; work: completing transactions), summed over the instances: connections running our statements, and statements waiting for one. Waiting above 0 for long means the pool is too small or the database slow.', 'none')
      .min(0)
      .withTarget(query(`sum by (pool) (idempotency_db_pool_connections_in_use{${SELECTED}})`, 'in use: {{pool}}', 'A'))
      .withTarget(query(`sum by (pool) (idempotency_db_pool_waiting{${SELECTED}})`, 'waiting: {{pool}}', 'B'))
      .withTarget(query(`sum by (pool) (idempotency_db_pool_connections_max{${SELECTED}})`, 'size: {{pool}}', 'C')))
    .withPanel(graph(PANELS.ready, `Per instance: 1 while it reaches PostgreSQL (GET /readyz 200), 0 while not. The paging alert fires after ${OUTAGE_FOR_SECONDS} s at 0.`, 'none')
      .min(0).max(1)
      .withTarget(query(`1 - ${notReady(SELECTED)}`, '{{instance}}')))

    .withRow(new dashboard.RowBuilder('Recovery and maintenance'))
    .withPanel(graph('Reclaims, lost leases, releases, forced expirations', 'Per second: stale keys taken over by a retry, workers fenced off at commit, keys released after a failure, operator force-expirations by outcome (from the audit trail: page, API and CLI).', 'ops')
      .withTarget(query(`sum(rate(idempotency_reclaims_total{${SELECTED}}[$__rate_interval]))`, 'reclaimed', 'A'))
      .withTarget(query(`sum(rate(idempotency_lease_lost_total{${SELECTED}}[$__rate_interval]))`, 'lease lost', 'B'))
      .withTarget(query(`sum(rate(idempotency_releases_total{${SELECTED}}[$__rate_interval]))`, 'released', 'C'))
      .withTarget(query(forcedExpirations(SELECTED), 'force-expire {{outcome}}', 'D')))
    .withPanel(graph('Purged keys', 'Completed keys deleted after their retention, per second.', 'ops')
      .withTarget(query(`sum(rate(idempotency_purged_keys_total{${SELECTED}}[$__rate_interval]))`, 'purged')))
    .withPanel(graph(PANELS.purgeOverdue, `How long past its retention the next key the purge deletes has waited: near 0 while the purge keeps up. The ticket alert fires above ${PURGE_OVERDUE_THRESHOLD_SECONDS / 3600} hour for 15 minutes.`, 's')
      .min(0)
      .thresholdsStyle(new common.GraphThresholdsStyleConfigBuilder().mode(common.GraphThresholdsStyleMode.Line))
      .thresholds(thresholds([null, 'green'], [PURGE_OVERDUE_THRESHOLD_SECONDS, 'red']))
      .withTarget(query(purgeOverdue(SELECTED), 'overdue')))
    .withPanel(graph('HTTP answers by status', 'Every answer of the service, 4xx from auth and validation included.', 'reqps')
      .withTarget(query(`sum by (status) (rate(http_requests_total{${SELECTED}}[$__rate_interval]))`, '{{status}}')))
    .withPanel(graph(PANELS.gaugeRefresh, '1 when the last run of a database query behind /metrics failed or timed out (its gauges then show older values), by query.', 'none')
      .min(0).max(1)
      .withTarget(query(gaugesRefreshFailed(SELECTED), '{{query}} failed')))
    .withPanel(graph('Gauge query duration', 'How long the last run of each database query behind /metrics took (each has a 1 s timeout).', 's')
      .min(0)
      .withTarget(query(`max by (query) (idempotency_gauges_refresh_duration_seconds{${SELECTED}})`, '{{query}}')))
    .build()
  // Stable panel ids, so the JSON does not change from one build to the next and alerts can point at a panel.
  built.panels?.forEach((panel, index) => { panel.id = index + 1 })
  return built
}

/** The id of the panel titled `title`; throws unless exactly one panel has it. */
export function panelId(board: dashboard.Dashboard, title: string): number {
  const found = (board.panels ?? []).filter((panel) => 'title' in panel && panel.title === title)
  if (found.length !== 1 || found[0]!.id === undefined) throw new Error(`dashboard ${board.uid}: expected one panel titled ${JSON.stringify(title)}, found ${found.length}`)
  return found[0]!.id
}
