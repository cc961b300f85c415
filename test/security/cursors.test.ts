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
import { api, signIn, stuckKey, type Signed } from '../admin/support'

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
  test('a tampered but well-formed cursor is a 400 on the JSON API and on the page, never a 500', async () => {
    for (const at of IMPOSSIBLE) {
      const cursor = encodeKeyCursor({ at, tenant: 'acme', key: 'k' })
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
