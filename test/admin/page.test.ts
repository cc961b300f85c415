/** The page and the JSON API over real HTTP: listing, filters, search, counts, keyset pages, auto-refresh, hostile keys shown escaped. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { api, decode, getPage, keyInProcessing, postForm, signIn, startAdmin, stuckKey, type AdminServer, type Signed } from './support'

/** Keys are client-chosen (printable ASCII, no space: the table's CHECK): each of these must come back as text. */
const HOSTILE_KEYS = [
  '<script>alert(1)</script>',
  '"><img/src=x/onerror=alert(1)>',
  "'><svg/onload=alert(1)>",
  '{{7*7}}',
  '${7*7}',
  '</td></tr></table><h1>owned</h1>',
  '&lt;already-escaped&gt;',
  'javascript:alert(1)',
  '../../admin/logout',
  'a/b?c=d#e%20f',
]

let db: TestDatabase
let server: AdminServer
let admin: Signed
beforeAll(async () => {
  db = await createTestDatabase('admin_page')
  server = startAdmin(db.pools, { ttlSeconds: 30 })
  admin = await signIn(server.url, 'alice')
})
afterAll(async () => {
  await server?.stop()
  await db?.drop()
})

const page = (path: string) => getPage(server.url, path, admin)

/** The keys of the list's table, decoded as a browser would. */
function keyCells(html: string): string[] {
  const table = /<table class="cards keys">[\s\S]*?<\/table>/.exec(html)?.[0] ?? ''
  return [...table.matchAll(/<td data-label="Key" class="key"><a href="[^"]*">([^<]*)<\/a><\/td>/g)].map((match) => decode(match[1]!))
}
/** The detail links of the list, decoded (as a browser follows them). */
const detailLinks = (html: string) => [...html.matchAll(/<td data-label="Key" class="key"><a href="([^"]*)">/g)].map((match) => decode(match[1]!))
const field = (html: string, name: string) => decode(new RegExp(`name="${name}" value="([^"]*)"`).exec(html)?.[1] ?? '')

describe('hostile keys', () => {
  test('are text in the list, the detail page, the confirmation, the hidden fields, the notice and the audit trail', async () => {
    for (const key of HOSTILE_KEYS) await stuckKey(db.sql, 'acme', key)
    const { html, response } = await page('/admin?tenant=acme')
    expect(response.status).toBe(200)
    expect(keyCells(html).sort()).toEqual([...HOSTILE_KEYS].sort())
    for (const raw of ['<script>alert(1)</script>', '<img/src=x', '<svg/onload', '<h1>owned</h1>', '"><img']) expect(html).not.toContain(raw)

    // Every detail link leads to its own key, whatever the key holds (/, ?, #, %, ..).
    const links = detailLinks(html)
    for (const [index, key] of keyCells(html).entries()) {
      const detail = await page(links[index]!)
      expect({ key, status: detail.response.status }).toEqual({ key, status: 200 })
      expect(decode(/<h2>Key <span class="mono">([^<]*)<\/span>/.exec(detail.html)![1]!)).toBe(key)
      expect(detail.html).not.toContain('<script>alert(1)')
    }

    // The confirmation carries the exact key back: confirming expires that row and no other.
    const victim = HOSTILE_KEYS[1]!
    const detail = await page(links[keyCells(html).indexOf(victim)]!)
    const confirmHref = decode(/id="force-expire"\s+href="([^"]*)"/.exec(detail.html)![1]!)
    const confirm = await page(confirmHref)
    expect(field(confirm.html, 'key')).toBe(victim)
    expect(confirm.html).not.toContain('"><img')
    const expired = await postForm(server.url, '/admin/keys/expire', { csrf: admin.csrf, tenant: 'acme', key: victim, lease: field(confirm.html, 'lease'), back: field(confirm.html, 'back') }, { cookie: admin.cookie })
    expect(expired.status).toBe(303)
    expect(await keyInProcessing(db.sql, 'acme', victim)).toBe(false)
    expect(await keyInProcessing(db.sql, 'acme', HOSTILE_KEYS[0]!)).toBe(true)
    const after = await page(expired.headers.get('location')!)
    expect(after.html).toContain('Expired: the key was released')
    expect(after.html).not.toContain('"><img')
    expect(after.html).toContain('&quot;&gt;&lt;img/src=x/onerror=alert(1)&gt;')

    const audit = await page('/admin/audit?tenant=acme')
    expect([...audit.html.matchAll(/<td data-label="Key" class="key">([^<]*)<\/td>/g)].map((match) => decode(match[1]!))).toContain(victim)
    expect(audit.html).not.toContain('"><img')
    const entryHref = /<a href="(\/admin\/audit\/\d+)">/.exec(audit.html)![1]!
    const entry = await page(entryHref)
    expect(entry.response.status).toBe(200)
    expect(entry.html).not.toContain('"><img')
    expect(entry.html).toContain('&quot;&gt;&lt;img/src=x/onerror=alert(1)&gt;')
  })

  test('the page forbids scripts outright (CSP) and is not framed or cached', async () => {
    for (const path of ['/admin', '/admin/audit', '/admin/confirm/purge']) {
      const { response } = await page(path)
      const csp = response.headers.get('content-security-policy')!
      expect(csp).toContain("default-src 'none'")
      expect(csp).not.toContain('script-src')
      expect(csp).toContain("frame-ancestors 'none'")
      expect(response.headers.get('x-frame-options')).toBe('DENY')
      expect(response.headers.get('cache-control')).toBe('no-store')
      expect(response.headers.get('content-type')).toBe('text/html; charset=utf-8')
    }
  })

  test('the JSON API returns hostile keys as exact JSON strings, and finds each by its URL-encoded path', async () => {
    const response = await api(server.url, '/admin/api/keys?tenant=acme&limit=100')
    const body = await response.json() as { data: { key: string }[] }
    for (const key of HOSTILE_KEYS.filter((key) => key !== HOSTILE_KEYS[1])) expect(body.data.map((row) => row.key)).toContain(key)
    for (const key of HOSTILE_KEYS) {
      const detail = await api(server.url, `/admin/api/keys/acme/${encodeURIComponent(key)}`)
      expect({ key, status: detail.status }).toEqual({ key, status: 200 })
      expect(((await detail.json()) as { key: string }).key).toBe(key)
    }
  })

  test('keys a path cannot carry ("." and "..") are reached by query, from the page and the API', async () => {
    await stuckKey(db.sql, 'dots', '..')
    await stuckKey(db.sql, 'dots', '.')
    const { html } = await page('/admin?tenant=dots')
    const links = detailLinks(html)
    expect(links.every((link) => link.startsWith('/admin/key?'))).toBe(true)
    for (const [index, key] of keyCells(html).entries()) {
      const detail = await page(links[index]!)
      expect(decode(/<h2>Key <span class="mono">([^<]*)<\/span>/.exec(detail.html)![1]!)).toBe(key)
    }
    const viaApi = await api(server.url, '/admin/api/key?tenant=dots&key=..')
    expect(await viaApi.json()).toMatchObject({ tenant: 'dots', key: '..', status: 'processing' })
  })

  test('@kitajs/ts-html-plugin finds no XSS in the admin TSX', async () => {
    const files = [...new Bun.Glob('src/admin/**/*.tsx').scanSync('.')]
    expect(files.length).toBeGreaterThanOrEqual(5)
    const scan = Bun.spawn(['node_modules/.bin/xss-scan', ...files], { stdout: 'pipe', stderr: 'pipe' })
    const output = (await new Response(scan.stdout).text()) + (await new Response(scan.stderr).text())
    expect({ code: await scan.exited, output }).toEqual({ code: 0, output: expect.stringContaining('No XSS') })
  }, 30_000)
})

