/**
 * DATABASE_PGBOUNCER=1: the service never migrates through the pooler (a
 * session advisory lock could be stranded there); it checks the schema and
 * refuses another one, naming the command that fixes it. Checked here against
 * PostgreSQL directly: the check itself needs no PgBouncer (npm run test:scale
 * runs the real thing).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startProvider, type ProviderHandle } from '../support/server'
import { spawnService } from '../support/process'

let migrated: TestDatabase
let provider: ProviderHandle
let emptyUrl: string
beforeAll(async () => {
  migrated = await createTestDatabase('pgb_mode')
  provider = await startProvider()
  const name = `idem_pgb_empty_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  await admin.end()
  const url = new URL(process.env.DATABASE_URL!)
  url.pathname = `/${name}`
  emptyUrl = url.toString()
})
afterAll(async () => {
  const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`drop database if exists "${new URL(emptyUrl).pathname.slice(1)}" with (force)`)
  await admin.end()
  await provider?.stop()
  await migrated?.drop()
})

const env = (url: string) => ({ DATABASE_URL: url, DATABASE_PGBOUNCER: '1', PAYMENT_PROVIDER_URL: provider.url, API_KEYS: 'acme:acme-key', ADMIN_TOKEN: 'test-admin-token-123' })

test('an unmigrated database is refused at start with the command to run, and nothing is migrated', async () => {
  const proc = Bun.spawn([process.execPath, 'src/main.ts'], { env: { ...process.env, ...env(emptyUrl), PORT: '0', TEST_ALLOW_PORT_0: '1' }, stdout: 'pipe', stderr: 'pipe' })
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  expect(code).not.toBe(0)
  expect(out + err).toContain('npm run migrate')
  const sql = postgres(emptyUrl, { max: 1, onnotice: () => undefined })
  const [row] = await sql`select to_regclass('idempotency_keys') as t`
  await sql.end()
  expect(row!.t).toBeNull()
})

test('a migrated database: the schema is checked, not migrated, and the service serves', async () => {
  const service = await spawnService({ env: env(migrated.url) })
  try {
    expect(service.output()).toContain('does not migrate')
    expect((await fetch(`${service.url}/readyz`)).status).toBe(200)
  } finally {
    service.proc.kill('SIGTERM')
    await service.proc.exited
  }
})
