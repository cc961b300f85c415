/**
 * The scale suite's own processes: PostgreSQL servers, PgBouncer, HAProxy,
 * service instances and the provider simulator, each in a process group of
 * its own so a SIGKILL takes the whole "host" down at once. Every one is
 * registered here and killed by its group id at the end (and at exit, if the
 * test runner dies first). Nothing is ever killed by name.
 *
 * Registrations go to the current scope: a scenario run inside `scoped()`
 * owns what it starts, and its teardown (bounded, every step named) removes
 * only that. A test that timed out goes on in the background (bun does not
 * stop it); when its teardown finally runs, it must not take the next test's
 * cluster with it, as a suite-wide cleanup did (the asynchronous failover's
 * data directory removed under it by the synchronous run's late cleanup).
 * AsyncLocalStorage carries the scope through every await of the scenario,
 * so nothing has to be threaded through the helpers that start processes.
 */
import type { Subprocess } from 'bun'
import { AsyncLocalStorage } from 'node:async_hooks'
import { chmodSync, chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { waitUntil, within } from '../../support/wait'

/** What one scenario started: process groups, temp dirs, killers, and teardown steps (run last-in first-out). */
class Scope {
  readonly groups = new Set<number>()
  readonly temps = new Set<string>()
  /** Killers of processes that live outside any group we started (Patroni's detached postmasters). */
  readonly killers = new Set<() => void>()
  readonly steps: { what: string; run: () => Promise<unknown>; timeoutMs: number }[] = []
  constructor(readonly label: string) {}
}

/** What was started outside any `scoped()` (a file's beforeAll): removed by cleanupAll() from afterAll. */
const fileScope = new Scope('file')
const scopes = new Set<Scope>([fileScope])
const storage = new AsyncLocalStorage<Scope>()
const current = (): Scope => storage.getStore() ?? fileScope

/**
 * How long a helper process (a PostgreSQL server's fast shutdown, PgBouncer,
 * HAProxy, etcd) may take to exit when told to stop: a checkpoint of a small
 * test cluster takes well under a second; 30 s is a machine that is very busy.
 */
export const STOP_MS = 30_000

/** How long a killed process may take to be gone (SIGKILL: the kernel's time only) before cleanup says which one is left. */
const KILLED_GONE_MS = 10_000

/** `kill` runs at cleanup (and at exit): for processes this registry cannot reach by group. It must be synchronous. */
export function onCleanup(kill: () => void): void {
  current().killers.add(kill)
}

/**
 * A teardown step of the current scope, run at its end (last registered
 * first), bounded by `timeoutMs`: past it the step is given up, named in the
 * error (`what`: what it waited for), and the scope's kills and removals run
 * anyway.
 */
export function onTeardown(what: string, run: () => Promise<unknown>, timeoutMs: number): void {
  current().steps.push({ what, run, timeoutMs })
}

/** `step`, or an error naming `what` it waited for once `timeoutMs` passed (the step goes on, unobserved). */
export async function bounded<T>(what: string, step: Promise<T>, timeoutMs: number): Promise<T> {
  const timedOut = Symbol('timed out')
  const result = await within(step, timeoutMs, timedOut)
  if (result === timedOut) throw new Error(`teardown: gave up after ${timeoutMs} ms waiting for ${what}`)
  return result as T
}

/**
 * Runs `body` in a scope of its own: everything it starts is registered
 * there, and removed when it ends, passed or failed (its teardown steps, then
 * every process killed and every temp dir removed, each bounded). A failed
 * step fails the scenario, naming what it waited for, after the rest ran.
 */
export async function scoped<T>(label: string, body: () => Promise<T>): Promise<T> {
  const scope = new Scope(label)
  scopes.add(scope)
  let result: T
  try {
    result = await storage.run(scope, body)
  } catch (error) {
    const problems = await cleanScope(scope)
    if (problems.length) console.log(`[scale] ${label}: teardown after a failure: ${problems.join('; ')}`)
    throw error
  }
  const problems = await cleanScope(scope)
  if (problems.length) throw new Error(`${label}: ${problems.join('; ')}`)
  return result
}

/** Kills the group of `pid` (SIGKILL unless told), ignoring one that is gone. */
export function killGroup(pid: number, signal: NodeJS.Signals = 'SIGKILL'): void {
  try { process.kill(-pid, signal) } catch { /* gone */ }
}

/** `root` and every process below it (by parent pid), root first. */
export function descendants(root: number): number[] {
  const children = new Map<number, number[]>()
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8')
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      children.set(ppid, [...(children.get(ppid) ?? []), Number(name)])
    } catch { /* gone */ }
  }
  const out: number[] = []
  const walk = (pid: number) => { out.push(pid); for (const child of children.get(pid) ?? []) walk(child) }
  walk(root)
  return out
}