describe('listing', () => {
  test('stale keys come first, with tenant, route, age and attempts; filters and the key search narrow it', async () => {
    await stuckKey(db.sql, 'globex', 'fresh-one', 5)
    await stuckKey(db.sql, 'globex', 'stale-one', 7200)
    await stuckKey(db.sql, 'globex', 'other-route', 7300, '/api/refunds')
    await db.sql`update idempotency_keys set attempts = 3 where key = 'stale-one'`
    const { html } = await page('/admin?tenant=globex')
    expect(keyCells(html)).toEqual(['other-route', 'stale-one', 'fresh-one'])
    const staleRow = /<tr class="stale">(?:(?!<\/tr>).)*stale-one(?:(?!<\/tr>).)*<\/tr>/s.exec(html)![0]
    expect(staleRow).toContain('POST /api/payments')
    expect(staleRow).toContain('2h 00m')
    expect(staleRow).toMatch(/<td data-label="Attempts" class="num">3<\/td>/)
    expect(html).toMatch(/<tr class="">(?:(?!<\/tr>).)*fresh-one/s)

    expect(keyCells((await page('/admin?tenant=globex&stale=1')).html)).toEqual(['other-route', 'stale-one'])
    expect(keyCells((await page('/admin?tenant=globex&route=POST+/api/refunds')).html)).toEqual(['other-route'])
    expect(keyCells((await page('/admin?tenant=globex&route=/api/payments&stale=1')).html)).toEqual(['stale-one'])
    expect(keyCells((await page('/admin?key=-one')).html)).toEqual(['stale-one', 'fresh-one'])
    const bad = await page('/admin?route=not-a-route')
    expect(bad.response.status).toBe(400)
    expect(bad.html).toContain('route must look like')
  })

  test('counts follow the filters: a tenant\'s page counts that tenant only', async () => {
    await stuckKey(db.sql, 'initech', 'i-1', 600)
    await stuckKey(db.sql, 'umbrella', 'u-1', 600)
    await stuckKey(db.sql, 'umbrella', 'u-2', 600)
    const count = (html: string, label: string) => Number(new RegExp(`<b>(\\d+)</b><span>${label}`).exec(html)?.[1])
    const one = (await page('/admin?tenant=initech&stale=1')).html
    expect(count(one, 'stale')).toBe(1)
    expect(count(one, 'in processing')).toBe(1)
    expect(keyCells(one)).toEqual(['i-1'])
    const all = (await page('/admin')).html
    expect(count(all, 'stale')).toBeGreaterThan(3)
    const json = await (await api(server.url, '/admin/api/counts?tenant=umbrella')).json()
    expect(json).toMatchObject({ processing: 2, stale: 2, matching: 2, ttl_seconds: 30 })
  })

  test('keyset pages show every key exactly once, also when many share one locked_at', async () => {
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, locked_at)
      select 'paged', 'k-' || lpad(i::text, 4, '0'), 'POST', '/api/payments', repeat('b', 64), 'processing',
             timestamptz '2026-01-01 00:00:00+00' + (i / 40) * interval '1 second'
        from generate_series(1, 130) i`
    const seen: string[] = []
    let path: string | undefined = '/admin?tenant=paged'
    let pages = 0
    while (path) {
      const { html, response } = await page(path)
      expect(response.status).toBe(200)
      seen.push(...keyCells(html))
      path = /<a href="([^"]+)">Next page/.exec(html)?.[1]?.replace(/&amp;/g, '&')
      pages++
    }
    expect(pages).toBe(3)
    expect(seen).toHaveLength(130)
    expect(new Set(seen).size).toBe(130)

    // The same through the JSON API's cursor.
    const apiSeen: string[] = []
    let cursor: string | null = null
    do {
      const response = await api(server.url, `/admin/api/keys?tenant=paged&limit=30${cursor ? `&cursor=${cursor}` : ''}`)
      const body = await response.json() as { data: { key: string }[]; next_cursor: string | null }
      apiSeen.push(...body.data.map((row) => row.key))
      cursor = body.next_cursor
    } while (cursor)
    expect(apiSeen).toEqual(seen)
    expect((await page('/admin?after=bm90LWEtY3Vyc29y')).response.status).toBe(400)
    expect((await api(server.url, '/admin/api/keys?cursor=bm90LWEtY3Vyc29y')).status).toBe(400)
  })
})

describe('auto-refresh', () => {
  const refreshOf = (html: string) => decode(/<meta http-equiv="refresh" content="([^"]*)"/.exec(html)?.[1] ?? '')

  test('the list reloads itself with its own filters and page, never the notice; detail and confirmation pages never reload', async () => {
    expect(refreshOf((await page('/admin?tenant=globex&stale=1&result=1')).html)).toBe('30; url=/admin?tenant=globex&stale=1&auto=1')
    const first = (await page('/admin?tenant=paged')).html
    const next = decode(/<a href="([^"]+)">Next page/.exec(first)![1]!)
    expect(refreshOf((await page(next)).html)).toBe(`30; url=${next}&auto=1`)
    const detail = (await page('/admin/keys/globex/stale-one')).html
    expect(detail).toContain('Downstream key')
    expect(refreshOf(detail)).toBe('')
    const lease = field(detail, 'lease') || /lease=(\d+)/.exec(decode(detail))![1]!
    expect(refreshOf((await page(`/admin/confirm/expire?tenant=globex&key=stale-one&lease=${lease}`)).html)).toBe('')
    expect(refreshOf((await page('/admin/confirm/expire-stale')).html)).toBe('')
  })

  test('pausing it sticks to the filters and the pages', async () => {
    const paused = (await page('/admin?tenant=paged&refresh=off')).html
    expect(refreshOf(paused)).toBe('')
    expect(paused).toContain('Resume auto-refresh')
    expect(decode(/<a href="([^"]+)">Next page/.exec(paused)![1]!)).toContain('refresh=off')
    expect(paused).toContain('<input type="hidden" name="refresh" value="off"/>')
  })
})
