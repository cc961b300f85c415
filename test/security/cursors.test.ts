/**
 * A list cursor is held by the client, so it may come back changed. One that
 * is still well-formed (base64url of the right shape) but names an
 * impossible timestamp reached PostgreSQL and came back a 500; it is a 400
 * now, on the payments API, the admin page and the admin JSON API, over real
 * HTTP. A genuine cursor still pages.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { encodeCursor as encodeKeyCursor } from '../../src/operations/cursor'
import { cursorKey, encodeCursor as encodePaymentCursor } from '../../src/payments/cursor'
import { isTimestampText } from '../../src/store/timestamp'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { ADMIN_TOKEN } from '../support/server'
import { api, getPage, signIn, stuckKey, type Signed } from '../admin/support'
import { writeServerSettings } from '../../src/core/settings'
import { runIdem } from '../support/cli'

/** Timestamps of the right shape that PostgreSQL refuses (22008 and friends). */
const IMPOSSIBLE = [
  '2026-13-01 10:00:00+00', '2026-00-10 10:00:00+00', '2026-02-30 10:00:00+00', '2025-02-29 10:00:00+00', '2026-04-31 10:00:00+00',
  '0000-01-01 10:00:00+00', '2026-01-01 24:00:00+00', '2026-01-01 10:60:00+00', '2026-01-01 10:00:61+00',
  '2026-01-01 10:00:00+16', '2026-01-01 10:00:00+05:60', '9999-99-99 99:99:99.999999+99:99',
]

let db: TestDatabase
let service: InProcessService
let url: string
let admin: Signed
beforeAll(async () => {
  db = await createTestDatabase('security_cursors')
  service = await startApp(db)
  url = service.listen()
  admin = await signIn(url)
})
afterAll(async () => {
  await service?.stop()
  await db?.drop()
})

test('the timestamp check takes what PostgreSQL writes and refuses what it would refuse', () => {
  for (const text of ['2026-12-01 00:50:46.069123+00', '2024-02-29 23:59:59+05:30', '2026-06-30 00:00:00-11', '0001-01-01 00:00:00+00']) expect({ text, ok: isTimestampText(text) }).toEqual({ text, ok: true })
  for (const text of IMPOSSIBLE) expect({ text, ok: isTimestampText(text) }).toEqual({ text, ok: false })
})

describe('the payments list', () => {
  test('a tampered but well-formed cursor is a 400 problem, never a 500', async () => {
    for (const at of IMPOSSIBLE) {
      // Signed as the service signs (so only the timestamp check can refuse it).
      const cursor = encodePaymentCursor({ createdAt: at, id: crypto.randomUUID() }, cursorKey('acme-key'))
      const response = await fetch(`${url}/api/payments?customer=c&cursor=${cursor}`, { headers: { authorization: 'Bearer acme-key' } })
      expect({ at, status: response.status }).toEqual({ at, status: 400 })
      expect(await response.json()).toMatchObject({ code: 'invalid-query' })
    }
  })

  test('an edited cursor, an unsigned one, or one given to another API key is a 400 problem (the cursor is signed)', async () => {
    for (let i = 0; i < 3; i++) expect((await postPayment(url, payment({ customer: 'cursor-signed' }))).status).toBe(201)
    const first = await (await fetch(`${url}/api/payments?customer=cursor-signed&limit=1`, { headers: { authorization: 'Bearer acme-key' } })).json() as { next_cursor: string }
    const [payload] = first.next_cursor.split('.') as [string]
    const [at, id] = Buffer.from(payload, 'base64url').toString().split('|') as [string, string]
    const edited = Buffer.from(`2099-01-01 00:00:00+00|${id}`).toString('base64url')
    const refused = [
      `${edited}.${first.next_cursor.split('.')[1]}`, // a well-formed, possible timestamp, the old signature
      payload, // unsigned (the form of earlier releases)
      encodePaymentCursor({ createdAt: at, id }, cursorKey('globex-key')), // signed for another key
    ]
    for (const cursor of refused) {
      const response = await fetch(`${url}/api/payments?customer=cursor-signed&cursor=${cursor}`, { headers: { authorization: 'Bearer acme-key' } })
      expect({ cursor, status: response.status }).toEqual({ cursor, status: 400 })
    }
    expect((await fetch(`${url}/api/payments?customer=cursor-signed&cursor=${first.next_cursor}`, { headers: { authorization: 'Bearer acme-key' } })).status).toBe(200)
  })

  // Catches: the cursor's instant sent as a timestamptz parameter (postgres.js makes a Date of it, to the millisecond):
  // payments made within one millisecond of a page's last one were skipped.
  test('pages skip nothing: payments a few microseconds apart each come once', async () => {
    for (let i = 0; i < 4; i++) expect((await postPayment(url, payment({ customer: 'cursor-micro' }))).status).toBe(201)
    await db.sql`update payments set created_at = timestamptz '2026-06-01 12:00:00+00' + (select count(*) from payments p where p.customer = 'cursor-micro' and p.id < payments.id) * interval '1 microsecond'
                  where customer = 'cursor-micro'`
    const seen: string[] = []
    let cursor: string | null = null
    do {
      const response = await fetch(`${url}/api/payments?customer=cursor-micro&limit=1${cursor ? `&cursor=${cursor}` : ''}`, { headers: { authorization: 'Bearer acme-key' } })
      const body = await response.json() as { data: { id: string }[]; next_cursor: string | null }
      seen.push(...body.data.map((row) => row.id))
      cursor = body.next_cursor
    } while (cursor && seen.length < 10)
    expect(seen).toHaveLength(4)
    expect(new Set(seen).size).toBe(4)
  })

  test('a genuine cursor still pages', async () => {
    for (let i = 0; i < 3; i++) expect((await postPayment(url, payment({ customer: 'cursor-pages' }))).status).toBe(201)
    const first = await (await fetch(`${url}/api/payments?customer=cursor-pages&limit=2`, { headers: { authorization: 'Bearer acme-key' } })).json()
    expect(first.data).toHaveLength(2)
    const second = await fetch(`${url}/api/payments?customer=cursor-pages&limit=2&cursor=${first.next_cursor}`, { headers: { authorization: 'Bearer acme-key' } })
    expect(second.status).toBe(200)
    expect((await second.json()).data).toHaveLength(1)
  })
})

