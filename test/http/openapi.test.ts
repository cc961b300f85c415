/**
 * GET /openapi.json (the public API) and GET /admin/api/openapi.json (the
 * admin's, behind its token) are valid OpenAPI 3.1 documents (checked by
 * @readme/openapi-parser against the OAS 3.1 schema plus its own rules:
 * duplicate operationIds and parameters, bad component names, dangling
 * $refs), they publish the running server's key expiry, and real answers of
 * the service match what they document: status, content type, required
 * headers, and the body against the documented JSON Schema (Ajv, draft
 * 2020-12 as OAS 3.1 uses, on the dereferenced document). In process
 * (app.handle), with a provider the test steers, so a 409 and a 502 are made
 * on purpose, not by timing.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { compileErrors, dereference, validate } from '@readme/openapi-parser'
import Ajv2020 from 'ajv/dist/2020'
import { loadConfig } from '../../src/config'
import { createMetrics } from '../../src/metrics/registry'
import { ProviderError, type Charge, type PaymentProvider } from '../../src/provider/client'
import { buildApp } from '../../src/server'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { waitFor } from '../support/wait'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

let db: TestDatabase
let app: ReturnType<typeof buildApp>
let down: ReturnType<typeof buildApp>
let doc: any
/** `doc` with every $ref resolved, for Ajv. */
let resolved: any
let adminDoc: any
let adminResolved: any
/** Charges for customer `hold` wait until released: the request stays in processing meanwhile. */
let releaseHeld: () => void = () => undefined
const held = new Promise<void>((resolve) => { releaseHeld = resolve })

const provider: PaymentProvider = {
  async charge(request, { signal }) {
    if (request.customer === 'refuse') throw new ProviderError('the provider refused the charge', 500)
    if (request.customer === 'hold') await held
    signal.throwIfAborted()
    return { id: `ch_${crypto.randomUUID().slice(0, 12)}`, ...request, created_at: new Date().toISOString() } satisfies Charge
  },
}

beforeAll(async () => {
  db = await createTestDatabase('openapi')
  // Not the defaults: the document must publish what this server runs with.
  const config = loadConfig({
    API_KEYS: 'acme:acme-key', ADMIN_TOKEN: 'admin-token-openapi', PAYMENT_PROVIDER_URL: 'http://provider.invalid', MAX_BODY_BYTES: '2048',
    IDEMPOTENCY_TTL_SECONDS: '20', IDEMPOTENCY_RETENTION_SECONDS: '7200',
  })
  app = buildApp({ config, pools: db.pools, metrics: createMetrics(), provider })
  down = buildApp({ config, pools: db.pools, metrics: createMetrics(), provider, health: { up: false } as never })
  doc = await (await app.handle(new Request('http://api.test/openapi.json'))).json()
  resolved = await dereference(structuredClone(doc))
  adminDoc = await (await app.handle(get('/admin/api/openapi.json', { authorization: 'Bearer admin-token-openapi' }))).json()
  adminResolved = await dereference(structuredClone(adminDoc))
})
afterAll(async () => {
  releaseHeld()
  await db?.drop()
})

const ajv = new Ajv2020({ strict: false, allErrors: true })
// RFC 3339's date-time, as OAS 3.1 means it (Ajv checks no format by itself).
ajv.addFormat('date-time', /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/i)

const post = (body: unknown, headers: Record<string, string> = {}) => new Request('http://api.test/api/payments', {
  method: 'POST',
  headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': crypto.randomUUID(), ...headers },
  body: typeof body === 'string' ? body : JSON.stringify(body),
})
const get = (path: string, headers: Record<string, string> = { authorization: 'Bearer acme-key' }) => new Request(`http://api.test${path}`, { headers })
const order = (customer = 'cus_doc') => ({ amount: 1250, currency: 'EUR', customer })

/** Checks `response` against the documented answer of `path`/`method` for its status; returns the body. */
async function expectDocumented(path: string, method: string, response: Response, document = path.startsWith('/admin/') ? adminResolved : resolved): Promise<any> {
  const documented = document.paths[path]?.[method]?.responses?.[String(response.status)]
  expect(documented, `${method.toUpperCase()} ${path} does not document ${response.status}`).toBeDefined()
  for (const [name, header] of Object.entries<any>(documented.headers ?? {}))
    if (header.required) expect(response.headers.get(name), `${response.status} documents the header ${name}`).not.toBeNull()
  const mediaType = (response.headers.get('content-type') ?? '').split(';')[0]!.trim()
  const content = documented.content?.[mediaType]
  expect(content, `${response.status} documents no ${mediaType} body (it documents ${Object.keys(documented.content ?? {})})`).toBeDefined()
  const text = await response.text()
  if (mediaType === 'text/plain') return text
  const body = JSON.parse(text)
  const check = ajv.compile(content.schema)
  expect(check(body) ? [] : check.errors).toEqual([])
  return body
}

