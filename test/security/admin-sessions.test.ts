/**
 * Admin sessions live on the server, over real HTTP: signing out ends the
 * session (its cookie opens nothing, not even a purge with its CSRF token),
 * 30 idle minutes end it (on the admin's clock, moved by the test: no
 * sleeping), the sessions page lists open sessions and ends one. Operators
 * are named by their token: the audit actor comes from it, never from the
 * note typed at sign-in or an X-Admin-Actor header alone.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { credential } from '../../src/admin/operators'
import { SignInThrottle } from '../../src/http/throttle'
import { createLogger } from '../../src/log'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { api, decode, getPage, keyInProcessing, postForm, signIn, startAdmin, stuckKey, type AdminServer, type Signed } from '../admin/support'

const ALICE = `alice-token-${'a'.repeat(32)}`
const BOB = `bob-token-${'b'.repeat(32)}`
const CAROL = `carol-token-${'c'.repeat(32)}`

let db: TestDatabase
let server: AdminServer
/** The admin's clock: sessions and operations read it (AdminOptions.now). */
let now = new Date('2026-06-01T12:00:00Z')
beforeAll(async () => {
  db = await createTestDatabase('security_sessions')
  server = startAdmin(db.pools, {
    // Carol's token is given by its hash, as ADMIN_TOKENS=carol:sha256:<hex> does.
    operators: [credential('alice', ALICE), credential('bob', BOB), credential('carol', `sha256:${createHash('sha256').update(CAROL).digest('hex')}`)],
    now: () => now,
    throttle: new SignInThrottle(),
    log: createLogger({ sink: () => undefined }),
  })
})
afterAll(async () => {
  await server?.stop()
  await db?.drop()
})

const opens = async (signed: Signed) => (await fetch(`${server.url}/admin`, { headers: { cookie: signed.cookie }, redirect: 'manual' })).status === 200
const minutes = (n: number) => n * 60_000

