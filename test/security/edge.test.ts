/**
 * What every answer carries and what every request meets first, on a real
 * socket (server.ts's serve, the service's own listener code): nosniff on
 * every answer, no-store on admin answers, HSTS only behind a trusted TLS
 * proxy, the Host allow-list against DNS rebinding (raw sockets, so the Host
 * is exactly what an attacker's browser would send), /metrics behind its
 * token and on its own listener.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { ADMIN_TOKEN, startServer } from '../support/server'
import { rawRequest } from '../fuzz/raw-http'

const METRICS_TOKEN = `metrics-${'m'.repeat(32)}`

let db: TestDatabase
let plain: InProcessService
let plainUrl: string
let proxied: InProcessService
let proxiedUrl: string
beforeAll(async () => {
  db = await createTestDatabase('security_edge')
  ;[plain, proxied] = await Promise.all([
    startApp(db, { env: { METRICS_TOKEN } }),
    startApp(db, { env: { TRUST_PROXY: '1', ALLOWED_HOSTS: 'payments.example,.internal.example' } }),
  ])
  plainUrl = plain.listen()
  proxiedUrl = proxied.listen()
})
afterAll(async () => {
  await Promise.all([plain?.stop(), proxied?.stop()])
  await db?.drop()
})

const portOf = (url: string) => Number(new URL(url).port)
const raw = (url: string, lines: string[]) => rawRequest(portOf(url), `${lines.join('\r\n')}\r\n\r\n`)

describe('headers', () => {
  test('every answer carries X-Content-Type-Options: nosniff: API, errors, health, metrics, docs, admin', async () => {
    const answers = await Promise.all([
      postPayment(plainUrl, payment()),
      postPayment(plainUrl, payment(), { apiKey: 'wrong' }),
      postPayment(plainUrl, '{', {}),
      fetch(`${plainUrl}/api/payments/not-a-uuid`, { headers: { authorization: 'Bearer acme-key' } }),
      fetch(`${plainUrl}/no-such-path`),
      fetch(`${plainUrl}/healthz`),
      fetch(`${plainUrl}/readyz`),
      fetch(`${plainUrl}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } }),
      fetch(`${plainUrl}/metrics`),
      fetch(`${plainUrl}/openapi.json`),
      fetch(`${plainUrl}/docs`),
      fetch(`${plainUrl}/admin`, { redirect: 'manual' }),
      fetch(`${plainUrl}/admin/login`),
      fetch(`${plainUrl}/admin/api/keys`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
    ])
    const statuses = answers.map((response) => response.status)
    expect(statuses).toEqual([201, 401, 400, 404, 404, 200, 200, 200, 401, 200, 200, 303, 200, 200])
    for (const response of answers) expect({ url: response.url, nosniff: response.headers.get('x-content-type-options') }).toEqual({ url: response.url, nosniff: 'nosniff' })
  })

  test('admin answers are Cache-Control: no-store, signed in or not, HTML or JSON', async () => {
    const answers = await Promise.all([
      fetch(`${plainUrl}/admin`, { redirect: 'manual' }),
      fetch(`${plainUrl}/admin/login`),
      fetch(`${plainUrl}/admin/no-such-page`, { redirect: 'manual' }),
      fetch(`${plainUrl}/admin/api/keys`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
      fetch(`${plainUrl}/admin/api/counts`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
      fetch(`${plainUrl}/admin/api/keys`),
      fetch(`${plainUrl}/admin/api/nope`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
    ])
    expect(answers.map((response) => response.status)).toEqual([303, 200, 303, 200, 200, 401, 404])
    for (const response of answers) expect({ url: response.url, cache: response.headers.get('cache-control') }).toEqual({ url: response.url, cache: 'no-store' })
  })

  test('HSTS is sent only when a trusted proxy says the client came over TLS', async () => {
    const tls = { 'x-forwarded-proto': 'https' }
    expect((await fetch(`${proxiedUrl}/healthz`, { headers: tls })).headers.get('strict-transport-security')).toBe('max-age=31536000')
    expect((await fetch(`${proxiedUrl}/admin/login`, { headers: tls })).headers.get('strict-transport-security')).toBe('max-age=31536000')
    expect((await fetch(`${proxiedUrl}/healthz`)).headers.get('strict-transport-security')).toBeNull()
    expect((await fetch(`${proxiedUrl}/healthz`, { headers: { 'x-forwarded-proto': 'http' } })).headers.get('strict-transport-security')).toBeNull()
    // Without TRUST_PROXY the header is anyone's word.
    expect((await fetch(`${plainUrl}/healthz`, { headers: tls })).headers.get('strict-transport-security')).toBeNull()
  })
})

describe('Host allow-list (DNS rebinding)', () => {
  test('a name we do not serve is refused with 421 problem+json, before anything runs', async () => {
    for (const host of ['attacker.example', 'attacker.example:3000', 'localhost.attacker.example', 'payments.example.attacker.example', '127.0.0.1.nip.io']) {
      const answer = await raw(plainUrl, ['GET /api/payments?customer=c HTTP/1.1', `Host: ${host}`, 'Authorization: Bearer acme-key', 'Connection: close'])
      expect({ host, status: answer?.status }).toEqual({ host, status: 421 })
      expect(answer!.headers.get('content-type')).toBe('application/problem+json')
      expect(new TextDecoder().decode(answer!.body)).toContain('host-not-allowed')
    }
    // A rebinding page cannot read the admin either.
    expect((await raw(plainUrl, ['GET /admin/login HTTP/1.1', 'Host: attacker.example', 'Connection: close']))?.status).toBe(421)
  })

  test('what a laptop, a container probed by IP and a health check send is allowed without any setting', async () => {
    for (const host of ['localhost', 'localhost:3000', 'app.localhost:3000', '127.0.0.1:3000', '[::1]:3000', '10.1.2.3:8080', 'LOCALHOST']) {
      const answer = await raw(plainUrl, ['GET /healthz HTTP/1.1', `Host: ${host}`, 'Connection: close'])
      expect({ host, status: answer?.status }).toEqual({ host, status: 200 })
    }
    // HTTP/1.0 without Host (HAProxy's default check) is served as before.
    expect((await raw(plainUrl, ['GET /healthz HTTP/1.0']))?.status).toBe(200)
  })

  test('ALLOWED_HOSTS adds names, and a leading dot a domain with every name under it', async () => {
    for (const [host, status] of [['payments.example', 200], ['Payments.Example:443', 200], ['api.internal.example', 200], ['internal.example', 200], ['other.example', 421], ['xinternal.example', 421]] as const) {
      const answer = await raw(proxiedUrl, ['GET /healthz HTTP/1.1', `Host: ${host}`, 'Connection: close'])
      expect({ host, status: answer?.status }).toEqual({ host, status })
    }
  })
})

describe('/metrics', () => {
  test('with METRICS_TOKEN: 401 with a Bearer challenge without it or with another, 200 with it', async () => {
    for (const authorization of [undefined, 'Bearer wrong', `Bearer ${METRICS_TOKEN}x`, `Basic ${btoa(`x:${METRICS_TOKEN}`)}`]) {
      const response = await fetch(`${plainUrl}/metrics`, { headers: authorization ? { authorization } : {} })
      expect({ authorization, status: response.status }).toEqual({ authorization, status: 401 })
      expect(response.headers.get('www-authenticate')).toContain('Bearer')
      expect(await response.text()).not.toContain('idempotency_')
    }
    const scraped = await fetch(`${plainUrl}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } })
    expect(scraped.status).toBe(200)
    expect(await scraped.text()).toContain('http_requests_total')
  })

  test('with METRICS_PORT, /metrics is served there only, and PORT answers it 404', async () => {
    const metricsPort = await freePort()
    const server = await startServer(db.url, { METRICS_PORT: String(metricsPort), METRICS_HOST: '127.0.0.1', METRICS_TOKEN })
    try {
      const onMain = await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } })
      expect(onMain.status).toBe(404)
      const metricsUrl = `http://127.0.0.1:${metricsPort}`
      const scraped = await fetch(`${metricsUrl}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } })
      expect(scraped.status).toBe(200)
      expect(await scraped.text()).toContain('idempotency_stale_processing_keys')
      expect((await fetch(`${metricsUrl}/metrics`)).status).toBe(401)
      // The metrics listener serves nothing else: not the API, not the admin.
      for (const path of ['/api/payments?customer=c', '/admin/login', '/healthz', '/docs']) expect({ path, status: (await fetch(`${metricsUrl}${path}`, { headers: { authorization: 'Bearer acme-key' } })).status }).toEqual({ path, status: 404 })
      expect((await fetch(`${server.url}/healthz`)).status).toBe(200)
      expect(server.output()).toContain(`metrics on 127.0.0.1:${metricsPort}`)
    } finally {
      await server.stop()
    }
  }, 30_000)
})

/** A port nothing listens on now (bound, read, released). */
async function freePort(): Promise<number> {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response() })
  const port = probe.port!
  await probe.stop(true)
  return port
}