test('both documents are valid OpenAPI 3.1', async () => {
  for (const document of [doc, adminDoc]) {
    expect(document.openapi).toStartWith('3.1.')
    const result = await validate(structuredClone(document))
    if (!result.valid) throw new Error(compileErrors(result))
    expect(result.valid).toBe(true)
  }
})

test('the key expiry the server runs with is published: in words and as x-idempotency', () => {
  const key = doc.paths['/api/payments'].post.parameters.find((parameter: any) => parameter.name === 'Idempotency-Key')
  expect(key['x-idempotency']).toMatchObject({ retentionSeconds: 7200, ttlSeconds: 20, scope: 'tenant' })
  expect(key.description).toContain('7200 s (2 h)')
  expect(key.description).toContain('20 s')
  expect(doc['x-idempotency']).toMatchObject({ retentionSeconds: 7200, ttlSeconds: 20 })
  expect(doc.info.description).toContain('7200 s (2 h)')
})

test('named component schemas, date-times, identifier operationIds', () => {
  expect(Object.keys(doc.components.schemas).sort()).toEqual(['NewPayment', 'Payment', 'PaymentPage', 'Problem'])
  expect(doc.components.schemas.Payment.properties.created_at).toMatchObject({ type: 'string', format: 'date-time' })
  expect(doc.components.schemas.PaymentPage.properties.data.items).toEqual({ $ref: '#/components/schemas/Payment' })
  const post = doc.paths['/api/payments'].post
  expect(post.requestBody.content['application/json'].schema).toEqual({ $ref: '#/components/schemas/NewPayment' })
  expect(post.responses['201'].content['application/json'].schema).toEqual({ $ref: '#/components/schemas/Payment' })
  expect(doc.paths['/api/payments'].get.responses['200'].content['application/json'].schema).toEqual({ $ref: '#/components/schemas/PaymentPage' })
  expect(post.responses['409'].content['application/problem+json'].schema.allOf[0]).toEqual({ $ref: '#/components/schemas/Problem' })
  const ids = [doc, adminDoc].flatMap((document) => Object.values<any>(document.paths).flatMap((item) => Object.values<any>(item).map((operation) => operation.operationId)))
  expect(ids.filter((id) => !/^[A-Za-z][A-Za-z0-9]*$/.test(id))).toEqual([])
  expect(new Set(ids).size).toBe(ids.length)
  expect(adminDoc.paths['/admin/api/keys/expire-stale'].post.operationId).toBe('expireStaleKeys')
})

test('POST /api/payments declares its header, its body and every answer', () => {
  const operation = resolved.paths['/api/payments'].post
  const key = operation.parameters.find((parameter: any) => parameter.name === 'Idempotency-Key')
  expect(key).toMatchObject({ in: 'header', required: true })
  // The key bare, or as an sf-string: both forms are documented, and checked against real values.
  const field = ajv.compile(key.schema)
  for (const value of ['k-1', '"k-1"', '"k-1";x=1']) expect(field(value), value).toBe(true)
  for (const value of ['has space', '']) expect(field(value), value).toBe(false)
  expect(operation.requestBody.content['application/json'].schema).toMatchObject({
    type: 'object',
    additionalProperties: false,
    required: ['amount', 'currency', 'customer'],
  })
  expect(Object.keys(operation.responses).sort()).toEqual(['201', '400', '401', '409', '413', '415', '422', '500', '502', '503', '504'])
  expect(operation.responses['201'].headers.Location.required).toBe(true)
  expect(operation.responses['201'].headers['Idempotent-Replayed']).toBeDefined()
  expect(operation.responses['409'].headers['Retry-After'].required).toBe(true)
  for (const status of ['400', '401', '409', '413', '415', '422', '500', '502', '503', '504'])
    expect(Object.keys(operation.responses[status].content)).toEqual(['application/problem+json'])
})

