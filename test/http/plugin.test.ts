/**
 * The plugin on a route of its own (not payments): any JSON POST route can
 * opt in, the handler writes through the transaction it is given, and a
 * deterministic business refusal is stored and replayed like a success.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { Elysia, t } from 'elysia'
import { idempotentPost, type Validation } from '../../src/http/idempotency'
import { createTestDatabase, type TestDatabase } from '../support/db'

interface Transfer { from: string; to: string; cents: number }

function validateTransfer(body: unknown): Validation<Transfer> {
  const b = body as Partial<Transfer>
  return typeof b === 'object' && b !== null && typeof b.from === 'string' && typeof b.to === 'string' && Number.isInteger(b.cents)
    ? { ok: true, value: b as Transfer }
    : { ok: false, errors: ['from, to and cents are required'] }
}

let db: TestDatabase
let server: ReturnType<typeof Bun.serve>
let url: string
let handlerRuns = 0

beforeAll(async () => {
  db = await createTestDatabase('plugin')
  await db.sql`create table transfers (id serial primary key, tenant text, source text, target text, cents int)`
  await db.sql`create table balances (account text primary key, cents int not null)`
  await db.sql`insert into balances values ('alice', 100), ('bob', 0)`
  const app = new Elysia().use(idempotentPost({
    pools: db.pools,
    tenant: (request) => request.headers.get('x-tenant') ?? undefined,
    ttlSeconds: 5,
  }, {
    path: '/transfers',
    validate: validateTransfer,
    // No foreign call here: a transfer between our own accounts is all database.
    act: async () => {
      handlerRuns++
    },
    async record({ body, tx, tenant }) {
      const [balance] = await tx<{ cents: number }[]>`select cents from balances where account = ${body.from} for update`
      if (!balance || balance.cents < body.cents)
        return { status: 402, body: { type: 'urn:example:insufficient-funds', title: 'Insufficient funds', status: 402 } }
      await tx`update balances set cents = cents - ${body.cents} where account = ${body.from}`
      await tx`update balances set cents = cents + ${body.cents} where account = ${body.to}`
      const [row] = await tx<{ id: number }[]>`insert into transfers (tenant, source, target, cents) values (${tenant}, ${body.from}, ${body.to}, ${body.cents}) returning id`
      return { status: 201, body: { id: row!.id, ...body } }
    },
  }))
  server = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: (request) => app.handle(request) })
  url = `http://127.0.0.1:${server.port}`
})
afterAll(async () => {
  server?.stop(true)
  await db?.drop()
})

const transfer = (key: string, body: Transfer, tenant = 't1') =>
  fetch(`${url}/transfers`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-tenant': tenant },
    body: JSON.stringify(body),
  })

test('writes through the handler\'s transaction happen once per key', async () => {
  const key = crypto.randomUUID()
  const answers = await Promise.all(Array.from({ length: 20 }, () => transfer(key, { from: 'alice', to: 'bob', cents: 30 })))
  // Late ones may find it done and get the replay; exactly one ran the handler.
  expect(answers.filter((a) => a.status === 201 && a.headers.get('idempotent-replayed') !== 'true')).toHaveLength(1)
  expect(answers.every((a) => a.status === 201 || a.status === 409)).toBe(true)
  const [alice] = await db.sql`select cents from balances where account = 'alice'`
  expect(alice!.cents).toBe(70)
})

test('a business refusal (4xx from the handler) is stored and replayed, not run again', async () => {
  const key = crypto.randomUUID()
  const runsBefore = handlerRuns
  const first = await transfer(key, { from: 'bob', to: 'alice', cents: 1_000_000 })
  expect(first.status).toBe(402)
  expect(first.headers.get('content-type')).toBe('application/problem+json')
  const firstBody = await first.text()
  const again = await transfer(key, { from: 'bob', to: 'alice', cents: 1_000_000 })
  expect(again.status).toBe(402)
  expect(again.headers.get('idempotent-replayed')).toBe('true')
  expect(await again.text()).toBe(firstBody)
  expect(handlerRuns).toBe(runsBefore + 1)
})

test('the tenant function scopes keys, and no tenant means 401', async () => {
  const key = crypto.randomUUID()
  expect((await transfer(key, { from: 'alice', to: 'bob', cents: 1 }, 't1')).status).toBe(201)
  const other = await transfer(key, { from: 'alice', to: 'bob', cents: 1 }, 't2')
  expect(other.status).toBe(201)
  expect(other.headers.get('idempotent-replayed')).toBeNull()
  const anonymous = await fetch(`${url}/transfers`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: '{}' })
  expect(anonymous.status).toBe(401)
})

test('the route\'s own validation refuses with 400 and stores nothing', async () => {
  const key = crypto.randomUUID()
  const response = await fetch(`${url}/transfers`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-tenant': 't1' },
    body: JSON.stringify({ from: 'alice' }),
  })
  expect(response.status).toBe(400)
  const [row] = await db.sql`select count(*)::int as n from idempotency_key_states where key = ${key}`
  expect(row!.n).toBe(0)
})

// Catches: a body schema with transforms checked but not decoded ("4" reached act as a string while TypeScript said number).
test('a body given as Elysia\'s t.Object with t.Integer reaches act decoded: "4" is the number 4', async () => {
  const seen: unknown[] = []
  const app = new Elysia().use(idempotentPost({ pools: db.pools, tenant: () => 't-schema' }, {
    path: '/seats',
    body: t.Object({ seats: t.Integer() }),
    act: async ({ body }) => { seen.push(body.seats) },
    recordRows: ({ body }) => ({ status: 201, body: { seats: body.seats }, insert: {} }),
  }))
  const post = (key: string, body: unknown) => app.handle(new Request('http://plugin.test/seats', {
    method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: JSON.stringify(body),
  }))
  const answer = await post(`seats-${crypto.randomUUID()}`, { seats: '4' })
  expect(answer.status).toBe(201)
  expect(await answer.json()).toEqual({ seats: 4 })
  expect(seen).toEqual([4])
  expect((await post(`seats-${crypto.randomUUID()}`, { seats: 'four' })).status).toBe(400)
})

// Catches: a plugin app's answers without X-Request-Id, and its problems without `instance` (the service's edge stamped them, the plugin alone did not).
test('mounted alone, the plugin answers with the request\'s id: X-Request-Id on every answer, `instance` in its problems', async () => {
  const key = `rid-${crypto.randomUUID()}`
  const first = await fetch(`${url}/transfers`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-tenant': 't1', 'x-request-id': 'client-abc' },
    body: JSON.stringify({ from: 'alice', to: 'bob', cents: 1 }),
  })
  expect(first.headers.get('x-request-id')).toBe('client-abc')
  const other = await fetch(`${url}/transfers`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-tenant': 't1' },
    body: JSON.stringify({ from: 'alice', to: 'bob', cents: 2 }),
  })
  const id = other.headers.get('x-request-id')
  expect({ status: other.status, id: typeof id === 'string' && id.length > 0 }).toEqual({ status: 422, id: true })
  expect(await other.json()).toMatchObject({ code: 'idempotency-key-reused', instance: `urn:idempotent-post:request:${id}` })
})
