/**
 * Every admin input answered by its range, never by a 500 (issue 27): ids
 * beyond bigint, a year 0, a sign-in `next` outside printable ASCII; and the
 * JSON API takes its token only with the Bearer scheme (RFC 6750).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { visibleText } from '../../src/characters'
import { RELEASE_REASONS } from '../../src/core/release'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { ADMIN_TOKEN } from '../support/server'
import { api, getPage, postForm, signIn, startAdmin, stuckKey, type AdminServer } from './support'

let db: TestDatabase
let admin: AdminServer
beforeAll(async () => {
  db = await createTestDatabase('admin_inputs')
  admin = startAdmin(db.pools)
})
afterAll(async () => {
  await admin?.stop()
  await db?.drop()
})

const BEYOND_BIGINT = '9999999999999999999'

test('the JSON API wants the Bearer scheme: a bare token is refused as no token at all', async () => {
  const bare = await api(admin.url, '/admin/api/counts', { token: null, headers: { authorization: ADMIN_TOKEN } })
  expect(bare.status).toBe(401)
  expect(bare.headers.get('www-authenticate')).toContain('Bearer')
  expect((await api(admin.url, '/admin/api/counts')).status).toBe(200)
})

test('ids beyond bigint and a year 0 are 400 problems in the JSON API, not 500s', async () => {
  const lease = await stuckKey(db.sql, 'acme', 'inputs-key')
  const answers = await Promise.all([
    api(admin.url, `/admin/api/audit/${BEYOND_BIGINT}`),
    api(admin.url, '/admin/api/keys/expire', { method: 'POST', body: { tenant: 'acme', key: 'inputs-key', lease: BEYOND_BIGINT } }),
    api(admin.url, '/admin/api/keys/expire-stale', { method: 'POST', body: { as_of: '0000-01-01T00:00:00Z' } }),
  ])
  for (const answer of answers) {
    expect(answer.status).toBe(400)
    expect(answer.headers.get('content-type')).toStartWith('application/problem+json')
  }
  // Nothing happened to the key.
  const [row] = await db.sql<{ lease: string; status: string }[]>`select lease::text, status from idempotency_key_states where key = 'inputs-key'`
  expect(row).toEqual({ lease, status: 'processing' })
})

test('the same values in the HTML admin: an answer of 400, never a 500', async () => {
  const signed = await signIn(admin.url)
  expect((await getPage(admin.url, `/admin/audit/${BEYOND_BIGINT}`, signed)).response.status).toBe(400)
  const end = await postForm(admin.url, '/admin/sessions/end', { csrf: signed.csrf, id: BEYOND_BIGINT }, { cookie: signed.cookie })
  expect(end.status).toBeLessThan(500)
  const stale = await postForm(admin.url, '/admin/expire-stale', { csrf: signed.csrf, as_of: '0000-01-01T00:00:00Z' }, { cookie: signed.cookie })
  expect(stale.status).toBe(400)
})

test('a sign-in `next` outside printable ASCII signs in to /admin instead of breaking the sign-in', async () => {
  const response = await postForm(admin.url, '/admin/login', { token: ADMIN_TOKEN, next: '/admin/😀' })
  expect(response.status).toBe(303)
  expect(response.headers.get('location')).toBe('/admin')
  const page = await fetch(`${admin.url}/admin/login?next=${encodeURIComponent('/admin/😀')}`)
  expect(page.status).toBe(200)
  expect(await page.text()).not.toContain('😀')
})

test('the released list takes every reason a release records, the ones its counts report (the page links each)', async () => {
  const signed = await signIn(admin.url)
  for (const reason of RELEASE_REASONS) {
    const listed = await api(admin.url, `/admin/api/released?reason=${reason}`)
    expect({ reason, status: listed.status }).toEqual({ reason, status: 200 })
    expect(Object.keys(((await listed.json()) as { counts: Record<string, number> }).counts).sort()).toEqual([...RELEASE_REASONS].sort())
    expect({ reason, status: (await getPage(admin.url, `/admin/released?reason=${reason}`, signed)).response.status }).toEqual({ reason, status: 200 })
  }
  expect((await api(admin.url, '/admin/api/released?reason=nonsense')).status).toBe(400)
})

test('bidi controls in client-chosen text (a request summary) are written out on the admin page, never shown raw', async () => {
  const signed = await signIn(admin.url)
  await stuckKey(db.sql, 'acme', 'bidi-key')
  await db.sql`update idempotency_keys set summary = ${db.sql.json({ customer: 'cus_\u202Egnp.exe', amount: 100 })} where key = 'bidi-key'`
  const { response, html } = await getPage(admin.url, '/admin/keys/acme/bidi-key', signed)
  expect(response.status).toBe(200)
  expect(html).toContain('cus_\\u202egnp.exe')
  expect(html).not.toMatch(/[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/)
  expect(visibleText('a\u2066b\u200fc')).toBe('a\\u2066b\\u200fc')
})

/**
 * Every admin input, each given the values that broke one of them once (issue
 * 27, finding 6: bigint, 1e300, year 0) and their neighbours: no answer is a
 * 5xx, on the JSON API or the pages, signed in, over real HTTP. The values go
 * where a client or an operator can put them: path, query, form and JSON.
 */
