import { expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { dirname } from 'node:path'
import { ALERTS, RULE_GROUPS, comparison } from '../../dashboards/alert-definitions'
import { OUTPUTS } from '../../dashboards/build'
import { prometheusRules } from '../../dashboards/alerts'
import { DEFAULT_SETTINGS } from '../../dashboards/settings'

/** The promtool unit tests: the main group's (evaluated every 30 s) and the provider group's (every 5 s). */
const RULE_TESTS = [`${dirname(OUTPUTS.prometheusRules)}/prometheus-rules.test.yml`, `${dirname(OUTPUTS.prometheusRules)}/prometheus-rules-provider.test.yml`]

async function promtool(...args: string[]): Promise<{ code: number; output: string }> {
  const proc = Bun.spawn(['promtool', ...args], { cwd: dirname(OUTPUTS.prometheusRules), stdout: 'pipe', stderr: 'pipe' })
  const [code, out, err] = await Promise.all([proc.exited, new Response(proc.stdout).text(), new Response(proc.stderr).text()])
  return { code, output: out + err }
}

test('promtool accepts the rule file', async () => {
  const { code, output } = await promtool('check', 'rules', OUTPUTS.prometheusRules)
  expect(output).toContain(`SUCCESS: ${ALERTS.length} rules found`)
  expect(code).toBe(0)
})

test('promtool test rules: thresholds, `for` durations, aggregation and alert texts behave as designed', async () => {
  for (const file of RULE_TESTS) {
    const { code, output } = await promtool('test', 'rules', file)
    if (code !== 0) console.error(output)
    expect({ file, success: output.includes('SUCCESS') }).toEqual({ file, success: true })
    expect({ file, code }).toEqual({ file, code: 0 })
  }
})

test('the promtool tests make every rule fire at least once', () => {
  const fired = new Set<string>()
  for (const file of RULE_TESTS) {
    const tests = Bun.YAML.parse(readFileSync(file, 'utf8')) as { tests: { alert_rule_test?: { alertname: string; exp_alerts: unknown[] }[] }[] }
    for (const t of tests.tests) for (const a of t.alert_rule_test ?? []) if (a.exp_alerts.length > 0) fired.add(a.alertname)
  }
  expect([...fired].sort()).toEqual(ALERTS.map((alert) => alert.name).sort())
})

test('the Grafana rules and the Prometheus rules are the same alerts with the same expressions, in the same groups', () => {
  const grafana = Bun.YAML.parse(readFileSync(OUTPUTS.grafanaAlerts, 'utf8')) as any
  const prometheus = Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any
  // Each group at its own interval: the provider's every 5 s in Prometheus, every 10 s in Grafana (its least).
  expect(prometheus.groups.map((group: any) => [group.name, group.interval])).toEqual(Object.values(RULE_GROUPS).map((group) => [group.name, `${group.prometheusSeconds}s`]))
  expect(grafana.groups.map((group: any) => [group.name, group.interval])).toEqual(Object.values(RULE_GROUPS).map((group) => [group.name, `${group.grafanaSeconds}s`]))
  const fromGrafana = grafana.groups.flatMap((group: any) => group.rules.map((rule: any) => {
    const threshold = rule.data.find((q: any) => q.model.type === 'threshold').model.conditions[0].evaluator
    const query: string = rule.data[0].model.expr
    // A per-series threshold is compared in query A (`> on (...)`), and the condition asks for any value over 0.
    const expr = / > on \(/.test(query) && threshold.params[0] === 0 ? query : comparison(query, threshold.params[0])
    return { group: group.name, alert: rule.title, expr, for: rule.for, severity: rule.labels.severity, op: threshold.type }
  }))
  const fromPrometheus = prometheus.groups.flatMap((group: any) => group.rules.map((rule: any) => ({ group: group.name, alert: rule.alert, expr: rule.expr, for: rule.for, severity: rule.labels.severity, op: 'gt' })))
  expect(fromGrafana).toEqual(fromPrometheus)
  expect(fromPrometheus.map((rule: any) => rule.alert)).toEqual([
    'IdempotencyStaleProcessingKeys', 'IdempotencyConflictRatioHigh', 'IdempotencyDuplicateEntities', 'IdempotencyPurgeBehind', 'IdempotencyGaugesRefreshFailing', 'IdempotencyTargetDown',
    'IdempotencyServerErrorsHigh', 'IdempotencyTenantHeldAtLimit', 'IdempotencyNotReady', 'IdempotencyProviderSlow',
  ])
})

test('the 409 ratio divides idempotency outcomes (created at 0), in the dashboard, the Prometheus rules and the Grafana rules alike', () => {
  // The alerts keep their job (sum by (job)), the dashboard sums what its variables select.
  const ratio = /sum(?: by \(job\) )?\(rate\(idempotency_requests_total\{[^}]*route="\/api\/payments", outcome="in_progress"\}\[[^\]]+\]\)\) \/ sum(?: by \(job\) )?\(rate\(idempotency_requests_total\{[^}]*route="\/api\/payments", outcome=~"created\|replayed\|reclaimed"\}\[[^\]]+\]\)\)/
  const prometheus = Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any
  const grafana = Bun.YAML.parse(readFileSync(OUTPUTS.grafanaAlerts, 'utf8')) as any
  const dashboard = JSON.parse(readFileSync(OUTPUTS.dashboard, 'utf8'))
  expect(prometheus.groups.flatMap((group: any) => group.rules).find((rule: any) => rule.alert === 'IdempotencyConflictRatioHigh').expr).toMatch(ratio)
  expect(grafana.groups.flatMap((group: any) => group.rules).find((rule: any) => rule.title === 'IdempotencyConflictRatioHigh').data[0].model.expr).toMatch(ratio)
  expect(dashboard.panels.find((panel: any) => panel.title === '409 per 2xx on /api/payments').targets[0].expr).toMatch(ratio)
  const all = [readFileSync(OUTPUTS.prometheusRules, 'utf8'), readFileSync(OUTPUTS.grafanaAlerts, 'utf8'), readFileSync(OUTPUTS.dashboard, 'utf8')].join('\n')
  expect(all).not.toMatch(/status=\\?"409\\?"/)
})

// Catches: an alert that reads every job (another team's 5xx paged us) or drops the job label.
test('every alert reads the scrape job it was built for, and keeps the job as a label', () => {
  for (const job of ['idempotent-post', 'payments-eu']) {
    const rules = Bun.YAML.parse(Bun.YAML.stringify(prometheusRules({ ...DEFAULT_SETTINGS, job }))) as any
    for (const rule of rules.groups.flatMap((group: any) => group.rules)) {
      const selectors = [...String(rule.expr).matchAll(/\b([a-z_]+)\{([^}]*)\}/g)]
      expect({ alert: rule.alert, unscoped: selectors.filter(([, , labels]) => !labels!.includes(`job="${job}"`)).map(([all]) => all) }).toEqual({ alert: rule.alert, unscoped: [] })
      if (rule.alert !== 'IdempotencyTargetDown') expect({ alert: rule.alert, keeps: /by \([^)]*\bjob\b/.test(rule.expr) }).toEqual({ alert: rule.alert, keeps: true })
      expect(rule.annotations.description).toContain('{{ $labels.job }}')
    }
  }
})
