/**
 * The embedded default works in any checkout: here one made as CI and
 * newcomers make it, by `mktemp -d` (mode 0700), with spaces in its path, and
 * the service started from inside it with no setting at all (data dir
 * `.data/pg`). As root, PostgreSQL runs as `postgres`, which cannot enter a
 * 0700 folder of root's: the data then lives in a folder of this checkout
 * under /var/lib/idempotent-post, and the service says where. As any other
 * user, it stays in the checkout. Either way: restarts find the same data,
 * after a clean stop, after a SIGKILL of the service's group (PostgreSQL
 * outlives it and is adopted) and after a SIGKILL of PostgreSQL itself (its
 * stale lock file is cleared).
 */
import { afterAll, expect, test } from 'bun:test'
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import postgres from 'postgres'
import { startEmbedded, SYSTEM_DATA_ROOTS } from '../../src/store/embedded'
import { freePort } from '../chaos/clients'
import { waitFor } from '../support/wait'
import { alive, startDetached, type GroupProcess } from './spawn'

const REPO = join(import.meta.dir, '..', '..')
const checkout = mkdtempSync(join(tmpdir(), 'idem private checkout '))
// The checkout: this repository's files, linked (a copy of node_modules would cost seconds and 200 MB).
for (const name of ['package.json', 'tsconfig.json', 'bunfig.toml', 'src', 'sql', 'node_modules']) symlinkSync(join(REPO, name), join(checkout, name))
const port = freePort()
const root = process.getuid?.() === 0
let dataDir: string | undefined
const services: GroupProcess[] = []

afterAll(async () => {
  for (const s of services) if (s.proc.exitCode === null) try { process.kill(-s.proc.pid, 'SIGKILL') } catch { /* gone */ }
  const pid = dataDir ? postmasterPid(dataDir) : undefined
  if (pid && alive(pid)) process.kill(pid, 'SIGQUIT')
  if (pid) await waitFor(() => !alive(pid), `PostgreSQL (pid ${pid}) to exit`, 30_000)
  rmSync(checkout, { recursive: true, force: true })
  if (dataDir && SYSTEM_DATA_ROOTS.some((r) => dataDir!.startsWith(`${r}/`))) rmSync(dirname(dataDir), { recursive: true, force: true })
})

function postmasterPid(dir: string): number | undefined {
  const file = join(dir, 'postmaster.pid')
  return existsSync(file) ? Number(readFileSync(file, 'utf8').split('\n')[0]) : undefined
}

async function query<T>(fn: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(`postgres://postgres:postgres@127.0.0.1:${port}/postgres`, { max: 1, onnotice: () => undefined })
  try {
    return await fn(sql)
  } finally {
    await sql.end({ timeout: 1 })
  }
}
const marker = () => query((sql) => sql<{ note: string }[]>`select note from first_run`).then((rows) => rows.map((r) => r.note))

/** `npm start` from inside the checkout, nothing set: the defaults a newcomer gets. */
async function startService(): Promise<GroupProcess> {
  const service = await startDetached([process.execPath, 'src/main.ts'], { DATABASE_URL: undefined, EMBEDDED_PG_DIR: undefined, EMBEDDED_PG_PORT: String(port) }, { cwd: checkout })
  services.push(service)
  return service
}

test('a 0700 checkout with spaces in its path: the embedded PostgreSQL starts, and every restart finds the same data', async () => {
  expect(statSync(checkout).mode & 0o777).toBe(0o700)
  expect(checkout).toContain(' ')

  // 1. First start (startEmbedded, as `npm start` and `npm test` call it): a table is made.
  const lines: string[] = []
  const first = await startEmbedded({ dir: join(checkout, '.data', 'pg'), port, log: (line) => lines.push(line) })
  dataDir = first.dir
  if (root) {
    expect(dataDir.startsWith(`${SYSTEM_DATA_ROOTS[0]}/`)).toBe(true)
    expect(lines.join('\n')).toContain(`keeps this checkout's data in ${dataDir}`)
    expect(readFileSync(join(dirname(dataDir), 'README'), 'utf8')).toContain(join(checkout, '.data', 'pg'))
  } else {
    expect(dataDir).toBe(join(checkout, '.data', 'pg'))
  }
  await query(async (sql) => {
    await sql`create table first_run (note text)`
    await sql`insert into first_run values ('made by the first start')`
  })
  await first.stop()
  expect(postmasterPid(dataDir)).toBeUndefined()

  // 2. The service from inside the checkout, with no setting: same data; then SIGKILL of its whole group.
  let service = await startService()
  expect(service.output()).toContain(`embedded PostgreSQL ready (data in ${dataDir},`)
  expect(await marker()).toEqual(['made by the first start'])
  const postmaster = postmasterPid(dataDir)!
  process.kill(-service.proc.pid, 'SIGKILL')
  await service.proc.exited
  expect(alive(postmaster)).toBe(true) // detached by design: it outlives the group

  // 3. The next start adopts the PostgreSQL left running; then PostgreSQL is SIGKILLed too.
  service = await startService()
  expect(service.output()).toContain(`adopting the PostgreSQL server (pid ${postmaster}) still running on ${dataDir}`)
  expect(await marker()).toEqual(['made by the first start'])
  process.kill(-service.proc.pid, 'SIGKILL')
  await service.proc.exited
  process.kill(postmaster, 'SIGKILL')
  await waitFor(() => !alive(postmaster), `the SIGKILLed PostgreSQL (pid ${postmaster}) to be gone`, 30_000)
  expect(postmasterPid(dataDir)).toBe(postmaster) // the stale lock file

  // 4. The next start clears the stale lock, PostgreSQL recovers from its WAL; a SIGTERM stops it all, exit 0.
  service = await startService()
  expect(service.output()).not.toContain('adopting')
  expect(service.output()).toContain(`embedded PostgreSQL ready (data in ${dataDir},`)
  expect(await marker()).toEqual(['made by the first start'])
  process.kill(service.proc.pid, 'SIGTERM')
  expect(await service.exited()).toBe(0)
  expect(service.output()).toContain('embedded PostgreSQL stopped')
  expect(postmasterPid(dataDir)).toBeUndefined()
  console.log(`${root ? 'root' : `uid ${process.getuid?.()}`}: checkout ${JSON.stringify(checkout)} (0700), data in ${dataDir}`)
}, 120_000)
