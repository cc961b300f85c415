/**
 * Clients that walk away from slow bodies: 50 raw sockets each announce a
 * body, send part of it, and close. The real service process logs that at
 * info, one line and at most one summary per interval, not 50 error lines;
 * nothing is claimed, and the service keeps serving.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startServer, type ServerProcess } from '../support/server'
import { waitFor } from '../support/wait'

let db: TestDatabase
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('security_abort')
  server = await startServer(db.url)
})
afterAll(async () => {
  await server?.stop()
  await db?.drop()
})

/** Sends the headers and half of an announced body, waits until the server has the bytes, and hangs up. */
async function abandon(port: number, key: string): Promise<void> {
  const body = JSON.stringify(payment({ customer: 'walks-away' }))
  const head = [
    'POST /api/payments HTTP/1.1', 'Host: 127.0.0.1', 'Authorization: Bearer acme-key', 'Content-Type: application/json',
    `Idempotency-Key: ${key}`, `Content-Length: ${body.length + 500}`,
  ].join('\r\n')
  await new Promise<void>((resolve, reject) => {
    void Bun.connect({
      hostname: '127.0.0.1',
      port,
      socket: {
        open(socket) {
          socket.write(`${head}\r\n\r\n${body.slice(0, 20)}`)
          socket.flush()
          // The server has read the headers once the handler waits on the body; then the client is gone.
          setTimeout(() => socket.end(), 50)
        },
        data() {},
        close() { resolve() },
        error(_socket, error) { reject(error) },
      },
    }).catch(reject)
  })
}

test('50 abandoned slow bodies: no error line, at most two info lines, nothing claimed, still serving', async () => {
  const port = Number(new URL(server.url).port)
  const keys = Array.from({ length: 50 }, (_, i) => `abandoned-${i}-${crypto.randomUUID()}`)
  const before = server.output().length
  await Promise.all(keys.map((key) => abandon(port, key)))
  const lines = () => server.output().slice(before).split('\n').filter((line) => line.trim() !== '')
  await waitFor(() => lines().some((line) => line.includes('client closed the connection')), () => `the abort to be logged; got:\n${lines().join('\n')}`)

  const logged = lines()
  const errors = logged.filter((line) => /"level":"error"|unhandled|error:/i.test(line))
  expect(errors).toEqual([])
  const aborts = logged.filter((line) => line.includes('client closed the connection'))
  expect(aborts.length).toBeLessThanOrEqual(2)
  for (const line of aborts) expect(JSON.parse(line)).toMatchObject({ level: 'info' })

  const [claimed] = await db.sql`select count(*)::int as n from idempotency_key_states where key like 'abandoned-%'`
  expect(claimed!.n).toBe(0)
  expect((await postPayment(server.url, payment())).status).toBe(201)
}, 30_000)