test('the GETs, health and metrics are in the public document; the admin JSON API in its own, behind its token', async () => {
  for (const path of ['/api/payments/{id}', '/healthz', '/readyz', '/metrics']) expect(doc.paths[path]?.get, path).toBeDefined()
  expect(doc.paths['/api/payments'].get).toBeDefined()
  expect(Object.keys(doc.paths).filter((path) => path.startsWith('/admin'))).toEqual([])
  expect(Object.keys(doc.components.securitySchemes)).toEqual(['apiKey'])
  for (const [path, method] of [['/admin/api/keys', 'get'], ['/admin/api/keys/{tenant}/{key}', 'get'], ['/admin/api/counts', 'get'], ['/admin/api/audit', 'get'],
    ['/admin/api/keys/expire', 'post'], ['/admin/api/keys/expire-stale', 'post'], ['/admin/api/purge', 'post']] as const) {
    expect(adminDoc.paths[path]?.[method], `${method} ${path}`).toMatchObject({ tags: ['admin'], security: [{ adminToken: [] }] })
    expect(adminDoc.paths[path][method].responses['401'], `${method} ${path}`).toBeDefined()
  }
  expect(adminDoc.paths['/admin/api/keys/expire'].post.requestBody.content['application/json'].schema.required).toEqual(['tenant', 'key', 'lease'])
  expect(adminDoc.paths['/admin/api/keys/expire'].post.responses['409']).toBeDefined()
  // Only the JSON API: the HTML admin pages are not an API, and the document does not describe itself.
  expect(Object.keys(adminDoc.paths).filter((path) => !path.startsWith('/admin/api/') || path.endsWith('openapi.json'))).toEqual([])
  // Without the token: 401, like any admin API call.
  for (const headers of [{}, { authorization: 'Bearer wrong' }]) {
    const refused = await app.handle(get('/admin/api/openapi.json', headers))
    expect(refused.status).toBe(401)
    expect(await refused.text()).not.toContain('/admin/api/keys')
  }
})

describe('real answers match the document', () => {
  const path = '/api/payments'

  test('201 with Location, then its replay with Idempotent-Replayed', async () => {
    const key = `doc-${crypto.randomUUID()}`
    const first = await app.handle(post(order(), { 'idempotency-key': key }))
    expect(first.status).toBe(201)
    const created = await expectDocumented(path, 'post', first.clone())
    expect(first.headers.get('location')).toBe(`/api/payments/${created.id}`)
    const again = await app.handle(post(order(), { 'idempotency-key': key }))
    expect(again.status).toBe(201)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(await expectDocumented(path, 'post', again)).toEqual(created)

    const one = await app.handle(get(`/api/payments/${created.id}`))
    expect(one.status).toBe(200)
    expect(await expectDocumented('/api/payments/{id}', 'get', one)).toEqual(created)
    const list = await app.handle(get('/api/payments?customer=cus_doc&limit=1'))
    expect(list.status).toBe(200)
    await expectDocumented('/api/payments', 'get', list)
  })

  test('409 with Retry-After while the first is in flight, 422 for another request under the key', async () => {
    const key = `held-${crypto.randomUUID()}`
    const first = app.handle(post(order('hold'), { 'idempotency-key': key }))
    await waitFor(async () => (await db.sql`select 1 from idempotency_key_states where key = ${key} and status = 'processing'`).length === 1, 'the first request to claim its key')
    const busy = await app.handle(post(order('hold'), { 'idempotency-key': key }))
    expect(busy.status).toBe(409)
    expect((await expectDocumented(path, 'post', busy)).code).toBe('in-progress')
    const other = await app.handle(post(order('someone-else'), { 'idempotency-key': key }))
    expect(other.status).toBe(422)
    expect((await expectDocumented(path, 'post', other)).code).toBe('idempotency-key-reused')
    releaseHeld()
    expect((await first).status).toBe(201)
  })

  test('400, 401, 413, 415', async () => {
    const cases: [Request, number, string][] = [
      [post(order(), { 'idempotency-key': 'has space' }), 400, 'invalid-idempotency-key'],
      [post(order(), { 'idempotency-key': '"unterminated' }), 400, 'invalid-idempotency-key'],
      [post({ ...order(), amount: 0 }), 400, 'invalid-body'],
      [post('{"amount":'), 400, 'invalid-json'],
      [post(order(), { authorization: 'Bearer nope' }), 401, 'unauthorized'],
      [post({ ...order(), description: 'x'.repeat(3000) }), 413, 'body-too-large'],
      [post(order(), { 'content-type': 'text/plain' }), 415, 'unsupported-media-type'],
    ]
    for (const [request, status, code] of cases) {
      const response = await app.handle(request)
      expect(response.status).toBe(status)
      expect((await expectDocumented(path, 'post', response)).code).toBe(code)
    }
  })

  test('5xx: the provider refuses (502), the database is away (503)', async () => {
    const refused = await app.handle(post(order('refuse')))
    expect(refused.status).toBe(502)
    expect((await expectDocumented(path, 'post', refused)).code).toBe('provider-failed')
    const away = await down.handle(post(order()))
    expect(away.status).toBe(503)
    expect((await expectDocumented(path, 'post', away)).code).toBe('database-unavailable')
  })

  test('GET answers: 404, 400, 401, health, metrics', async () => {
    const missing = await app.handle(get(`/api/payments/${crypto.randomUUID()}`))
    expect(missing.status).toBe(404)
    await expectDocumented('/api/payments/{id}', 'get', missing)
    const badQuery = await app.handle(get('/api/payments?customer=c&limit=1000'))
    expect(badQuery.status).toBe(400)
    await expectDocumented('/api/payments', 'get', badQuery)
    const anonymous = await app.handle(get('/api/payments/x', {}))
    expect(anonymous.status).toBe(401)
    await expectDocumented('/api/payments/{id}', 'get', anonymous)
    await expectDocumented('/healthz', 'get', await app.handle(get('/healthz')))
    await expectDocumented('/readyz', 'get', await app.handle(get('/readyz')))
    await expectDocumented('/metrics', 'get', await app.handle(get('/metrics')))
  })
})

