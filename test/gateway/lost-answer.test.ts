/**
 * A lost upstream answer: the request reached json-server (it made the
 * record), and the connection was reset before its answer came back, by a
 * TCP proxy between the gateway and json-server. Whether the upstream acted
 * is unknown to the gateway. `hold` (the default) keeps the key: retries get
 * 409 until the TTL, and no second record is made. `release` gives it back:
 * the retry is forwarded again, and json-server, which does not dedupe on
 * the forwarded key, makes a second record: why hold is the default.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { waitFor } from '../support/wait'
import { startJsonServer, type JsonServer } from './support/json-server'
import { startHttpProxy, type HttpProxy } from './support/http-proxy'
import { post, read, startGateway, type TestGateway } from './support/gateway'
import { listKeys } from '../../src/operations/list'
import { forceExpireKey } from '../../src/operations/actions'

let upstream: JsonServer
let proxy: HttpProxy
let gateway: TestGateway

const AUTH = { authorization: 'Bearer lost-answer-client' }

beforeAll(async () => {
  upstream = await startJsonServer({ held: [], released: [], expiring: [], slow: [] })
  proxy = await startHttpProxy(upstream.url)
  gateway = await startGateway({
    upstream: proxy.url,
    routes: [
      { path: '/released', name: 'release-route', unknown: 'release' },
      { path: '/expiring', name: 'short-hold', ttlSeconds: 2 },
      { path: '/slow', name: 'slow', timeoutMs: 300 },
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
const statusOf = async (key: string) => (await gateway.db.sql<{ status: string }[]>`select status from idempotency_key_states where key = ${key}`)[0]?.status

/** Sends one request whose answer the proxy cuts after the upstream began answering. */
async function cutOnce(path: string, key: string): Promise<{ status: number; headers: Headers; text: string }> {
  proxy.mode = 'cut'
  try {
    return await read(await post(gateway.url, path, { sku: key }, { ...AUTH, 'idempotency-key': key, 'x-test-key': key }))
  } finally {
    proxy.mode = 'pass'
  }
}

