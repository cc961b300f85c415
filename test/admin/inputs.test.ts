/**
 * Every admin input answered by its range, never by a 500 (issue 27): ids
 * beyond bigint, a year 0, a sign-in `next` outside printable ASCII; and the
 * JSON API takes its token only with the Bearer scheme (RFC 6750).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { visibleBidi } from '../../src/characters'
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
  const [row] = await db.sql<{ lease: string; status: string }[]>`select lease::text, status from idempotency_keys where key = 'inputs-key'`
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
  expect(html).toContain('cus_&lt;U+202E&gt;gnp.exe')
  expect(html).not.toMatch(/[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/)
  expect(visibleBidi('a\u2066b\u200fc')).toBe('a<U+2066>b<U+200F>c')
})
