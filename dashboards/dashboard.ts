import * as common from '@grafana/grafana-foundation-sdk/common'
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard'
import * as prometheus from '@grafana/grafana-foundation-sdk/prometheus'
import * as stat from '@grafana/grafana-foundation-sdk/stat'
import * as timeseries from '@grafana/grafana-foundation-sdk/timeseries'
import { CONFLICT_RATIO_THRESHOLD, STALE_KEYS_FOR_SECONDS } from './alert-definitions'
import {
  PANELS, SELECTED, conflictRatio, duplicateEntities, forcedExpirations, gaugesRefreshFailed,
  latencyQuantile, oldestProcessingAge, outcomes, staleKeys,
} from './queries'
import { ASSUMED_TTL_SECONDS } from './settings'

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

function single(title: string, description: string, unit: string, expr: string, legend: string, warnAt: number) {
  return new stat.PanelBuilder()
    .title(title).description(description).datasource(DATASOURCE)
    .unit(unit).height(6).span(8)
    .colorMode(common.BigValueColorMode.Background)
    .graphMode(common.BigValueGraphMode.Area)
    .reduceOptions(new common.ReduceDataOptionsBuilder().calcs(['lastNotNull']).values(false))
    .thresholds(thresholds([null, 'green'], [warnAt, 'red']))
    .withTarget(query(expr, legend))
}

export function buildDashboard(): dashboard.Dashboard {
  const datasource = new dashboard.DatasourceVariableBuilder('datasource').label('Data source').type('prometheus')
  const job = new dashboard.QueryVariableBuilder('job').label('Job')
    .datasource(DATASOURCE).query('label_values(idempotency_gauges_refresh_failed, job)')
    .refresh(dashboard.VariableRefresh.OnTimeRangeChanged).sort(dashboard.VariableSort.AlphabeticalAsc)
    .multi(true).includeAll(true).allValue('.*')
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
    .withPanel(graph(PANELS.targetsUp, 'Per target: 1 when Prometheus\'s last scrape of it succeeded, 0 when it failed. The target-down alert fires after 2 minutes at 0, or when the job has no target at all.', 'none')
      .min(0).max(1)
      .withTarget(query(`up{${SELECTED}}`, '{{instance}}')))

    .withRow(new dashboard.RowBuilder('Keys (computed in PostgreSQL, the same from every instance)'))
    .withPanel(single('Stale processing keys', `Keys in processing past the TTL: their worker is probably gone and no retry reclaimed them. The alert fires after ${STALE_KEYS_FOR_SECONDS} s.`, 'none', `sum(${staleKeys(SELECTED)})`, 'stale', 1))
    .withPanel(single('Oldest processing age', 'Age of the oldest lease in processing; above the TTL it is stale.', 's', oldestProcessingAge(SELECTED), 'oldest', ASSUMED_TTL_SECONDS))
    .withPanel(single('Duplicate entities (last hour)', 'Completions that repeat the same request under another key: a client makes a new key per retry.', 'none', `sum(${duplicateEntities(SELECTED)})`, 'duplicates', 1))
    .withPanel(graph(PANELS.staleByTenant, 'Per tenant, so the owner of stuck keys is visible.', 'none')
      .withTarget(query(staleKeys(SELECTED), '{{tenant}}')))
    .withPanel(graph(PANELS.duplicatesByTenant, 'Per tenant: which client retries with new keys.', 'none')
      .withTarget(query(duplicateEntities(SELECTED), '{{tenant}}')))

    .withRow(new dashboard.RowBuilder('Recovery and maintenance'))
    .withPanel(graph('Reclaims, lost leases, releases, forced expirations', 'Per second: stale keys taken over by a retry, workers fenced off at commit, keys released after a failure, operator force-expirations by outcome (from the audit trail: page, API and CLI).', 'ops')
      .withTarget(query(`sum(rate(idempotency_reclaims_total{${SELECTED}}[$__rate_interval]))`, 'reclaimed', 'A'))
      .withTarget(query(`sum(rate(idempotency_lease_lost_total{${SELECTED}}[$__rate_interval]))`, 'lease lost', 'B'))
      .withTarget(query(`sum(rate(idempotency_releases_total{${SELECTED}}[$__rate_interval]))`, 'released', 'C'))
      .withTarget(query(forcedExpirations(SELECTED), 'force-expire {{outcome}}', 'D')))
    .withPanel(graph('Purged keys', 'Completed keys deleted after their retention, per second.', 'ops')
      .withTarget(query(`sum(rate(idempotency_purged_keys_total{${SELECTED}}[$__rate_interval]))`, 'purged')))
    .withPanel(graph('HTTP answers by status', 'Every answer of the service, 4xx from auth and validation included.', 'reqps')
      .withTarget(query(`sum by (status) (rate(http_requests_total{${SELECTED}}[$__rate_interval]))`, '{{status}}')))
    .withPanel(graph(PANELS.gaugeRefresh, '1 when the last run of a database query behind /metrics failed or timed out (its values are then older), by query; and how long each took.', 's')
      .withTarget(query(gaugesRefreshFailed(SELECTED), '{{query}} failed', 'A'))
      .withTarget(query(`max by (query) (idempotency_gauges_refresh_duration_seconds{${SELECTED}})`, '{{query}} duration', 'B')))
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
