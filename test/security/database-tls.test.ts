/**
 * Issue 41.1 (ASVS 9.2.2): REQUIRE_TLS=1 was bypassed by a repeated parameter.
 * `?sslmode=require&sslmode=disable` passed the start check (it read the
 * first) while postgres.js used the last: the production service started and
 * every connection's startup went in plain text. Now DATABASE_URL and the PG*
 * variables are resolved once (src/store/connection-settings.ts), a repeated
 * or conflicting parameter is refused naming it, and the driver is handed the
 * resolved mode. Proved on real processes (the service, `idem`, `npm run
 * migrate`) against a recorder in front of this machine's PostgreSQL (which
 * has no TLS): what the first bytes of each connection were.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { writeServerSettings } from '../../src/core/settings'
import { runIdem } from '../support/cli'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startStartupRecorder, type StartupRecorder } from '../support/startup-recorder'

const CANARY = 'pw-canary-tls-41'
const LONG = (tag: string) => `${tag}-${createHash('sha256').update(tag).digest('base64url').slice(0, 40)}`
const PRODUCTION: Record<string, string> = {
  NODE_ENV: 'production',
  PAYMENT_PROVIDER_URL: 'https://provider.invalid',
  API_KEYS: `acme:${LONG('acme')},globex:${LONG('globex')}`,
  ADMIN_TOKEN: LONG('admin'),
  METRICS_TOKEN: LONG('metrics'),
  HOST: '127.0.0.1',
  PORT: '0',
  TEST_ALLOW_PORT_0: '1',
}
/** The PG* variables a test sets: none of the shell's reaches a run unless the row sets it. */
const NO_PG = { PGSSLMODE: undefined, PGSSL: undefined, PGSSLNEGOTIATION: undefined, PGHOST: undefined, PGPORT: undefined }

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('database_tls')
  // As a server that ran on it would have: the CLI takes the server's TTL and retention.
  await writeServerSettings(db.pools.short, { ttlSeconds: 30, retentionSeconds: 86_400 })
})
afterAll(async () => {
  await db.drop()
})

/**
 * `url` with `query` as its only parameters (the test database's own, such as the embedded server's
 * `sslmode=disable`, would meet the ones under test twice), and the canary as its password where asked.
 */
function withQuery(url: string, query: string, password?: string): string {
  const parsed = new URL(url)
  if (password) parsed.password = password
  parsed.search = ''
  const params = query.replace(/^\?/, '')
  return `${parsed.toString()}${params ? `?${params}` : ''}`
}

interface Run { readonly code: number | null; readonly stdout: string; readonly stderr: string }

/** A process of ours, to its exit (a start that is not refused serves until the timeout kills it). */
async function run(command: string[], env: Record<string, string | undefined>, timeoutMs = 20_000): Promise<Run> {
  const merged = { ...process.env, ...NO_PG, ...env }
  const proc = Bun.spawn([process.execPath, ...command], {
    env: Object.fromEntries(Object.entries(merged).filter(([, value]) => value !== undefined)) as Record<string, string>,
    stdout: 'pipe',
    stderr: 'pipe',
    timeout: timeoutMs,
  })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, stdout, stderr }
}

async function withRecorder<T>(work: (recorder: StartupRecorder) => Promise<T>): Promise<T> {
  const recorder = await startStartupRecorder(db.url)
  try {
    return await work(recorder)
  } finally {
    await recorder.stop()
  }
}

