/**
 * End to end: a database outage pages, once. A real Prometheus scrapes a
 * real server whose database connections go through a TCP proxy; the proxy
 * is frozen (a partition: the database hangs, as for this server only), while
 * a client keeps paying. The readiness alert of dashboards/prometheus-rules.yml,
 * with its production `for` (30 s), reaches `firing` within 2 minutes of the
 * outage and resolves when it ends; the 5xx-share alert, whose share the
 * outage's 503s fill, stays silent during it and in the minute after (it
 * used to page a second time, and to stay firing 67 s after the outage). Only the scrape and evaluation
 * intervals are shortened (2 s and 1 s instead of 15 s and 30 s): their terms of the
 * detection time are covered by the promtool cases and outageDetection().
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { OUTAGE_FOR_SECONDS, OUTAGE_PAGE_WITHIN_SECONDS } from '../../dashboards/alert-definitions'
import { prometheusRules } from '../../dashboards/alerts'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startServer, type ServerProcess } from '../support/server'
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy'
import { waitForValue } from '../support/wait'
import { startPrometheus, type PromAlert, type RealPrometheus } from './prometheus'

const OUTAGE_ALERTS = ['IdempotencyServerErrorsHigh', 'IdempotencyNotReady'] as const

let db: TestDatabase
let proxy: TcpProxy
let server: ServerProcess
let prometheus: RealPrometheus | undefined
let paying = true
let traffic: Promise<void> | undefined
const answers: number[] = []

const alerts = (): Promise<PromAlert[]> => prometheus!.alerts(OUTAGE_ALERTS)
const instant = (expr: string) => prometheus!.instant(expr)

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

  const rules = prometheusRules()
  for (const group of rules.groups) group.interval = '1s' // the evaluation interval only; every `for` stays as shipped
  // 2 s scrapes: while the database hangs, a scrape waits out the gauges' 1.25 s query deadline (metrics/gauges.ts)
  prometheus = await startPrometheus({ rules, target: new URL(server.url).host, scrapeInterval: '2s', scrapeTimeout: '1900ms' })
}, 60_000)

afterAll(async () => {
  paying = false
  await traffic
  proxy?.thaw()
  await prometheus?.stop()
  await server?.stop()
  proxy?.stop()
  await db?.drop()
}, 60_000)

test('the database goes away under traffic: the readiness alert fires within 2 minutes and resolves when it is back; the 5xx alert never does', async () => {
  traffic = pay()
  // Healthy first: Prometheus has seen the service ready and answering 201s, and nothing is pending.
  await waitForValue('a scrape with idempotency_ready 1 and some 201s', async () =>
    (await instant('max(idempotency_ready)')) === '1' && Number(await instant('sum(http_requests_total{route="/api/payments", status="201"})')) > 0 || undefined, 30_000, 250)
    .catch((error: unknown) => { throw new Error(`${error}\n--- prometheus log ---\n${prometheus?.log()}`) })
  expect(await alerts()).toEqual([])

  const outage = Date.now()
  proxy.freeze() // every connection to the database hangs, and so does every new one
  const seen = new Set<string>()
  const fired = await waitForValue('the readiness alert to fire', async () => {
    const now = await alerts()
    for (const alert of now) seen.add(alert.labels.alertname!)
    const firing = now.filter((alert) => alert.state === 'firing' && alert.labels.alertname === 'IdempotencyNotReady')
    return firing.length === 1 ? firing : undefined
  }, (OUTAGE_PAGE_WITHIN_SECONDS + 30) * 1000, 250).catch(async (error: unknown) => {
    throw new Error(`${error}\nalerts: ${JSON.stringify(await alerts())}\nup: ${await instant('up')}, ready: ${await instant('max(idempotency_ready)')}, answers: ${JSON.stringify(answers.slice(-20))}\n--- prometheus log ---\n${prometheus?.log()}`)
  })
  const seconds = (Date.now() - outage) / 1000
  console.log(`outage alerts firing ${seconds.toFixed(1)} s after the database went away (for: ${OUTAGE_FOR_SECONDS} s; 2 s scrapes, 1 s evaluations)`)
  expect(seconds).toBeLessThan(OUTAGE_PAGE_WITHIN_SECONDS)
  expect(seconds).toBeGreaterThanOrEqual(OUTAGE_FOR_SECONDS) // the shipped `for`, not a shortened one
  const byName = Object.fromEntries(fired.map((alert) => [alert.labels.alertname, alert]))
  expect(byName.IdempotencyNotReady!.labels).toMatchObject({ severity: 'page', instance: new URL(server.url).host })
  expect(byName.IdempotencyNotReady!.annotations.runbook_url).toBe('http://127.0.0.1:3000/admin/runbooks/IdempotencyNotReady')
  expect(byName.IdempotencyNotReady!.labels).toMatchObject({ job: 'idempotent-post' })
  // What the client saw meanwhile: 503s, answered (no request hung until the client gave up), enough to page the 5xx alert on their own.
  expect(answers).toContain(503)
  expect(Number(await instant('sum(increase(http_requests_total{route="/api/payments", status="503"}[1m]))'))).toBeGreaterThanOrEqual(3)
  expect(seen.has('IdempotencyServerErrorsHigh')).toBe(false)

  proxy.thaw()
  const thawedAt = answers.length
  await waitForValue('readiness to resolve once the database is back', async () =>
    (await alerts()).some((alert) => alert.labels.alertname === 'IdempotencyNotReady') ? undefined : true, 60_000, 250)
  await waitForValue('a payment to succeed again', () => answers.slice(thawedAt).includes(201), 30_000, 100)
  // The minute after: the 5xx window still holds the outage's 503s; no second page comes of them.
  const until = Date.now() + 20_000 // a pending 5xx alert would show within it (1 s evaluations)
  while (Date.now() < until) {
    for (const alert of await alerts()) seen.add(alert.labels.alertname!)
    await Bun.sleep(500)
  }
  expect([...seen]).toEqual(['IdempotencyNotReady'])
}, 300_000)