describe('signing out', () => {
  test('ends the session: the old cookie opens nothing, not even a purge with its own CSRF token', async () => {
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
      values ('acme', 'signed-out-purge-target', 'POST', '/api/payments', ${'e'.repeat(64)}, 'done', now() - interval '400 days', now() - interval '400 days', now() - interval '400 days', 201, '{}'::jsonb, '{}')`
    const alice = await signIn(server.url, '', ALICE)
    expect(await opens(alice)).toBe(true)
    const out = await postForm(server.url, '/admin/logout', { csrf: alice.csrf }, { cookie: alice.cookie })
    expect(out.status).toBe(303)
    expect(out.headers.get('set-cookie')).toContain('Max-Age=0')

    // A browser that kept the cookie (or someone who copied it):
    const page = await fetch(`${server.url}/admin`, { headers: { cookie: alice.cookie }, redirect: 'manual' })
    expect(page.status).toBe(303)
    expect(page.headers.get('location')).toStartWith('/admin/login')
    for (const path of ['/admin/purge', '/admin/expire-stale', '/admin/keys/expire', '/admin/logout']) {
      const response = await postForm(server.url, path, { csrf: alice.csrf, as_of: new Date().toISOString(), tenant: 'acme', key: 'x', lease: '1' }, { cookie: alice.cookie })
      expect({ path, status: response.status }).toEqual({ path, status: 401 })
    }
    const [left] = await db.sql`select count(*)::int as n from idempotency_key_states where key = 'signed-out-purge-target'`
    expect(left!.n).toBe(1)
    const [audit] = await db.sql`select count(*)::int as n from idempotency_audit`
    expect(audit!.n).toBe(0)
    const [rows] = await db.sql`select count(*)::int as n from admin_sessions where operator = 'alice'`
    expect(rows!.n).toBe(0)
  })
})

describe('idling', () => {
  test('30 minutes without a request end a session; a request within them keeps it open', async () => {
    now = new Date('2026-06-01T12:00:00Z')
    const bob = await signIn(server.url, '', BOB)
    now = new Date(now.getTime() + minutes(29))
    expect(await opens(bob)).toBe(true)
    // 29 + 29 minutes after sign-in, but 29 after its last use: still open.
    now = new Date(now.getTime() + minutes(29))
    expect(await opens(bob)).toBe(true)
    now = new Date(now.getTime() + minutes(30) + 1000) // SPEC: 30 idle minutes, counted here, not read from the code
    expect(await opens(bob)).toBe(false)
    // Ended means ended: coming back to the same moment does not revive it.
    now = new Date(now.getTime() - minutes(10))
    expect(await opens(bob)).toBe(false)
  })

  test('however active, a session ends 8 hours after it began', async () => {
    now = new Date('2026-06-02T08:00:00Z')
    const bob = await signIn(server.url, '', BOB)
    const started = now.getTime()
    const maxMs = minutes(8 * 60)
    for (let at = started; at < started + maxMs; at += minutes(20)) {
      now = new Date(at)
      expect(await opens(bob)).toBe(true)
    }
    now = new Date(started + maxMs + 1000)
    expect(await opens(bob)).toBe(false)
  })
})

describe('the sessions page', () => {
  test('lists open sessions (operator, address, started, last seen) and ends one: its cookie is dead, the others live', async () => {
    now = new Date('2026-06-03T09:00:00Z')
    const alice = await signIn(server.url, 'incident 4312', ALICE)
    now = new Date('2026-06-03T09:05:00Z')
    const bob = await signIn(server.url, '', BOB)
    now = new Date('2026-06-03T09:07:00Z')
    const { response, html } = await getPage(server.url, '/admin/sessions', alice)
    expect(response.status).toBe(200)
    expect(response.headers.get('cache-control')).toBe('no-store')
    const rows = [...html.matchAll(/<tr>(.*?)<\/tr>/gs)].map(([row]) => decode(row!.replace(/<[^>]+>/g, ' ').replace(/\s+/g, ' ').trim()))
    const aliceRow = rows.find((row) => row.includes('alice'))!
    expect(aliceRow).toContain('(incident 4312)')
    expect(aliceRow).toContain('this browser')
    expect(aliceRow).toContain('127.0.0.1')
    expect(aliceRow).toContain('2026-06-03 09:00:00')
    expect(aliceRow).toContain('2026-06-03 09:07:00')
    const bobRow = rows.find((row) => row.includes('bob'))!
    expect(bobRow).toContain('2026-06-03 09:05:00')
    // Sessions idle for longer than 30 minutes (the earlier tests') are not listed.
    expect(rows.filter((row) => /#\d+/.test(row))).toHaveLength(2)

    const bobId = /#(\d+)/.exec(bobRow)![1]!
    // Ending one is a state-changing form like the others: the CSRF token and the origin are checked.
    expect((await postForm(server.url, '/admin/sessions/end', { id: bobId }, { cookie: alice.cookie })).status).toBe(403)
    expect((await postForm(server.url, '/admin/sessions/end', { id: bobId, csrf: bob.csrf }, { cookie: alice.cookie })).status).toBe(403)
    expect((await postForm(server.url, '/admin/sessions/end', { id: bobId, csrf: alice.csrf }, { cookie: alice.cookie, origin: 'https://evil.example' })).status).toBe(403)
    expect(await opens(bob)).toBe(true)

    const ended = await postForm(server.url, '/admin/sessions/end', { id: bobId, csrf: alice.csrf }, { cookie: alice.cookie })
    expect(ended.status).toBe(303)
    expect(ended.headers.get('location')).toBe(`/admin/sessions?ended=${bobId}`)
    expect(await opens(bob)).toBe(false)
    expect(await opens(alice)).toBe(true)
    expect((await getPage(server.url, `/admin/sessions?ended=${bobId}`, alice)).html).toContain(`Session #${bobId} ended`)

    // Ending one's own session is signing out.
    const aliceId = /#(\d+)/.exec(aliceRow)![1]!
    const own = await postForm(server.url, '/admin/sessions/end', { id: aliceId, csrf: alice.csrf }, { cookie: alice.cookie })
    expect(own.headers.get('location')).toBe('/admin/login')
    expect(await opens(alice)).toBe(false)
  })
})

