/**
 * The runbooks open while the database is unreachable (SPEC, Metrics: "runbooks
 * open while the database is unreachable"): they are public by design (the
 * guide's own text, no data), looked up in memory, let through the database
 * gate. Everything else of the admin still needs a session, and the database.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'

let db: TestDatabase
let down: InProcessService
let up: InProcessService
beforeAll(async () => {
  db = await createTestDatabase('runbooks_public')
  down = await startApp(db, { health: { up: false } })
  up = await startApp(db)
})
afterAll(async () => {
  await down?.stop()
  await up?.stop()
  await db?.drop()
})

const get = (service: InProcessService, path: string) => service.fetch(path, { redirect: 'manual', headers: { accept: 'text/html' } })

// Catches: runbooks behind the session (sessions live in the database) or behind the database gate.
test('with the database away, a runbook and the index open without a session; the rest of the admin answers 503', async () => {
  const runbook = await get(down, '/admin/runbooks/IdempotencyNotReady')
  const html = await runbook.text()
  expect({ status: runbook.status, type: runbook.headers.get('content-type'), cookie: runbook.headers.get('set-cookie') })
    .toEqual({ status: 200, type: expect.stringContaining('text/html'), cookie: null })
  expect(html).toContain('Runbook: IdempotencyNotReady')
  expect((await get(down, '/admin/runbooks')).status).toBe(200)
  for (const path of ['/admin', '/admin/released', '/admin/runbooksx', '/api/payments?customer=x'])
    expect({ path, status: (await get(down, path)).status }).toEqual({ path, status: 503 })
})

test('signed out, with the database up: the runbook is served, not a sign-in redirect; an unknown alert is a 404 that lists the others', async () => {
  const runbook = await get(up, '/admin/runbooks/IdempotencyStaleProcessingKeys')
  expect(runbook.status).toBe(200)
  expect(await runbook.text()).not.toContain('Sign out')
  const missing = await get(up, '/admin/runbooks/NoSuchAlert')
  expect(missing.status).toBe(404)
  expect(await missing.text()).toContain('/admin/runbooks/IdempotencyNotReady')
  expect((await get(up, '/admin')).status).toBe(303)
})
