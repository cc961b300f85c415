/**
 * The session limits an operator meets (issue 27, ASVS 3.3.2): the idle limit
 * counts what the operator did, not the list page's automatic reload (an
 * unattended browser reaches it), and one operator has at most
 * MAX_SESSIONS_PER_OPERATOR open sessions (a sign-in past it ends the least
 * recently used one). The clock is the admin's own (`now`), moved by the test.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { MAX_SESSIONS_PER_OPERATOR, SESSION_IDLE_SECONDS } from '../../src/admin/sessions'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { getPage, signIn, startAdmin, type AdminServer } from './support'

let db: TestDatabase
let admin: AdminServer
let clock = new Date('2030-01-01T09:00:00Z')
const later = (minutes: number) => { clock = new Date(clock.getTime() + minutes * 60_000) }
beforeAll(async () => {
  db = await createTestDatabase('admin_session_limits')
  admin = startAdmin(db.pools, { now: () => clock })
})
afterAll(async () => {
  await admin?.stop()
  await db?.drop()
})

const idleMinutes = SESSION_IDLE_SECONDS / 60

test('the list page reloads itself with auto=1, and such reloads do not keep an unattended session open', async () => {
  const unattended = await signIn(admin.url)
  const page = await getPage(admin.url, '/admin', unattended)
  expect(page.html).toMatch(/http-equiv="refresh" content="\d+; url=\/admin\?[^"]*auto=1/)
  later(idleMinutes - 10)
  expect((await getPage(admin.url, '/admin?auto=1', unattended)).response.status).toBe(200) // still open
  later(11) // idle limit passed since the sign-in: the reloads did not count
  expect((await getPage(admin.url, '/admin?auto=1', unattended)).response.status).toBe(303)
})

test('an operator\'s own request renews the session', async () => {
  const attended = await signIn(admin.url)
  later(idleMinutes - 10)
  expect((await getPage(admin.url, '/admin', attended)).response.status).toBe(200) // a click: renews
  later(11)
  expect((await getPage(admin.url, '/admin?auto=1', attended)).response.status).toBe(200)
})

test(`at most ${MAX_SESSIONS_PER_OPERATOR} open sessions per operator: a sign-in past it ends the least recently used`, async () => {
  await db.sql`delete from admin_sessions`
  const sessions = []
  for (let i = 0; i < MAX_SESSIONS_PER_OPERATOR + 2; i++) {
    later(1)
    sessions.push(await signIn(admin.url))
  }
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from admin_sessions where operator = 'admin'`
  expect(row!.n).toBe(MAX_SESSIONS_PER_OPERATOR)
  expect((await getPage(admin.url, '/admin', sessions[0]!)).response.status).toBe(303)
  expect((await getPage(admin.url, '/admin', sessions[1]!)).response.status).toBe(303)
  expect((await getPage(admin.url, '/admin', sessions.at(-1)!)).response.status).toBe(200)
})
