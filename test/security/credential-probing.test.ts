/**
 * Probing is seen (issue 27, ASVS 2.2.1, 7.2.1): wrong API keys and metrics
 * tokens are counted (http_auth_failures_total{area}), throttled per client
 * address as the admin sign-in is (10 in a minute, then 429 with
 * Retry-After, the credential not looked at), and logged as a summary: one
 * line at the first failure and one when throttled, not one per guess. Over
 * real HTTP (the service's own listener: the client address is the socket's).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createLogger } from '../../src/log'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'

const METRICS_TOKEN = 'metrics-token-0123456789abcdef0123456789'
let db: TestDatabase
let app: InProcessService
let url: string
const lines: string[] = []
beforeAll(async () => {
  db = await createTestDatabase('credential_probing')
  app = await startApp(db, { env: { METRICS_TOKEN }, log: createLogger({ sink: (line) => lines.push(line) }) })
  url = app.listen()
})
afterAll(async () => {
  await app?.stop()
  await db?.drop()
})

const pay = (key: string | undefined) => fetch(`${url}/api/payments`, {
  method: 'POST',
  headers: { 'content-type': 'application/json', 'idempotency-key': crypto.randomUUID(), ...(key ? { authorization: `Bearer ${key}` } : {}) },
  body: JSON.stringify({ amount: 100, currency: 'EUR', customer: 'cus_probe' }),
})
const metrics = (token: string) => fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${token}` } })
/** Read from the registry: /metrics itself refuses a throttled address, the right token too. */
const failures = async (area: string) => {
  const text = await app.metrics.registry.getSingleMetricAsString('http_auth_failures_total')
  return Number(new RegExp(`^http_auth_failures_total\\{area="${area}"\\} (\\d+)$`, 'm').exec(text)?.[1] ?? Number.NaN)
}
const logged = (msg: string) => lines.map((line) => JSON.parse(line) as { msg: string; area?: string; address?: string }).filter((line) => line.msg === msg)

test('no key guesses nothing: 401, not counted, not throttled', async () => {
  for (let i = 0; i < 12; i++) expect((await pay(undefined)).status).toBe(401)
  expect(await failures('api')).toBe(0)
})

test('wrong API keys: 10 answered 401, then 429 with Retry-After for every key from that address, the right one too; counted and logged twice', async () => {
  const statuses: number[] = []
  for (let i = 0; i < 12; i++) statuses.push((await pay(`wrong-key-${i}`)).status)
  expect(statuses).toEqual([...Array(10).fill(401), 429, 429])
  const right = await pay('acme-key')
  expect(right.status).toBe(429)
  expect(Number(right.headers.get('retry-after'))).toBeGreaterThan(0)
  expect(((await right.json()) as { code: string }).code).toBe('credentials-throttled')
  // A 429 on /api says which limit it is, as the tenant limits' do (issue 27: the RateLimit fields on 429s).
  expect(right.headers.get('ratelimit-policy')).toBe('"credentials";q=10;w=60')
  expect(right.headers.get('ratelimit')).toBe(`"credentials";r=0;t=${right.headers.get('retry-after')}`)
  expect(await failures('api')).toBe(10)
  expect(logged('wrong API key')).toHaveLength(1)
  expect(logged('API key attempts throttled')).toHaveLength(1)
  expect(logged('wrong API key')[0]!.address).toBe('127.0.0.1')
})

test('wrong metrics tokens the same, in an area of their own', async () => {
  const statuses: number[] = []
  for (let i = 0; i < 11; i++) statuses.push((await metrics(`wrong-metrics-token-${i}`)).status)
  expect(statuses).toEqual([...Array(10).fill(401), 429])
  expect((await metrics(METRICS_TOKEN)).status).toBe(429) // the right token too, from this address, for now
  expect(await failures('metrics')).toBe(10)
  expect(logged('wrong metrics token')).toHaveLength(1)
})

test('an admin sign-in failure is logged under the request id the client sent (one id from the client to the log)', async () => {
  const requestId = `rid-signin-${crypto.randomUUID().slice(0, 8)}`
  const answer = await app.fetch('/admin/login', {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', origin: app.url, 'x-request-id': requestId },
    body: new URLSearchParams({ token: 'not-an-operator-token' }).toString(),
  })
  expect(answer.status).toBe(401)
  expect(answer.headers.get('x-request-id')).toBe(requestId)
  const line = lines.map((text) => JSON.parse(text) as { msg: string; request_id?: string }).find((entry) => entry.msg === 'admin sign-in failed: wrong token')
  expect(line?.request_id).toBe(requestId)
})