/** Whether `pid` still runs (a zombie, dead and waiting to be reaped, does not). */
export function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z'
  } catch {
    return false
  }
}

/**
 * SIGKILL to `root`'s group and to every descendant, at once: a host crash.
 * A group alone is not enough for PostgreSQL, whose backends each call
 * setsid(); killed with the postmaster only, they linger until they notice.
 * Returns the pids it signalled.
 */
export function killTree(root: number): number[] {
  const pids = descendants(root)
  killGroup(root)
  for (const pid of pids) try { process.kill(pid, 'SIGKILL') } catch { /* gone */ }
  return pids
}

function killEverythingNow(): void {
  for (const scope of scopes) {
    for (const kill of scope.killers) try { kill() } catch { /* best effort */ }
    for (const pid of scope.groups) killTree(pid)
    for (const dir of scope.temps) try { rmSync(dir, { recursive: true, force: true }) } catch { /* best effort */ }
  }
}
process.on('exit', killEverythingNow)
// Our servers run in groups of their own, so a Ctrl-C to the runner does not reach them: pass it on.
for (const signal of ['SIGINT', 'SIGTERM'] as const)
  process.once(signal, () => {
    killEverythingNow()
    process.exit(130)
  })

/**
 * Tears `scope` down: its steps (last first, each bounded), then its killers
 * and process groups (SIGKILL), waiting until every killed process is gone,
 * then its temp dirs. Returns what it gave up on, by name; never throws.
 */
async function cleanScope(scope: Scope): Promise<string[]> {
  const problems: string[] = []
  for (const step of scope.steps.splice(0).reverse()) {
    try {
      await bounded(`${step.what} (${scope.label})`, step.run(), step.timeoutMs)
    } catch (error) {
      problems.push(error instanceof Error ? error.message : String(error))
    }
  }
  for (const kill of scope.killers) try { kill() } catch (error) { problems.push(`a killer failed: ${String(error)}`) }
  scope.killers.clear()
  const killed = [...scope.groups].flatMap((pid) => killTree(pid))
  scope.groups.clear()
  // SIGKILLed: gone as soon as the kernel has torn them down; their folders are removed after.
  if (!(await waitUntil(() => killed.every((pid) => !alive(pid)), KILLED_GONE_MS, 20))) {
    problems.push(`teardown: gave up after ${KILLED_GONE_MS} ms waiting for killed processes to be gone (${scope.label}): ${killed.filter(alive).join(', ')} still run`)
  }
  for (const dir of scope.temps) try { rmSync(dir, { recursive: true, force: true }) } catch (error) { problems.push(`could not remove ${dir}: ${String(error)}`) }
  scope.temps.clear()
  if (scope !== fileScope) scopes.delete(scope)
  return problems
}

/**
 * Inside `scoped()`: that scope, torn down now. Outside (a file's afterAll):
 * everything still registered, every scope's included (a scenario that timed
 * out and still runs in the background loses its processes here).
 * Throws naming what a teardown step gave up waiting for.
 */
export async function cleanupAll(): Promise<void> {
  const inside = storage.getStore()
  const problems = inside ? await cleanScope(inside) : (await Promise.all([...scopes].map(cleanScope))).flat()
  if (problems.length) throw new Error(problems.join('; '))
}

export const isRoot = process.getuid?.() === 0

/** PostgreSQL and PgBouncer refuse to run as root: as root we drop to this user. */
export const SERVICE_USER = 'postgres'

/** The argv prefix that runs a command as SERVICE_USER when we are root (setpriv execs, so the pid stays the server's). */
export function asServiceUser(argv: string[]): string[] {
  return isRoot ? ['setpriv', `--reuid=${SERVICE_USER}`, `--regid=${SERVICE_USER}`, '--init-groups', '--', ...argv] : argv
}