describe('a repeated or conflicting TLS parameter is refused, naming it, before any connection', () => {
  const REFUSED: [label: string, query: string, env: Record<string, string>, parameter: RegExp, variable: string][] = [
    ['sslmode twice (require, then disable)', '?sslmode=require&sslmode=disable', {}, /\bsslmode\b/, 'DATABASE_URL'],
    ['sslmode twice (disable, then require)', '?sslmode=disable&sslmode=require', {}, /\bsslmode\b/, 'DATABASE_URL'],
    ['ssl twice', '?ssl=true&ssl=false', {}, /\bssl\b/, 'DATABASE_URL'],
    ['sslmode and ssl disagreeing', '?sslmode=require&ssl=false', {}, /\bssl=false\b/, 'DATABASE_URL'],
    ['sslrootcert=system with sslmode=disable', '?sslmode=disable&sslrootcert=system', {}, /\bsslrootcert\b/, 'DATABASE_URL'],
    ['SSLMODE in capitals (ignored by the driver)', '?SSLMODE=require', {}, /\bSSLMODE\b/, 'DATABASE_URL'],
    ['PGSSLMODE and PGSSL disagreeing', '', { PGSSLMODE: 'require', PGSSL: 'disable' }, /PGSSLMODE \(require\) and PGSSL \(disable\)/, 'PGSSLMODE'],
    // postgres.js does not read ?host=: the check once took it for a socket while the driver went to the URL's host.
    ['a host both in the URL and as ?host= (a socket directory)', '?host=/var/run/postgresql', {}, /\?host=/, 'DATABASE_URL'],
  ]

  // Catches: the check reading one sslmode and the driver another (issue 41.1), or a refusal that shows the password.
  test('the production service exits 2 naming the parameter, with REQUIRE_TLS=1 and without; nothing connects', async () => {
    for (const [label, query, env, parameter, variable] of REFUSED) {
      for (const requireTls of ['1', undefined]) {
        await withRecorder(async (recorder) => {
          const result = await run(['src/main.ts'], { ...PRODUCTION, DATABASE_URL: withQuery(recorder.url, query, CANARY), REQUIRE_TLS: requireTls, ...env })
          const line = JSON.parse(result.stderr.trim().split('\n').at(-1) ?? '{}') as { msg?: string; variable?: string }
          expect({ label, requireTls, code: result.code, variable: line.variable, named: parameter.test(line.msg ?? ''), connections: recorder.connections.length })
            .toEqual({ label, requireTls, code: 2, variable, named: true, connections: 0 })
          expect(`${result.stdout}${result.stderr}`).not.toContain(CANARY)
        })
      }
    }
  }, 120_000)

  test('idem and npm run migrate refuse it the same way (exit 2, the parameter named, nothing connects)', async () => {
    for (const [label, query, env, parameter] of REFUSED) {
      await withRecorder(async (recorder) => {
        const url = withQuery(recorder.url, query, CANARY)
        const cli = await runIdem(url, ['counts'], { ...NO_PG, REQUIRE_TLS: '1', ...env })
        const migrate = await run(['src/store/migrate-cli.ts'], { DATABASE_URL: url, REQUIRE_TLS: '1', ...env })
        expect({ label, cli: cli.code, cliNamed: /^idem: \w+: /.test(cli.stderr) && parameter.test(cli.stderr), migrate: migrate.code, migrateNamed: /^configuration error: \w+: /.test(migrate.stderr) && parameter.test(migrate.stderr), connections: recorder.connections.length })
          .toEqual({ label, cli: 2, cliNamed: true, migrate: 2, migrateNamed: true, connections: 0 })
        expect(`${cli.stdout}${cli.stderr}${migrate.stdout}${migrate.stderr}`).not.toContain(CANARY)
      })
    }
  }, 120_000)
})

// Catches: the check judging a URL without a host as local while the driver goes where PGHOST says, in plain text.
test('REQUIRE_TLS=1 judges the host the driver goes to: PGHOST and PGPORT, where the URL names no host', async () => {
  await withRecorder(async (recorder) => {
    const database = new URL(db.url).pathname
    const env = { ...PRODUCTION, DATABASE_URL: `postgres://${database}`, PGHOST: '0.0.0.0', PGPORT: String(recorder.port), PGUSER: new URL(db.url).username || 'postgres', PGPASSWORD: CANARY }
    const refused = await run(['src/main.ts'], { ...env, REQUIRE_TLS: '1' })
    const line = JSON.parse(refused.stderr.trim().split('\n').at(-1) ?? '{}') as { msg?: string; variable?: string }
    expect({ code: refused.code, variable: line.variable, requireTls: /REQUIRE_TLS=1/.test(line.msg ?? ''), connections: recorder.connections.length })
      .toEqual({ code: 2, variable: 'DATABASE_URL', requireTls: true, connections: 0 })
    const cli = await runIdem(`postgres://${database}`, ['counts'], { ...NO_PG, PGHOST: '0.0.0.0', PGPORT: String(recorder.port), REQUIRE_TLS: '1' })
    expect({ code: cli.code, requireTls: /^idem: DATABASE_URL: .*REQUIRE_TLS=1/.test(cli.stderr), connections: recorder.connections.length }).toEqual({ code: 2, requireTls: true, connections: 0 })
    expect(`${refused.stdout}${refused.stderr}${cli.stderr}`).not.toContain(CANARY)
  })
}, 60_000)

/**
 * Every spelling of a TLS mode that reaches the driver, through the real CLI
 * (the config check, then the pools): what the recorder saw first. `tls`: an
 * SSLRequest and never a StartupMessage in plain text (the server has no TLS,
 * so the command fails); `plain`: a StartupMessage first (the command works);
 * `prefer`: an SSLRequest, then, refused, a plain StartupMessage.
 */
