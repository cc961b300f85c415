/**
 * End to end: a database outage pages. A real Prometheus scrapes a real
 * server whose database connections go through a TCP proxy; the proxy is
 * frozen (a partition: the database hangs, as for this server only), while a
 * client keeps paying. The 5xx-share and readiness alerts of
 * dashboards/prometheus-rules.yml, with their production `for` (30 s), reach
 * `firing` within 2 minutes of the outage. Only the scrape and evaluation
 * intervals are shortened (2 s and 1 s instead of 15 s and 30 s): their terms of the
 * detection time are covered by the promtool cases and outageDetection().
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { OUTAGE_FOR_SECONDS, OUTAGE_PAGE_WITHIN_SECONDS } from '../../dashboards/alert-definitions'
import { prometheusRules } from '../../dashboards/alerts'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startServer, type ServerProcess } from '../support/server'
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy'
import { waitForValue } from '../support/wait'

const OUTAGE_ALERTS = ['IdempotencyServerErrorsHigh', 'IdempotencyNotReady'] as const

let db: TestDatabase
let proxy: TcpProxy
let server: ServerProcess
let prometheus: Subprocess | undefined
let prometheusUrl: string
let dir: string
let prometheusLog = ''
let paying = true
let traffic: Promise<void> | undefined
const answers: number[] = []

function freePort(): number {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response(null) })
  const port = probe.port!
  probe.stop(true)
  return port
}

interface PromAlert { labels: Record<string, string>; annotations: Record<string, string>; state: 'pending' | 'firing' }

async function alerts(): Promise<PromAlert[]> {
  const body = await (await fetch(`${prometheusUrl}/api/v1/alerts`)).json() as { data: { alerts: PromAlert[] } }
  return body.data.alerts.filter((alert) => (OUTAGE_ALERTS as readonly string[]).includes(alert.labels.alertname!))
}

async function instant(expr: string): Promise<string | undefined> {
  const body = await (await fetch(`${prometheusUrl}/api/v1/query?query=${encodeURIComponent(expr)}`)).json() as any
  return body.data?.result?.[0]?.value?.[1]
}

/** A client paying about 5 times a second, each request given up after 10 s; bounded by `paying` and 600 requests. */
async function pay(): Promise<void> {
  for (let i = 0; paying && i < 600; i++) {
    const started = Date.now()
    const response = await postPayment(server.url, payment({ customer: 'outage' }), { signal: AbortSignal.timeout(10_000) }).catch(() => undefined)
    answers.push(response?.status ?? 0)
    await response?.arrayBuffer().catch(() => undefined)
    await Bun.sleep(Math.max(0, 200 - (Date.now() - started))) // pacing the load, not synchronisation
  }
}

beforeAll(async () => {
  db = await createTestDatabase('prometheus_outage')
  proxy = await startTcpProxy(db.url)
  server = await startServer(proxy.url, { METRICS_CACHE_MS: '200' })

  dir = mkdtempSync(join(tmpdir(), 'idem-prometheus-outage-'))
  const rules = prometheusRules()
  for (const group of rules.groups) group.interval = '1s' // the evaluation interval only; every `for` stays as shipped
  await Bun.write(join(dir, 'rules.yml'), Bun.YAML.stringify(rules, null, 2))
  await Bun.write(join(dir, 'prometheus.yml'), Bun.YAML.stringify({
    // 2 s scrapes: while the database hangs, a scrape waits out the gauges' 1.25 s query deadline (metrics/gauges.ts)
    global: { scrape_interval: '2s', evaluation_interval: '1s', scrape_timeout: '1900ms' },
    rule_files: ['rules.yml'],
    scrape_configs: [{ job_name: 'idempotent-post', static_configs: [{ targets: [new URL(server.url).host] }] }],
  }, null, 2))
  const port = freePort()
  prometheusUrl = `http://127.0.0.1:${port}`
  prometheus = Bun.spawn(['prometheus', `--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], { stdout: 'pipe', stderr: 'pipe' })
  void (async () => {
    const reader = (prometheus.stderr as ReadableStream<Uint8Array>).getReader()
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) prometheusLog += new TextDecoder().decode(chunk.value)
  })()
  await waitForValue('Prometheus to be ready', async () => (await fetch(`${prometheusUrl}/-/ready`).catch(() => undefined))?.ok || undefined, 30_000, 250)
}, 60_000)

afterAll(async () => {
  paying = false
  await traffic
  proxy?.thaw()
  prometheus?.kill('SIGTERM')
  await prometheus?.exited
  await server?.stop()
  proxy?.stop()
  await db?.drop()
  if (dir) rmSync(dir, { recursive: true, force: true })
}, 60_000)

test('the database goes away under traffic: the 5xx-share and readiness alerts fire within 2 minutes, and readiness resolves when it is back', async () => {
  traffic = pay()
  // Healthy first: Prometheus has seen the service ready and answering 201s, and nothing is pending.
  await waitForValue('a scrape with idempotency_ready 1 and some 201s', async () =>
    (await instant('max(idempotency_ready)')) === '1' && Number(await instant('sum(http_requests_total{route="/api/payments", status="201"})')) > 0 || undefined, 30_000, 250)
    .catch((error: unknown) => { throw new Error(`${error}\n--- prometheus log ---\n${prometheusLog}`) })
  expect(await alerts()).toEqual([])

  const outage = Date.now()
  proxy.freeze() // every connection to the database hangs, and so does every new one
  const fired = await waitForValue('both outage alerts to fire', async () => {
    const firing = (await alerts()).filter((alert) => alert.state === 'firing')
    return firing.length === OUTAGE_ALERTS.length ? firing : undefined
  }, (OUTAGE_PAGE_WITHIN_SECONDS + 30) * 1000, 250).catch(async (error: unknown) => {
    throw new Error(`${error}\nalerts: ${JSON.stringify(await alerts())}\nup: ${await instant('up')}, ready: ${await instant('max(idempotency_ready)')}, answers: ${JSON.stringify(answers.slice(-20))}\n--- prometheus log ---\n${prometheusLog}`)
  })
  const seconds = (Date.now() - outage) / 1000
  console.log(`outage alerts firing ${seconds.toFixed(1)} s after the database went away (for: ${OUTAGE_FOR_SECONDS} s; 2 s scrapes, 1 s evaluations)`)
  expect(seconds).toBeLessThan(OUTAGE_PAGE_WITHIN_SECONDS)
  expect(seconds).toBeGreaterThanOrEqual(OUTAGE_FOR_SECONDS) // the shipped `for`, not a shortened one
  const byName = Object.fromEntries(fired.map((alert) => [alert.labels.alertname, alert]))
  expect(byName.IdempotencyNotReady!.labels).toMatchObject({ severity: 'page', instance: new URL(server.url).host })
  expect(byName.IdempotencyNotReady!.annotations.runbook_url).toBe('http://127.0.0.1:3000/admin/runbooks/IdempotencyNotReady')
  expect(byName.IdempotencyServerErrorsHigh!.labels).toMatchObject({ severity: 'page' })
  // What the client saw meanwhile: 503s, answered (no request hung until the client gave up).
  expect(answers).toContain(503)

  proxy.thaw()
  const thawedAt = answers.length
  await waitForValue('readiness to resolve once the database is back', async () =>
    (await alerts()).some((alert) => alert.labels.alertname === 'IdempotencyNotReady') ? undefined : true, 60_000, 250)
  await waitForValue('a payment to succeed again', () => answers.slice(thawedAt).includes(201), 30_000, 100)
}, 240_000)
