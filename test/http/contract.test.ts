/**
 * Every row of the HTTP contract (docs/reference/http-api.md: the HTTP API, the problem codes), through the service's app in this
 * process (`app.handle`, as elysia-html tests) and a real PostgreSQL; the
 * body limits also over a real socket. No process boundary is under test
 * here: the storm, chaos and shutdown suites run the service as a process.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { json, payment, paymentRequest, type PostOptions } from '../support/http'
import { createKey, identity } from '../support/keys'
import { startGatedProvider, startProvider, type GatedProvider, type ProviderHandle } from '../support/server'
import { track, waitFor, waitForClaims } from '../support/wait'

let db: TestDatabase
/** Charges through a provider the tests can hold, so a request stays in processing exactly as long as a test needs. */
let provider: GatedProvider
let server: InProcessService
let failingProvider: ProviderHandle
let failing: InProcessService

beforeAll(async () => {
  db = await createTestDatabase('contract')
  ;[provider, failingProvider] = await Promise.all([startGatedProvider(), startProvider({ failureRate: 1 })])
  ;[server, failing] = await Promise.all([
    startApp(db, { env: { MAX_BODY_BYTES: '2048' }, provider }),
    startApp(db, { provider: failingProvider }),
  ])
})
afterAll(async () => {
  await Promise.all([server?.stop(), failing?.stop()])
  await Promise.all([provider?.stop(), failingProvider?.stop()])
  await db?.drop()
})

/** A client's payment POST, answered by the app in this process. */
function postPayment(service: InProcessService, body: unknown, options: PostOptions = {}): Promise<Response> {
  return service.handle(paymentRequest(service.url, body, options))
}

/**
 * Sends a payment and resolves once it has claimed its key and waits at the
 * provider, where it is held until `provider.release()`: the state "the
 * first request is processing", reached by signal rather than by a delay.
 */
async function processing(key: string, body: unknown, apiKey = 'acme-key', tenant = 'acme') {
  provider.hold(1)
  const first = track(postPayment(server, body, { key, apiKey }))
  await waitForClaims(db.sql, [key], tenant)
  await waitFor(() => provider.held() === 1, 'the first request to be held at the provider')
  return first
}

/** Keys that hold a claim or an answer (a released key holds neither), and payments. */
async function counts(key?: string) {
  const [row] = await db.sql<{ keys: number; payments: number }[]>`
    select (select count(*)::int from idempotency_key_states where status <> 'released' and (${key ?? null}::text is null or key = ${key ?? null})) as keys,
           (select count(*)::int from payments where ${key ?? null}::text is null or idempotency_key = ${key ?? null}) as payments`
  return row!
}

async function expectProblem(response: Response, status: number) {
  expect(response.status).toBe(status)
  expect(response.headers.get('content-type')).toStartWith('application/problem+json')
  const body = await json(response)
  expect(body.status).toBe(status)
  expect(typeof body.title).toBe('string')
  expect(typeof body.type).toBe('string')
  return body
}

