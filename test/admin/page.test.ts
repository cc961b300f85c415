/** The page and the JSON API over real HTTP: listing, filters, keyset pages, hostile keys shown escaped. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer, type ServerProcess } from '../support/server'
import { api, keyInProcessing, postForm, signIn, stuckKey, type Signed } from './support'

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
]

let db: TestDatabase
let server: ServerProcess
let admin: Signed
beforeAll(async () => {
  db = await createTestDatabase('admin_page')
  server = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: '30' })
  admin = await signIn(server.url, 'alice')
})
afterAll(async () => {
  await server?.stop()
  await db?.drop()
})

const page = async (path: string) => {
  const response = await fetch(`${server.url}${path}`, { headers: { cookie: admin.cookie } })
  return { response, html: await response.text() }
}

/** The text of every <td class="key"> cell of the keys table (the audit table below it has them too), decoded as a browser would. */
function keyCells(html: string): string[] {
  const keysTable = html.split('<h2>Recent operator actions')[0]!
  return [...keysTable.matchAll(/<td class="key">([^<]*)<\/td>/g)].map((match) => decode(match[1]!))
}
function decode(text: string): string {
  return text.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;|&#34;/g, '"').replace(/&#39;|&#x27;/g, "'").replace(/&amp;/g, '&')
}

describe('hostile keys', () => {
  test('are shown escaped in the list, in hidden form fields, in the notice and in the audit trail', async () => {
    for (const key of HOSTILE_KEYS) await stuckKey(db.sql, 'acme', key)
    const { html, response } = await page('/admin?tenant=acme')
    expect(response.status).toBe(200)
    for (const key of HOSTILE_KEYS) expect(keyCells(html)).toContain(key)
    // No raw markup from a key made it into the page.
    expect(html).not.toContain('<script>alert(1)</script>')
    expect(html).not.toContain('<img/src=x')
    expect(html).not.toContain('<svg/onload')
    expect(html).not.toContain('<h1>owned</h1>')
    expect(html).not.toContain('"><img')
    // Hidden fields carry the exact key back: expiring through the form hits the right row.
    const victim = HOSTILE_KEYS[1]!
    const hidden = [...html.matchAll(/name="key" value="([^"]*)"/g)].map((match) => decode(match[1]!))
    expect(hidden).toContain(victim)
    const lease = [...html.matchAll(/name="key" value="([^"]*)"\/><input type="hidden" name="lease" value="(\d+)"/g)]
      .find((match) => decode(match[1]!) === victim)![2]!
    const expired = await postForm(server.url, '/admin/keys/expire', { csrf: admin.csrf, tenant: 'acme', key: victim, lease }, { cookie: admin.cookie })
    expect(expired.status).toBe(303)
    expect(await keyInProcessing(db.sql, 'acme', victim)).toBe(false)
    const after = await page(expired.headers.get('location')!)
    expect(after.html).toContain('Expired: the key was deleted')
    expect(after.html).not.toContain('"><img')
    expect(after.html).toContain('&quot;&gt;&lt;img/src=x/onerror=alert(1)&gt;')
    const audit = await page('/admin/audit')
    expect([...audit.html.matchAll(/<td class="key">([^<]*)<\/td>/g)].map((match) => decode(match[1]!))).toContain(victim)
    expect(audit.html).not.toContain('"><img')
  })

  test('the page forbids scripts outright (CSP) and is not framed or cached', async () => {
    const { response } = await page('/admin')
    const csp = response.headers.get('content-security-policy')!
    expect(csp).toContain("default-src 'none'")
    expect(csp).not.toContain('script-src')
    expect(csp).toContain("frame-ancestors 'none'")
    expect(response.headers.get('x-frame-options')).toBe('DENY')
    expect(response.headers.get('cache-control')).toBe('no-store')
    expect(response.headers.get('content-type')).toBe('text/html; charset=utf-8')
  })

  test('the JSON API returns hostile keys as exact JSON strings', async () => {
    const response = await api(server.url, '/admin/api/keys?tenant=acme&limit=100')
    const body = await response.json() as { data: { key: string }[] }
    for (const key of HOSTILE_KEYS.filter((key) => key !== HOSTILE_KEYS[1])) expect(body.data.map((row) => row.key)).toContain(key)
  })

  test('@kitajs/ts-html-plugin finds no XSS in the admin TSX', async () => {
    const files = [...new Bun.Glob('src/admin/*.tsx').scanSync('.')]
    expect(files.length).toBeGreaterThanOrEqual(3)
    const scan = Bun.spawn(['node_modules/.bin/xss-scan', ...files], { stdout: 'pipe', stderr: 'pipe' })
    const output = (await new Response(scan.stdout).text()) + (await new Response(scan.stderr).text())
    expect({ code: await scan.exited, output }).toEqual({ code: 0, output: expect.stringContaining('No XSS') })
  }, 30_000)
})

describe('listing', () => {
  test('stale keys come first, with tenant, route, age and attempts; filters narrow it', async () => {
    await stuckKey(db.sql, 'globex', 'fresh-one', 5)
    await stuckKey(db.sql, 'globex', 'stale-one', 7200)
    await stuckKey(db.sql, 'globex', 'other-route', 7300, '/api/refunds')
    await db.sql`update idempotency_keys set attempts = 3 where key = 'stale-one'`
    const { html } = await page('/admin?tenant=globex')
    const keys = keyCells(html)
    expect(keys).toEqual(['other-route', 'stale-one', 'fresh-one'])
    const staleRow = /<tr class="stale">(?:(?!<\/tr>).)*stale-one(?:(?!<\/tr>).)*<\/tr>/s.exec(html)![0]
    expect(staleRow).toContain('POST /api/payments')
    expect(staleRow).toContain('2h 00m')
    expect(staleRow).toMatch(/<td class="num">3<\/td>/)
    expect(html).toMatch(/<tr class="">(?:(?!<\/tr>).)*fresh-one/s)

    expect(keyCells((await page('/admin?tenant=globex&stale=1')).html)).toEqual(['other-route', 'stale-one'])
    expect(keyCells((await page('/admin?tenant=globex&route=POST+/api/refunds')).html)).toEqual(['other-route'])
    expect(keyCells((await page('/admin?tenant=globex&route=/api/payments&stale=1')).html)).toEqual(['stale-one'])
    expect((await page('/admin?route=not-a-route')).response.status).toBe(400)
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
      const body = await response.json() as { data: { key: string; stale: boolean }[]; next_cursor: string | null }
      apiSeen.push(...body.data.map((row) => row.key))
      cursor = body.next_cursor
    } while (cursor)
    expect(apiSeen).toEqual(seen)
    expect((await page('/admin?after=bm90LWEtY3Vyc29y')).response.status).toBe(400)
    expect((await api(server.url, '/admin/api/keys?cursor=bm90LWEtY3Vyc29y')).status).toBe(400)
  })

  test('counts are shown and served as JSON', async () => {
    const response = await api(server.url, '/admin/api/counts')
    const counts = await response.json() as { processing: number; stale: number; ttl_seconds: number }
    const [row] = await db.sql`select count(*)::int as n from idempotency_keys where status = 'processing'`
    expect(counts.processing).toBe(row!.n)
    expect(counts.stale).toBe(row!.n - 1) // only fresh-one is younger than the TTL
    expect(counts.ttl_seconds).toBe(30)
  })
})
