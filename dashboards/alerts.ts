import * as alerting from '@grafana/grafana-foundation-sdk/alerting'
import type * as dashboard from '@grafana/grafana-foundation-sdk/dashboard'
import * as expr from '@grafana/grafana-foundation-sdk/expr'
import * as prometheus from '@grafana/grafana-foundation-sdk/prometheus'
import { RULE_GROUPS, alertAnnotations, alertsFor, comparison, type AlertDefinition, type Dialect, type RuleGroupName } from './alert-definitions'
import { SCRAPE_JOB, ttlOf } from './queries'
import { buildDashboard, panelId } from './dashboard'
import { DEFAULT_SETTINGS, type BuildSettings } from './settings'

/**
 * The Prometheus datasource UID the Grafana rules query. Provision your
 * Prometheus datasource with this uid (docs/how-to/monitoring.md), or change it
 * here and run `npm run dashboards`.
 */
export const PROMETHEUS_UID = 'prometheus'
/** The main rule group's name (RULE_GROUPS.main), in both systems. */
export const RULE_GROUP = RULE_GROUPS.main.name
export const RULE_FOLDER = 'Idempotency'
/** Grafana's id for its server-side expressions (reduce, threshold). */
const EXPRESSION_UID = '__expr__'
/** The reduce step: Grafana templates read the alert's value as `$values.B.Value`. */
const REDUCED = 'B'
/** The TTL query of an alert whose text names the TTL: `$values.T.Value`. */
const TTL_QUERY = 'T'

/**
 * Prometheus templates may query: the TTL is read from the servers when the
 * alert fires (an empty answer, no server scraped, names the setting instead).
 */
export function prometheusDialect(job: string): Dialect {
  // A raw string (backquotes) in the template: the job's double quotes need no escaping.
  return { value: '$value', ttl: `{{ with query \`${ttlOf(job)}\` }}{{ . | first | value }} s{{ else }}IDEMPOTENCY_TTL_SECONDS{{ end }}` }
}
export const PROMETHEUS_DIALECT: Dialect = prometheusDialect(SCRAPE_JOB)
/** Grafana templates cannot query: the rule carries the TTL as an instant query of its own (T). */
export const GRAFANA_DIALECT: Dialect = { value: `$values.${REDUCED}.Value`, ttl: `{{ $values.${TTL_QUERY}.Value }} s` }

function grafanaRule(alert: AlertDefinition, settings: BuildSettings, board: dashboard.Dashboard): alerting.RuleBuilder {
  const rule = new alerting.RuleBuilder(alert.name)
    .uid(alert.uid)
    .ruleGroup(RULE_GROUPS[alert.group ?? 'main'].name)
    .folderUID(RULE_FOLDER)
    .orgID(1)
    .condition('C')
    .forDuration(alert.for)
    // No series at all means the service is not scraped: the target-down alert's job, not these.
    .noDataState(alert.noData ?? 'OK')
    .execErrState('Error')
    .labels({ severity: alert.severity })
    .annotations({
      ...alertAnnotations(alert, settings, GRAFANA_DIALECT),
      // Grafana links the alert to its panel ("View panel", the panel's heart).
      __dashboardUid__: board.uid!,
      __panelId__: String(panelId(board, alert.panel)),
    })
    .withQuery(new alerting.QueryBuilder('A')
      .datasourceUid(PROMETHEUS_UID)
      .relativeTimeRange({ from: 600, to: 0 })
      // A per-series threshold is compared in PromQL: A keeps the series over theirs, and C asks for any (> 0).
      .model(new prometheus.DataqueryBuilder().refId('A').expr(alert.perSeriesThreshold ? comparison(alert.expr, 0, alert.perSeriesThreshold) : alert.expr).instant()))
    .withQuery(new alerting.QueryBuilder(REDUCED)
      .datasourceUid(EXPRESSION_UID)
      .model(new expr.TypeReduceBuilder().refId(REDUCED).expression('A').reducer('last')))
    .withQuery(new alerting.QueryBuilder('C')
      .datasourceUid(EXPRESSION_UID)
      .model(new expr.TypeThresholdBuilder().refId('C').expression(REDUCED)
        .conditions([{ evaluator: { type: 'gt', params: [alert.threshold] } }])))
  if (!alert.usesTtl) return rule
  return rule.withQuery(new alerting.QueryBuilder(TTL_QUERY)
    .datasourceUid(PROMETHEUS_UID)
    .relativeTimeRange({ from: 600, to: 0 })
    .model(new prometheus.DataqueryBuilder().refId(TTL_QUERY).expr(ttlOf(settings.job)).instant()))
}

