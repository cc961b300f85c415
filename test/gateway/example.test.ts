/**
 * examples/gateway runs as its README says: one command starts json-server
 * and the gateway in front of it; the README's requests give its answers
 * (one record for two POSTs with one key, the replay, the 422); SIGTERM
 * stops both, and the exit is 0.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { captureOutput, waitForListening } from '../support/process'
import { within } from '../support/wait'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { freePort } from './support/json-server'
import { post, read } from './support/gateway'

const SCRIPT = join(import.meta.dir, '..', '..', 'examples', 'gateway', 'run.sh')

let db: TestDatabase
const data = mkdtempSync(join(tmpdir(), 'gateway-example-'))

beforeAll(async () => { db = await createTestDatabase('gateway_example') })
afterAll(async () => {
  await db?.drop()
  rmSync(data, { recursive: true, force: true })
})

test('bash examples/gateway/run.sh: json-server behind the gateway, the README\'s requests, a clean stop', async () => {
  const upstreamPort = freePort()
  const proc = Bun.spawn(['bash', SCRIPT], {
    env: { ...process.env, DATABASE_URL: db.url, UPSTREAM_PORT: String(upstreamPort), PORT: '0', TEST_ALLOW_PORT_0: '1', GATEWAY_EXAMPLE_DATA: data },
    stdout: 'pipe', stderr: 'pipe',
  })
  const output = captureOutput(proc)
  try {
    await exampleRuns(proc, output, upstreamPort)
  } finally {
    // A failed check must not leave the script's gateway and json-server running: SIGTERM is what stops both (its trap).
    if (proc.exitCode === null) {
      proc.kill('SIGTERM')
      if (await within(proc.exited, 10_000, 'hung') === 'hung') proc.kill('SIGKILL')
    }
  }
})

async function exampleRuns(proc: Subprocess, output: ReturnType<typeof captureOutput>, upstreamPort: number): Promise<void> {
  const port = await waitForListening(proc, output, 30_000)
  if (!port) throw new Error(`the example did not start:\n${output()}`)
  const gateway = `http://127.0.0.1:${port}`
  const headers = { authorization: 'Bearer my-token', 'idempotency-key': 'order-42' }
  const first = await read(await post(gateway, '/items', { sku: 'book', qty: 1 }, headers))
  expect(first.status).toBe(201)
  const again = await read(await post(gateway, '/items', { sku: 'book', qty: 1 }, headers))
  expect(again.status).toBe(201)
  expect(again.headers.get('idempotent-replayed')).toBe('true')
  expect(again.text).toBe(first.text)
  expect((await post(gateway, '/items', { sku: 'book', qty: 2 }, headers)).status).toBe(422)
  const records = (await (await fetch(`http://127.0.0.1:${upstreamPort}/items`)).json()) as unknown[]
  expect(records.length).toBe(1)

  proc.kill('SIGTERM')
  expect(await proc.exited).toBe(0)
  await output.ended
  expect(output()).toContain('"exit_code":0')
  // json-server stopped with it: its port is free again.
  expect(await fetch(`http://127.0.0.1:${upstreamPort}/items`).then(() => 'answered', () => 'closed')).toBe('closed')
}