/** A temp dir removed at the end; owned by SERVICE_USER when we are root, so the servers can write in it. */
export function tempDir(label: string): string {
  const dir = mkdtempSync(join(tmpdir(), `idem-scale-${label}-`))
  current().temps.add(dir)
  if (isRoot) {
    const { uid, gid } = serviceUserIds()
    chownSync(dir, uid, gid)
  }
  chmodSync(dir, 0o700)
  return dir
}

let ids: { uid: number; gid: number } | undefined
function serviceUserIds(): { uid: number; gid: number } {
  if (ids) return ids
  const out = Bun.spawnSync(['id', '-u', SERVICE_USER]).stdout.toString().trim()
  const gid = Bun.spawnSync(['id', '-g', SERVICE_USER]).stdout.toString().trim()
  if (!/^\d+$/.test(out)) throw new Error(`running as root, but there is no "${SERVICE_USER}" user to run the servers as`)
  ids = { uid: Number(out), gid: Number(gid) }
  return ids
}

/** Files the servers must read (configs) are handed to SERVICE_USER. */
export function giveToServiceUser(path: string): void {
  if (!isRoot) return
  const { uid, gid } = serviceUserIds()
  chownSync(path, uid, gid)
}

export interface Started {
  readonly proc: Subprocess
  /** Everything it printed so far. */
  readonly output: () => string
}

/** Spawns `argv` detached (its own process group), registered for cleanup, its output captured. */
export function start(argv: string[], options: { env?: Record<string, string>; cwd?: string } = {}): Started {
  const proc = Bun.spawn(argv, {
    env: options.env ?? (process.env as Record<string, string>),
    cwd: options.cwd ?? process.cwd(),
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'pipe',
    detached: true,
  })
  track(proc.pid)
  let out = ''
  const collect = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder()
    const reader = stream.getReader()
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) return
        out += decoder.decode(value, { stream: true })
      }
    } catch { /* closed */ }
  }
  void collect(proc.stdout as ReadableStream<Uint8Array>)
  void collect(proc.stderr as ReadableStream<Uint8Array>)
  return { proc, output: () => out }
}

/** Registers a process group leader started elsewhere (spawnService, spawnSimulator with detached). */
export function track(pid: number): void {
  current().groups.add(pid)
}

/** Runs a command to completion; throws with its output on a non-zero exit. */
export function run(argv: string[], options: { env?: Record<string, string> } = {}): string {
  const result = Bun.spawnSync(argv, { env: options.env ?? (process.env as Record<string, string>), stdout: 'pipe', stderr: 'pipe' })
  const output = result.stdout.toString() + result.stderr.toString()
  if (result.exitCode !== 0) throw new Error(`${argv.join(' ')} exited ${result.exitCode}:\n${output}`)
  return output
}

/** Where a Debian binary is, or undefined. PostgreSQL's server binaries are not on PATH on Debian. */
export function findBinary(name: string): string | undefined {
  const candidates = [
    ...(process.env.PATH ?? '').split(':').map((dir) => join(dir, name)),
    `/usr/sbin/${name}`,
    ...['18', '17', '16', '15', '14'].map((v) => `/usr/lib/postgresql/${v}/bin/${name}`),
  ]
  return candidates.find((path) => path && existsSync(path))
}

/**
 * The binaries a scenario needs, or a clear reason to skip it. The runner
 * (test/scale/run.sh) installs them from Debian's packages when it can.
 */
export function missing(names: string[]): string | undefined {
  const absent = names.filter((name) => !findBinary(name))
  if (absent.length === 0) return undefined
  return `skipped: ${absent.join(', ')} not found (apt-get install -y ${[...new Set(absent.map(debianPackage))].join(' ')})`
}

function debianPackage(binary: string): string {
  if (binary === 'pgbouncer' || binary === 'haproxy' || binary === 'patroni') return binary
  if (binary === 'patronictl') return 'patroni'
  if (binary === 'etcd') return 'etcd-server'
  return 'postgresql'
}

/** A TCP port nobody listens on right now on 127.0.0.1. */
export function freePort(): number {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response(null) })
  const port = probe.port!
  probe.stop(true)
  return port
}

/** The suite's one waiting helper, in its value-returning form (test/support/wait.ts). */
export { waitForValue as waitFor } from '../../support/wait'
