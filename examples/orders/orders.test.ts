/**
 * The example as its user would run it: a database with nothing in it, the
 * app applies the engine's schema and its own table, and a retried order
 * reserves stock once.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { join } from 'node:path'
import postgres from 'postgres'
import { freePort } from '../../test/chaos/clients'
import { backdateKey } from '../../test/support/keys'
import { waitFor } from '../../test/support/wait'
import { createOrdersApp } from './app'
import { startWarehouse, type Warehouse } from './warehouse'

const base = process.env.DATABASE_URL! // test/support/setup.ts starts an embedded PostgreSQL when unset
const name = `orders_example_${crypto.randomUUID().slice(0, 8)}`
let warehouse: Warehouse
let orders: Awaited<ReturnType<typeof createOrdersApp>>
let sql: postgres.Sql

beforeAll(async () => {
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  await admin.end()
  const url = new URL(base)
  url.pathname = `/${name}`
  warehouse = startWarehouse({ 'sku-1': 10 })
  orders = await createOrdersApp({ databaseUrl: url.toString(), warehouseUrl: warehouse.url, apiKeys: new Map([['shop-key', 'shop']]) })
  sql = postgres(url.toString(), { max: 1, onnotice: () => undefined })
})
afterAll(async () => {
  await sql?.end()
  await orders?.close()
  warehouse?.stop()
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`drop database if exists "${name}" with (force)`)
  await admin.end()
})

const order = (key: string, body: unknown) => orders.app.handle(new Request('http://orders.test/orders', {
  method: 'POST',
  headers: { authorization: 'Bearer shop-key', 'content-type': 'application/json', 'idempotency-key': key },
  body: JSON.stringify(body),
}))

test('an order retried 20 times at once reserves once and is stored once', async () => {
  const answers = await Promise.all(Array.from({ length: 20 }, () => order('order-1', { sku: 'sku-1', quantity: 3 })))
  const created = answers.filter((answer) => answer.status === 201)
  expect(created.length).toBeGreaterThan(0)
  expect(answers.every((answer) => answer.status === 201 || answer.status === 409)).toBe(true)
  const ids = new Set(await Promise.all(created.map(async (answer) => (await answer.json() as { id: string }).id)))
  expect(ids.size).toBe(1)
  expect(warehouse.stock.get('sku-1')).toBe(7)
  expect(await sql`select id from orders`).toHaveLength(1)

  const replay = await order('order-1', { sku: 'sku-1', quantity: 3 })
  expect(replay.status).toBe(201)
  expect(replay.headers.get('idempotent-replayed')).toBe('true')
  expect((await replay.json() as { id: string }).id).toBe([...ids][0]!)
})

test('out of stock is a refusal that is stored and replayed; another order under the key is 422', async () => {
  const first = await order('order-2', { sku: 'sku-1', quantity: 50 })
  expect(first.status).toBe(422)
  expect(await first.json()).toMatchObject({ type: 'urn:orders:problem:out-of-stock', title: 'Out of stock', status: 422, code: 'out-of-stock', detail: 'Not 50 of sku-1 in stock.' })
  warehouse.stock.set('sku-1', 100)
  const again = await order('order-2', { sku: 'sku-1', quantity: 50 })
  expect(again.status).toBe(422)
  expect(again.headers.get('idempotent-replayed')).toBe('true')
  const reused = await order('order-2', { sku: 'sku-1', quantity: 1 })
  expect(reused.status).toBe(422)
  expect((await reused.json() as { code: string }).code).toBe('idempotency-key-reused')
})

test('a body outside the schema is a 400 and stores nothing', async () => {
  const answer = await order('order-3', { sku: 'sku-1', quantity: 0 })
  expect(answer.status).toBe(400)
  expect((await answer.json() as { code: string }).code).toBe('invalid-body')
  expect(await sql`select 1 from idempotency_keys where key = 'order-3'`).toHaveLength(0)
})

test('a key past its retention is deleted by the app\'s purge; the order stays', async () => {
  await backdateKey(sql, 'order-1', 2 * 86_400)
  expect(await orders.purge.runOnce()).toBe(1)
  expect(await sql`select 1 from idempotency_keys where key = 'order-1'`).toHaveLength(0)
  expect(await sql`select 1 from idempotency_keys where key = 'order-2'`).toHaveLength(1)
  expect(await sql`select id from orders`).toHaveLength(1)
})

test('README\'s command runs as written: npm run example:orders, then one order over HTTP', async () => {
  const url = new URL(base)
  url.pathname = `/${name}`
  const port = String(freePort())
  const proc = Bun.spawn(['npm', 'run', '--silent', 'example:orders'], {
    cwd: join(import.meta.dir, '..', '..'),
    env: { ...process.env, DATABASE_URL: url.toString(), PORT: port },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  let output = ''
  const decoder = new TextDecoder()
  void (async () => { for await (const chunk of proc.stdout as unknown as AsyncIterable<Uint8Array>) output += decoder.decode(chunk) })()
  void (async () => { for await (const chunk of proc.stderr as unknown as AsyncIterable<Uint8Array>) output += decoder.decode(chunk) })()
  try {
    await waitFor(() => output.includes('orders: http://') || proc.exitCode !== null, 'the example to listen')
    const answer = await fetch(`http://127.0.0.1:${port}/orders`, {
      method: 'POST',
      headers: { authorization: 'Bearer shop-key', 'content-type': 'application/json', 'idempotency-key': 'readme-order' },
      body: JSON.stringify({ sku: 'sku-1', quantity: 3 }),
    })
    expect(answer.status).toBe(201)
  } finally {
    proc.kill('SIGTERM')
    expect(await proc.exited, output).toBe(0)
  }
}, 30_000)