describe('the admin key list', () => {
  test('a signed cursor holding an impossible timestamp is a 400 on the JSON API and on the page, never a 500', async () => {
    for (const at of IMPOSSIBLE) {
      // Signed with the database's own secret, as the service signs (so only the timestamp check can refuse it).
      const cursor = await encodeKeyCursor(db.sql, 'keys', { at, tenant: 'acme', key: 'k' })
      const fromApi = await api(url, `/admin/api/keys?cursor=${cursor}`, { token: ADMIN_TOKEN })
      expect({ at, status: fromApi.status }).toEqual({ at, status: 400 })
      expect(await fromApi.json()).toMatchObject({ code: 'invalid-query' })
      const page = await fetch(`${url}/admin?after=${cursor}`, { headers: { cookie: admin.cookie }, redirect: 'manual' })
      expect({ at, status: page.status }).toEqual({ at, status: 400 })
      expect(await page.text()).toContain('cursor is not one this list gave out')
    }
  })

  test('a genuine cursor still pages', async () => {
    for (let i = 0; i < 3; i++) await stuckKey(db.sql, 'acme', `cursor-key-${i}`, 100 + i)
    const first = await (await api(url, '/admin/api/keys?limit=2', { token: ADMIN_TOKEN })).json()
    expect(first.data).toHaveLength(2)
    const next = await api(url, `/admin/api/keys?limit=2&cursor=${first.next_cursor}`, { token: ADMIN_TOKEN })
    expect(next.status).toBe(200)
    expect((await next.json()).data.length).toBeGreaterThanOrEqual(1)
  })
})

/**
 * The admin's lists sign their cursors too (SPEC, Production mode), with a
 * secret the page, the JSON API and the CLI (another process) share: the
 * database's (idempotency_secrets). An edited cursor is refused by each of
 * them; one handed out by any of them pages in the others.
 */