/** The alerts of each rule group (RULE_GROUPS), in their order; a group with no alert is left out. */
function byGroup(alerts: readonly AlertDefinition[]): [RuleGroupName, AlertDefinition[]][] {
  return (Object.keys(RULE_GROUPS) as RuleGroupName[])
    .map((group): [RuleGroupName, AlertDefinition[]] => [group, alerts.filter((alert) => (alert.group ?? 'main') === group)])
    .filter(([, members]) => members.length > 0)
}

/** Grafana's rule groups, each evaluated at its own interval (RULE_GROUPS: the provider alert's every 10 s, Grafana's least). */
export function buildGrafanaRuleGroups(settings: BuildSettings = DEFAULT_SETTINGS, board: dashboard.Dashboard = buildDashboard()): alerting.RuleGroup[] {
  return byGroup(alertsFor(settings.job)).map(([group, alerts]) => new alerting.RuleGroupBuilder(RULE_GROUPS[group].name)
    .folderUid(RULE_FOLDER)
    .interval(RULE_GROUPS[group].grafanaSeconds)
    .rules(alerts.map((alert) => grafanaRule(alert, settings, board)))
    .build())
}

/**
 * The same rule group as a Grafana file-provisioning document
 * (provisioning/alerting/*.yaml): the SDK builds the API shape, and the file
 * format names a few fields differently (name, folder, orgId). The file
 * format takes the panel link as `dashboardUid`/`panelId` fields; the API
 * shape as the `__dashboardUid__`/`__panelId__` annotations. Both are written,
 * with the same values.
 */
export function grafanaProvisioning(settings: BuildSettings = DEFAULT_SETTINGS, board: dashboard.Dashboard = buildDashboard()) {
  return {
    apiVersion: 1,
    groups: buildGrafanaRuleGroups(settings, board).map((group) => ({
      orgId: 1,
      name: group.title,
      folder: RULE_FOLDER,
      interval: `${group.interval}s`,
      rules: (group.rules ?? []).map((rule) => ({
        uid: rule.uid,
        title: rule.title,
        condition: rule.condition,
        data: rule.data,
        dashboardUid: rule.annotations?.__dashboardUid__,
        panelId: Number(rule.annotations?.__panelId__),
        noDataState: rule.noDataState,
        execErrState: rule.execErrState,
        for: rule.for,
        labels: rule.labels,
        annotations: rule.annotations,
        isPaused: false,
      })),
    })),
  }
}

/**
 * The same alerts as a Prometheus rule file: one group per RULE_GROUPS entry,
 * each with its own `interval:` (which overrides the global
 * evaluation_interval, 1 m by default): the stale-key detection time counts
 * on the main group's 30 s, the provider alert's construction on its 5 s.
 */
export function prometheusRules(settings: BuildSettings = DEFAULT_SETTINGS) {
  return {
    groups: byGroup(alertsFor(settings.job)).map(([group, alerts]) => ({
      name: RULE_GROUPS[group].name,
      interval: `${RULE_GROUPS[group].prometheusSeconds}s`,
      rules: alerts.map((alert) => ({
        alert: alert.name,
        expr: comparison(alert.expr, alert.threshold, alert.perSeriesThreshold),
        for: alert.for,
        labels: { severity: alert.severity },
        annotations: alertAnnotations(alert, settings, prometheusDialect(settings.job)),
      })),
    })),
  }
}
