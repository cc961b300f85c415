import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer, type ServerProcess } from '../support/server'
import { payment, postPayment } from '../support/http'

let db: TestDatabase
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('smoke')
  server = await startServer(db.url)
})
afterAll(async () => {
  await server?.stop()
  await db?.drop()
})

test('a payment is created once', async () => {
  const key = crypto.randomUUID()
  const first = await postPayment(server.url, payment(), { key })
  expect(first.status).toBe(201)
  const again = await postPayment(server.url, payment(), { key })
  expect(again.status).toBe(201)
  expect(again.headers.get('idempotent-replayed')).toBe('true')
  const [{ count }] = await db.sql`select count(*)::int as count from payments`
  expect(count).toBe(1)
})