test('no value in any admin input is answered 500', async () => {
  const signed = await signIn(admin.url)
  const lease = await stuckKey(db.sql, 'acme', 'matrix-key')
  const ids = [BEYOND_BIGINT, '9223372036854775808', '1e300', '1e+300', '0', '-1', '00000000000000000001', '١٢', ' 1', '']
  const instants = ['0000-01-01T00:00:00Z', '2026-02-30T00:00:00Z', '2025-02-29T12:00:00Z', '2026-01-01T24:00:00Z', '+275760-09-13T00:00:00Z', '9999-12-31T23:59:59Z', '1e300', '2026-13-01T00:00:00Z', '2026-01-01T00:00:60Z']
  const numbers = [1e300, 2 ** 63, 9.5, -1, 0, Number.MAX_SAFE_INTEGER + 2]
  const limits = ['0', '9999', '1e3', '-1', '501']
  const q = (value: string) => encodeURIComponent(value)
  const answers: [string, Promise<Response>][] = []
  const get = (path: string) => answers.push([`GET ${path}`, fetch(`${admin.url}${path}`, { headers: { cookie: signed.cookie }, redirect: 'manual' })])
  const apiGet = (path: string) => answers.push([`API GET ${path}`, api(admin.url, path)])
  const apiPost = (path: string, body: unknown) => answers.push([`API POST ${path} ${JSON.stringify(body)}`, api(admin.url, path, { method: 'POST', body })])
  const form = (path: string, fields: Record<string, string>) => answers.push([`POST ${path} ${JSON.stringify(fields)}`, postForm(admin.url, path, { csrf: signed.csrf, ...fields }, { cookie: signed.cookie })])
  for (const id of ids) {
    apiGet(`/admin/api/audit/${q(id)}`)
    apiGet(`/admin/api/audit?before=${q(id)}`)
    get(`/admin/audit/${q(id)}`)
    get(`/admin/audit?before=${q(id)}`)
    get(`/admin?result=${q(id)}`)
    get(`/admin/keys/acme/matrix-key?result=${q(id)}`)
    get(`/admin/key?tenant=acme&key=matrix-key&result=${q(id)}`)
    get(`/admin/sessions?ended=${q(id)}`)
    get(`/admin/confirm/expire?tenant=acme&key=matrix-key&lease=${q(id)}`)
    apiPost('/admin/api/keys/expire', { tenant: 'acme', key: 'matrix-key', lease: id })
    form('/admin/keys/expire', { tenant: 'acme', key: 'matrix-key', lease: id })
    form('/admin/sessions/end', { id })
  }
  for (const lease of numbers) apiPost('/admin/api/keys/expire', { tenant: 'acme', key: 'matrix-key', lease })
  for (const asOf of instants) {
    apiPost('/admin/api/keys/expire-stale', { as_of: asOf, tenant: 'nobody' })
    form('/admin/expire-stale', { as_of: asOf, tenant: 'nobody' })
  }
  for (const limit of limits) {
    apiGet(`/admin/api/keys?limit=${q(limit)}`)
    apiGet(`/admin/api/audit?limit=${q(limit)}`)
    apiGet(`/admin/api/released?limit=${q(limit)}`)
  }
  const failed: string[] = []
  for (const [label, answer] of answers) {
    const status = (await answer).status
    if (status >= 500) failed.push(`${label} → ${status}`)
  }
  expect(failed).toEqual([])
  // None of it touched the key.
  const [row] = await db.sql<{ lease: string; status: string }[]>`select lease::text, status from idempotency_key_states where key = 'matrix-key'`
  expect(row).toEqual({ lease, status: 'processing' })
}, 60_000)
