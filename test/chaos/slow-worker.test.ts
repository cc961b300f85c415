/**
 * A worker slower than the TTL (provider delay 2.5 s, TTL 1 s). Its key looks
 * stale, but the worker is alive and holds the key row FOR UPDATE, so retries
 * that try to reclaim it get NOWAIT's refusal and answer 409 at once: no
 * second payment, and the slow worker's own answer is the one that counts.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer, type ServerProcess } from '../support/server'
import { payment, postPayment } from '../support/http'

const TTL_SECONDS = 1
const DELAY_MS = 2_500

let db: TestDatabase
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('chaos_slow')
  server = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: String(TTL_SECONDS), PAYMENT_PROVIDER_DELAY_MS: String(DELAY_MS) })
})
afterAll(async () => {
  if (server?.proc.exitCode === null) await server.stop('SIGKILL')
  await db?.drop()
})

test('retries of a key whose worker outlives the TTL get 409, never a second payment', async () => {
  const keys = Array.from({ length: 8 }, (_, i) => `slow-${i}-${crypto.randomUUID()}`)
  const body = (i: number) => payment({ customer: `cus_${i}` })
  const firsts = keys.map((key, i) => postPayment(server.url, body(i), { key }).then(async (r) => ({ status: r.status, body: await r.json() as { id: string } })))

  await Bun.sleep(TTL_SECONDS * 1000 + 300) // every key is now past its TTL, its worker still busy
  const { stale } = (await db.sql<{ stale: number }[]>`
    select count(*)::int as stale from idempotency_keys
     where status = 'processing' and locked_at < now() - make_interval(secs => ${TTL_SECONDS})`)[0]!
  expect(stale).toBe(keys.length)

  // 5 concurrent retriers per key, each retrying until the first answer is stored.
  const retries = await Promise.all(keys.flatMap((key, i) => Array.from({ length: 5 }, async () => {
    const seen: { status: number; replayed: boolean; id?: string; retryAfter: string | null; ms: number }[] = []
    for (;;) {
      const started = performance.now()
      const response = await postPayment(server.url, body(i), { key })
      const json = await response.json() as { id?: string; status?: number }
      seen.push({ status: response.status, replayed: response.headers.get('idempotent-replayed') === 'true', retryAfter: response.headers.get('retry-after'), ms: performance.now() - started, ...(response.status === 201 ? { id: json.id! } : {}) })
      if (response.status === 201) return { key, seen }
      await Bun.sleep(150)
    }
  })))

  const results = await Promise.all(firsts)
  const all = retries.flatMap((r) => r.seen)
  const conflicts = all.filter((a) => a.status === 409)
  console.log(`slow worker: ${conflicts.length} 409s to retries while the worker ran (slowest ${Math.max(...conflicts.map((c) => c.ms)).toFixed(0)} ms), ${all.filter((a) => a.replayed).length} replays after`)
  for (const first of results) expect(first.status).toBe(201) // the slow worker was not robbed
  expect(conflicts.length).toBeGreaterThan(0)
  for (const conflict of conflicts) expect(Number(conflict.retryAfter)).toBeGreaterThanOrEqual(1)
  // A retry's 2xx is only ever the replay of the slow worker's answer.
  expect(all.filter((a) => a.status !== 409 && a.status !== 201)).toEqual([])
  for (const a of all.filter((a) => a.status === 201)) expect(a.replayed).toBe(true)
  for (const [i, key] of keys.entries()) {
    const payments = await db.sql<{ id: string }[]>`select id::text from payments where idempotency_key = ${key}`
    expect(payments.map((p) => p.id)).toEqual([results[i]!.body.id])
    for (const r of retries.filter((r) => r.key === key)) expect(r.seen.at(-1)!.id).toBe(results[i]!.body.id)
  }
  // Nobody took a lease over: one attempt per key.
  const { reclaimed } = (await db.sql<{ reclaimed: number }[]>`select count(*)::int as reclaimed from idempotency_keys where attempts > 1`)[0]!
  expect(reclaimed).toBe(0)
}, 30_000)
