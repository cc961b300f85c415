import { expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { dirname } from 'node:path'
import { ALERTS, comparison } from '../../dashboards/alert-definitions'
import { OUTPUTS } from '../../dashboards/build'
import { prometheusRules } from '../../dashboards/alerts'
import { DEFAULT_SETTINGS } from '../../dashboards/settings'

const RULE_TESTS = `${dirname(OUTPUTS.prometheusRules)}/prometheus-rules.test.yml`

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
  const { code, output } = await promtool('test', 'rules', RULE_TESTS)
  if (code !== 0) console.error(output)
  expect(output).toContain('SUCCESS')
  expect(code).toBe(0)
})

test('the promtool tests make every rule fire at least once', () => {
  const tests = Bun.YAML.parse(readFileSync(RULE_TESTS, 'utf8')) as { tests: { alert_rule_test?: { alertname: string; exp_alerts: unknown[] }[] }[] }
  const fired = new Set(tests.tests.flatMap((t) => (t.alert_rule_test ?? []).filter((a) => a.exp_alerts.length > 0).map((a) => a.alertname)))
  expect([...fired].sort()).toEqual(ALERTS.map((alert) => alert.name).sort())
})

test('the Grafana rules and the Prometheus rules are the same alerts with the same expressions', () => {
  const grafana = Bun.YAML.parse(readFileSync(OUTPUTS.grafanaAlerts, 'utf8')) as any
  const prometheus = Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any
  expect(grafana.groups[0].interval).toBe(prometheus.groups[0].interval)
  const fromGrafana = grafana.groups[0].rules.map((rule: any) => {
    const threshold = rule.data.find((q: any) => q.model.type === 'threshold').model.conditions[0].evaluator
    return { alert: rule.title, expr: comparison(rule.data[0].model.expr, threshold.params[0]), for: rule.for, severity: rule.labels.severity, op: threshold.type }
  })
  const fromPrometheus = prometheus.groups[0].rules.map((rule: any) => ({ alert: rule.alert, expr: rule.expr, for: rule.for, severity: rule.labels.severity, op: 'gt' }))
  expect(fromGrafana).toEqual(fromPrometheus)
  expect(fromPrometheus.map((rule: any) => rule.alert)).toEqual([
    'IdempotencyStaleProcessingKeys', 'IdempotencyConflictRatioHigh', 'IdempotencyDuplicateEntities', 'IdempotencyGaugesRefreshFailing', 'IdempotencyTargetDown',
    'IdempotencyServerErrorsHigh', 'IdempotencyProviderSlow', 'IdempotencyTenantHeldAtLimit', 'IdempotencyNotReady',
  ])
})

test('the 409 ratio divides idempotency outcomes (created at 0), in the dashboard, the Prometheus rules and the Grafana rules alike', () => {
  // The alerts keep their job (sum by (job)), the dashboard sums what its variables select.
  const ratio = /sum(?: by \(job\) )?\(rate\(idempotency_requests_total\{[^}]*route="\/api\/payments", outcome="in_progress"\}\[[^\]]+\]\)\) \/ sum(?: by \(job\) )?\(rate\(idempotency_requests_total\{[^}]*route="\/api\/payments", outcome=~"created\|replayed\|reclaimed"\}\[[^\]]+\]\)\)/
  const prometheus = Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any
  const grafana = Bun.YAML.parse(readFileSync(OUTPUTS.grafanaAlerts, 'utf8')) as any
  const dashboard = JSON.parse(readFileSync(OUTPUTS.dashboard, 'utf8'))
  expect(prometheus.groups[0].rules.find((rule: any) => rule.alert === 'IdempotencyConflictRatioHigh').expr).toMatch(ratio)
  expect(grafana.groups[0].rules.find((rule: any) => rule.title === 'IdempotencyConflictRatioHigh').data[0].model.expr).toMatch(ratio)
  expect(dashboard.panels.find((panel: any) => panel.title === '409 per 2xx on /api/payments').targets[0].expr).toMatch(ratio)
  const all = [readFileSync(OUTPUTS.prometheusRules, 'utf8'), readFileSync(OUTPUTS.grafanaAlerts, 'utf8'), readFileSync(OUTPUTS.dashboard, 'utf8')].join('\n')
  expect(all).not.toMatch(/status=\\?"409\\?"/)
})

// Catches: an alert that reads every job (another team's 5xx paged us) or drops the job label.
test('every alert reads the scrape job it was built for, and keeps the job as a label', () => {
  for (const job of ['idempotent-post', 'payments-eu']) {
    const rules = Bun.YAML.parse(Bun.YAML.stringify(prometheusRules({ ...DEFAULT_SETTINGS, job }))) as any
    for (const rule of rules.groups[0].rules) {
      const selectors = [...String(rule.expr).matchAll(/\b([a-z_]+)\{([^}]*)\}/g)]
      expect({ alert: rule.alert, unscoped: selectors.filter(([, , labels]) => !labels!.includes(`job="${job}"`)).map(([all]) => all) }).toEqual({ alert: rule.alert, unscoped: [] })
      if (rule.alert !== 'IdempotencyTargetDown') expect({ alert: rule.alert, keeps: /by \([^)]*\bjob\b/.test(rule.expr) }).toEqual({ alert: rule.alert, keeps: true })
      expect(rule.annotations.description).toContain('{{ $labels.job }}')
    }
  }
})
