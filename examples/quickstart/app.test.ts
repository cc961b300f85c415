/**
 * The README's plugin example is this file, and it runs as written: the
 * README's block must be app.ts byte for byte, and app.ts, started on a
 * fresh database, answers an order, replays it to a retry (one row), and
 * refuses another order under the same key.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { createTestDatabase, type TestDatabase } from '../../test/support/db'
import { waitFor } from '../../test/support/wait'

const ROOT = join(import.meta.dir, '..', '..')
const APP = readFileSync(join(import.meta.dir, 'app.ts'), 'utf8')

let db: TestDatabase
let app: ReturnType<typeof Bun.spawn> | undefined
let output = ''
beforeAll(async () => {
  db = await createTestDatabase('quickstart')
})
afterAll(async () => {
  app?.kill('SIGTERM')
  await app?.exited
  await db?.drop()
})

test('the README shows app.ts as it is', () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  const block = /<!-- app\.ts: compiled by test\/package\/package\.test\.ts -->\n```ts\n([^]*?)\n```/.exec(readme)?.[1]
  expect(block, 'README.md has no app.ts block').toBeDefined()
  expect(`${block!}\n`).toBe(APP)
  expect(APP.trimEnd().split('\n').length).toBeLessThanOrEqual(30)
})

test('app.ts runs as written: an order, its replay, one row, another order under the key refused', async () => {
  app = Bun.spawn([process.execPath, join(import.meta.dir, 'app.ts')], {
    cwd: ROOT,
    env: { ...process.env, DATABASE_URL: db.url, PORT: '0' },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const decoder = new TextDecoder()
  for (const stream of [app.stdout, app.stderr] as unknown as AsyncIterable<Uint8Array>[])
    void (async () => { for await (const chunk of stream) output += decoder.decode(chunk) })()
  await waitFor(() => /listening on (\S+)/.test(output) || app!.exitCode !== null, 'the example to listen')
  const url = /listening on (\S+)/.exec(output)?.[1]
  expect(url, output).toStartWith('http://127.0.0.1:')

  const order = (key: string, body: unknown) => fetch(url!, {
    method: 'POST',
    headers: { authorization: 'Bearer dev-key', 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  })
  const first = await order('order-1', { item: 'tea', quantity: 2 })
  expect(first.status).toBe(201)
  const body = await first.text()
  expect(JSON.parse(body)).toMatchObject({ item: 'tea', quantity: 2, totalCents: 900 })
  const retry = await order('order-1', { item: 'tea', quantity: 2 })
  expect(retry.status).toBe(201)
  expect(retry.headers.get('idempotent-replayed')).toBe('true')
  expect(await retry.text()).toBe(body)
  expect([...await db.sql`select tenant, item, quantity, total_cents from cafe_orders`]).toEqual([{ tenant: 'cafe', item: 'tea', quantity: 2, total_cents: 900 }])
  expect((await order('order-1', { item: 'cake', quantity: 2 })).status).toBe(422)
  expect((await order('order-2', { item: 'coffee', quantity: 1 })).status).toBe(400)
}, 30_000)