describe('POST /api/payments', () => {
  test('first request: 201 with Location and the payment', async () => {
    const response = await postPayment(server, payment({ amount: 4200, description: 'Order #1' }))
    expect(response.status).toBe(201)
    const body = await json(response)
    expect(body).toMatchObject({ amount: 4200, currency: 'EUR', customer: 'cus_1', description: 'Order #1', status: 'succeeded' })
    expect(response.headers.get('location')).toBe(`/api/payments/${body.id}`)
    expect(response.headers.get('idempotent-replayed')).toBeNull()
  })

  test('same key, same request after it finished: the first answer byte for byte, marked replayed', async () => {
    const key = `replay-${crypto.randomUUID()}`
    const first = await postPayment(server, payment(), { key })
    const firstBody = await first.text()
    // Key order and white space differ: still the same request.
    const again = await postPayment(server, '{ "customer" : "cus_1",\n "currency":"EUR", "amount": 1250 }', { key })
    expect(again.status).toBe(first.status)
    expect(await again.text()).toBe(firstBody)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(again.headers.get('location')).toBe(first.headers.get('location'))
    expect(await counts(key)).toEqual({ keys: 1, payments: 1 })
  })

  test('same key while the first is processing: 409 at once with Retry-After', async () => {
    const key = `busy-${crypto.randomUUID()}`
    const first = await processing(key, payment())
    const retry = await postPayment(server, payment(), { key })
    const problem = await expectProblem(retry, 409)
    expect(problem.code).toBe('in-progress')
    const retryAfter = Number(retry.headers.get('retry-after'))
    expect(Number.isInteger(retryAfter)).toBe(true)
    expect(retryAfter).toBeGreaterThanOrEqual(1)
    expect(retryAfter).toBeLessThanOrEqual(30)
    // Answered while the first still runs: it did not wait on the worker's lock.
    expect(first.settled() ? 'finished' : 'still running').toBe('still running')
    provider.release()
    expect((await first.promise).status).toBe(201)
    expect(await counts(key)).toEqual({ keys: 1, payments: 1 })
  })

  test('same key, different request: 422 whether the first is finished or still processing', async () => {
    const key = `mismatch-${crypto.randomUUID()}`
    expect((await postPayment(server, payment({ amount: 100 }), { key })).status).toBe(201)
    await expectProblem(await postPayment(server, payment({ amount: 101 }), { key }), 422)
    await expectProblem(await postPayment(server, payment({ amount: 100, description: 'x' }), { key }), 422)

    const busy = `mismatch-busy-${crypto.randomUUID()}`
    const first = await processing(busy, payment({ amount: 100 }))
    await expectProblem(await postPayment(server, payment({ amount: 999 }), { key: busy }), 422)
    expect(first.settled()).toBe(false)
    provider.release()
    expect((await first.promise).status).toBe(201)
    expect(await counts(busy)).toEqual({ keys: 1, payments: 1 })
  })

  test('a trailing slash is the same path: the same request, replayed', async () => {
    const key = `slash-${crypto.randomUUID()}`
    const first = await postPayment(server, payment(), { key })
    expect(first.status).toBe(201)
    const request = paymentRequest(server.url, payment(), { key })
    const slash = await server.handle(new Request(`${server.url}/api/payments/`, { method: 'POST', headers: request.headers, body: JSON.stringify(payment()) }))
    expect(slash.status).toBe(201)
    expect(slash.headers.get('idempotent-replayed')).toBe('true')
    expect(await slash.text()).toBe(await first.text())
    expect(await counts(key)).toEqual({ keys: 1, payments: 1 })
  })

  test('the query string is not part of the request: the same request, replayed', async () => {
    const key = `query-${crypto.randomUUID()}`
    expect((await postPayment(server, payment(), { key })).status).toBe(201)
    const other = await server.fetch('/api/payments?x=1', {
      method: 'POST',
      headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify(payment()),
    })
    // The query string is not part of the path: this is the same request.
    expect(other.headers.get('idempotent-replayed')).toBe('true')
  })

  test('a key first used on another path is a different request: 422, whether that one is done or processing', async () => {
    // The service has one POST route; the key's first request is put in place as
    // another route of the same tenant would have left it, with the same body.
    for (const status of ['done', 'processing'] as const) {
      const key = `path-${status}-${crypto.randomUUID()}`
      await createKey(db.sql, identity({ key, path: '/api/refunds', body: payment() }), { status })
      const problem = await expectProblem(await postPayment(server, payment(), { key }), 422)
      expect(problem.code).toBe('idempotency-key-reused')
      expect(await counts(key)).toEqual({ keys: 1, payments: 0 })
    }
  })

  const badKeys: [string, string | null][] = [
    ['missing', null],
    ['256 characters', 'k'.repeat(256)],
    ['a space', 'has space'],
    ['a tab', 'tab\there'],
    ['non-ASCII', 'ключ'],
  ]
  for (const [name, key] of badKeys) {
    test(`Idempotency-Key ${name}: 400, nothing stored`, async () => {
      const before = await counts()
      const headers: Record<string, string> = { authorization: 'Bearer acme-key', 'content-type': 'application/json' }
      if (key !== null) headers['idempotency-key'] = key
      const response = await (async () => server.fetch('/api/payments', { method: 'POST', headers, body: JSON.stringify(payment()) }))().catch(() => undefined)
      // Request itself refuses some header values (as fetch does); the server must never see them then.
      if (response) await expectProblem(response, 400)
      expect(await counts()).toEqual(before)
    })
  }

  describe('Idempotency-Key as an RFC 8941 sf-string (draft-ietf-httpapi-idempotency-key-header)', () => {
    /** Over a real socket: the field as a client's HTTP stack sends it. */
    const send = (url: string, field: string, body: unknown = payment()) => fetch(paymentRequest(url, body, { key: field }))

    test('"k-1", k-1 and "k-1";x=1 name one key: one payment, the rest replays', async () => {
      const url = server.listen()
      const key = `sf-${crypto.randomUUID()}`
      const first = await send(url, `"${key}"`)
      expect(first.status).toBe(201)
      const body = await first.text()
      for (const field of [key, `"${key}";x=1;y`, ` "${key}" `]) {
        const again = await send(url, field)
        expect(again.status, field).toBe(201)
        expect(again.headers.get('idempotent-replayed'), field).toBe('true')
        expect(await again.text()).toBe(body)
      }
      expect(await counts(key)).toEqual({ keys: 1, payments: 1 })
      // The bare form first, then the quoted one: the same key still.
      const bare = `sf-bare-${crypto.randomUUID()}`
      expect((await send(url, bare)).status).toBe(201)
      expect((await send(url, `"${bare}"`)).headers.get('idempotent-replayed')).toBe('true')
      expect(await counts(bare)).toEqual({ keys: 1, payments: 1 })
    })

    test('\\" and \\\\ are unescaped: the key is what the sf-string says', async () => {
      const url = server.listen()
      const id = crypto.randomUUID()
      const key = `sf"q\\${id}`
      expect((await send(url, `"sf\\"q\\\\${id}"`)).status).toBe(201)
      const [row] = await db.sql<{ key: string }[]>`select key from idempotency_key_states where key like ${`%${id}`}`
      expect(row!.key).toBe(key)
      expect((await send(url, key)).headers.get('idempotent-replayed')).toBe('true')
      expect(await counts(key)).toEqual({ keys: 1, payments: 1 })
    })

    const malformed: [string, string][] = [
      ['unterminated', '"sf-open'],
      ['text after the string', '"sf-1" x'],
      ['an escape other than \\" and \\\\', '"sf\\q"'],
      ['two members (the field sent twice)', '"sf-1", "sf-1"'],
      ['empty', '""'],
      ['a space inside', '"sf 1"'],
      ['256 characters once unescaped', `"${'k'.repeat(256)}"`],
      ['a malformed parameter', '"sf-1";X=1'],
    ]
    for (const [name, field] of malformed) {
      test(`a field starting with " that is not a valid key (${name}): 400, nothing stored`, async () => {
        const url = server.listen()
        const before = await counts()
        const problem = await expectProblem(await send(url, field), 400)
        expect(problem.code).toBe('invalid-idempotency-key')
        expect(await counts()).toEqual(before)
      })
    }
  })

  test('Idempotency-Key of exactly 255 printable characters is accepted', async () => {
    const key = '!~'.repeat(127) + 'x'
    expect((await postPayment(server, payment(), { key })).status).toBe(201)
  })

  const badBodies: [string, string][] = [
    ['not JSON', 'amount=1'],
    ['empty', ''],
    ['an array', '[1,2]'],
    ['amount 0', JSON.stringify(payment({ amount: 0 }))],
    ['amount over 10^12', JSON.stringify(payment({ amount: 1e12 + 1 }))],
    ['a fractional amount', JSON.stringify(payment({ amount: 10.5 }))],
    ['amount as a string', JSON.stringify({ ...payment(), amount: '10' })],
    ['lower-case currency', JSON.stringify(payment({ currency: 'eur' }))],
    ['a four-letter currency', JSON.stringify(payment({ currency: 'EURO' }))],
    ['an empty customer', JSON.stringify(payment({ customer: '' }))],
    ['a 65-character customer', JSON.stringify(payment({ customer: 'c'.repeat(65) }))],
    ['a 501-character description', JSON.stringify(payment({ description: 'd'.repeat(501) }))],
    ['an unknown field', JSON.stringify({ ...payment(), tip: 5 })],
    ['a missing field', JSON.stringify({ amount: 1, currency: 'EUR' })],
    ['a NUL character', JSON.stringify(payment({ customer: 'a\u0000b' }))],
    ['a NUL character in a key', '{"amount":1,"currency":"EUR","customer":"c","\\u0000":1}'],
    // JSON.parse keeps the last amount; a proxy or the client's own log may read the first.
    ['a member named twice', '{"amount":100,"amount":200,"currency":"EUR","customer":"c"}'],
    ['a member named twice, once escaped', '{"amount":100,"currency":"EUR","customer":"c","\\u0063ustomer":"d"}'],
  ]
  for (const [name, body] of badBodies) {
    test(`body with ${name}: 400 problem+json, nothing stored`, async () => {
      const key = `bad-${crypto.randomUUID()}`
      await expectProblem(await postPayment(server, body, { key }), 400)
      expect(await counts(key)).toEqual({ keys: 0, payments: 0 })
    })
  }

  test('"description": null is no description: 201, answered as null, the same request on a retry', async () => {
    const key = `null-description-${crypto.randomUUID()}`
    const body = { ...payment(), description: null }
    const first = await postPayment(server, body, { key })
    expect(first.status).toBe(201)
    const created = await json(first)
    expect(created.description).toBeNull()
    const again = await postPayment(server, body, { key })
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(await counts(key)).toEqual({ keys: 1, payments: 1 })
    // A client may send back what it got: the answer's own fields, description null included.
    const { amount, currency, customer, description } = created
    expect((await postPayment(server, { amount, currency, customer, description })).status).toBe(201)
    const [row] = await db.sql`select description from payments where idempotency_key = ${key}`
    expect(row!.description).toBeNull()
  })

  test('a 500-character description and a 64-character customer are accepted', async () => {
    const response = await postPayment(server, payment({ description: 'd'.repeat(500), customer: 'c'.repeat(64), amount: 1e12 }))
    expect(response.status).toBe(201)
  })

  test('Content-Type other than application/json: 415, nothing stored', async () => {
    const key = `ct-${crypto.randomUUID()}`
    await expectProblem(await postPayment(server, JSON.stringify(payment()), { key, contentType: 'text/plain' }), 415)
    await expectProblem(await postPayment(server, JSON.stringify(payment()), { key, contentType: 'application/x-www-form-urlencoded' }), 415)
    expect(await counts(key)).toEqual({ keys: 0, payments: 0 })
    expect((await postPayment(server, payment(), { key, contentType: 'application/json; charset=utf-8' })).status).toBe(201)
  })

  test('no or wrong bearer token: 401', async () => {
    const key = `auth-${crypto.randomUUID()}`
    await expectProblem(await postPayment(server, payment(), { key, apiKey: null }), 401)
    await expectProblem(await postPayment(server, payment(), { key, apiKey: 'wrong' }), 401)
    await expectProblem(await postPayment(server, payment(), { key, headers: { authorization: 'Basic YWNtZTphY21lLWtleQ==' }, apiKey: null }), 401)
    expect(await counts(key)).toEqual({ keys: 0, payments: 0 })
  })

  test('body over the limit: 413, nothing stored', async () => {
    const key = `big-${crypto.randomUUID()}`
    await expectProblem(await postPayment(server, payment({ description: 'x'.repeat(4000) }), { key }), 413)
    expect(await counts(key)).toEqual({ keys: 0, payments: 0 })
  })

  test('over a real socket, a chunked body over the limit and a 3 MiB one: 413 problem+json', async () => {
    const url = server.listen()
    const key = `chunked-${crypto.randomUUID()}`
    const chunk = new TextEncoder().encode(' '.repeat(1024))
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) { controller.enqueue(chunk) }, // endless: the server must stop reading by itself
    })
    const response = await fetch(`${url}/api/payments`, {
      method: 'POST',
      headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': key },
      body: stream,
    })
    await expectProblem(response, 413)
    const huge = await fetch(paymentRequest(url, ' '.repeat(3 * 1024 * 1024) + JSON.stringify(payment()), { key }))
    await expectProblem(huge, 413)
    expect(await counts(key)).toEqual({ keys: 0, payments: 0 })
  })

  test('provider failure: 502 problem+json, the key released, and a retry succeeds', async () => {
    const key = `fail-${crypto.randomUUID()}`
    const failed = await postPayment(failing, payment(), { key })
    const problem = await expectProblem(failed, 502)
    expect(problem.detail).toContain('released')
    expect(await counts(key)).toEqual({ keys: 0, payments: 0 })
    const retry = await postPayment(server, payment(), { key })
    expect(retry.status).toBe(201)
    expect(retry.headers.get('idempotent-replayed')).toBeNull()
    expect(await counts(key)).toEqual({ keys: 1, payments: 1 })
  })

  test('the same key from two tenants is two unrelated requests', async () => {
    const key = `shared-${crypto.randomUUID()}`
    const acme = await postPayment(server, payment({ amount: 1 }), { key, apiKey: 'acme-key' })
    const globex = await postPayment(server, payment({ amount: 2 }), { key, apiKey: 'globex-key' })
    expect(acme.status).toBe(201)
    expect(globex.status).toBe(201)
    expect(globex.headers.get('idempotent-replayed')).toBeNull()
    expect((await json(acme)).id).not.toBe((await json(globex)).id)
  })

  test('a tenant cannot block another tenant\'s key while it is processing', async () => {
    const key = `block-${crypto.randomUUID()}`
    const acme = await processing(key, payment(), 'acme-key', 'acme')
    const globex = await postPayment(server, payment(), { key, apiKey: 'globex-key' })
    expect(globex.status).toBe(201)
    // globex was answered while acme's request still held the key.
    expect(acme.settled()).toBe(false)
    provider.release()
    expect((await acme.promise).status).toBe(201)
  })
})

