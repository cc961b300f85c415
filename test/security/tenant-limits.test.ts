/**
 * Per-tenant limits over real HTTP, on the service's own listener (serve):
 * a rate (429 + Retry-After + the IETF RateLimit fields) on a clock the test
 * moves, and a cap on requests in processing (held at a gated provider, so a
 * request stays in flight exactly as long as the test needs). Other tenants
 * are untouched, nothing is stored for a refused request, and every admitted
 * request gives its slot back, whatever its answer.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { loadConfig } from '../../src/config'
import { TenantLimits } from '../../src/http/rate-limit'
import { createMetrics } from '../../src/metrics/registry'
import { buildApp, serve } from '../../src/server'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { ADMIN_TOKEN, API_KEYS, startGatedProvider, startServer, type GatedProvider } from '../support/server'
import { waitFor } from '../support/wait'
import { createLogger } from '../../src/log'
import { signIn } from '../admin/support'

let db: TestDatabase
let provider: GatedProvider
beforeAll(async () => {
  db = await createTestDatabase('security_limits')
  provider = await startGatedProvider()
})
afterAll(async () => {
  await provider?.stop()
  await db?.drop()
})

/** The service's app on a real socket, with these limits. */
function service(limits: TenantLimits) {
  const config = loadConfig({ API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', HOST: '127.0.0.1', PORT: '0', TEST_ALLOW_PORT_0: '1', DATABASE_URL: db.url, PAYMENT_PROVIDER_URL: provider.url })
  const deps = { config, pools: db.pools, metrics: createMetrics(), limits }
  const server = serve(buildApp(deps), deps)
  return { url: `http://127.0.0.1:${server.port}`, stop: () => server.stop(true) }
}

const storedKeys = async (key: string) => (await db.sql`select count(*)::int as n from idempotency_key_states where key = ${key}`)[0]!.n as number

describe('the rate', () => {
  test('a burst of 5 at 2 per second: 5 answered, the 6th 429 with Retry-After and RateLimit fields; refilled with time; other tenants untouched', async () => {
    const clock = { ms: 0 }
    const limits = new TenantLimits({ rate: 2, burst: 5, maxInFlight: 0, now: () => clock.ms })
    const app = service(limits)
    try {
      const answers: Response[] = []
      for (let i = 0; i < 5; i++) answers.push(await postPayment(app.url, payment({ customer: `rate-${i}` })))
      expect(answers.map((response) => response.status)).toEqual([201, 201, 201, 201, 201])
      expect(answers[0]!.headers.get('ratelimit-policy')).toBe('"tenant";q=5;w=3')
      expect(answers.map((response) => response.headers.get('ratelimit'))).toEqual([
        '"tenant";r=4;t=1', '"tenant";r=3;t=1', '"tenant";r=2;t=2', '"tenant";r=1;t=2', '"tenant";r=0;t=3',
      ])

      const key = `rate-limited-${crypto.randomUUID()}`
      const refused = await postPayment(app.url, payment(), { key })
      expect(refused.status).toBe(429)
      expect(refused.headers.get('content-type')).toBe('application/problem+json')
      expect(refused.headers.get('retry-after')).toBe('1')
      expect(refused.headers.get('ratelimit')).toBe('"tenant";r=0;t=1')
      expect(refused.headers.get('ratelimit-policy')).toBe('"tenant";q=5;w=3')
      expect(await refused.json()).toMatchObject({ code: 'rate-limited', status: 429 })
      // Nothing was claimed or stored for it.
      expect(await storedKeys(key)).toBe(0)
      // Reads count too: the limit is on the tenant's requests, not on payments.
      expect((await fetch(`${app.url}/api/payments?customer=rate-0`, { headers: { authorization: 'Bearer acme-key' } })).status).toBe(429)

      // Another tenant has a bucket of its own; a request without a valid key is not counted for anyone.
      expect((await postPayment(app.url, payment(), { apiKey: 'globex-key' })).status).toBe(201)
      expect((await postPayment(app.url, payment(), { apiKey: 'nobody' })).status).toBe(401)

      clock.ms += 500
      expect((await postPayment(app.url, payment(), { key })).status).toBe(201)
      expect((await postPayment(app.url, payment())).status).toBe(429)
    } finally {
      await app.stop()
    }
  })
})

describe('the cap on requests in processing', () => {
  test('3 in flight: the 4th gets 429 too-many-in-flight with Retry-After at once; a slot frees when one finishes; other tenants untouched', async () => {
    const limits = new TenantLimits({ rate: 0, burst: 1, maxInFlight: 3 })
    const app = service(limits)
    try {
      provider.hold(3)
      const held = [0, 1, 2].map((i) => postPayment(app.url, payment({ customer: `cap-${i}` })))
      await waitFor(() => provider.held() === 3, () => `3 requests held at the provider (${provider.held()})`)
      expect(limits.inFlight('acme')).toBe(3)

      const key = `capped-${crypto.randomUUID()}`
      const started = performance.now()
      const refused = await postPayment(app.url, payment(), { key })
      expect(performance.now() - started).toBeLessThan(1_000)
      expect(refused.status).toBe(429)
      expect(refused.headers.get('retry-after')).toBe('1')
      expect(await refused.json()).toMatchObject({ code: 'too-many-in-flight', status: 429 })
      expect(await storedKeys(key)).toBe(0)
      expect((await postPayment(app.url, payment(), { apiKey: 'globex-key' })).status).toBe(201)

      provider.release()
      expect((await Promise.all(held)).map((response) => response.status)).toEqual([201, 201, 201])
      expect(limits.inFlight('acme')).toBe(0)
      expect((await postPayment(app.url, payment(), { key })).status).toBe(201)
    } finally {
      provider.release()
      await app.stop()
    }
  })

  test('every answer gives its slot back: replays, 409s, 422s, 400s, 404s, and a client that hangs up', async () => {
    const limits = new TenantLimits({ rate: 0, burst: 1, maxInFlight: 2 })
    const app = service(limits)
    try {
      const key = `slots-${crypto.randomUUID()}`
      provider.hold(1)
      const first = postPayment(app.url, payment(), { key })
      await waitFor(() => provider.held() === 1, 'the first request held at the provider')
      const answers: number[] = []
      // One slot is the held request's; each of these takes the other and gives it back.
      for (const send of [
        () => postPayment(app.url, payment(), { key }),
        () => postPayment(app.url, payment({ amount: 9 }), { key }),
        () => postPayment(app.url, '{', { key: `bad-${key}` }),
        () => fetch(`${app.url}/api/payments/${crypto.randomUUID()}`, { headers: { authorization: 'Bearer acme-key' } }),
      ]) {
        answers.push((await send()).status)
        expect(limits.inFlight('acme')).toBe(1)
      }
      expect(answers).toEqual([409, 422, 400, 404])
      provider.release()
      expect((await first).status).toBe(201)
      expect((await postPayment(app.url, payment(), { key })).headers.get('idempotent-replayed')).toBe('true')
      expect(limits.inFlight('acme')).toBe(0)

      // A client that goes away while its request is held at the provider.
      provider.hold(1)
      const gone = new AbortController()
      const abandoned = postPayment(app.url, payment({ customer: 'hangs-up' }), { signal: gone.signal }).catch(() => 'aborted')
      await waitFor(() => provider.held() === 1, 'the request held at the provider')
      gone.abort()
      expect(await abandoned).toBe('aborted')
      provider.release()
      await waitFor(() => limits.inFlight('acme') === 0, () => `every slot given back (${limits.inFlight('acme')} in flight)`)
    } finally {
      provider.release()
      await app.stop()
    }
  })
})

test('the service applies the configured limits and answers with the RateLimit fields (TENANT_RATE_LIMIT, TENANT_RATE_BURST)', async () => {
  const server = await startServer(db.url, { TENANT_RATE_LIMIT: '1', TENANT_RATE_BURST: '3', TENANT_MAX_IN_FLIGHT: '10' }, { provider })
  try {
    const statuses: number[] = []
    // A refill of 1 per second can add a token mid-burst on a slow machine: at most one more 201.
    for (let i = 0; i < 6; i++) statuses.push((await postPayment(server.url, payment())).status)
    expect(statuses.slice(0, 3)).toEqual([201, 201, 201])
    expect(statuses.filter((status) => status === 429).length).toBeGreaterThanOrEqual(2)
    const answer = await postPayment(server.url, payment())
    expect(answer.headers.get('ratelimit-policy')).toBe('"tenant";q=3;w=3')
  } finally {
    await server.stop()
  }
}, 30_000)

describe('which tenant is held at its limits', () => {
  // Catches: refusals that leave no trace (12,000 × 429 for one tenant showed nowhere), a log line per refusal,
  // or a 429 of the in-flight cap without the RateLimit fields every /api answer carries.
  test('counted by tenant and reason, logged once a window, on the admin page; the in-flight 429 says the rate too', async () => {
    const clock = { ms: 0 }
    const limits = new TenantLimits({ rate: 1, burst: 2, maxInFlight: 1, now: () => clock.ms })
    const lines: string[] = []
    const config = loadConfig({ API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', HOST: '127.0.0.1', PORT: '0', TEST_ALLOW_PORT_0: '1', DATABASE_URL: db.url, PAYMENT_PROVIDER_URL: provider.url })
    const deps = { config, pools: db.pools, metrics: createMetrics(), limits, log: createLogger({ sink: (line) => lines.push(line) }) }
    const server = serve(buildApp(deps), deps)
    const url = `http://127.0.0.1:${server.port}`
    try {
      const before = await deps.metrics.registry.getSingleMetricAsString('http_tenant_refusals_total')
      expect(before).toContain('http_tenant_refusals_total{tenant="globex",reason="too_many_in_flight"} 0')

      provider.hold(1)
      const held = postPayment(url, payment({ customer: 'held-1' }))
      await waitFor(() => provider.held() === 1, 'one request held at the provider')
      const capped = await postPayment(url, payment({ customer: 'capped' }))
      expect({ status: capped.status, policy: capped.headers.get('ratelimit-policy'), rate: capped.headers.get('ratelimit') })
        .toEqual({ status: 429, policy: '"tenant";q=2;w=2', rate: '"tenant";r=1;t=1' })
      provider.release()
      expect((await held).status).toBe(201)
      const over: number[] = []
      for (let i = 0; i < 5; i++) over.push((await postPayment(url, payment({ customer: `over-${i}` }))).status) // one token left, then over the rate
      expect(over).toEqual([201, 429, 429, 429, 429])

      const text = await deps.metrics.registry.getSingleMetricAsString('http_tenant_refusals_total')
      expect(text).toContain('http_tenant_refusals_total{tenant="acme",reason="too_many_in_flight"} 1')
      expect(text).toContain('http_tenant_refusals_total{tenant="acme",reason="rate_limited"} 4')
      expect(text).toContain('http_tenant_refusals_total{tenant="globex",reason="rate_limited"} 0')
      const held1 = lines.filter((line) => line.includes('held at its limit'))
      expect(held1).toHaveLength(1)
      expect(JSON.parse(held1[0]!)).toMatchObject({ level: 'warn', tenant: 'acme', reason: 'too_many_in_flight' })

      const signed = await signIn(url)
      const page = await (await fetch(`${url}/admin`, { headers: { cookie: signed.cookie } })).text()
      expect(page).toMatch(/id="tenants-held"[^]*>acme<\/a>[^]*4 over the rate, 1 over the in-flight cap/)
    } finally {
      provider.release()
      await server.stop(true)
    }
  })
})
