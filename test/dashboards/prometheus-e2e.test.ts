import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { prometheusRules } from '../../dashboards/alerts'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startServer, type ServerProcess } from '../support/server'
import { generatedExpressions } from './promql'

/**
 * End to end: a real Prometheus scrapes a real server, a worker dies with a
 * key in processing, and the stale-keys alert of dashboards/prometheus-rules.yml
 * (with `for` shortened to 2 s, evaluated every second) reaches `firing` in
 * Prometheus' HTTP API, with its links and labels filled in.
 */
const ALERT = 'IdempotencyStaleProcessingKeys'
const SHORT_FOR = '2s'

let db: TestDatabase
let scraped: ServerProcess
let victim: ServerProcess | undefined
let prometheus: Subprocess | undefined
let prometheusUrl: string
let dir: string
let prometheusLog = ''

function freePort(): number {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response(null) })
  const port = probe.port!
  probe.stop(true)
  return port
}

async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    const value = await probe().catch(() => undefined)
    if (value !== undefined) return value
    await Bun.sleep(250)
  }
  throw new Error(`timed out waiting for ${what}\n--- prometheus log ---\n${prometheusLog}`)
}

interface PromAlert { labels: Record<string, string>; annotations: Record<string, string>; state: 'pending' | 'firing' }

async function alerts(): Promise<PromAlert[]> {
  const body = await (await fetch(`${prometheusUrl}/api/v1/alerts`)).json() as { data: { alerts: PromAlert[] } }
  return body.data.alerts.filter((alert) => alert.labels.alertname === ALERT)
}

beforeAll(async () => {
  db = await createTestDatabase('prometheus_e2e')
  // TTL 1 s: a dead worker's key is stale a second later; gauges recomputed at most every 200 ms.
  const env = { IDEMPOTENCY_TTL_SECONDS: '1', METRICS_CACHE_MS: '200' }
  scraped = await startServer(db.url, env)

  dir = mkdtempSync(join(tmpdir(), 'idem-prometheus-'))
  const rules = prometheusRules()
  for (const group of rules.groups) {
    group.interval = '1s' // the rule file's own 30 s would override the 1 s below
    for (const rule of group.rules) rule.for = SHORT_FOR
  }
  await Bun.write(join(dir, 'rules.yml'), Bun.YAML.stringify(rules, null, 2))
  const target = new URL(scraped.url).host
  await Bun.write(join(dir, 'prometheus.yml'), Bun.YAML.stringify({
    global: { scrape_interval: '1s', evaluation_interval: '1s', scrape_timeout: '900ms' },
    rule_files: ['rules.yml'],
    scrape_configs: [{ job_name: 'idempotent-post', static_configs: [{ targets: [target] }] }],
  }, null, 2))
  const port = freePort()
  prometheusUrl = `http://127.0.0.1:${port}`
  prometheus = Bun.spawn(['prometheus', `--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], { stdout: 'pipe', stderr: 'pipe' })
  void (async () => {
    const reader = (prometheus.stderr as ReadableStream<Uint8Array>).getReader()
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) prometheusLog += new TextDecoder().decode(chunk.value)
  })()
  await until('Prometheus to be ready', 30_000, async () => (await fetch(`${prometheusUrl}/-/ready`)).ok || undefined)
}, 60_000)

afterAll(async () => {
  victim?.proc.kill('SIGKILL')
  prometheus?.kill('SIGTERM')
  await prometheus?.exited
  await scraped?.stop()
  await db?.drop()
  if (dir) rmSync(dir, { recursive: true, force: true })
}, 30_000)

test('a worker killed mid-request strands its key, and the stale-keys alert fires in Prometheus', async () => {
  // Prometheus scrapes the service and sees no stale key yet.
  await until('a first scrape with the stale-keys gauge at 0', 30_000, async () => {
    const body = await (await fetch(`${prometheusUrl}/api/v1/query?query=${encodeURIComponent('max(idempotency_stale_processing_keys)')}`)).json() as any
    return body.data.result[0]?.value[1] === '0' ? true : undefined
  })
  expect(await alerts()).toEqual([])

  // A second server takes a payment whose provider call never returns, and is SIGKILLed mid-request.
  victim = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: '1', PAYMENT_PROVIDER_DELAY_MS: '60000' })
  const key = `stranded-${crypto.randomUUID()}`
  void postPayment(victim.url, payment(), { key }).catch(() => undefined)
  await until('the key to be claimed', 10_000, async () =>
    (await db.sql`select 1 from idempotency_keys where key = ${key} and status = 'processing'`).length ? true : undefined)
  victim.proc.kill('SIGKILL')
  await victim.proc.exited

  const firing = await until(`${ALERT} to fire`, 60_000, async () => (await alerts()).find((alert) => alert.state === 'firing'))
  expect(firing.labels).toMatchObject({ alertname: ALERT, tenant: 'acme', severity: 'page' })
  expect(firing.annotations).toMatchObject({
    summary: 'Tenant acme: 1 idempotency key(s) stuck in processing',
    admin_url: 'http://127.0.0.1:3000/admin?tenant=acme&stale=1',
    runbook_url: 'http://127.0.0.1:3000/admin/runbooks/IdempotencyStaleProcessingKeys',
  })
  // The text names the TTL the server runs with (1 s here), read from idempotency_ttl_seconds when it fired.
  expect(firing.annotations.description).toContain('for longer than the TTL (1 s)')

  // A retry reclaims the key; the gauge drops to 0 and the alert resolves.
  const retry = await postPayment(scraped.url, payment(), { key })
  expect(retry.status).toBe(201)
  await until(`${ALERT} to resolve`, 60_000, async () => ((await alerts()).length === 0 ? true : undefined))
}, 150_000)

test('every dashboard and alert expression runs on this Prometheus', async () => {
  const failures: string[] = []
  for (const { where, expr } of generatedExpressions()) {
    if (expr.startsWith('label_values(')) continue // a Grafana function, not PromQL
    const query = expr.replaceAll('$__rate_interval', '1m').replaceAll('$job', '.*').replaceAll('$instance', '.*')
    const response = await fetch(`${prometheusUrl}/api/v1/query?query=${encodeURIComponent(query)}`)
    const body = await response.json() as { status: string; error?: string }
    if (body.status !== 'success') failures.push(`${where}: ${body.error}`)
  }
  expect(failures).toEqual([])
}, 30_000)