describe('GET /api/payments', () => {
  test('by id: 200 for the owner, 404 for another tenant, unknown or malformed ids', async () => {
    const created = await json(await postPayment(server, payment()))
    const get = (id: string, apiKey = 'acme-key') => server.fetch(`/api/payments/${id}`, { headers: { authorization: `Bearer ${apiKey}` } })
    const own = await get(created.id)
    expect(own.status).toBe(200)
    expect(await json(own)).toEqual(created)
    await expectProblem(await get(created.id, 'globex-key'), 404)
    await expectProblem(await get(crypto.randomUUID()), 404)
    await expectProblem(await get('not-a-uuid'), 404)
    await expectProblem(await get('%27%20or%201=1--'), 404)
    await expectProblem(await server.fetch(`/api/payments/${created.id}`), 401)
  })

  test('by customer: this tenant\'s payments, newest first, paged by cursor', async () => {
    const customer = `cus_${crypto.randomUUID().slice(0, 8)}`
    const ids: string[] = []
    for (let i = 0; i < 5; i++) ids.push((await json(await postPayment(server, payment({ customer, amount: i + 1 })))).id)
    await postPayment(server, payment({ customer }), { apiKey: 'globex-key' })
    const list = (query: string) => server.fetch(`/api/payments?${query}`, { headers: { authorization: 'Bearer acme-key' } })

    const all = await json(await list(`customer=${customer}`))
    expect(all.data.map((p: { id: string }) => p.id)).toEqual([...ids].reverse())
    expect(all.next_cursor).toBeNull()

    const seen: string[] = []
    let cursor: string | null = null
    do {
      const page: { data: { id: string }[]; next_cursor: string | null } = await json(await list(`customer=${customer}&limit=2${cursor ? `&cursor=${cursor}` : ''}`))
      expect(page.data.length).toBeLessThanOrEqual(2)
      seen.push(...page.data.map((p) => p.id))
      cursor = page.next_cursor
    } while (cursor)
    expect(seen).toEqual([...ids].reverse())

    await expectProblem(await list(`customer=${customer}&limit=101`), 400)
    await expectProblem(await list(`customer=${customer}&limit=0`), 400)
    await expectProblem(await list(`customer=${customer}&cursor=garbage!`), 400)
    await expectProblem(await list(''), 400)
  })
})

