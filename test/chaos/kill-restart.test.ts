/**
 * SIGKILL the server mid-flight, several times, and start it again on the
 * same database. Clients keep retrying with their keys. Afterwards every key
 * has exactly one payment, and every 2xx for a key carried that payment's id.
 *
 * What makes it hold: a killed worker's connections close, so PostgreSQL rolls
 * back a completion in flight (no payment); its keys stay `processing` and
 * become reclaimable once the 1 s TTL has passed. The reclaim keeps the
 * request's downstream key, so a charge the killed worker made is returned by
 * the provider, not made again: one charge per key in the provider's ledger.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer, type ServerProcess } from '../support/server'
import { payment } from '../support/http'
import { waitUntil } from '../support/wait'
import { startProvider, type ProviderHandle } from '../support/server'
import { chargedOnce, exactlyOnce, payUntilAnswered, paymentsByKey, tally, type Attempt } from './clients'

const ENV = { IDEMPOTENCY_TTL_SECONDS: '1' }
const KEYS = 60
const KILLS = 4

let db: TestDatabase
let server: ServerProcess
/** Outlives every restart of the service, as a real provider does: its ledger counts the charges. */
let provider: ProviderHandle
beforeAll(async () => {
  db = await createTestDatabase('chaos_kill')
  provider = await startProvider({ delayMs: 150 })
})
afterAll(async () => {
  if (server?.proc.exitCode === null) await server.stop('SIGKILL')
  await provider?.stop()
  await db?.drop()
})

test(`${KILLS} SIGKILLs under load: exactly one payment and one charge per key`, async () => {
  server = await startServer(db.url, ENV, { provider })
  let url = server.url
  const results = new Map<string, Attempt[]>()
  const customers = new Map<string, string>()
  let strandedSeen = 0

  // Clients start in waves, so some are mid-flight at every kill.
  const clients = Array.from({ length: KEYS }, async (_, i) => {
    await Bun.sleep(i * 40)
    const key = `kill-${i}-${crypto.randomUUID()}`
    customers.set(key, `cus_kill_${i}`)
    results.set(key, await payUntilAnswered(key, payment({ customer: customers.get(key)!, amount: 100 + i }), { url: () => url }))
  })

  const chaos = (async () => {
    for (let kill = 0; kill < KILLS; kill++) {
      await Bun.sleep(400 + Math.random() * 300)
      // Only kill with work in flight, or the kill proves nothing (after 5 s without any, it goes on: the last clients may be done).
      await waitUntil(async () => (await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing'`)[0]!.n > 0, 5_000)
      server.proc.kill('SIGKILL')
      await server.proc.exited
      const { n } = (await db.sql`select count(*)::int as n from idempotency_key_states where status = 'processing'`)[0]!
      strandedSeen += n
      await Bun.sleep(100) // clients meet a closed port for a while
      server = await startServer(db.url, ENV, { provider })
      url = server.url
    }
  })()

  await Promise.all([...clients, chaos])
  const payments = await paymentsByKey(db.sql)
  const counts = tally(results.values())
  console.log(`kill/restart: ${KILLS} kills, ${strandedSeen} keys stranded in processing at the kills; answers seen: ${JSON.stringify(counts)}`)

  expect(results.size).toBe(KEYS)
  expect(exactlyOnce(results, payments)).toEqual([])
  expect(await chargedOnce(db.sql, provider, customers)).toEqual([])
  expect(strandedSeen).toBeGreaterThan(0) // the kills did hit work in flight
  expect(counts['network-error'] ?? 0).toBeGreaterThan(0)
  // No 5xx other than 503 (database) / 502 (provider), and no error outside problem+json.
  for (const attempts of results.values())
    for (const a of attempts)
      if (typeof a.status === 'number' && a.status >= 400) expect(a.contentType).toBe('application/problem+json')
  // Stranded keys were taken over by a retry after the TTL (attempts counts leases).
  const { reclaimed } = (await db.sql`select count(*)::int as reclaimed from idempotency_key_states where attempts > 1`)[0]!
  expect(reclaimed).toBeGreaterThan(0)
  const { processing } = (await db.sql`select count(*)::int as processing from idempotency_key_states where status = 'processing'`)[0]!
  expect(processing).toBe(0)
  // The stored answer of each key names the payment that exists.
  const stored = await db.sql<{ key: string; id: string }[]>`
    select key, (response_body::jsonb ->> 'id') as id from idempotency_key_states where tenant = 'acme'`
  for (const row of stored) expect(payments.get(row.key)).toEqual([row.id])
  expect(await server.stop()).toBe(0)
}, 90_000)