test('admin JSON API answers match the document', async () => {
  const admin = { authorization: 'Bearer admin-token-openapi' }
  const counts = await app.handle(get('/admin/api/counts', admin))
  expect(counts.status).toBe(200)
  await expectDocumented('/admin/api/counts', 'get', counts)
  const keys = await app.handle(get('/admin/api/keys?stale=1', admin))
  expect(keys.status).toBe(200)
  await expectDocumented('/admin/api/keys', 'get', keys)
  const anonymous = await app.handle(get('/admin/api/counts', {}))
  expect(anonymous.status).toBe(401)
  await expectDocumented('/admin/api/counts', 'get', anonymous)
  const missing = await app.handle(get('/admin/api/keys/acme/no-such-key', admin))
  expect(missing.status).toBe(404)
  await expectDocumented('/admin/api/keys/{tenant}/{key}', 'get', missing)
  const expire = (body: string) => app.handle(new Request('http://api.test/admin/api/keys/expire', { method: 'POST', headers: { ...admin, 'content-type': 'application/json' }, body }))
  const malformed = await expire('{"tenant":"acme"}')
  expect(malformed.status).toBe(400)
  await expectDocumented('/admin/api/keys/expire', 'post', malformed)
  const purge = await app.handle(new Request('http://api.test/admin/api/purge', { method: 'POST', headers: { ...admin, 'content-type': 'application/json' }, body: '{}' }))
  expect(purge.status).toBe(200)
  await expectDocumented('/admin/api/purge', 'post', purge)
})

test('/docs is a page that loads the document', async () => {
  const page = await app.handle(new Request('http://api.test/docs'))
  expect(page.status).toBe(200)
  expect(page.headers.get('content-type')).toStartWith('text/html')
  expect(await page.text()).toContain('openapi.json')
})

// Catches: a document a generated client cannot find its base URL in, or operations with no 4XX answer documented (Redocly's recommended rules).
test('both documents name their server, and every operation documents a 4XX answer', () => {
  for (const document of [doc, adminDoc] as { servers?: { url: string; description?: string }[]; paths: Record<string, Record<string, { responses: Record<string, unknown> }>> }[]) {
    expect(document.servers).toEqual([{ url: '/', description: expect.any(String) }])
    const without = Object.entries(document.paths).flatMap(([path, operations]) => Object.entries(operations)
      .filter(([, operation]) => typeof operation === 'object' && operation !== null && 'responses' in operation && !Object.keys(operation.responses).some((status) => /^4(\d\d|XX)$/.test(status)))
      .map(([method]) => `${method} ${path}`))
    expect(without).toEqual([])
  }
})

// Catches: a document Redocly's recommended rules refuse (no servers, no license, an operation without a 4XX answer, ...).
test('both documents pass `redocly lint` (recommended rules) with no error or warning', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'idem-redocly-'))
  try {
    const files = { 'public.json': doc, 'admin.json': adminDoc }
    for (const [name, document] of Object.entries(files)) writeFileSync(join(dir, name), JSON.stringify(document))
    const lint = Bun.spawn(['node', join(import.meta.dir, '..', '..', 'node_modules', '@redocly', 'cli', 'bin', 'cli.js'), 'lint', '--extends=recommended', ...Object.keys(files)],
      { cwd: dir, stdout: 'pipe', stderr: 'pipe', env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true', NO_COLOR: '1' } })
    const [out, err, code] = await Promise.all([new Response(lint.stdout).text(), new Response(lint.stderr).text(), lint.exited])
    const said = `${out}${err}`
    // Problems are listed per file and summed up as "You have N warnings"; the CLI's own notices (a Node.js deprecation) are not the documents'.
    const clean = code === 0 && said.includes('Your API descriptions are valid') && !/You have \d+ warnings?/.test(said)
    expect({ code, said: clean ? '' : said }).toEqual({ code: 0, said: '' })
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}, 60_000)
