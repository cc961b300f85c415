/**
 * What an operator reads at 3 a.m.: the service's own output, parsed as JSON
 * lines, holds one line for each failed, deadline-hit and fenced request and
 * each operator action, under the request id the client got back (its
 * X-Request-Id and its problem's `instance`); hostile strings arrive escaped.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { newLeaseId } from '../../src/core/lease-id'
import { rawRequest } from '../fuzz/raw-http'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { json, payment, paymentRequest, postPayment } from '../support/http'
import { ADMIN_TOKEN, startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { waitFor, waitForClaims } from '../support/wait'
import { createLogger } from '../../src/log'

type Line = Record<string, unknown> & { level: string; msg: string; time: string }

/** The banner `npm start` prints for a person: the only lines that are not JSON. */
const BANNER = /^(payments API|API keys?|admin|admin token|API docs|metrics|database|provider) {2,}/

/** Every line the service printed, parsed; throws on a line that is neither JSON nor the banner. */
function lines(output: string): Line[] {
  const parsed: Line[] = []
  for (const line of output.split('\n').filter(Boolean)) {
    if (BANNER.test(line)) continue
    expect({ line, ascii: /^[\x20-\x7e]*$/.test(line) }).toEqual({ line, ascii: true })
    parsed.push(JSON.parse(line) as Line)
  }
  return parsed
}

const URN = (id: string) => `urn:idempotent-post:request:${id}`
const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

