/**
 * In-request recovery (core/recovery.ts) under a database that keeps killing
 * the service's connections: for 12 s, every 150–400 ms, the service's
 * backends in this test's database are terminated (pg_terminate_backend):
 * every one running a statement, and half of the others (the health
 * probe's among them), while 48
 * clients pay through a 300 ms provider, each key sent three times at once and
 * then retried like a careful client until it has its 2xx.
 *
 * The run of such a loop had 1,735 of 3,273 answers 503; on this
 * one (and this machine) the release before recovery answered 33 of 4,332
 * sends 503 (0.76 %; 34 when only the running ones were aimed at). Now: at most 1 % of the answers and 1 in 1,000 sends
 * are 5xx (0 in the runs seen); every key has one payment and one charge at
 * the provider's ledger; the process never exits; and the retries are
 * counted by statement and cause.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, type PaymentBody } from '../support/http'
import { spawnProvider, type ProviderProcess } from '../support/provider-process'
import { startService, type ServiceProcess } from '../support/service-process'
import { serviceBackends, terminate } from '../support/statement-holds'
import { chargedOnce, exactlyOnce, paymentsByKey, payUntilAnswered, type Attempt } from './clients'

const LOOP_MS = 12_000
const CLIENTS = 48
const SENDS_PER_KEY = 3

let db: TestDatabase
let provider: ProviderProcess
let service: ServiceProcess
beforeAll(async () => {
  db = await createTestDatabase('terminate_loop')
  provider = await spawnProvider({ delayMs: 300 })
  service = await startService(db.url, provider.url)
})
afterAll(async () => {
  await service?.stop('SIGKILL')
  await provider?.stop()
  await db?.drop()
})

test('a 12-second loop of pg_terminate_backend under load: ≤ 1 % 5xx, one payment and one charge per key, the process serving', async () => {
  const results = new Map<string, Attempt[]>()
  const bodies = new Map<string, PaymentBody>()
  let killing = true
  let terminated = 0
  let rounds = 0
  const killer = (async () => {
    while (killing) {
      await Bun.sleep(150 + Math.random() * 250)
      const backends = await serviceBackends(db.sql, { pid: service.pid })
      // Every one running a statement (the faults that reach a request), and half of the others.
      const busy = backends.filter((b) => b.state === 'active')
      const idle = backends.filter((b) => b.state !== 'active')
      const victims = [...busy, ...idle.slice(0, Math.ceil(idle.length / 2))]
      terminated += (await terminate(db.sql, victims)).length
      rounds++
    }
  })()
  const stopAt = performance.now() + LOOP_MS
  const client = async (n: number) => {
    for (let i = 0; performance.now() < stopAt; i++) {
      const key = `loop-${n}-${i}-${crypto.randomUUID().slice(0, 8)}`
      const body = payment({ customer: `cus_${key}` })
      bodies.set(key, body)
      const sends = await Promise.all(Array.from({ length: SENDS_PER_KEY }, () =>
        payUntilAnswered(key, body, { url: () => service.url, pauseMs: 200, deadlineMs: 40_000 })))
      results.set(key, sends.flat())
    }
  }
  try {
    await Promise.all(Array.from({ length: CLIENTS }, (_, n) => client(n)))
  } finally {
    killing = false
    await killer
  }

  const answers = [...results.values()].flat()
  const tally: Record<string, number> = {}
  for (const a of answers) tally[String(a.status)] = (tally[String(a.status)] ?? 0) + 1
  const serverErrors = answers.filter((a) => typeof a.status === 'number' && a.status >= 500).length
  const retries = (await (await fetch(`${service.url}/metrics`)).text()).split('\n')
    .filter((line) => line.startsWith('idempotency_statement_retries_total{') && !line.endsWith(' 0'))
  console.log(`[terminate-loop] ${results.size} keys, ${answers.length} answers ${JSON.stringify(tally)}; ${terminated} backends terminated in ${rounds} rounds; retries:\n  ${retries.join('\n  ')}`)

  for (const a of answers) if (typeof a.status === 'number' && a.status >= 500) console.log(`  ${a.status} after ${Math.round(a.ms)} ms: ${a.error}`)
  // What the service said about those requests (its line for each failure names the cause).
  const failedIds = new Set(answers.flatMap((a) => /urn:idempotent-post:request:([0-9a-f-]+)/.exec(a.error ?? '')?.[1] ?? []))
  if (failedIds.size > 0)
    for (const line of service.output().split('\n')) if ([...failedIds].some((id) => line.includes(id))) console.log(`  service: ${line.slice(0, 600)}`)
  expect(service.alive()).toBe(true)
  expect(terminated).toBeGreaterThan(rounds) // the loop did kill, and more than one backend a round
  expect(retries.length).toBeGreaterThan(0)
  // The target is 1 % of answers; recovery absorbs these faults whole, so hold it to 1 in 1,000 sends
  // (before: 33 × 503 in 4,332 sends on this loop).
  expect(serverErrors / answers.length).toBeLessThanOrEqual(0.01)
  expect(serverErrors).toBeLessThanOrEqual(Math.floor(results.size * SENDS_PER_KEY / 1_000))
  expect(answers.filter((a) => a.status === 'network-error')).toEqual([])
  expect(exactlyOnce(results, new Map([...(await paymentsByKey(db.sql))].filter(([key]) => bodies.has(key))))).toEqual([])
  expect(await chargedOnce(db.sql, provider, new Map([...bodies].map(([key, body]) => [key, body.customer])))).toEqual([])
  const [left] = await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing'`
  expect(left!.n).toBe(0)
}, 90_000)