describe('service endpoints', () => {
  test('healthz and readyz answer 200', async () => {
    expect((await server.fetch('/healthz')).status).toBe(200)
    expect((await server.fetch('/readyz')).status).toBe(200)
  })

  test('unknown routes answer 404 problem+json, whatever the method', async () => {
    await expectProblem(await server.fetch('/nope'), 404)
    await expectProblem(await server.fetch('/nope', { method: 'PUT' }), 404)
    await expectProblem(await server.fetch('/api/nope', { method: 'DELETE', headers: { authorization: 'Bearer acme-key' } }), 404)
  })

  test('a method a path does not serve: 405 problem+json with Allow, over a real socket; nothing stored', async () => {
    const url = server.listen()
    const before = await counts()
    const cases: [string, string, string][] = [
      ['PUT', '/api/payments', 'GET, HEAD, OPTIONS, POST'],
      ['DELETE', '/api/payments', 'GET, HEAD, OPTIONS, POST'],
      ['PATCH', `/api/payments/${crypto.randomUUID()}`, 'GET, HEAD, OPTIONS'],
      ['DELETE', '/api/payments/x', 'GET, HEAD, OPTIONS'],
      ['POST', '/api/payments/x', 'GET, HEAD, OPTIONS'],
      ['POST', '/healthz', 'GET, HEAD, OPTIONS'],
      ['PUT', '/readyz', 'GET, HEAD, OPTIONS'],
      ['DELETE', '/openapi.json', 'GET, HEAD, OPTIONS'],
    ]
    for (const [method, path, allow] of cases) {
      const response = await fetch(`${url}${path}`, {
        method,
        headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': crypto.randomUUID() },
        body: JSON.stringify(payment()),
      })
      const problem = await expectProblem(response, 405)
      expect(problem.code, `${method} ${path}`).toBe('method-not-allowed')
      expect(response.headers.get('allow'), `${method} ${path}`).toBe(allow)
    }
    expect(await counts()).toEqual(before)
  })

  test('HEAD answers as GET without a body; OPTIONS says what a path takes', async () => {
    const url = server.listen()
    const created = await json(await postPayment(server, payment()))
    const head = (path: string, apiKey = 'acme-key') => fetch(`${url}${path}`, { method: 'HEAD', headers: { authorization: `Bearer ${apiKey}` } })
    const health = await head('/healthz')
    expect(health.status).toBe(200)
    expect(health.headers.get('content-type')).toStartWith('application/json')
    expect(await health.text()).toBe('')
    const one = await head(`/api/payments/${created.id}`)
    expect(one.status).toBe(200)
    expect(await one.text()).toBe('')
    // As its GET: another tenant's payment is not found, no token is 401.
    expect((await head(`/api/payments/${created.id}`, 'globex-key')).status).toBe(404)
    expect((await fetch(`${url}/api/payments/${created.id}`, { method: 'HEAD' })).status).toBe(401)
    expect((await head('/nope')).status).toBe(404)
    // In process too (app.handle, without Bun's server).
    const inProcess = await server.fetch(`/api/payments/${created.id}`, { method: 'HEAD', headers: { authorization: 'Bearer acme-key' } })
    expect(inProcess.status).toBe(200)
    expect(inProcess.headers.get('content-type')).toStartWith('application/json')
    expect(await inProcess.text()).toBe('')

    const options = await fetch(`${url}/api/payments`, { method: 'OPTIONS' })
    expect(options.status).toBe(204)
    expect(options.headers.get('allow')).toBe('GET, HEAD, OPTIONS, POST')
    expect((await fetch(`${url}/nope`, { method: 'OPTIONS' })).status).toBe(404)
  })
})
