/** The operator CLI end to end: `bun src/cli.ts ...` as a separate process, on a real database. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, copyFileSync, existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir, userInfo } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { processIo, resolveActor, UsageError } from '../../src/cli'
import { migrate } from '../../src/store/migrate'
import { claim } from '../../src/core/claim'
import { writeServerSettings } from '../../src/core/settings'
import { api, keyInProcessing, startAdmin, stuckKey, type AdminServer } from '../admin/support'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { identity } from '../support/keys'
import { runIdem } from '../support/cli'

const RETENTION = 3600
let db: TestDatabase
let admin: AdminServer
beforeAll(async () => {
  db = await createTestDatabase('cli')
  // As a server does at start: the CLI applies these, never its own shell's.
  await writeServerSettings(db.sql, { ttlSeconds: 30, retentionSeconds: RETENTION })
  // The admin JSON API on the same database, to compare the CLI's JSON with.
  admin = startAdmin(db.pools, { ttlSeconds: 30, retentionSeconds: RETENTION })
})
afterAll(async () => {
  await admin?.stop()
  await db?.drop()
})

interface Run { code: number; stdout: string; stderr: string }

const BUN = process.execPath

const idem = (args: string[], env: Record<string, string | undefined> = {}, stdin?: string): Promise<Run> => runIdem(db.url, args, env, stdin)

/** The CLI in a terminal (a pseudo-terminal from util-linux `script`), typing `answer` at its question. */
async function runScript(command: string, answer: string): Promise<Run> {
  const proc = Bun.spawn(['script', '-qec', command, '/dev/null'], {
    env: { ...process.env, DATABASE_URL: db.url } as Record<string, string>,
    stdin: new TextEncoder().encode(`${answer}\n`),
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, stdout, stderr }
}

const doneKey = (key: string, completedAgo: string) => db.sql`
  insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
  values ('acme', ${key}, 'POST', '/api/payments', ${'e'.repeat(64)}, 'done', now() - interval '3 hours', now() - interval '3 hours',
          now() - ${completedAgo}::interval, 201, '{}'::jsonb, '{}')`
const exists = async (key: string) => (await db.sql`select 1 from idempotency_key_states where key = ${key}`).length === 1

describe('usage', () => {
  test('DATABASE_URL unset with no embedded PostgreSQL running, or malformed: a clear usage error (exit 2), checked by the server\'s own parser', async () => {
    const nowhere = join(tmpdir(), `idem-no-pg-${crypto.randomUUID()}`)
    const unset = await idem(['counts'], { DATABASE_URL: '', EMBEDDED_PG_DIR: nowhere })
    expect(unset.code).toBe(2)
    expect(unset.stderr).toContain(`DATABASE_URL is not set, and no embedded PostgreSQL of this checkout is running (data in ${nowhere})`)
    expect(unset.stderr).toContain('npm start')
    const bad = await idem(['counts'], { DATABASE_URL: 'mysql://x' })
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('DATABASE_URL: must be a postgres:// or postgresql:// URL')
  })

  test('unknown commands and bad options are usage errors (exit 2); --help is not', async () => {
    expect((await idem(['frobnicate'])).code).toBe(2)
    expect((await idem(['list', '--limit', 'lots'])).code).toBe(2)
    expect((await idem(['list', '--cursor', 'bm90LWEtY3Vyc29y'])).code).toBe(2)
    expect((await idem(['list', '--route', 'not a route'])).code).toBe(2)
    expect((await idem(['expire', 'acme'])).code).toBe(2)
    expect((await idem(['expire', 'acme', 'k', '--lease', '-1'])).code).toBe(2)
    expect((await idem(['audit', '--action', 'drop_table'])).code).toBe(2)
    const help = await idem(['--help'])
    expect(help.code).toBe(0)
    for (const command of ['list', 'show', 'expire', 'expire-stale', 'purge', 'counts', 'audit']) expect(help.stdout).toContain(command)
  })

  test('an unreachable database is a failure (exit 1) with the reason', async () => {
    const run = await idem(['counts'], { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/nowhere' })
    expect(run.code).toBe(1)
    expect(run.stderr).toContain('idem: failed:')
  })
})

describe('who acts', () => {
  test('the OS user, else $USER, with --actor as a note beside it (never alone); with none of them a clear refusal', () => {
    const noPasswd = () => { throw new Error('no passwd entry') }
    expect(resolveActor('pager bot', { env: {}, osUser: () => 'deploy' })).toBe('cli:deploy (pager bot)')
    expect(resolveActor('pager bot', { env: { USER: 'eve' }, osUser: noPasswd })).toBe('cli:eve (pager bot)')
    expect(resolveActor('pager bot', { env: {}, osUser: noPasswd }, 1042)).toBe('cli:uid-1042 (pager bot)')
    expect(resolveActor(undefined, { env: { USER: 'eve' }, osUser: () => 'mallory' })).toBe('cli:mallory')
    expect(resolveActor(undefined, { env: { USER: 'eve' }, osUser: noPasswd })).toBe('cli:eve')
    expect(() => resolveActor(undefined, { env: {}, osUser: noPasswd })).toThrow(UsageError)
    expect(() => resolveActor(undefined, { env: {}, osUser: noPasswd })).toThrow('$USER is unset and this uid has no passwd entry')
    expect(() => resolveActor(' ', { env: {}, osUser: noPasswd })).toThrow('--actor')
  })

  test('a uid without a passwd entry and no $USER: expire refuses with exit 2 and does nothing', async () => {
    if (process.getuid?.() !== 0 || !existsSync('/usr/bin/setpriv')) throw new Error('this test runs as root with setpriv (util-linux) to take a uid that has no passwd entry')
    await stuckKey(db.sql, 'nobody', 'cli-nobody', 600)
    // That uid cannot enter a private checkout (CI clones into a 0700 mktemp -d): it runs
    // the CLI bundled into one file, with a copy of Bun, from a folder anyone can read.
    const dir = mkdtempSync(join(tmpdir(), 'idem-cli-nobody-'))
    try {
      chmodSync(dir, 0o755)
      expect(Bun.spawnSync([BUN, 'build', 'src/cli.ts', '--target=bun', '--outfile', join(dir, 'cli.js')]).exitCode).toBe(0)
      chmodSync(join(dir, 'cli.js'), 0o644) // written under the runner's umask: 0600 under a hardened 077
      copyFileSync(BUN, join(dir, 'bun'))
      chmodSync(join(dir, 'bun'), 0o755)
      const proc = Bun.spawn(['setpriv', '--reuid', '54321', '--regid', '54321', '--clear-groups', join(dir, 'bun'), 'cli.js', 'expire', 'nobody', 'cli-nobody'], {
        cwd: dir,
        env: { PATH: process.env.PATH ?? '', DATABASE_URL: db.url, HOME: '/tmp' },
        stdout: 'pipe',
        stderr: 'pipe',
      })
      const [stderr, code] = await Promise.all([new Response(proc.stderr).text(), proc.exited])
      expect({ code, stderr }).toEqual({ code: 2, stderr: expect.stringContaining('no actor for the audit trail') })
      expect(await keyInProcessing(db.sql, 'nobody', 'cli-nobody')).toBe(true)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe('operations', () => {
  // Who the CLI says it is, found as it finds it (the OS user; Bun's userInfo() alone can say "unknown").
  const user = resolveActor(undefined, processIo)

  test('list shows stuck keys stale first, pages with --cursor; --json is the admin API\'s JSON', async () => {
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

    const first = await idem(['list', '--tenant', 'acme', '--limit', '2'])
    const cursor = /more: add --cursor (\S+)/.exec(first.stdout)![1]!
    const rest = await idem(['list', '--tenant', 'acme', '--limit', '2', '--cursor', cursor])
    expect(rest.stdout).toMatch(/running\s+acme\s+cli-fresh/)
    expect(rest.stdout).not.toContain('more:')

    const json = JSON.parse((await idem(['list', '--tenant', 'acme', '--stale', '--json'])).stdout)
    const viaApi = await (await api(admin.url, '/admin/api/keys?tenant=acme&stale=1')).json()
    const steady = (body: { data: Record<string, unknown>[] }) => ({ ...body, data: body.data.map(({ age_seconds: _, ...rest }) => rest) })
    expect(steady(json)).toEqual(steady(viaApi))
    expect(Object.keys(json.data[0]).sort()).toEqual(['age_seconds', 'attempts', 'created_at', 'key', 'lease', 'locked_at', 'method', 'path', 'stale', 'tenant', 'worked_on'])
    expect(json.data.map((key: { key: string }) => key.key)).toEqual(['cli-stuck', '<b>cli-hostile</b>'])
  })

  test('show prints one key; --json is GET /admin/api/keys/{tenant}/{key}', async () => {
    const shown = await idem(['show', 'acme', 'cli-stuck'])
    expect(shown.code).toBe(0)
    expect(shown.stdout).toMatch(/^status\s+processing \(stale\)$/m)
    expect(shown.stdout).toMatch(/^downstream key\s+idp_\S{43}$/m)
    expect(shown.stdout).toContain('A force-expire would release the key now')
    const json = JSON.parse((await idem(['show', 'acme', 'cli-stuck', '--json'])).stdout)
    const viaApi = await (await api(admin.url, '/admin/api/keys/acme/cli-stuck')).json()
    expect({ ...json, age_seconds: 0 }).toEqual({ ...viaApi, age_seconds: 0 })
    expect((await idem(['show', 'acme', 'no-such-key'])).code).toBe(1)
  })

  test('expire releases a dead worker\'s key and records who did it, --actor included; one JSON log line per action on stderr', async () => {
    const run = await idem(['expire', 'acme', 'cli-stuck', '--yes'])
    expect(run).toMatchObject({ code: 0 })
    expect(run.stdout).toContain('expired: the key was released')
    const line = JSON.parse(run.stderr.trim().split('\n').at(-1)!)
    expect(line).toMatchObject({ level: 'info', msg: 'operator action: force_expire', component: 'cli', actor: user, tenant: 'acme', key: 'cli-stuck', outcome: 'expired', audit_id: expect.any(String) })
    expect(await keyInProcessing(db.sql, 'acme', 'cli-stuck')).toBe(false)
    await stuckKey(db.sql, 'acme', 'cli-named', 600)
    const named = JSON.parse((await idem(['expire', 'acme', 'cli-named', '--actor', 'night shift', '--json', '--yes'])).stdout)
    expect(named).toEqual({ outcome: 'expired', lease: expect.any(String), audit_id: expect.any(String) })
    const entries = await db.sql`select actor, action, outcome from idempotency_audit where key in ('cli-stuck', 'cli-named') order by id`
    expect([...entries]).toEqual([{ actor: user, action: 'force_expire', outcome: 'expired' }, { actor: `${user} (night shift)`, action: 'force_expire', outcome: 'expired' }])
  })

  test('expire is refused (exit 1) while a completion holds the key, for a missing key, and for an old lease', async () => {
    const lease = await stuckKey(db.sql, 'acme', 'cli-held', 600)
    const worker = await db.sql.reserve()
    await worker`begin`
    await worker`select 1 from idempotency_keys where key = 'cli-held' for update`
    try {
      const refused = await idem(['expire', 'acme', 'cli-held', '--yes'])
      expect(refused.code).toBe(1)
      expect(refused.stdout).toContain('live worker')
      const batch = await idem(['expire-stale', '--tenant', 'acme', '--yes', '--json'])
      expect(batch.code).toBe(0)
      expect(JSON.parse(batch.stdout)).toMatchObject({ worker_alive: 1, worker_alive_keys: [{ tenant: 'acme', key: 'cli-held' }] })
    } finally {
      await worker`rollback`
      worker.release()
    }
    expect(await keyInProcessing(db.sql, 'acme', 'cli-held')).toBe(true)
    const missing = await idem(['expire', 'acme', 'no-such-key', '--yes'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain('nothing done')
    const oldLease = await idem(['expire', 'acme', 'cli-held', '--lease', String(BigInt(lease) + 1000n), '--yes'])
    expect(oldLease.code).toBe(1)
    expect(oldLease.stdout).toContain('nothing done')
    expect(await keyInProcessing(db.sql, 'acme', 'cli-held')).toBe(true)
  })

  test('expire-stale refuses without --yes outside a terminal (exit 2), doing nothing; --yes does it', async () => {
    await stuckKey(db.sql, 'globex', 'cli-batch-1', 600)
    await stuckKey(db.sql, 'globex', 'cli-batch-2', 600)
    const refused = await idem(['expire-stale', '--tenant', 'globex'])
    expect(refused.code).toBe(2)
    expect(refused.stderr).toContain('2 key(s) in processing of tenant globex are older than the server\'s TTL (30s)')
    expect(refused.stderr).toContain('refusing without --yes: not a terminal')
    expect(await keyInProcessing(db.sql, 'globex', 'cli-batch-1')).toBe(true)
    const run = await idem(['expire-stale', '--tenant', 'globex', '--yes'])
    expect(run.code).toBe(0)
    expect(run.stdout).toContain('expired 2 stale key(s); 0 skipped')
    expect(await keyInProcessing(db.sql, 'globex', 'cli-batch-2')).toBe(false)
  })

  test('purge refuses without --yes outside a terminal; in a terminal it asks, and does only what was answered', async () => {
    await doneKey('cli-old-1', '2 hours')
    await doneKey('cli-old-2', '2 hours')
    const refused = await idem(['purge'])
    expect(refused.code).toBe(2)
    expect(refused.stderr).toContain('2 completed and 0 released key(s) are past retention (3600s)')
    expect(await exists('cli-old-1')).toBe(true)

    const declined = await runScript(`'${BUN}' src/cli.ts purge`, 'no')
    expect(declined.code).toBe(1)
    expect(declined.stdout).toContain('Type "yes" to go ahead')
    expect(declined.stdout).toContain('not confirmed; nothing was done')
    expect(await exists('cli-old-1')).toBe(true)

    const accepted = await runScript(`'${BUN}' src/cli.ts purge`, 'yes')
    expect(accepted.code).toBe(0)
    expect(accepted.stdout).toContain('purged 2 expired key(s)')
    expect(await exists('cli-old-1')).toBe(false)
  })

  test('counts follow the filters and print the admin API\'s JSON; audit lists, filters and shows entries', async () => {
    await doneKey('cli-done-new', '1 minute')
    const counts = JSON.parse((await idem(['counts', '--tenant', 'globex', '--json'])).stdout)
    expect(counts).toEqual(await (await api(admin.url, '/admin/api/counts?tenant=globex')).json())
    expect(counts).toMatchObject({ processing: 0, stale: 0, ttl_seconds: 30, retention_seconds: RETENTION })
    const audit = await idem(['audit', '--by', `${user} (night`, '--limit', '3'])
    expect(audit.code).toBe(0)
    expect(audit.stdout).toContain(`${user} (night shift)`)
    // Only the entry noted "night shift": the header and its one line.
    expect(audit.stdout.trim().split('\n').slice(1).every((line) => line.includes('(night shift)'))).toBe(true)
    const id = /^(\d+)\s/m.exec(audit.stdout.split('\n').slice(1).join('\n'))![1]!
    const entry = JSON.parse((await idem(['audit', id, '--json'])).stdout)
    expect(entry).toEqual(await (await api(admin.url, `/admin/api/audit/${id}`)).json())
    expect(entry).toMatchObject({ actor: `${user} (night shift)`, action: 'force_expire', key: 'cli-named' })
  })

  test('the server\'s retention, not the shell\'s: IDEMPOTENCY_RETENTION_SECONDS=1 purge --yes leaves a live key replayable', async () => {
    const id = identity({ tenant: 'acme', key: 'cli-live' })
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
      values ('acme', 'cli-live', ${id.method}, ${id.path}, ${id.fingerprint}, 'done', now() - interval '1 minute', now() - interval '1 minute',
              now() - interval '1 minute', 201, '{}'::jsonb, '{"paid":true}')`
    const purge = await idem(['purge', '--yes'], { IDEMPOTENCY_RETENTION_SECONDS: '1', IDEMPOTENCY_TTL_SECONDS: '1' })
    expect(purge.code).toBe(0)
    expect(purge.stderr).toContain('ignoring IDEMPOTENCY_RETENTION_SECONDS=1 from this shell: the server runs with 3600')
    // The client's retry is still answered from the stored result, as the server would.
    const retry = await claim(db.pools.short, id, { ttlSeconds: 30, retentionSeconds: RETENTION })
    expect(retry).toMatchObject({ kind: 'replay', response: { status: 201, body: '{"paid":true}' } })
  })

  test('on a database no server has run on, operator commands refuse rather than guess the settings (exit 2), and do nothing', async () => {
    const empty = await createTestDatabase('cli_empty')
    try {
      await empty.sql`
        insert into idempotency_keys (tenant, key, method, path, fingerprint, status, completed_at, response_status, response_headers, response_body)
        values ('acme', 'cli-unknown-retention', 'POST', '/x', ${'f'.repeat(64)}, 'done', now() - interval '2 hours', 201, '{}'::jsonb, '{}')`
      for (const args of [['purge', '--yes'], ['list'], ['purge', '--yes', '--ttl-seconds', '30']]) {
        const run = await idem(args, { DATABASE_URL: empty.url, IDEMPOTENCY_TTL_SECONDS: '30', IDEMPOTENCY_RETENTION_SECONDS: '60' })
        expect(run.code, args.join(' ')).toBe(2)
        expect(run.stderr).toContain('--ttl-seconds 30 --retention-seconds 86400')
      }
      const backwards = await idem(['list', '--ttl-seconds', '60', '--retention-seconds', '30'], { DATABASE_URL: empty.url })
      expect(backwards.code).toBe(2)
      expect(backwards.stderr).toContain('must be at least --ttl-seconds')
      expect((await empty.sql`select 1 from idempotency_key_states where key = 'cli-unknown-retention'`).length).toBe(1)
    } finally {
      await empty.drop()
    }
  })

  test('a value given where the server recorded its own must agree with it', async () => {
    const wrong = await idem(['purge', '--yes', '--retention-seconds', '60'])
    expect(wrong.code).toBe(2)
    expect(wrong.stderr).toContain(`--retention-seconds 60 disagrees with the ${RETENTION} the server recorded`)
    expect((await idem(['counts', '--retention-seconds', String(RETENTION), '--ttl-seconds', '30'])).code).toBe(0)
  })
})

describe('on an app\'s database (the plugin\'s tables only, no settings recorded)', () => {
  let app: { url: string; sql: postgres.Sql; drop(): Promise<void> }
  beforeAll(async () => {
    const name = `idem_cli_plugin_${crypto.randomUUID().slice(0, 8)}`
    const base = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
    await base.unsafe(`create database "${name}"`)
    await base.end()
    const url = new URL(process.env.DATABASE_URL!)
    url.pathname = `/${name}`
    await migrate(url.toString()) // what idempotent-post/engine gives an app: no payments, no settings row
    const sql = postgres(url.toString(), { max: 2, onnotice: () => undefined })
    app = {
      url: url.toString(),
      sql,
      async drop() {
        await sql.end({ timeout: 1 })
        const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
        await admin.unsafe(`drop database if exists "${name}" with (force)`)
        await admin.end()
      },
    }
  })
  afterAll(async () => {
    await app?.drop()
  })

  test('with the app\'s TTL and retention given, every command works: list, show, expire, purge, audit', async () => {
    const flags = ['--ttl-seconds', '20', '--retention-seconds', '600']
    const env = { DATABASE_URL: app.url }
    await app.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, locked_at)
      values ('shop', 'order-stuck', 'POST', '/orders', ${'c'.repeat(64)}, 'processing', now() - interval '1 minute')`
    await app.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
      values ('shop', 'order-old', 'POST', '/orders', ${'d'.repeat(64)}, 'done', now() - interval '12 minutes', now() - interval '12 minutes', now() - interval '11 minutes', 201, '{}'::jsonb, ${JSON.stringify({ id: crypto.randomUUID() })}),
             ('shop', 'order-new', 'POST', '/orders', ${'d'.repeat(64)}, 'done', now() - interval '10 minutes', now() - interval '10 minutes', now() - interval '9 minutes', 201, '{}'::jsonb, '{}')`
    const list = await idem(['list', ...flags], env)
    expect(list.code).toBe(0)
    expect(list.stdout).toMatch(/stale\s+shop\s+order-stuck\s+POST \/orders/)
    // A completed key whose answer names an id: no payments table here, so no payment, and no error.
    const show = await idem(['show', 'shop', 'order-old', '--json', ...flags], env)
    expect(show.code).toBe(0)
    expect(JSON.parse(show.stdout).payment).toBeNull()
    const expire = await idem([...flags, 'expire', 'shop', 'order-stuck', '--yes', '--actor', 'ops'], env)
    expect(expire.code).toBe(0)
    expect((await app.sql`select status from idempotency_key_states where key = 'order-stuck'`)[0]!.status).toBe('released')
    const purge = await idem(['purge', '--yes', '--actor', 'ops', ...flags], env)
    expect(purge.code).toBe(0)
    expect(purge.stdout).toContain('purged 1 expired key(s)')
    expect((await app.sql`select key from idempotency_key_states order by key`).map((row) => row.key)).toEqual(['order-new', 'order-stuck'])
    const audit = await idem(['audit', ...flags], env)
    expect(audit.stdout).toMatch(/cli:\S+ \(ops\)\s+purge_expired/)
    expect(audit.stdout).toMatch(/cli:\S+ \(ops\)\s+force_expire\s+shop\s+order-stuck\s+expired/)
  })
})

describe('dry runs and confirmations', () => {
  /** Every key and audit row as it is: a dry run must leave all of it exactly so. */
  const snapshot = async () => ({
    keys: [...await db.sql`select tenant, key, status, lease::text, attempts, released_at, completed_at from idempotency_key_states order by tenant, key`],
    audit: (await db.sql`select count(*)::int as n from idempotency_audit`)[0]!.n as number,
  })

  test('--dry-run on expire, expire-stale and purge shows what would happen and changes nothing (rows counted before and after)', async () => {
    await stuckKey(db.sql, 'acme', 'dry-stuck', 600)
    await stuckKey(db.sql, 'globex', 'dry-stuck-2', 600)
    await doneKey('dry-old', '2 hours')
    const before = await snapshot()
    expect(before.keys.filter((row) => row.status === 'processing').length).toBeGreaterThanOrEqual(2)

    const expire = await idem(['expire', 'acme', 'dry-stuck', '--dry-run'])
    expect(expire).toMatchObject({ code: 0 })
    expect(expire.stdout).toContain('dry run, nothing done')
    expect(expire.stdout).toContain('A force-expire would release the key now')
    const stale = await idem(['expire-stale', '--dry-run'])
    expect(stale).toMatchObject({ code: 0 })
    expect(stale.stdout).toMatch(/dry run, nothing done:\n\d+ key\(s\) in processing are older than the server's TTL/)
    expect(stale.stdout).toContain('dry-stuck-2')
    const purge = await idem(['purge', '--dry-run'])
    expect(purge).toMatchObject({ code: 0 })
    expect(purge.stdout).toMatch(/[1-9]\d* completed and \d+ released key\(s\) are past retention \(3600s\)/)
    const jsonRun = await idem(['purge', '--dry-run', '--json'])
    const json = JSON.parse(jsonRun.stdout)
    expect(json, jsonRun.stdout).toMatchObject({ dry_run: true, retention_seconds: RETENTION })
    expect(json.done).toBeGreaterThanOrEqual(1)

    // Nothing acted, nothing audited, no action line.
    for (const run of [expire, stale, purge]) expect(run.stderr).not.toContain('operator action')
    expect(await snapshot()).toEqual(before)
  })

  test('expire without --yes refuses outside a terminal (exit 2); in a terminal it shows the key and asks', async () => {
    await stuckKey(db.sql, 'acme', 'ask-stuck', 600)
    const refused = await idem(['expire', 'acme', 'ask-stuck'])
    expect(refused.code).toBe(2)
    expect(refused.stderr).toContain('tenant acme, key ask-stuck, POST /api/payments')
    expect(refused.stderr).toContain('refusing without --yes: not a terminal')
    expect(await keyInProcessing(db.sql, 'acme', 'ask-stuck')).toBe(true)

    const declined = await runScript(`'${BUN}' src/cli.ts expire acme ask-stuck --actor tty`, 'no')
    expect(declined.code).toBe(1)
    expect(declined.stdout).toContain('A force-expire would release the key now')
    expect(declined.stdout).toContain('Type "yes" to go ahead')
    expect(declined.stdout).toContain('not confirmed; nothing was done')
    expect(await keyInProcessing(db.sql, 'acme', 'ask-stuck')).toBe(true)

    const accepted = await runScript(`'${BUN}' src/cli.ts expire acme ask-stuck --actor tty`, 'yes')
    expect(accepted.code).toBe(0)
    expect(accepted.stdout).toContain('expired: the key was released')
    expect(await keyInProcessing(db.sql, 'acme', 'ask-stuck')).toBe(false)
  })

  test('the purge preview says what a purge would do, not that it was done', async () => {
    const refused = await idem(['purge'])
    expect(refused.code).toBe(2)
    expect(refused.stderr).toContain('A purge would delete them.')
    expect(refused.stderr).not.toContain('They are deleted')
  })
})
