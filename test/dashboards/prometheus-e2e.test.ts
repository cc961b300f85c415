import { afterAll, beforeAll, expect, test } from 'bun:test'
import { prometheusRules } from '../../dashboards/alerts'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startServer, type ServerProcess } from '../support/server'
import { waitUntil } from '../support/wait'
import { generatedExpressions } from './promql'
import { startPrometheus, type PromAlert, type RealPrometheus } from './prometheus'

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
let prometheus: RealPrometheus | undefined

/** Prometheus evaluates every 250 ms or so: polled at that pace, failing with its log. */
async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  let value: T | undefined
  if (await waitUntil(async () => (value = await probe().catch(() => undefined)) !== undefined, timeoutMs, 250)) return value as T
  throw new Error(`timed out waiting for ${what}\n--- prometheus log ---\n${prometheus?.log()}`)
}

const alerts = (): Promise<PromAlert[]> => prometheus!.alerts([ALERT])

beforeAll(async () => {
  db = await createTestDatabase('prometheus_e2e')
  // TTL 1 s: a dead worker's key is stale a second later; gauges recomputed at most every 200 ms.
  const env = { IDEMPOTENCY_TTL_SECONDS: '1', METRICS_CACHE_MS: '200' }
  scraped = await startServer(db.url, env)

  const rules = prometheusRules()
  for (const group of rules.groups) {
    group.interval = '1s' // the rule file's own 30 s would override the 1 s evaluation interval
    for (const rule of group.rules) rule.for = SHORT_FOR
  }
  prometheus = await startPrometheus({ rules, target: new URL(scraped.url).host, scrapeInterval: '1s', scrapeTimeout: '900ms' })
}, 60_000)

afterAll(async () => {
  victim?.proc.kill('SIGKILL')
  await prometheus?.stop()
  await scraped?.stop()
  await db?.drop()
}, 30_000)

test('a worker killed mid-request strands its key, and the stale-keys alert fires in Prometheus', async () => {
  // Prometheus scrapes the service and sees no stale key yet.
  await until('a first scrape with the stale-keys gauge at 0', 30_000, async () => {
    const body = await (await fetch(`${prometheus!.url}/api/v1/query?query=${encodeURIComponent('max(idempotency_stale_processing_keys)')}`)).json() as any
    return body.data.result[0]?.value[1] === '0' ? true : undefined
  })
  expect(await alerts()).toEqual([])

  // A second server takes a payment whose provider call never returns, and is SIGKILLed mid-request.
  victim = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: '1', PAYMENT_PROVIDER_DELAY_MS: '60000' })
  const key = `stranded-${crypto.randomUUID()}`
  void postPayment(victim.url, payment(), { key }).catch(() => undefined)
  await until('the key to be claimed', 10_000, async () =>
    (await db.sql`select 1 from idempotency_key_states where key = ${key} and status = 'processing'`).length ? true : undefined)
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
    const response = await fetch(`${prometheus!.url}/api/v1/query?query=${encodeURIComponent(query)}`)
    const body = await response.json() as { status: string; error?: string }
    if (body.status !== 'success') failures.push(`${where}: ${body.error}`)
  }
  expect(failures).toEqual([])
}, 30_000)
