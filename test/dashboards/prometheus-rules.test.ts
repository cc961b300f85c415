import { expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { dirname } from 'node:path'
import { OUTPUTS } from '../../dashboards/build'

const RULE_TESTS = `${dirname(OUTPUTS.prometheusRules)}/prometheus-rules.test.yml`

async function promtool(...args: string[]): Promise<{ code: number; output: string }> {
  const proc = Bun.spawn(['promtool', ...args], { cwd: dirname(OUTPUTS.prometheusRules), stdout: 'pipe', stderr: 'pipe' })
  const [code, out, err] = await Promise.all([proc.exited, new Response(proc.stdout).text(), new Response(proc.stderr).text()])
  return { code, output: out + err }
}

test('promtool accepts the rule file', async () => {
  const { code, output } = await promtool('check', 'rules', OUTPUTS.prometheusRules)
  expect(output).toContain('SUCCESS: 4 rules found')
  expect(code).toBe(0)
})

test('promtool test rules: thresholds, `for` durations and aggregation behave as designed', async () => {
  const { code, output } = await promtool('test', 'rules', RULE_TESTS)
  if (code !== 0) console.error(output)
  expect(output).toContain('SUCCESS')
  expect(code).toBe(0)
})

test('the Grafana rules and the Prometheus rules are the same alerts with the same expressions', () => {
  const grafana = Bun.YAML.parse(readFileSync(OUTPUTS.grafanaAlerts, 'utf8')) as any
  const prometheus = Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any
  const fromGrafana = grafana.groups[0].rules.map((rule: any) => {
    const threshold = rule.data.find((q: any) => q.model.type === 'threshold').model.conditions[0].evaluator
    return { alert: rule.title, expr: `${rule.data[0].model.expr} > ${threshold.params[0]}`, for: rule.for, severity: rule.labels.severity, op: threshold.type }
  })
  const fromPrometheus = prometheus.groups[0].rules.map((rule: any) => ({ alert: rule.alert, expr: rule.expr, for: rule.for, severity: rule.labels.severity, op: 'gt' }))
  expect(fromGrafana).toEqual(fromPrometheus)
  expect(fromPrometheus.map((rule: any) => rule.alert)).toEqual(['IdempotencyStaleProcessingKeys', 'IdempotencyConflictRatioHigh', 'IdempotencyDuplicateEntities', 'IdempotencyGaugesRefreshFailing'])
})