describe('operators by name', () => {
  test('the audit actor is the token\'s operator; the sign-in note and X-Admin-Actor only add to it', async () => {
    now = new Date()
    const lease1 = await stuckKey(db.sql, 'acme', 'actor-page', 3600)
    const lease2 = await stuckKey(db.sql, 'acme', 'actor-api', 3600)
    const lease3 = await stuckKey(db.sql, 'acme', 'actor-hashed', 3600)
    // Alice types "bob" as her note: she is still alice.
    const alice = await signIn(server.url, 'bob', ALICE)
    expect((await postForm(server.url, '/admin/keys/expire', { tenant: 'acme', key: 'actor-page', lease: lease1, csrf: alice.csrf }, { cookie: alice.cookie })).status).toBe(303)
    const byApi = await api(server.url, '/admin/api/keys/expire', { method: 'POST', token: BOB, body: { tenant: 'acme', key: 'actor-api', lease: lease2 }, headers: { 'x-admin-actor': 'alice' } })
    expect(byApi.status).toBe(200)
    const carol = await signIn(server.url, '', CAROL)
    expect((await postForm(server.url, '/admin/keys/expire', { tenant: 'acme', key: 'actor-hashed', lease: lease3, csrf: carol.csrf }, { cookie: carol.cookie })).status).toBe(303)
    const actors = await db.sql<{ key: string; actor: string }[]>`select key, actor from idempotency_audit where key like 'actor-%' order by id`
    expect([...actors]).toEqual([
      { key: 'actor-page', actor: 'admin:alice (bob)' },
      { key: 'actor-api', actor: 'api:bob (alice)' },
      { key: 'actor-hashed', actor: 'admin:carol' },
    ])
    for (const key of ['actor-page', 'actor-api', 'actor-hashed']) expect(await keyInProcessing(db.sql, 'acme', key)).toBe(false)
  })

  test('the page shows the operator the token named', async () => {
    const bob = await signIn(server.url, '', BOB)
    const { html } = await getPage(server.url, '/admin', bob)
    expect(html).toMatch(/<nav>.*<span>bob<\/span>/s)
  })
})

describe('behind a TLS proxy', () => {
  test('TRUST_PROXY and X-Forwarded-Proto: https make the cookie Secure and __Host-; a cookie sent twice opens nothing; without TRUST_PROXY the header is ignored', async () => {
    const proxied = startAdmin(db.pools, { operators: [credential('alice', ALICE)], trustProxy: 1, log: createLogger({ sink: () => undefined }) })
    try {
      const viaTls = await postForm(proxied.url, '/admin/login', { token: ALICE }, { headers: { 'x-forwarded-proto': 'https', 'x-forwarded-for': '203.0.113.9' } })
      expect(viaTls.status).toBe(303)
      expect(viaTls.headers.get('set-cookie')).toContain('; Secure')
      const plain = await postForm(proxied.url, '/admin/login', { token: ALICE }, { headers: { 'x-forwarded-proto': 'http' } })
      expect(plain.headers.get('set-cookie')).not.toContain('Secure')

      // Over TLS the cookie is __Host- prefixed (Secure, Path=/, no Domain: no sibling subdomain can set it),
      // and the plain name is not read there; a cookie sent twice (tossed in beside ours) opens nothing.
      const cookie = viaTls.headers.get('set-cookie')!
      expect(cookie).toMatch(/^__Host-idem_admin=[^;]+; Path=\/; HttpOnly; SameSite=Strict; Max-Age=\d+; Secure$/)
      const value = cookie.split(';')[0]!.split('=')[1]!
      const tls = { 'x-forwarded-proto': 'https', 'x-forwarded-for': '203.0.113.9' }
      const open = (cookies: string) => fetch(`${proxied.url}/admin`, { headers: { ...tls, cookie: cookies }, redirect: 'manual' })
      expect((await open(`__Host-idem_admin=${value}`)).status).toBe(200)
      expect((await open(`idem_admin=${value}`)).status).toBe(303)
      expect((await open(`__Host-idem_admin=tossed; __Host-idem_admin=${value}`)).status).toBe(303)
      expect((await open(`__Host-idem_admin=${value}; __Host-idem_admin=tossed`)).status).toBe(303)
    } finally {
      await proxied.stop()
    }
    const direct = await postForm(server.url, '/admin/login', { token: ALICE }, { headers: { 'x-forwarded-proto': 'https' } })
    expect(direct.status).toBe(303)
    expect(direct.headers.get('set-cookie')).not.toContain('Secure')
  })
})
