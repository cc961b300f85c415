import * as alerting from '@grafana/grafana-foundation-sdk/alerting'
import * as expr from '@grafana/grafana-foundation-sdk/expr'
import * as prometheus from '@grafana/grafana-foundation-sdk/prometheus'
import { ALERTS, type AlertDefinition } from './queries'

/**
 * The Prometheus datasource UID the Grafana rules query. Provision your
 * Prometheus datasource with this uid (docs/observability.md), or change it
 * here and run `npm run dashboards`.
 */
export const PROMETHEUS_UID = 'prometheus'
export const RULE_GROUP = 'idempotency'
export const RULE_FOLDER = 'Idempotency'
/** 60 s: as often as Prometheus' own rule evaluation in most setups (the SDK's Duration is in seconds). */
const EVALUATION_INTERVAL_SECONDS = 60
/** Grafana's id for its server-side expressions (reduce, threshold). */
const EXPRESSION_UID = '__expr__'

function grafanaRule(alert: AlertDefinition): alerting.RuleBuilder {
  return new alerting.RuleBuilder(alert.name)
    .uid(alert.uid)
    .ruleGroup(RULE_GROUP)
    .folderUID(RULE_FOLDER)
    .orgID(1)
    .condition('C')
    .forDuration(alert.for)
    // No series at all means the service is not scraped: that is the job of an `up` alert, not of these.
    .noDataState('OK')
    .execErrState('Error')
    .labels({ severity: alert.severity })
    .annotations({ summary: alert.summary, description: alert.description })
    .withQuery(new alerting.QueryBuilder('A')
      .datasourceUid(PROMETHEUS_UID)
      .relativeTimeRange({ from: 600, to: 0 })
      .model(new prometheus.DataqueryBuilder().refId('A').expr(alert.expr).instant()))
    .withQuery(new alerting.QueryBuilder('B')
      .datasourceUid(EXPRESSION_UID)
      .model(new expr.TypeReduceBuilder().refId('B').expression('A').reducer('last')))
    .withQuery(new alerting.QueryBuilder('C')
      .datasourceUid(EXPRESSION_UID)
      .model(new expr.TypeThresholdBuilder().refId('C').expression('B')
        .conditions([{ evaluator: { type: 'gt', params: [alert.threshold] } }])))
}

export function buildGrafanaRuleGroup(): alerting.RuleGroup {
  return new alerting.RuleGroupBuilder(RULE_GROUP)
    .folderUid(RULE_FOLDER)
    .interval(EVALUATION_INTERVAL_SECONDS)
    .rules(ALERTS.map(grafanaRule))
    .build()
}

/**
 * The same rule group as a Grafana file-provisioning document
 * (provisioning/alerting/*.yaml): the SDK builds the API shape, and the file
 * format names a few fields differently (name, folder, orgId).
 */
export function grafanaProvisioning(group: alerting.RuleGroup = buildGrafanaRuleGroup()) {
  return {
    apiVersion: 1,
    groups: [{
      orgId: 1,
      name: group.title,
      folder: RULE_FOLDER,
      interval: `${group.interval ?? EVALUATION_INTERVAL_SECONDS}s`,
      rules: (group.rules ?? []).map((rule) => ({
        uid: rule.uid,
        title: rule.title,
        condition: rule.condition,
        data: rule.data,
        noDataState: rule.noDataState,
        execErrState: rule.execErrState,
        for: rule.for,
        labels: rule.labels,
        annotations: rule.annotations,
        isPaused: false,
      })),
    }],
  }
}

/** The same alerts as a Prometheus rule file. */
export function prometheusRules() {
  return {
    groups: [{
      name: RULE_GROUP,
      rules: ALERTS.map((alert) => ({
        alert: alert.name,
        expr: `${alert.expr} > ${alert.threshold}`,
        for: alert.for,
        labels: { severity: alert.severity },
        annotations: { summary: alert.summary, description: alert.description },
      })),
    }],
  }
}
