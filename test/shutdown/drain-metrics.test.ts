/**
 * A drain that Prometheus sees to its end (SPEC: `/metrics` keeps answering
 * through a drain until the last in-flight request's counters are written).
 *
 * The service runs as users run it (`bun src/main.ts`), scraped every 250 ms
 * by this test as Prometheus would; payments are in flight (the provider
 * takes 1.5 s) when SIGTERM comes. Then: /readyz says `draining` at once, a
 * new payment is refused with 503 `shutting-down` (nothing stored), the
 * in-flight ones are answered 201, and the last scrape the service answered
 * counts every one of those answers; the exit is 0. Before, the listener,
 * /metrics with it, closed at the signal: the last scrape counted none of them.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { waitFor } from '../support/wait'
import { startDetached, type GroupProcess } from './spawn'

let db: TestDatabase
let ledgerDir: string
let service: GroupProcess | undefined
beforeAll(async () => {
  db = await createTestDatabase('drain_metrics')
  ledgerDir = mkdtempSync(join(tmpdir(), 'idem-drain-metrics-'))
})
afterAll(async () => {
  if (service?.proc.exitCode === null) try { process.kill(-service.proc.pid, 'SIGKILL') } catch { /* gone */ }
  await db?.drop()
  if (ledgerDir) rmSync(ledgerDir, { recursive: true, force: true })
})

/** The sum of http_requests_total's samples for `route` and `status`, in one exposition. */
function answered(exposition: string, route: string, status: string): number {
  let sum = 0
  for (const line of exposition.split('\n')) {
    if (!line.startsWith('http_requests_total{')) continue
    if (line.includes(`route="${route}"`) && line.includes(`status="${status}"`)) sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return sum
}

test('SIGTERM mid-flight: readiness says draining at once, and the last scrape counts every answer of the drain', async () => {
  service = await startDetached([process.execPath, 'src/main.ts'], {
    DATABASE_URL: db.url, PAYMENT_PROVIDER_DELAY_MS: '1500', PAYMENT_PROVIDER_LEDGER: join(ledgerDir, 'ledger.sqlite'),
  })
  const url = service.url
  let last = ''
  let scrapes = 0
  let scraping = true
  const scraper = (async () => {
    while (scraping) {
      try {
        const response = await fetch(`${url}/metrics`)
        if (response.ok) { last = await response.text(); scrapes++ }
      } catch { /* the listener is gone */ }
      await Bun.sleep(250)
    }
  })()
  try {
    await waitFor(() => scrapes >= 2, 'two scrapes (a regular scraper)')
    const keys = Array.from({ length: 6 }, () => crypto.randomUUID())
    const answers = keys.map(async (key) => (await postPayment(url, payment(), { key })).status)
    await waitFor(async () => (await db.sql`select 1 from idempotency_key_states where key in ${db.sql(keys)} and status = 'processing'`).length === keys.length, 'all six in processing')

    process.kill(service.proc.pid, 'SIGTERM')
    await waitFor(() => service!.output().includes('draining 6 in-flight'), 'the drain to begin', 2_000)
    const ready = await fetch(`${url}/readyz`)
    expect({ status: ready.status, code: ((await ready.json()) as { code: string }).code }).toEqual({ status: 503, code: 'draining' })
    const late = crypto.randomUUID()
    const refused = await postPayment(url, payment(), { key: late })
    expect({ status: refused.status, code: ((await refused.json()) as { code: string }).code }).toEqual({ status: 503, code: 'shutting-down' })

    expect(await Promise.all(answers)).toEqual(keys.map(() => 201))
    expect(await service.exited(30_000)).toBe(0)
    expect(service.output()).toContain('metrics read after the last answer')
    expect(answered(last, '/api/payments', '201')).toBe(keys.length)
    expect(answered(last, '/api/payments', '503')).toBe(1)
    expect(answered(last, '/readyz', '503')).toBe(1)
    const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where key = ${late}`
    expect(row!.n).toBe(0)
  } finally {
    scraping = false
    await scraper
  }
}, 60_000)
