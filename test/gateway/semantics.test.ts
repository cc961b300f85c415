/**
 * What the gateway answers, key by key, in front of json-server: another
 * body under a key (422), a key in flight (409 + Retry-After), an upstream
 * 5xx (released: a retry forwards again) and 4xx (stored), credentials as
 * the key's scope (and never stored), the fields that cross, keyless
 * requests, and an answer too large to store.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { waitFor } from '../support/wait'
import { startJsonServer, type JsonServer } from './support/json-server'
import { startHttpProxy, type HttpProxy } from './support/http-proxy'
import { post, read, startGateway, type TestGateway } from './support/gateway'

let upstream: JsonServer
let proxy: HttpProxy
let gateway: TestGateway

const AUTH = { authorization: 'Bearer client-a-secret-credential' }

beforeAll(async () => {
  upstream = await startJsonServer({ items: [], orders: [] })
  proxy = await startHttpProxy(upstream.url)
  gateway = await startGateway({
    upstream: proxy.url,
    routes: [
      { path: '/items/:id', methods: ['PATCH'], name: 'tiny', maxStoredBytes: 16 },
      { path: '*', name: 'default' },
    ],
  })
})

afterAll(async () => {
  await gateway?.stop()
  proxy?.stop()
  await upstream?.stop()
})

const forwardsOf = (key: string) => proxy.requests.filter((request) => request.headers['x-test-key'] === key)
const keyRow = async (key: string) => (await gateway.db.sql<{ status: string; tenant: string }[]>`select status, tenant from idempotency_key_states where key = ${key}`)[0]

test('the same key with another body is a 422, and nothing is forwarded', async () => {
  const first = await read(await post(gateway.url, '/items', { sku: 'a' }, { ...AUTH, 'idempotency-key': 'body-1' }))
  expect(first.status).toBe(201)
  const before = proxy.requests.length
  const other = await read(await post(gateway.url, '/items', { sku: 'b' }, { ...AUTH, 'idempotency-key': 'body-1' }))
  expect(other.status).toBe(422)
  expect(other.headers.get('content-type')).toBe('application/problem+json')
  expect(JSON.parse(other.text).code).toBe('idempotency-key-reused')
  // Key order and white space do not make another JSON request; another path or query does.
  const reordered = await read(await post(gateway.url, '/items', '{ "sku" : "a" }', { ...AUTH, 'idempotency-key': 'body-1' }))
  expect(reordered.status).toBe(201)
  expect(reordered.text).toBe(first.text)
  expect((await post(gateway.url, '/items?x=1', { sku: 'a' }, { ...AUTH, 'idempotency-key': 'body-1' })).status).toBe(422)
  expect(proxy.requests.length).toBe(before)
})

test('a key in flight is answered 409 with Retry-After at once; its answer is replayed once it is done', async () => {
  proxy.mode = 'hold'
  const headers = { ...AUTH, 'idempotency-key': 'flight-1', 'x-test-key': 'flight-1' }
  const first = post(gateway.url, '/items', { sku: 'flight' }, headers)
  await waitFor(() => proxy.held === 1, 'the upstream\'s answer to be held')
  const started = performance.now()
  const retry = await read(await post(gateway.url, '/items', { sku: 'flight' }, headers))
  expect(retry.status).toBe(409)
  expect(performance.now() - started).toBeLessThan(1_000)
  expect(Number(retry.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
  expect(JSON.parse(retry.text).code).toBe('in-progress')
  expect(await keyRow('flight-1')).toMatchObject({ status: 'processing' })
  proxy.mode = 'pass'
  proxy.release()
  const answer = await read(await first)
  expect(answer.status).toBe(201)
  const replayed = await read(await post(gateway.url, '/items', { sku: 'flight' }, headers))
  expect(replayed.status).toBe(201)
  expect(replayed.headers.get('idempotent-replayed')).toBe('true')
  expect(replayed.text).toBe(answer.text)
  expect(forwardsOf('flight-1').length).toBe(1)
})

test('an upstream 5xx is answered and releases the key: a retry is forwarded again, under the same upstream key', async () => {
  // json-server answers 500 to a record whose id exists.
  const existing = await read(await post(upstream.url, '/orders', { note: 'existing' }))
  const id = JSON.parse(existing.text).id
  const headers = { ...AUTH, 'idempotency-key': 'five-1', 'x-test-key': 'five-1' }
  const first = await read(await post(gateway.url, '/orders', { id, note: 'dup' }, headers))
  expect(first.status).toBe(500)
  expect(first.headers.get('idempotent-replayed')).toBeNull()
  expect(await keyRow('five-1')).toMatchObject({ status: 'released' })
  const again = await read(await post(gateway.url, '/orders', { id, note: 'dup' }, headers))
  expect(again.status).toBe(500)
  const forwards = forwardsOf('five-1')
  expect(forwards.length).toBe(2)
  expect(forwards[0]!.headers['idempotency-key']).toBe(forwards[1]!.headers['idempotency-key'])
  expect(forwards[0]!.headers['idempotency-key']).not.toBe('five-1')
  expect(forwards[0]!.headers['idempotency-key']).toMatch(/^idp_[\w-]{43}$/)
})

test('an upstream 4xx is stored and replayed; the upstream sees the request once', async () => {
  const headers = { ...AUTH, 'idempotency-key': 'four-1', 'x-test-key': 'four-1' }
  const first = await read(await post(gateway.url, '/no-such-collection', { sku: 'x' }, headers))
  expect(first.status).toBe(404)
  const again = await read(await post(gateway.url, '/no-such-collection', { sku: 'x' }, headers))
  expect(again.status).toBe(404)
  expect(again.headers.get('idempotent-replayed')).toBe('true')
  expect(again.text).toBe(first.text)
  expect(forwardsOf('four-1').length).toBe(1)
})

test('keys are scoped by credential: one key from two credentials makes two records; Authorization reaches the upstream unchanged and is stored nowhere', async () => {
  const other = { authorization: 'Bearer client-b-other-credential' }
  const a = await read(await post(gateway.url, '/items', { sku: 'scope' }, { ...AUTH, 'idempotency-key': 'scope-1', 'x-test-key': 'scope-1' }))
  const b = await read(await post(gateway.url, '/items', { sku: 'scope' }, { ...other, 'idempotency-key': 'scope-1', 'x-test-key': 'scope-1' }))
  expect(a.status).toBe(201)
  expect(b.status).toBe(201)
  expect(JSON.parse(a.text).id).not.toBe(JSON.parse(b.text).id)
  expect((await upstream.records()).filter((record) => record.sku === 'scope').length).toBe(2)
  // Each credential replays its own answer.
  const againA = await read(await post(gateway.url, '/items', { sku: 'scope' }, { ...AUTH, 'idempotency-key': 'scope-1' }))
  expect(againA.text).toBe(a.text)
  const seen = forwardsOf('scope-1').map((request) => request.headers.authorization)
  expect(seen).toEqual([AUTH.authorization, other.authorization])
  const rows = await gateway.db.sql<{ tenant: string; text: string }[]>`select tenant, row_to_json(k)::text as text from idempotency_key_states k where key = 'scope-1'`
  expect(rows.length).toBe(2)
  expect(new Set(rows.map((row) => row.tenant)).size).toBe(2)
  const everything = (await gateway.db.sql<{ text: string }[]>`select string_agg(row_to_json(k)::text, ' ') as text from idempotency_key_states k`)[0]!.text
  for (const secret of ['client-a-secret-credential', 'client-b-other-credential']) expect(everything).not.toContain(secret)
})

test('hop-by-hop fields are dropped, Forwarded added, other fields and the body forwarded as sent', async () => {
  const body = '{"sku":"fields",  "qty": 2}'
  const response = await fetch(`${gateway.url}/items?source=test`, {
    method: 'POST',
    headers: {
      ...AUTH, 'content-type': 'application/json', 'idempotency-key': 'fields-1', 'x-test-key': 'fields-1',
      connection: 'keep-alive, x-hop', 'x-hop': 'drop me', 'keep-alive': 'timeout=5', te: 'trailers', 'x-end-to-end': 'keep me',
    },
    body,
  })
  expect(response.status).toBe(201)
  const [seen] = forwardsOf('fields-1')
  expect(seen!.target).toBe('/items?source=test')
  expect(seen!.headers['x-hop']).toBeUndefined()
  expect(seen!.headers['keep-alive']).toBeUndefined()
  expect(seen!.headers.te).toBeUndefined()
  expect(seen!.headers['x-end-to-end']).toBe('keep me')
  expect(seen!.headers.forwarded).toMatch(/^for=127\.0\.0\.1;host="?127\.0\.0\.1:\d+"?;proto=http$/)
  const record = (await upstream.records()).find((each) => each.sku === 'fields')
  expect(record).toMatchObject({ qty: 2 })
})

test('requests without a key, and other methods, are forwarded untouched (json-server makes a record per keyless POST)', async () => {
  const before = (await upstream.records()).filter((record) => record.sku === 'keyless').length
  for (let i = 0; i < 2; i++) expect((await post(gateway.url, '/items', { sku: 'keyless' }, AUTH)).status).toBe(201)
  expect((await upstream.records()).filter((record) => record.sku === 'keyless').length).toBe(before + 2)
  const list = await fetch(`${gateway.url}/items?sku=keyless`)
  expect(list.status).toBe(200)
  expect(((await list.json()) as unknown[]).length).toBe(before + 2)
  const [row] = await gateway.db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where path like '/items?sku=%'`
  expect(row!.n).toBe(0)
})

test('GATEWAY_REQUIRE_KEY=1 refuses a keyless POST with 400 and forwards nothing', async () => {
  const strict = await startGateway({ upstream: proxy.url, env: { GATEWAY_REQUIRE_KEY: '1' } })
  try {
    const before = proxy.requests.length
    const answer = await read(await post(strict.url, '/items', { sku: 'strict' }, AUTH))
    expect(answer.status).toBe(400)
    expect(JSON.parse(answer.text).code).toBe('missing-idempotency-key')
    expect(proxy.requests.length).toBe(before)
  } finally {
    await strict.stop()
  }
})

test('an answer over the stored-answer limit is answered whole, not stored: the key is released and counted', async () => {
  const created = JSON.parse((await read(await post(upstream.url, '/items', { sku: 'large' }))).text)
  const headers = { ...AUTH, 'content-type': 'application/json', 'idempotency-key': 'large-1', 'x-test-key': 'large-1' }
  // PATCH /items/:id is the route whose stored-answer limit is 16 bytes; json-server answers the whole record.
  const answer = await read(await fetch(`${gateway.url}/items/${created.id}`, { method: 'PATCH', headers, body: JSON.stringify({ padding: 'x'.repeat(100) }) }))
  expect(answer.status).toBe(200)
  expect(JSON.parse(answer.text)).toMatchObject({ sku: 'large', padding: 'x'.repeat(100) })
  expect(await keyRow('large-1')).toMatchObject({ status: 'released' })
  const metrics = await gateway.metrics.registry.getSingleMetricAsString('idempotency_gateway_unstored_answers_total')
  expect(metrics).toContain('idempotency_gateway_unstored_answers_total{route="tiny",reason="too_large"} 1')
})