test('hold (default): the answer is lost after json-server made the record; the key stays processing, a retry gets 409, no second record', async () => {
  const lost = await cutOnce('/held', 'hold-1')
  expect(proxy.cuts).toBeGreaterThanOrEqual(1)
  expect(lost.status).toBe(502)
  const problem = JSON.parse(lost.text)
  expect(problem.code).toBe('upstream-outcome-unknown')
  expect(problem.detail).toContain('held')
  expect(Number(lost.headers.get('retry-after'))).toBeGreaterThan(1)
  expect((await upstream.records('held')).length).toBe(1)
  expect(await statusOf('hold-1')).toBe('processing')

  const retry = await read(await post(gateway.url, '/held', { sku: 'hold-1' }, { ...AUTH, 'idempotency-key': 'hold-1', 'x-test-key': 'hold-1' }))
  expect(retry.status).toBe(409)
  expect(Number(retry.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
  expect(forwardsOf('hold-1').length).toBe(1)
  expect((await upstream.records('held')).length).toBe(1)
  // Counted: one key held on route default.
  expect(await gateway.metrics.registry.getSingleMetricAsString('idempotency_gateway_held_keys_total')).toContain('idempotency_gateway_held_keys_total{route="default"} 1')
  // Operators see it where they see every stuck key: in processing, with the gateway route in its summary.
  const operations = { sql: gateway.db.sql, ttlSeconds: 30, retentionSeconds: 86_400 }
  const { keys } = await listKeys(operations, { key: 'hold-1', staleOnly: false })
  expect(keys).toHaveLength(1)
  expect(keys[0]).toMatchObject({ key: 'hold-1', method: 'POST', path: '/held' })
  const [row] = await gateway.db.sql<{ summary: Record<string, string>; lease: string; tenant: string }[]>`select summary, lease::text, tenant from idempotency_key_states where key = 'hold-1'`
  expect(row!.summary).toMatchObject({ gateway_route: 'default', held: 'the upstream\'s answer was lost' })
  // Before its TTL no retry takes a held key (the 409 above); an operator may: it waits for a decision, and no worker runs it.
  const target = { tenant: row!.tenant, key: 'hold-1', lease: row!.lease }
  expect((await forceExpireKey(operations, target, 'test-operator')).outcome).toBe('expired')
  // The 409s said "later": for 250 ms this process may still say so from memory (http/busy-keys.ts).
  let after: { status: number } | undefined
  await waitFor(async () => {
    after = await read(await post(gateway.url, '/held', { sku: 'hold-1' }, { ...AUTH, 'idempotency-key': 'hold-1', 'x-test-key': 'hold-1' }))
    return after.status !== 409
  }, 'a retry after the operator released the key', 5_000, 100)
  expect(after!.status).toBe(201)
  const forwards = forwardsOf('hold-1')
  expect(forwards).toHaveLength(2)
  expect(forwards[1]!.headers['idempotency-key']).toBe(forwards[0]!.headers['idempotency-key'])
})

test('hold ends with the TTL: then a retry takes the key over and forwards again, under the same upstream key', async () => {
  const lost = await cutOnce('/expiring', 'expire-1')
  expect(lost.status).toBe(502)
  expect((await upstream.records('expiring')).length).toBe(1)
  let answer: { status: number; text: string } | undefined
  await waitFor(async () => {
    answer = await read(await post(gateway.url, '/expiring', { sku: 'expire-1' }, { ...AUTH, 'idempotency-key': 'expire-1', 'x-test-key': 'expire-1' }))
    return answer.status !== 409
  }, 'a retry past the 2 s TTL to be taken over', 10_000, 200)
  expect(answer!.status).toBe(201)
  const forwards = forwardsOf('expire-1')
  expect(forwards.length).toBe(2)
  expect(forwards[1]!.headers['idempotency-key']).toBe(forwards[0]!.headers['idempotency-key'])
  // json-server does not dedupe on the forwarded key: the take-over made a second record.
  expect((await upstream.records('expiring')).length).toBe(2)
})

test('release: the key is given back at once; the retry is forwarded again, and json-server makes a second record', async () => {
  const lost = await cutOnce('/released', 'release-1')
  expect(lost.status).toBe(502)
  expect(JSON.parse(lost.text).detail).toContain('released')
  expect(await statusOf('release-1')).toBe('released')
  expect((await upstream.records('released')).length).toBe(1)

  const retry = await read(await post(gateway.url, '/released', { sku: 'release-1' }, { ...AUTH, 'idempotency-key': 'release-1', 'x-test-key': 'release-1' }))
  expect(retry.status).toBe(201)
  const forwards = forwardsOf('release-1')
  expect(forwards.length).toBe(2)
  // The same upstream key both times: an upstream that dedupes on it would answer the first record.
  expect(forwards[1]!.headers['idempotency-key']).toBe(forwards[0]!.headers['idempotency-key'])
  expect((await upstream.records('released')).length).toBe(2)
})

test('the deadline is an unknown outcome too: 504, and the key is held', async () => {
  proxy.mode = 'hold'
  try {
    const answer = await read(await post(gateway.url, '/slow', { sku: 'slow-1' }, { ...AUTH, 'idempotency-key': 'slow-1', 'x-test-key': 'slow-1' }))
    expect(answer.status).toBe(504)
    expect(JSON.parse(answer.text).code).toBe('upstream-timeout')
    expect(await statusOf('slow-1')).toBe('processing')
    expect((await read(await post(gateway.url, '/slow', { sku: 'slow-1' }, { ...AUTH, 'idempotency-key': 'slow-1' }))).status).toBe(409)
  } finally {
    proxy.mode = 'pass'
    proxy.release()
  }
})