describe('the service process', () => {
  let db: TestDatabase
  let provider: GatedProvider
  let server: ServerProcess
  beforeAll(async () => {
    db = await createTestDatabase('request_log')
    // Every charge is refused (502); a held one runs into the 2 s TTL's deadline (1.8 s).
    provider = await startGatedProvider({ failureRate: 1 })
    server = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: '2', LOG_LEVEL: 'debug' }, { provider })
  }, 60_000)
  afterAll(async () => {
    if (server?.proc.exitCode === null) await server.stop()
    await provider?.stop()
    await db?.drop()
  })

  const find = (predicate: (line: Line) => boolean) => lines(server.output()).filter(predicate)

  test('a provider failure: the 502 names its request id in X-Request-Id and instance, and one line says what failed under that id', async () => {
    const key = `log-502-${crypto.randomUUID()}`
    const response = await postPayment(server.url, payment({ customer: 'cus_log' }), { key, headers: { 'x-request-id': 'client-req-502' } })
    expect(response.status).toBe(502)
    expect(response.headers.get('x-request-id')).toBe('client-req-502')
    expect((await json(response)).instance).toBe(URN('client-req-502'))

    await waitFor(() => find((line) => line.request_id === 'client-req-502').length > 0, 'the line of the failed request')
    const about = find((line) => line.request_id === 'client-req-502')
    expect(about).toHaveLength(1)
    expect(about[0]).toMatchObject({
      level: 'warn',
      tenant: 'acme',
      route: '/api/payments',
      key,
      outcome: 'failed',
      key_state: 'released',
      error: { name: 'ProviderError', code: 'PROVIDER_FAILED' },
    })
    expect(about[0]!.msg).toContain('the payment provider answered 5')
    expect(Number.isNaN(Date.parse(about[0]!.time))).toBe(false)

    // A retry's answer carries its own id; without one from the client, a UUIDv7 of ours.
    const retry = await postPayment(server.url, payment({ customer: 'cus_log' }), { key })
    expect(retry.headers.get('x-request-id')).toMatch(UUID_V7)
    expect((await json(retry)).instance).toBe(URN(retry.headers.get('x-request-id')!))
  })

  test('a request that runs into its deadline: 504, one deadline line under its id, and the key listed as released after its deadline', async () => {
    provider.hold(1)
    const key = `log-504-${crypto.randomUUID()}`
    const answer = postPayment(server.url, payment({ customer: 'cus_late', amount: 4200 }), { key, headers: { 'x-request-id': 'client-req-504' } })
    await waitFor(() => provider.held() === 1, 'the charge to be held at the provider')
    const response = await answer
    provider.release()
    expect(response.status).toBe(504)
    expect(response.headers.get('x-request-id')).toBe('client-req-504')
    await waitFor(() => find((line) => line.request_id === 'client-req-504').length > 0, 'the deadline line')
    expect(find((line) => line.request_id === 'client-req-504')).toEqual([expect.objectContaining({ level: 'warn', outcome: 'deadline', key, tenant: 'acme', key_state: 'released' })])

    // The admin lists it with the downstream key and the summary stored at claim.
    const listed = await (await fetch(`${server.url}/admin/api/released?reason=deadline`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).json() as any
    expect(listed.data).toEqual([expect.objectContaining({ tenant: 'acme', key, reason: 'deadline', downstream_key: expect.stringMatching(/^idp_/), summary: { customer: 'cus_late', amount: 4200, currency: 'EUR' } })])
    expect(listed.counts).toMatchObject({ deadline: 1 })
  }, 30_000)

  test('an operator action through the JSON API: one line under the request id its answer names', async () => {
    const response = await fetch(`${server.url}/admin/api/keys/expire`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json', 'x-request-id': 'op-req-1' },
      body: JSON.stringify({ tenant: 'acme', key: 'never-claimed', lease: '1' }),
    })
    expect(response.status).toBe(409)
    expect(response.headers.get('x-request-id')).toBe('op-req-1')
    expect((await json(response)).instance).toBe(URN('op-req-1'))
    await waitFor(() => find((line) => line.request_id === 'op-req-1').length > 0, 'the operator action line')
    expect(find((line) => line.request_id === 'op-req-1')).toEqual([expect.objectContaining({
      level: 'info', msg: 'operator action: force_expire', actor: 'api:admin', tenant: 'acme', key: 'never-claimed', outcome: 'unchanged', audit_id: expect.any(String),
    })])
  })

  test('hostile bytes in X-Request-Id and in an invalid key reach the log escaped: one line, printable ASCII, the exact text back', async () => {
    const port = Number(new URL(server.url).port)
    // Quotes, braces and a forged field, and Latin-1 bytes (obs-text, which HTTP allows in a field value).
    const hostileId = Buffer.concat([Buffer.from('x" ,"level":"error","msg":"forged'), Buffer.from([0xe9, 0xff])])
    const hostileKey = Buffer.concat([Buffer.from('k"}{'), Buffer.from([0xe9, 0x80])])
    const body = JSON.stringify(payment())
    const request = Buffer.concat([
      Buffer.from(`POST /api/payments HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nAuthorization: Bearer acme-key\r\nContent-Type: application/json\r\nConnection: close\r\n`),
      Buffer.from('X-Request-Id: '), hostileId, Buffer.from('\r\n'),
      Buffer.from('Idempotency-Key: '), hostileKey, Buffer.from('\r\n'),
      Buffer.from(`Content-Length: ${body.length}\r\n\r\n${body}`),
    ])
    const answer = await rawRequest(port, request)
    expect(answer?.status).toBe(400)
    const id = answer!.headers.get('x-request-id')!
    expect(id).toMatch(UUID_V7) // refused, not cleaned: a cleaned id would match nothing the client logged
    expect(JSON.parse(new TextDecoder().decode(answer!.body))).toMatchObject({ code: 'invalid-idempotency-key', instance: URN(id) })

    await waitFor(() => find((line) => line.request_id === id).length > 0, 'the refusal line (debug)')
    const [line, ...more] = find((line) => line.request_id === id)
    expect(more).toEqual([])
    expect(line).toMatchObject({ level: 'debug', msg: 'refused: invalid-idempotency-key', tenant: 'acme' })
    // Bun reads field bytes as Latin-1: the log gives back exactly that text, escaped to \u00e9 on the wire.
    expect(line!.refused_request_id).toBe(hostileId.toString('latin1'))
    expect(line!.key).toBe(hostileKey.toString('latin1'))
    const raw = server.output().split('\n').find((text) => text.includes(id))!
    expect(raw).toContain('\\u00e9')
    expect(find((each) => each.msg === 'forged')).toEqual([])
  })

  test('start and stop: a JSON line each, with the port and the exit code', async () => {
    expect(find((line) => /^listening on 127\.0\.0\.1:\d+ \(pid \d+\)$/.test(line.msg))).toEqual([expect.objectContaining({ level: 'info', port: Number(new URL(server.url).port), ttl_seconds: 2 })])
    expect(await server.stop('SIGTERM')).toBe(0)
    const stopped = find((line) => line.msg === 'stopped')
    expect(stopped).toEqual([expect.objectContaining({ level: 'info', exit_code: 0 })])
    expect(find((line) => /^SIGTERM: draining/.test(line.msg))).toHaveLength(1)
  })
})