describe('the admin lists\' cursors are signed, and shared by the page, the API and the CLI', () => {
  const TENANT = 'signed'
  const KEYS = Array.from({ length: 60 }, (_, i) => `signed-${String(i).padStart(2, '0')}`)
  /** The test's keys in the order a page, an answer or the CLI shows them, each once. */
  const keyIn = (text: string) => [...new Set([...text.matchAll(/signed-\d\d(?:-r)?/g)].map((match) => match[0]))]
  const released = (key: string, secondsAgo: number) => db.sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, released_at, release_reason)
    values (${TENANT}, ${key}, 'POST', '/api/payments', ${'d'.repeat(64)}, 'released', now() - interval '1 hour', now() - interval '1 hour',
            now() - make_interval(secs => ${secondsAgo}), 'deadline')`
  /** The page's "next" link (its cursor as the page wrote it, HTML-decoded). */
  const nextLink = (html: string, parameter: string) => {
    const href = /<a[^>]+href="([^"]*)"[^>]*>[^<]*(?:Next|next|Older|older|More|more)/.exec(html)?.[1]
    const value = href && new URL(href.replaceAll('&amp;', '&'), url).searchParams.get(parameter)
    if (!value) throw new Error(`no next link with ${parameter} on the page`)
    return value
  }
  /** An edit a client could make: the payload's tenant swapped, the old tag kept. */
  const edited = (cursor: string, to: string) => {
    const [payload, tag] = cursor.split('.') as [string, string]
    const [at, , key] = JSON.parse(Buffer.from(payload, 'base64url').toString()) as [string, string, string]
    return `${Buffer.from(JSON.stringify([at, to, key])).toString('base64url')}.${tag}`
  }
  const flipped = (text: string, at: number) => `${text.slice(0, at)}${text[at] === 'A' ? 'B' : 'A'}${text.slice(at + 1)}`
  /** base64url's last character of 16 bytes carries 2 bits: another spelling with the same bits decodes to the same tag. */
  const respelled = (tag: string) => {
    const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
    const index = alphabet.indexOf(tag.at(-1)!)
    return `${tag.slice(0, -1)}${alphabet[(index & ~15) | ((index & 15) === 0 ? 1 : 0)]}`
  }
  const idem = (args: string[]) => runIdem(db.url, args)

  beforeAll(async () => {
    // What a server records at start: the CLI applies it.
    await writeServerSettings(db.sql, { ttlSeconds: 30, retentionSeconds: 86_400 })
    for (const [i, key] of KEYS.entries()) {
      await stuckKey(db.sql, TENANT, key, 1000 + i)
      await released(`${key}-r`, 10 + i)
    }
  })

  test('a cursor from the page pages the JSON API and the CLI, and one from the CLI pages the page', async () => {
    const first = await getPage(url, `/admin?tenant=${TENANT}`, admin)
    const fromPage = nextLink(first.html, 'after')
    const apiPage = await api(url, `/admin/api/keys?tenant=${TENANT}&cursor=${fromPage}`, { token: ADMIN_TOKEN })
    expect(apiPage.status).toBe(200)
    const apiKeys = (await apiPage.json() as { data: { key: string }[] }).data.map((row) => row.key)
    expect(apiKeys).toEqual(keyIn((await getPage(url, `/admin?tenant=${TENANT}&after=${fromPage}`, admin)).html))
    // Every key once across the two pages (a cursor's instant kept to the microsecond).
    expect([...keyIn(first.html), ...apiKeys].toSorted()).toEqual(KEYS.toSorted())

    const cli = await idem(['list', '--tenant', TENANT, '--limit', '4', '--cursor', fromPage])
    expect(cli.code).toBe(0)
    expect(keyIn(cli.stdout)).toEqual(apiKeys.slice(0, 4))

    const fromCli = /more: add --cursor (\S+)/.exec(cli.stdout)![1]!
    const pageAfterCli = await getPage(url, `/admin?tenant=${TENANT}&after=${fromCli}`, admin)
    expect(pageAfterCli.response.status).toBe(200)
    expect(keyIn(pageAfterCli.html)).toEqual(apiKeys.slice(4))
  })

  test('the released list: a cursor from the page pages the API and the CLI', async () => {
    const first = await getPage(url, `/admin/released?reason=deadline&tenant=${TENANT}`, admin)
    const fromPage = nextLink(first.html, 'cursor')
    const apiPage = await api(url, `/admin/api/released?reason=deadline&tenant=${TENANT}&cursor=${fromPage}`, { token: ADMIN_TOKEN })
    expect(apiPage.status).toBe(200)
    const apiKeys = (await apiPage.json() as { data: { key: string }[] }).data.map((row) => row.key)
    expect([...keyIn(first.html), ...apiKeys].toSorted()).toEqual(KEYS.map((key) => `${key}-r`).toSorted())
    const cli = await idem(['released', '--tenant', TENANT, '--limit', '5', '--cursor', fromPage])
    expect(cli.code).toBe(0)
    expect(keyIn(cli.stdout)).toEqual(apiKeys.slice(0, 5))
  })

  test('an edited cursor is a 400 on the page and the API, and the CLI refuses it (exit 2, saying so)', async () => {
    const genuine = (await (await api(url, `/admin/api/keys?tenant=${TENANT}&limit=5`, { token: ADMIN_TOKEN })).json() as { next_cursor: string }).next_cursor
    const releasedCursor = (await (await api(url, `/admin/api/released?reason=deadline&tenant=${TENANT}&limit=5`, { token: ADMIN_TOKEN })).json() as { next_cursor: string }).next_cursor
    const [payload] = genuine.split('.') as [string]
    const refused: [string, string][] = [
      ['another tenant in it, the old tag', edited(genuine, 'acme')],
      ['the tag of another cursor', `${payload}.${releasedCursor.split('.')[1]}`],
      ['unsigned (the form of earlier releases)', payload],
      ['the released list\'s cursor', releasedCursor],
      ['one character of the tag changed', `${payload}.${flipped(genuine.split('.')[1]!, 5)}`],
      ['the tag\'s last character spelled otherwise (the same bytes)', `${payload}.${respelled(genuine.split('.')[1]!)}`],
    ]
    for (const [label, cursor] of refused) {
      const fromApi = await api(url, `/admin/api/keys?tenant=${TENANT}&cursor=${encodeURIComponent(cursor)}`, { token: ADMIN_TOKEN })
      expect({ label, status: fromApi.status }).toEqual({ label, status: 400 })
      expect(await fromApi.json()).toMatchObject({ code: 'invalid-query', detail: expect.stringContaining('cursor is not one this list gave out') })
      const page = await getPage(url, `/admin?tenant=${TENANT}&after=${encodeURIComponent(cursor)}`, admin)
      expect({ label, status: page.response.status }).toEqual({ label, status: 400 })
      expect(page.html).toContain('cursor is not one this list gave out')
      const cli = await idem(['list', '--tenant', TENANT, '--cursor', cursor])
      expect({ label, code: cli.code, stdout: cli.stdout }).toEqual({ label, code: 2, stdout: '' })
      expect(cli.stderr).toContain('idem: cursor is not one this list gave out')
    }
    // The released list refuses the key list's cursor, and an edited one of its own.
    for (const cursor of [genuine, edited(releasedCursor, 'acme')]) {
      expect((await api(url, `/admin/api/released?reason=deadline&cursor=${cursor}`, { token: ADMIN_TOKEN })).status).toBe(400)
      expect((await getPage(url, `/admin/released?reason=deadline&cursor=${cursor}`, admin)).response.status).toBe(400)
      expect((await idem(['released', '--cursor', cursor])).code).toBe(2)
    }
    // The genuine ones still page.
    expect((await api(url, `/admin/api/keys?tenant=${TENANT}&cursor=${genuine}`, { token: ADMIN_TOKEN })).status).toBe(200)
    expect((await api(url, `/admin/api/released?reason=deadline&tenant=${TENANT}&cursor=${releasedCursor}`, { token: ADMIN_TOKEN })).status).toBe(200)
  }, 60_000)

  test('deleting the secret rotates it: cursors given out before are refused, and the next list signs with a new one', async () => {
    const before = (await (await api(url, `/admin/api/keys?tenant=${TENANT}&limit=5`, { token: ADMIN_TOKEN })).json() as { next_cursor: string }).next_cursor
    const [old] = await db.sql<{ secret: Buffer }[]>`select secret from idempotency_secrets where purpose = 'admin-cursor'`
    await db.sql`delete from idempotency_secrets where purpose = 'admin-cursor'`
    expect((await api(url, `/admin/api/keys?tenant=${TENANT}&cursor=${before}`, { token: ADMIN_TOKEN })).status).toBe(400)
    const after = (await (await api(url, `/admin/api/keys?tenant=${TENANT}&limit=5`, { token: ADMIN_TOKEN })).json() as { next_cursor: string }).next_cursor
    expect(after).not.toBe(before)
    expect((await api(url, `/admin/api/keys?tenant=${TENANT}&cursor=${after}`, { token: ADMIN_TOKEN })).status).toBe(200)
    const [made] = await db.sql<{ secret: Buffer }[]>`select secret from idempotency_secrets where purpose = 'admin-cursor'`
    expect(made!.secret.length).toBe(32)
    expect(made!.secret.equals(old!.secret)).toBe(false)
  })
})
