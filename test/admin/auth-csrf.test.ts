/** Who may use /admin: nobody without the token, and no other site through a signed-in browser. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { SESSION_SECONDS } from '../../src/admin/session'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { ADMIN_TOKEN } from '../support/server'
import { api, keyInProcessing, postForm, signIn, startAdmin, stuckKey, type AdminServer, type Signed } from './support'

let db: TestDatabase
let server: AdminServer
let alice: Signed
beforeAll(async () => {
  db = await createTestDatabase('admin_auth')
  server = startAdmin(db.pools)
  alice = await signIn(server.url, 'alice')
})
afterAll(async () => {
  await server?.stop()
  await db?.drop()
})

describe('without credentials', () => {
  test('/admin redirects to a sign-in page that shows no key data', async () => {
    await stuckKey(db.sql, 'acme', 'secret-key-visible-only-to-admins')
    const response = await fetch(`${server.url}/admin`, { redirect: 'manual' })
    expect(response.status).toBe(303)
    expect(response.headers.get('location')).toBe('/admin/login?next=%2Fadmin')
    for (const path of ['/admin/login', '/admin/audit?x=1', '/admin/confirm/expire-stale', '/admin/keys/acme/secret-key-visible-only-to-admins',
      '/admin/key?tenant=acme&key=secret-key-visible-only-to-admins', '/admin/audit/1', '/admin/no-such-page', '/admin?route=not-a-route']) {
      const page = await fetch(`${server.url}${path}`)
      // The sign-in form echoes the address asked for (to go there after); beyond it, nothing of the key.
      const html = (await page.text()).replace(/name="next" value="[^"]*"/, '')
      expect(html).not.toContain('secret-key-visible-only-to-admins')
      expect(html).not.toContain('a'.repeat(64))
      expect(new URL(page.url).pathname).toBe('/admin/login')
      expect(html).toContain('name="token"')
    }
  })

  test('/admin/api answers 401 problem+json with a Bearer challenge, for no token and a wrong one', async () => {
    // A server of its own: its 9 wrong tokens stay under the sign-in throttle's 10 (test/security/admin-throttle.test.ts).
    const own = startAdmin(db.pools)
    try {
      const paths = [['GET', '/admin/api/keys'], ['GET', '/admin/api/audit'], ['POST', '/admin/api/keys/expire-stale'], ['GET', '/admin/api/nope'],
        ['GET', '/admin/api/keys/acme/secret-key-visible-only-to-admins'], ['GET', '/admin/api/keys?limit=not-a-number'], ['POST', '/admin/api/purge']] as const
      const attempts: [string | null, string, string][] = paths.map(([method, path]) => [null, method, path])
      for (const token of ['wrong-token-123', `${ADMIN_TOKEN}x`, 'acme-key']) for (const [method, path] of [paths[0], paths[3], paths[6]]) attempts.push([token, method, path])
      for (const [token, method, path] of attempts) {
        const response = await api(own.url, path, { token, method, ...(method === 'POST' ? { body: {} } : {}) })
        expect({ token, path, status: response.status }).toEqual({ token, path, status: 401 })
        expect(response.headers.get('content-type')).toStartWith('application/problem+json')
        expect(response.headers.get('www-authenticate')).toContain('Bearer')
        expect(await response.text()).not.toContain('secret-key')
      }
    } finally {
      await own.stop()
    }
  })

  test('the session cookie does not open the JSON API (it is Bearer only: nothing for a foreign page to ride on)', async () => {
    const response = await fetch(`${server.url}/admin/api/keys`, { headers: { cookie: alice.cookie } })
    expect(response.status).toBe(401)
  })

  test('a wrong token at sign-in sets no cookie', async () => {
    const response = await postForm(server.url, '/admin/login', { token: 'not-the-token', name: 'mallory' })
    expect(response.status).toBe(401)
    expect(response.headers.get('set-cookie')).toBeNull()
  })

  test('sign-in from another site is refused (login CSRF)', async () => {
    const response = await postForm(server.url, '/admin/login', { token: ADMIN_TOKEN, name: 'x' }, { origin: 'https://evil.example' })
    expect(response.status).toBe(403)
    expect(response.headers.get('set-cookie')).toBeNull()
  })

  test('after signing in, the operator lands on the page asked for (an alert\'s filtered link), and never off /admin', async () => {
    const asked = await fetch(`${server.url}/admin?tenant=acme&stale=1`, { redirect: 'manual' })
    const login = await fetch(`${server.url}${asked.headers.get('location')}`)
    const next = /name="next" value="([^"]*)"/.exec(await login.text())![1]!.replace(/&amp;/g, '&')
    expect(next).toBe('/admin?tenant=acme&stale=1')
    const signedIn = await postForm(server.url, '/admin/login', { token: ADMIN_TOKEN, name: 'dave', next })
    expect(signedIn.headers.get('location')).toBe('/admin?tenant=acme&stale=1')
    for (const evil of ['https://evil.example/admin', '//evil.example/admin', '/\\evil.example', '/adminx', '/api/payments']) {
      const response = await postForm(server.url, '/admin/login', { token: ADMIN_TOKEN, name: 'dave', next: evil })
      expect({ evil, location: response.headers.get('location') }).toEqual({ evil, location: '/admin' })
    }
  })

  test('the cookie is HttpOnly, SameSite=Strict, scoped to /admin, and expires', async () => {
    const response = await postForm(server.url, '/admin/login', { token: ADMIN_TOKEN, name: 'bob' })
    const cookie = response.headers.get('set-cookie')!
    expect(cookie).toContain('HttpOnly')
    expect(cookie).toContain('SameSite=Strict')
    expect(cookie).toContain('Path=/admin')
    expect(cookie).toContain(`Max-Age=${SESSION_SECONDS}`)
  })
})

describe('signed in', () => {
  test('an unknown page is a 404 page, a bad filter a 400 naming it, an unknown key a 404', async () => {
    const get = (path: string) => fetch(`${server.url}${path}`, { headers: { cookie: alice.cookie }, redirect: 'manual' })
    expect((await get('/admin/no-such-page')).status).toBe(404)
    const bad = await get('/admin/audit?action=drop_table')
    expect(bad.status).toBe(400)
    expect(await bad.text()).toContain('action must be one of')
    expect((await get('/admin/keys/acme/never-claimed')).status).toBe(404)
    expect((await api(server.url, '/admin/api/keys/acme/never-claimed')).status).toBe(404)
  })
})

describe('tampered cookies', () => {
  test('a changed, truncated or made-up session token is no session', async () => {
    const [name, token] = alice.cookie.split('=') as [string, string]
    const changed = (at: number) => `${token.slice(0, at)}${token[at] === 'A' ? 'B' : 'A'}${token.slice(at + 1)}`
    const forged = [
      `${name}=${changed(0)}`,
      `${name}=${changed(42)}`,
      `${name}=${token.slice(0, 42)}`,
      `${name}=${token}x`,
      `${name}=${Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString('base64url')}`,
      'idem_admin=garbage',
      'idem_admin=',
    ]
    for (const cookie of forged) {
      const response = await fetch(`${server.url}/admin`, { headers: { cookie }, redirect: 'manual' })
      expect({ cookie, status: response.status }).toEqual({ cookie, status: 303 })
      expect(response.headers.get('location')).toStartWith('/admin/login')
    }
    const genuine = await fetch(`${server.url}/admin`, { headers: { cookie: alice.cookie }, redirect: 'manual' })
    expect(genuine.status).toBe(200)
  })

  test('the database keeps only the token\'s hash', async () => {
    const token = alice.cookie.split('=')[1]!
    const rows = await db.sql<{ token_hash: Buffer }[]>`select token_hash from admin_sessions`
    expect(rows.length).toBeGreaterThan(0)
    for (const row of rows) expect(Buffer.from(row.token_hash).toString('base64url')).not.toBe(token)
    const [found] = await db.sql`select count(*)::int as n from admin_sessions where token_hash = sha256(convert_to(${token}, 'UTF8'))`
    expect(found!.n).toBe(1)
  })
})

describe('CSRF on state-changing forms', () => {
  test('force-expire without the token, with a wrong one, with another session\'s, or from another site does nothing', async () => {
    const lease = await stuckKey(db.sql, 'acme', 'csrf-target')
    const bob = await signIn(server.url, 'bob')
    const fields = { tenant: 'acme', key: 'csrf-target', lease }
    const attempts: [string, Promise<Response>][] = [
      ['no token', postForm(server.url, '/admin/keys/expire', fields, { cookie: alice.cookie })],
      ['wrong token', postForm(server.url, '/admin/keys/expire', { ...fields, csrf: 'x'.repeat(43) }, { cookie: alice.cookie })],
      ['other session\'s token', postForm(server.url, '/admin/keys/expire', { ...fields, csrf: bob.csrf }, { cookie: alice.cookie })],
      ['cross-site Origin', postForm(server.url, '/admin/keys/expire', { ...fields, csrf: alice.csrf }, { cookie: alice.cookie, origin: 'https://evil.example' })],
      ['Origin null', postForm(server.url, '/admin/keys/expire', { ...fields, csrf: alice.csrf }, { cookie: alice.cookie, origin: 'null' })],
      ['Sec-Fetch-Site cross-site', postForm(server.url, '/admin/keys/expire', { ...fields, csrf: alice.csrf }, { cookie: alice.cookie, origin: null, headers: { 'sec-fetch-site': 'cross-site' } })],
      ['no session', postForm(server.url, '/admin/keys/expire', { ...fields, csrf: alice.csrf })],
    ]
    for (const [label, attempt] of attempts) {
      const response = await attempt
      expect({ label, status: response.status }).toEqual({ label, status: label === 'no session' ? 401 : 403 })
    }
    expect(await keyInProcessing(db.sql, 'acme', 'csrf-target')).toBe(true)
    const [audit] = await db.sql`select count(*)::int as n from idempotency_audit where key = 'csrf-target'`
    expect(audit!.n).toBe(0)

    const allowed = await postForm(server.url, '/admin/keys/expire', { ...fields, csrf: alice.csrf }, { cookie: alice.cookie, headers: { 'sec-fetch-site': 'same-origin' } })
    expect(allowed.status).toBe(303)
    expect(await keyInProcessing(db.sql, 'acme', 'csrf-target')).toBe(false)
  })

  test('expire-all-stale, purge and sign-out check the token and the origin too', async () => {
    await stuckKey(db.sql, 'acme', 'csrf-stale-target')
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
      values ('acme', 'csrf-old-done', 'POST', '/api/payments', ${'e'.repeat(64)}, 'done', now() - interval '2 days', now() - interval '2 days', now() - interval '2 days', 201, '{}'::jsonb, '{}')`
    const refused = [
      await postForm(server.url, '/admin/expire-stale', { as_of: new Date().toISOString() }, { cookie: alice.cookie }),
      await postForm(server.url, '/admin/expire-stale', { as_of: new Date().toISOString(), csrf: alice.csrf }, { cookie: alice.cookie, origin: 'https://evil.example' }),
      await postForm(server.url, '/admin/purge', {}, { cookie: alice.cookie }),
      await postForm(server.url, '/admin/purge', { csrf: alice.csrf }, { cookie: alice.cookie, headers: { 'sec-fetch-site': 'cross-site' }, origin: null }),
      await postForm(server.url, '/admin/logout', {}, { cookie: alice.cookie, origin: 'https://evil.example' }),
    ]
    expect(refused.map((response) => response.status)).toEqual([403, 403, 403, 403, 403])
    expect(await keyInProcessing(db.sql, 'acme', 'csrf-stale-target')).toBe(true)
    const [done] = await db.sql`select count(*)::int as n from idempotency_key_states where key = 'csrf-old-done'`
    expect(done!.n).toBe(1)
    const purged = await postForm(server.url, '/admin/purge', { csrf: alice.csrf }, { cookie: alice.cookie })
    expect(purged.status).toBe(303)
    const [gone] = await db.sql`select count(*)::int as n from idempotency_key_states where key = 'csrf-old-done'`
    expect(gone!.n).toBe(0)
  })

  test('sign-out clears the cookie', async () => {
    const carol = await signIn(server.url, 'carol')
    const response = await postForm(server.url, '/admin/logout', { csrf: carol.csrf }, { cookie: carol.cookie })
    expect(response.status).toBe(303)
    expect(response.headers.get('set-cookie')).toContain('Max-Age=0')
  })
})
