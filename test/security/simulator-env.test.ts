/**
 * `npm start` without PAYMENT_PROVIDER_URL runs the bundled simulator: a
 * process with no authentication of its own, which gets its own settings and
 * nothing of the service's secrets (read from its /proc/<pid>/environ). The
 * start banner masks the database password, found by URL parsing.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { spawnService } from '../support/process'
import { waitFor } from '../support/wait'

let db: TestDatabase
let dir: string
beforeAll(async () => {
  db = await createTestDatabase('security_simulator')
  dir = mkdtempSync(join(tmpdir(), 'idem-sim-env-'))
})
afterAll(async () => {
  await db?.drop()
  rmSync(dir, { recursive: true, force: true })
})

test('the simulator sees none of ADMIN_TOKEN, ADMIN_TOKENS, API_KEYS, DATABASE_URL, METRICS_TOKEN; the banner shows no password', async () => {
  const secrets = {
    ADMIN_TOKEN: `admin-${'s'.repeat(32)}`,
    ADMIN_TOKENS: `alice:alice-${'s'.repeat(32)}`,
    API_KEYS: `acme:acme-${'s'.repeat(32)}`,
    METRICS_TOKEN: `metrics-${'s'.repeat(32)}`,
  }
  // A password in the URL, which the banner must mask: the server's own (the embedded test
  // server's), or else a made-up one, which trust authentication (the machine's server) ignores.
  const url = new URL(db.url)
  if (!url.password) {
    url.username ||= 'postgres'
    url.password = 's3cret-pass'
  }
  const password = decodeURIComponent(url.password)
  const { proc, output } = await spawnService({
    env: {
      ...secrets,
      DATABASE_URL: url.toString(),
      PAYMENT_PROVIDER_URL: undefined,
      PAYMENT_PROVIDER_LEDGER: join(dir, 'ledger.sqlite'),
      // The simulator records of this start stay in this test's folder, apart from other runs'.
      TMPDIR: dir,
      NODE_ENV: 'test',
    },
  })
  try {
    await waitFor(() => output().includes('provider       http://'), 'the banner')
    const pid = simulatorOf(proc.pid)
    const environ = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').filter(Boolean)
    const names = environ.map((entry) => entry.slice(0, entry.indexOf('=')))
    for (const name of ['ADMIN_TOKEN', 'ADMIN_TOKENS', 'API_KEYS', 'DATABASE_URL', 'METRICS_TOKEN']) expect(names).not.toContain(name)
    for (const secret of [...Object.values(secrets), `:${password}@`]) expect(environ.join('\n')).not.toContain(secret)
    // Its own settings it has.
    expect(names).toEqual(expect.arrayContaining(['PAYMENT_PROVIDER_PORT', 'PAYMENT_PROVIDER_LEDGER', 'PATH']))

    const banner = output()
    expect(banner).toContain('database       postgres://***:***@') // user and password: userinfo is masked whole (store/masked-url.ts)
    expect(banner).not.toContain(`:${password}@`)
    expect(banner).toContain('admin token    from ADMIN_TOKEN/ADMIN_TOKENS, operators: admin, alice')
    for (const secret of Object.values(secrets)) expect(banner).not.toContain(secret)
  } finally {
    proc.kill('SIGTERM')
    expect(await proc.exited).toBe(0)
  }
}, 60_000)

/** The simulator child of the service `parent` (its own process group, but still our child). */
function simulatorOf(parent: number): number {
  const read = (path: string) => { try { return readFileSync(path, 'utf8') } catch { return '' } }
  const children = readdirSync('/proc').filter((name) => /^\d+$/.test(name)).filter((pid) => {
    const stat = read(`/proc/${pid}/stat`)
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === parent && read(`/proc/${pid}/cmdline`).includes('provider/main.ts')
  })
  expect(children).toHaveLength(1)
  return Number(children[0])
}
