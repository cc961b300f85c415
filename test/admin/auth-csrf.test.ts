/** Who may use /admin: nobody without the token, and no other site through a signed-in browser. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { SessionKeys, SESSION_SECONDS } from '../../src/admin/session'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { ADMIN_TOKEN, startServer, type ServerProcess } from '../support/server'
import { api, keyInProcessing, postForm, signIn, stuckKey, type Signed } from './support'

let db: TestDatabase
let server: ServerProcess
let alice: Signed
beforeAll(async () => {
  db = await createTestDatabase('admin_auth')
  server = await startServer(db.url)
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
    expect(response.headers.get('location')).toBe('/admin/login')
    for (const path of ['/admin/login', '/admin/audit?x=1', '/admin/expire-stale']) {
      const page = await fetch(`${server.url}${path}`)
      const html = await page.text()
      expect(html).not.toContain('secret-key-visible-only-to-admins')
      expect(page.url).toEndWith('/admin/login')
      expect(html).toContain('name="token"')
    }
  })

  test('/admin/api answers 401 problem+json with a Bearer challenge, for no token and a wrong one', async () => {
    for (const token of [null, 'wrong-token-123', `${ADMIN_TOKEN}x`, 'acme-key']) {
      for (const [method, path] of [['GET', '/admin/api/keys'], ['GET', '/admin/api/audit'], ['POST', '/admin/api/keys/expire-stale'], ['GET', '/admin/api/nope']]) {
        const response = await api(server.url, path!, { token, method: method!, ...(method === 'POST' ? { body: {} } : {}) })
        expect(response.status).toBe(401)
        expect(response.headers.get('content-type')).toStartWith('application/problem+json')
        expect(response.headers.get('www-authenticate')).toContain('Bearer')
        expect(await response.text()).not.toContain('secret-key')
      }
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

  test('the cookie is HttpOnly, SameSite=Strict, scoped to /admin, and expires', async () => {
    const response = await postForm(server.url, '/admin/login', { token: ADMIN_TOKEN, name: 'bob' })
    const cookie = response.headers.get('set-cookie')!
    expect(cookie).toContain('HttpOnly')
    expect(cookie).toContain('SameSite=Strict')
    expect(cookie).toContain('Path=/admin')
    expect(cookie).toContain(`Max-Age=${SESSION_SECONDS}`)
  })
})

describe('tampered cookies', () => {
  const tamper = (cookie: string, part: number, replace: (text: string) => string) => {
    const [name, value] = cookie.split('=') as [string, string]
    const parts = value.split('.')
    parts[part] = replace(parts[part]!)
    return `${name}=${parts.join('.')}`
  }

  test('a changed expiry, name, nonce or signature is no session', async () => {
    const forged = [
      tamper(alice.cookie, 0, (expires) => String(Number(expires) + 86_400)),
      tamper(alice.cookie, 1, (nonce) => `A${nonce.slice(1)}`),
      tamper(alice.cookie, 2, () => Buffer.from('root').toString('base64url')),
      tamper(alice.cookie, 3, (mac) => `${mac.slice(0, -2)}AA`),
      'idem_admin=garbage',
      'idem_admin=',
    ]
    for (const cookie of forged) {
      const response = await fetch(`${server.url}/admin`, { headers: { cookie }, redirect: 'manual' })
      expect(response.status).toBe(303)
      expect(response.headers.get('location')).toBe('/admin/login')
    }
    const genuine = await fetch(`${server.url}/admin`, { headers: { cookie: alice.cookie }, redirect: 'manual' })
    expect(genuine.status).toBe(200)
  })

  test('a session expires, and a cookie signed under another token is refused', () => {
    const keys = new SessionKeys(ADMIN_TOKEN)
    const issuedAt = Date.now()
    const { cookie } = keys.issue('carol', issuedAt)
    expect(keys.verify(cookie, issuedAt + 1000)?.name).toBe('carol')
    expect(keys.verify(cookie, issuedAt + SESSION_SECONDS * 1000 + 1000)).toBeUndefined()
    expect(new SessionKeys('another-admin-token').verify(cookie, issuedAt)).toBeUndefined()
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

  test('expire-all-stale and sign-out check the token too', async () => {
    await stuckKey(db.sql, 'acme', 'csrf-stale-target')
    const refused = await postForm(server.url, '/admin/expire-stale', { as_of: new Date().toISOString() }, { cookie: alice.cookie })
    expect(refused.status).toBe(403)
    expect(await keyInProcessing(db.sql, 'acme', 'csrf-stale-target')).toBe(true)
    const logout = await postForm(server.url, '/admin/logout', {}, { cookie: alice.cookie, origin: 'https://evil.example' })
    expect(logout.status).toBe(403)
  })

  test('sign-out clears the cookie', async () => {
    const carol = await signIn(server.url, 'carol')
    const response = await postForm(server.url, '/admin/logout', { csrf: carol.csrf }, { cookie: carol.cookie })
    expect(response.status).toBe(303)
    expect(response.headers.get('set-cookie')).toContain('Max-Age=0')
  })
})