const SPELLINGS: [label: string, query: string, env: Record<string, string>, expect: 'tls' | 'plain' | 'prefer'][] = [
  ['sslmode=require', '?sslmode=require', {}, 'tls'],
  ['sslmode=verify-ca', '?sslmode=verify-ca', {}, 'tls'],
  ['sslmode=verify-full', '?sslmode=verify-full', {}, 'tls'],
  ['sslmode=no-verify (node-postgres\'s)', '?sslmode=no-verify', {}, 'tls'],
  ['sslmode=true', '?sslmode=true', {}, 'tls'],
  ['ssl=true', '?ssl=true', {}, 'tls'],
  ['ssl=require', '?ssl=require', {}, 'tls'],
  ['ssl=verify-full', '?ssl=verify-full', {}, 'tls'],
  ['sslrootcert=system', '?sslrootcert=system', {}, 'tls'],
  ['sslmode and ssl agreeing', '?sslmode=require&ssl=require', {}, 'tls'],
  ['PGSSLMODE=require (libpq\'s variable, which postgres.js alone ignores)', '', { PGSSLMODE: 'require' }, 'tls'],
  ['PGSSLMODE=verify-full', '', { PGSSLMODE: 'verify-full' }, 'tls'],
  ['PGSSL=require', '', { PGSSL: 'require' }, 'tls'],
  ['PGSSL=true', '', { PGSSL: 'true' }, 'tls'],
  ['PGSSLMODE and PGSSL agreeing', '', { PGSSLMODE: 'require', PGSSL: 'require' }, 'tls'],
  ['sslmode=require over PGSSL=disable (the URL wins)', '?sslmode=require', { PGSSL: 'disable' }, 'tls'],
  ['sslmode=allow', '?sslmode=allow', {}, 'tls'],
  ['sslmode=prefer', '?sslmode=prefer', {}, 'prefer'],
  ['PGSSLMODE=prefer', '', { PGSSLMODE: 'prefer' }, 'prefer'],
  ['no mode at all', '', {}, 'plain'],
  ['sslmode=disable', '?sslmode=disable', {}, 'plain'],
  ['sslmode=false', '?sslmode=false', {}, 'plain'],
  ['ssl=false', '?ssl=false', {}, 'plain'],
  ['ssl=disable', '?ssl=disable', {}, 'plain'],
  ['PGSSL=disable (postgres.js alone would take it for TLS)', '', { PGSSL: 'disable' }, 'plain'],
  ['PGSSLMODE=disable', '', { PGSSLMODE: 'disable' }, 'plain'],
  ['sslmode=disable over PGSSLMODE=require (the URL wins)', '?sslmode=disable', { PGSSLMODE: 'require' }, 'plain'],
]

describe('what the check judged is what the driver does, for every spelling', () => {
  // Catches: a spelling the check counts as TLS while the driver speaks plain text (or the reverse), in the CLI's pools.
  test('idem: a TLS mode never sends a StartupMessage in plain text; REQUIRE_TLS=1 refuses exactly the modes that may', async () => {
    for (const [label, query, env, expected] of SPELLINGS) {
      await withRecorder(async (recorder) => {
        const url = withQuery(recorder.url, query)
        const judged = await runIdem(url, ['counts'], { ...NO_PG, REQUIRE_TLS: '1', ...env })
        if (expected === 'tls') {
          // Passed the check, then failed on a server without TLS, having said nothing in plain text.
          expect({ label, exit: judged.code, refused: /REQUIRE_TLS/.test(judged.stderr), asked: recorder.sslRequests() > 0, plain: recorder.plain() })
            .toEqual({ label, exit: 1, refused: false, asked: true, plain: 0 })
          return
        }
        // Plain text possible: REQUIRE_TLS=1 refuses it before any connection, and without it the driver does what was judged.
        expect({ label, exit: judged.code, refused: /REQUIRE_TLS=1/.test(judged.stderr), connections: recorder.connections.length }).toEqual({ label, exit: 2, refused: true, connections: 0 })
        const used = await runIdem(url, ['counts'], { ...NO_PG, ...env })
        const firsts = recorder.connections.map((kinds) => kinds.slice(0, expected === 'prefer' ? 2 : 1).join(' then '))
        expect({ label, exit: used.code, stderr: used.code === 0 ? '' : used.stderr, firsts: [...new Set(firsts)] })
          .toEqual({ label, exit: 0, stderr: '', firsts: [expected === 'prefer' ? 'ssl-request then startup' : 'startup'] })
      })
    }
  }, 180_000)

  // Catches: the service's first connection (the migrations) or its pools and probe speaking plain text where the check saw TLS.
  test('the production service with REQUIRE_TLS=1 and sslmode=require on a server without TLS fails to start, and never speaks plain text', async () => {
    for (const [query, env] of [['?sslmode=require', {}], ['', { PGSSLMODE: 'require' }]] as const) {
      await withRecorder(async (recorder) => {
        const result = await run(['src/main.ts'], { ...PRODUCTION, DATABASE_URL: withQuery(recorder.url, query, CANARY), REQUIRE_TLS: '1', ...env })
        expect({ query, env, exited: result.code !== null && result.code !== 0 && result.code !== 2, asked: recorder.sslRequests() > 0, plain: recorder.plain() })
          .toEqual({ query, env, exited: true, asked: true, plain: 0 })
        expect(`${result.stdout}${result.stderr}`).not.toContain(CANARY)
      })
    }
  }, 60_000)

  test('npm run migrate with sslmode=require on a server without TLS fails, and never speaks plain text', async () => {
    await withRecorder(async (recorder) => {
      const result = await run(['src/store/migrate-cli.ts'], { DATABASE_URL: withQuery(recorder.url, '?sslmode=require'), REQUIRE_TLS: '1' })
      expect({ exit: result.code, asked: recorder.sslRequests() > 0, plain: recorder.plain() }).toEqual({ exit: 1, asked: true, plain: 0 })
    })
  }, 30_000)
})