describe('in-process: the lines no request can hide from', () => {
  let db: TestDatabase
  let provider: GatedProvider
  let service: InProcessService
  const printed: string[] = []
  beforeAll(async () => {
    db = await createTestDatabase('request_log_app')
    provider = await startGatedProvider()
    service = await startApp(db, { provider, log: createLogger({ sink: (line) => printed.push(line) }) })
  })
  afterAll(async () => {
    await service?.stop()
    await provider?.stop()
    await db?.drop()
  })
  const about = (id: string) => printed.map((line) => JSON.parse(line) as Line).filter((line) => line.request_id === id)

  test('a worker fenced off at commit (its key reclaimed meanwhile): 409 lease-lost, and one line under its id', async () => {
    provider.hold(1)
    const key = `log-fenced-${crypto.randomUUID()}`
    const answer = service.handle(paymentRequest(service.url, payment(), { key, headers: { 'x-request-id': 'fenced-1' } }))
    await waitForClaims(db.sql, [key])
    await waitFor(() => provider.held() === 1, 'the charge to be held')
    // What a reclaim does to the row: a new lease. The held worker's completion is then fenced.
    // In either form (sql/engine/00020): the new form's fence is its processing entry's lease.
    const lease = newLeaseId()
    await db.sql`
      with moved as (update idempotency_keys set lease = ${lease}::bigint, attempts = attempts + 1 where key = ${key} returning tenant, key)
      update idempotency_processing pr set lease = ${lease}::bigint from moved m where pr.tenant = m.tenant and pr.key = m.key and pr.lease is not null`
    provider.release()
    const response = await answer
    expect(response.status).toBe(409)
    expect((await json(response)).code).toBe('lease-lost')
    expect(about('fenced-1')).toEqual([expect.objectContaining({ level: 'warn', outcome: 'lease_lost', key, tenant: 'acme', route: '/api/payments' })])
  })

  test('an answer of 5xx that no layer logged (the database known to be away) gets the edge\'s line, with its route and code', async () => {
    const away = await startApp(db, { provider, log: createLogger({ sink: (line) => printed.push(line) }), health: { up: false } })
    try {
      const response = await away.handle(paymentRequest(away.url, payment(), { headers: { 'x-request-id': 'gate-503' } }))
      expect(response.status).toBe(503)
      expect((await json(response)).instance).toBe(URN('gate-503'))
      expect(about('gate-503')).toEqual([expect.objectContaining({ level: 'warn', msg: 'request failed', route: '/api/payments', status: 503, code: 'database-unavailable' })])
    } finally {
      await away.stop()
    }
  })

  test('a success writes no line at info (the metrics count it), and its answer still carries the id', async () => {
    const response = await service.handle(paymentRequest(service.url, payment(), { headers: { 'x-request-id': 'quiet-1' } }))
    expect(response.status).toBe(201)
    expect(response.headers.get('x-request-id')).toBe('quiet-1')
    expect(about('quiet-1')).toEqual([])
  })
})
