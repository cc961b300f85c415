/**
 * SIGTERM mid-burst, to `npm run gateway`'s process (src/gateway/main.ts),
 * in front of json-server: what was forwarded finishes and is stored, what
 * comes after the signal is refused with 503 and forwarded nowhere, the
 * process exits 0, no key is left in processing, and no key made two records.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { join } from 'node:path'
import { captureOutput, waitForListening } from '../support/process'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { waitFor } from '../support/wait'
import { startJsonServer, type JsonServer } from './support/json-server'
import { startHttpProxy, type HttpProxy } from './support/http-proxy'
import { post, read } from './support/gateway'

const MAIN = join(import.meta.dir, '..', '..', 'src', 'gateway', 'main.ts')

let upstream: JsonServer
let proxy: HttpProxy
let db: TestDatabase

beforeAll(async () => {
  upstream = await startJsonServer()
  proxy = await startHttpProxy(upstream.url)
  db = await createTestDatabase('gateway_sigterm')
})

afterAll(async () => {
  proxy?.stop()
  await upstream?.stop()
  await db?.drop()
})

test('SIGTERM mid-burst: in-flight forwards finish and are stored, later claims get 503, exit 0, no key left processing, one record per key at most', async () => {
  const proc = Bun.spawn([process.execPath, MAIN], {
    env: { ...process.env, DATABASE_URL: db.url, UPSTREAM_URL: proxy.url, PORT: '0', TEST_ALLOW_PORT_0: '1', LOG_LEVEL: 'info' },
    stdout: 'pipe', stderr: 'pipe',
  })
  const output = captureOutput(proc)
  const port = await waitForListening(proc, output, 30_000)
  if (!port) throw new Error(`the gateway did not start:\n${output()}`)
  const url = `http://127.0.0.1:${port}`

  proxy.mode = 'hold'
  const keys = Array.from({ length: 20 }, (_, i) => `term-${i}`)
  const send = (key: string) => post(url, '/items', { sku: 'term', key }, { authorization: 'Bearer term', 'idempotency-key': key }).then(read, (error: unknown) => ({ status: 0, headers: new Headers(), text: String(error) }))
  const burst = keys.flatMap((key) => [send(key), send(key)])
  await waitFor(() => proxy.held === keys.length, () => `all ${keys.length} forwards to be in flight (${proxy.held} held)`)

  proc.kill('SIGTERM')
  await waitFor(() => /draining \d+ in-flight/.test(output()), 'the gateway to start draining')
  const late = await send('term-late')
  expect(late.status).toBe(503)
  expect(JSON.parse(late.text).code).toBe('shutting-down')

  proxy.mode = 'pass'
  proxy.release()
  const answers = await Promise.all(burst)
  expect(await proc.exited).toBe(0)

  const statuses = answers.map((answer) => answer.status)
  expect(statuses.filter((status) => status === 201).length).toBe(keys.length)
  expect(statuses.every((status) => status === 201 || status === 409)).toBe(true)
  const [processing] = await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing'`
  expect(processing!.n).toBe(0)
  const [done] = await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'done'`
  expect(done!.n).toBe(keys.length)
  const records = (await upstream.records()).filter((record) => record.sku === 'term')
  expect(records.length).toBe(keys.length)
  expect(new Set(records.map((record) => record.key)).size).toBe(keys.length)
  expect(records.some((record) => record.key === 'term-late')).toBe(false)
})
