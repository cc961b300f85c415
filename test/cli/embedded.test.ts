/**
 * The newcomer's path: `npm start` in one terminal (no DATABASE_URL: the
 * embedded PostgreSQL), `npm run idem -- list` in another, with nothing set.
 * The CLI finds the service's embedded database by the same rules that
 * placed it (here a `mktemp -d` checkout, 0700: as root the data is
 * relocated under /var/lib/idempotent-post) and reads its port from the
 * server's lock file (the service runs it on a port the CLI is not told).
 * With the service stopped, the CLI says what to do instead of guessing.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { SYSTEM_DATA_ROOTS } from '../../src/store/embedded'
import { freePort } from '../chaos/clients'
import { payment, postPayment } from '../support/http'
import { waitFor } from '../support/wait'
import { alive, startDetached, type GroupProcess } from '../shutdown/spawn'

const REPO = join(import.meta.dir, '..', '..')
const checkout = mkdtempSync(join(tmpdir(), 'idem-cli-embedded-'))
for (const name of ['package.json', 'tsconfig.json', 'bunfig.toml', 'src', 'sql', 'node_modules']) symlinkSync(join(REPO, name), join(checkout, name))
/** Where the service said its data went. */
let dataDir: string | undefined
let service: GroupProcess | undefined

beforeAll(async () => {
  service = await startDetached([process.execPath, 'src/main.ts'], { DATABASE_URL: undefined, EMBEDDED_PG_DIR: undefined, EMBEDDED_PG_PORT: String(freePort()) }, { cwd: checkout })
  dataDir = /embedded PostgreSQL ready \(data in (.+), port \d+\)/.exec(service.output())?.[1]
}, 60_000) // a first start runs initdb

afterAll(async () => {
  if (service && service.proc.exitCode === null) try { process.kill(-service.proc.pid, 'SIGKILL') } catch { /* gone */ }
  const lock = dataDir && join(dataDir, 'postmaster.pid')
  const pid = lock && existsSync(lock) ? Number(readFileSync(lock, 'utf8').split('\n')[0]) : undefined
  if (pid && alive(pid)) process.kill(pid, 'SIGQUIT')
  if (pid) await waitFor(() => !alive(pid), `PostgreSQL (pid ${pid}) to exit`, 30_000)
  rmSync(checkout, { recursive: true, force: true })
  if (dataDir && SYSTEM_DATA_ROOTS.some((root) => dataDir!.startsWith(`${root}/`))) rmSync(dirname(dataDir), { recursive: true, force: true })
  // Where a start that failed before saying so would have put it (embedded.ts: a hash of the wanted path).
  const id = createHash('sha256').update(join(checkout, '.data', 'pg')).digest('hex').slice(0, 12)
  for (const root of SYSTEM_DATA_ROOTS) rmSync(join(root, id), { recursive: true, force: true })
}, 30_000)

/** `npm run idem -- ...` in the checkout, with nothing of the service's environment. */
async function idem(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^(DATABASE_URL|EMBEDDED_PG_|IDEMPOTENCY_)/.test(name))) as Record<string, string>
  const proc = Bun.spawn(['npm', 'run', '--silent', 'idem', '--', ...args], { cwd: checkout, env, stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, stdout, stderr }
}

test('right after npm start, npm run idem -- list finds the embedded database by itself', async () => {
  expect(dataDir).toBeDefined()
  const created = await postPayment(service!.url, payment({ customer: 'cli-embedded' }), { key: 'cli-embedded-1' })
  expect(created.status).toBe(201)

  const list = await idem(['list'])
  expect(list.stderr).toContain(`using the embedded PostgreSQL of this checkout (data in ${dataDir}`)
  expect(list.code).toBe(0)
  expect(list.stdout).toContain('no key in processing matches')
  const show = await idem(['show', 'acme', 'cli-embedded-1', '--json'])
  expect(show.code).toBe(0)
  expect(JSON.parse(show.stdout)).toMatchObject({ tenant: 'acme', key: 'cli-embedded-1', status: 'done', payment: { customer: 'cli-embedded' } })
}, 30_000)

test('with the service stopped, it says what to do (exit 2) and starts nothing', async () => {
  process.kill(service!.proc.pid, 'SIGTERM')
  expect(await service!.exited()).toBe(0)
  const run = await idem(['list'])
  expect(run.code).toBe(2)
  expect(run.stderr).toContain('no embedded PostgreSQL of this checkout is running')
  expect(run.stderr).toContain('npm start')
  expect(existsSync(join(dataDir!, 'postmaster.pid'))).toBe(false)
}, 30_000)
