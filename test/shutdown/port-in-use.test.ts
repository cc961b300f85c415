/**
 * A PORT another process holds: the start says which setting to change (exit
 * 2, naming PORT, as for a bad value) and leaves nothing running, instead of
 * "failed to start" and exit 1.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startProvider, type ProviderHandle } from '../support/server'

let db: TestDatabase
let provider: ProviderHandle
beforeAll(async () => {
  db = await createTestDatabase('port_in_use')
  provider = await startProvider()
})
afterAll(async () => {
  await provider?.stop()
  await db?.drop()
})

test('PORT in use: exit 2, the variable named, the port and what to do', async () => {
  const holder = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response('someone else') })
  try {
    const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
      env: { ...process.env, DATABASE_URL: db.url, PAYMENT_PROVIDER_URL: provider.url, HOST: '127.0.0.1', PORT: String(holder.port) },
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const [code, stderr] = await Promise.all([proc.exited, new Response(proc.stderr).text()])
    expect(code).toBe(2)
    const line = JSON.parse(stderr.trim().split('\n').at(-1)!) as { msg: string; variable: string }
    expect(line.variable).toBe('PORT')
    expect(line.msg).toContain(`PORT: port ${holder.port} on 127.0.0.1 is in use by another process`)
    expect(await (await fetch(`http://127.0.0.1:${holder.port}/`)).text()).toBe('someone else')
  } finally {
    holder.stop(true)
  }
}, 30_000)
