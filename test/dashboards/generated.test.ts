import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { relative } from 'node:path'
import { OUTPUTS, renderAll } from '../../dashboards/build'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startServer, type ServerProcess } from '../support/server'
import { exportedNames, generatedExpressions, metricNames } from './promql'

test('the committed dashboard, Grafana alerts, Prometheus rules and Alertmanager routing are what `npm run dashboards` generates', () => {
  for (const [path, text] of Object.entries(renderAll())) {
    const committed = readFileSync(path, 'utf8')
    if (committed !== text) throw new Error(`${relative(process.cwd(), path)} is stale: run \`npm run dashboards\` and commit the result`)
    expect(committed).toBe(text)
  }
})

test('the metric-name extraction sees through functions, labels, ranges and grouping', () => {
  expect(metricNames('histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{job=~"$job", route="/x"}[$__rate_interval])))'))
    .toEqual(['http_request_duration_seconds_bucket'])
  expect(metricNames('sum(rate(a_total{status="409"}[5m])) / sum(rate(b_total[5m])) > 0.1')).toEqual(['a_total', 'b_total'])
  expect(metricNames('label_values(idempotency_gauges_refresh_failed{job=~"$job"}, instance)')).toEqual(['idempotency_gauges_refresh_failed'])
  expect(metricNames('max by (tenant) (x_keys) > 1e3')).toEqual(['x_keys'])
  expect(metricNames('((1 - up{job="idempotent-post"}) or absent(up{job="idempotent-post"})) > 0')).toEqual(['up', 'up'])
})

test('every dashboard expression uses only variables the dashboard defines', () => {
  const dashboard = JSON.parse(readFileSync(OUTPUTS.dashboard, 'utf8'))
  const defined = new Set(['__rate_interval', '__interval', '__range', ...dashboard.templating.list.map((v: { name: string }) => v.name)])
  for (const { where, expr } of generatedExpressions())
    for (const [, name] of expr.matchAll(/\$\{?(\w+)/g)) expect({ where, variable: name, defined: defined.has(name!) }).toEqual({ where, variable: name, defined: true })
})

describe('against a live server', () => {
  let db: TestDatabase
  let server: ServerProcess
  beforeAll(async () => {
    db = await createTestDatabase('dashboards')
    server = await startServer(db.url, { METRICS_CACHE_MS: '0' })
  }, 60_000)
  afterAll(async () => {
    await server?.stop()
    await db?.drop()
  })

  test('every metric named in the dashboard, the Grafana rules and the Prometheus rules is one the service exports', async () => {
    const key = crypto.randomUUID()
    await postPayment(server.url, payment(), { key })
    await postPayment(server.url, payment(), { key })
    await postPayment(server.url, payment(), { apiKey: null })
    const exported = exportedNames(await (await fetch(`${server.url}/metrics`)).text())
    const expressions = generatedExpressions()
    expect(expressions.length).toBeGreaterThan(20)
    // `up` is Prometheus' own, one per scrape target (the target-down alert and its panel).
    const fromPrometheus = new Set(['up'])
    const missing = expressions.flatMap(({ where, expr }) => metricNames(expr).filter((name) => !exported.has(name) && !fromPrometheus.has(name)).map((name) => `${where}: ${name}`))
    expect(missing).toEqual([])
  }, 30_000)
})
