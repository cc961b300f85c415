/** The operator CLI end to end: `bun src/cli.ts ...` as a separate process, on a real database. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { userInfo } from 'node:os'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { keyInProcessing, stuckKey } from '../admin/support'
import { writeServerSettings } from '../../src/core/settings'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('cli')
  // As a server does at start: the CLI applies these, never its own shell's.
  await writeServerSettings(db.sql, { ttlSeconds: 30, retentionSeconds: 3600 })
})
afterAll(() => db?.drop())

interface Run { code: number; stdout: string; stderr: string }

async function idem(args: string[], env: Record<string, string> = {}): Promise<Run> {
  const proc = Bun.spawn([process.execPath, 'src/cli.ts', ...args], {
    env: { ...process.env, DATABASE_URL: db.url, IDEMPOTENCY_TTL_SECONDS: '', IDEMPOTENCY_RETENTION_SECONDS: '', ...env },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, stdout, stderr }
}

describe('usage', () => {
  test('DATABASE_URL unset is a clear usage error (exit 2)', async () => {
    const run = await idem(['counts'], { DATABASE_URL: '' })
    expect(run.code).toBe(2)
    expect(run.stderr).toContain('DATABASE_URL is not set')
  })

  test('unknown commands and bad options are usage errors (exit 2); --help is not', async () => {
    expect((await idem(['frobnicate'])).code).toBe(2)
    expect((await idem(['list', '--limit', 'lots'])).code).toBe(2)
    expect((await idem(['expire', 'acme'])).code).toBe(2)
    expect((await idem(['expire', 'acme', 'k', '--lease', '-1'])).code).toBe(2)
    const help = await idem(['--help'])
    expect(help.code).toBe(0)
    expect(help.stdout).toContain('expire-stale')
  })

  test('an unreachable database is a failure (exit 1) with the reason', async () => {
    const run = await idem(['counts'], { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/nowhere' })
    expect(run.code).toBe(1)
    expect(run.stderr).toContain('idem: failed:')
  })
})

describe('operations', () => {
  const user = `cli:${userInfo().username}`

  test('list shows stuck keys stale first; --json for scripts', async () => {
    await stuckKey(db.sql, 'acme', 'cli-fresh', 2)
    await stuckKey(db.sql, 'acme', 'cli-stuck', 7200)
    await stuckKey(db.sql, 'acme', '<b>cli-hostile</b>', 3600)
    const table = await idem(['list', '--tenant', 'acme'])
    expect(table.code).toBe(0)
    const lines = table.stdout.trim().split('\n')
    expect(lines[0]).toMatch(/^STATE\s+TENANT\s+KEY\s+ROUTE\s+AGE\s+ATTEMPTS\s+LEASE$/)
    expect(lines[1]).toMatch(/^stale\s+acme\s+cli-stuck\s+POST \/api\/payments\s+2h 00m\s+1\s+\d+$/)
    expect(lines[2]).toContain('<b>cli-hostile</b>')
    expect(lines[3]).toMatch(/^running\s+acme\s+cli-fresh/)
    const json = await idem(['list', '--stale', '--json'])
    expect(JSON.parse(json.stdout).map((key: { key: string }) => key.key)).toEqual(['cli-stuck', '<b>cli-hostile</b>'])
  })

  test('expire removes a dead worker\'s key and records who did it', async () => {
    const run = await idem(['expire', 'acme', 'cli-stuck'])
    expect(run).toMatchObject({ code: 0 })
    expect(run.stdout).toContain('expired')
    expect(await keyInProcessing(db.sql, 'acme', 'cli-stuck')).toBe(false)
    const [entry] = await db.sql`select actor, action, outcome from idempotency_audit where key = 'cli-stuck'`
    expect(entry).toEqual({ actor: user, action: 'force_expire', outcome: 'expired' })
  })

  test('expire is refused (exit 1) while a live worker holds the key, for a missing key, and for an old lease', async () => {
    const lease = await stuckKey(db.sql, 'acme', 'cli-held', 600)
    const worker = await db.sql.reserve()
    await worker`begin`
    await worker`select 1 from idempotency_keys where key = 'cli-held' for update`
    try {
      const refused = await idem(['expire', 'acme', 'cli-held'])
      expect(refused.code).toBe(1)
      expect(refused.stdout).toContain('live worker')
      const batch = await idem(['expire-stale', '--yes', '--json'])
      expect(batch.code).toBe(0)
      expect(JSON.parse(batch.stdout)).toMatchObject({ workerAlive: 1, aliveKeys: [{ tenant: 'acme', key: 'cli-held' }] })
    } finally {
      await worker`rollback`
      worker.release()
    }
    expect(await keyInProcessing(db.sql, 'acme', 'cli-held')).toBe(true)
    const missing = await idem(['expire', 'acme', 'no-such-key'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain('nothing done')
    const oldLease = await idem(['expire', 'acme', 'cli-held', '--lease', String(BigInt(lease) + 1000n)])
    expect(oldLease.code).toBe(1)
    expect(oldLease.stdout).toContain('nothing done')
    expect(await keyInProcessing(db.sql, 'acme', 'cli-held')).toBe(true)
    const [entry] = await db.sql`select outcome from idempotency_audit where key = 'cli-held' and action = 'force_expire' order by id limit 1`
    expect(entry!.outcome).toBe('worker_alive')
  })

  test('expire-stale asks for --yes before it acts', async () => {
    await stuckKey(db.sql, 'globex', 'cli-batch-1', 600)
    await stuckKey(db.sql, 'globex', 'cli-batch-2', 600)
    const dry = await idem(['expire-stale', '--tenant', 'globex'])
    expect(dry.code).toBe(2)
    expect(dry.stdout).toContain('2 stale key(s) would be expired')
    expect(await keyInProcessing(db.sql, 'globex', 'cli-batch-1')).toBe(true)
    const run = await idem(['expire-stale', '--tenant', 'globex', '--yes'])
    expect(run.code).toBe(0)
    expect(run.stdout).toContain('expired 2 stale key(s); 0 skipped')
    expect(await keyInProcessing(db.sql, 'globex', 'cli-batch-2')).toBe(false)
  })

  test('purge deletes completed keys past retention, counts shows the state, audit lists the actions', async () => {
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
      select 'acme', 'cli-done-' || i, 'POST', '/api/payments', repeat('e', 64), 'done', now() - interval '3 hours', now() - interval '3 hours',
             case when i <= 3 then now() - interval '2 hours' else now() end, 201, '{}'::jsonb, '{}'
        from generate_series(1, 5) i`
    const before = JSON.parse((await idem(['counts', '--json'])).stdout)
    expect(before).toMatchObject({ done: 5, expired: 3 })
    const purge = await idem(['purge'])
    expect(purge).toMatchObject({ code: 0, stdout: 'purged 3 expired key(s)\n' })
    const after = JSON.parse((await idem(['counts', '--json'])).stdout)
    expect(after).toMatchObject({ done: 2, expired: 0 })
    const audit = await idem(['audit', '--limit', '3'])
    expect(audit.code).toBe(0)
    expect(audit.stdout).toContain('purge_expired')
    expect(audit.stdout).toContain(user)
  })

  test('the server\'s retention, not the shell\'s: IDEMPOTENCY_RETENTION_SECONDS=1 purge leaves a live key replayable', async () => {
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
      values ('acme', 'cli-live', 'POST', '/api/payments', ${'f'.repeat(64)}, 'done', now() - interval '1 minute', now() - interval '1 minute',
              now() - interval '1 minute', 201, '{}'::jsonb, '{}')`
    const purge = await idem(['purge'], { IDEMPOTENCY_RETENTION_SECONDS: '1', IDEMPOTENCY_TTL_SECONDS: '1' })
    expect(purge.code).toBe(0)
    expect(purge.stderr).toContain('ignoring IDEMPOTENCY_RETENTION_SECONDS=1 from this shell: the server runs with 3600')
    const [row] = await db.sql`select status from idempotency_keys where tenant = 'acme' and key = 'cli-live'`
    expect(row?.status).toBe('done')
  })

  test('on a database no server has run on, operator commands refuse rather than guess the settings', async () => {
    const empty = await createTestDatabase('cli_empty')
    try {
      const run = await idem(['purge'], { DATABASE_URL: empty.url })
      expect(run.code).toBe(1)
      expect(run.stderr).toContain('start the service once')
    } finally {
      await empty.drop()
    }
  })
})
