/**
 * The scale suite's own processes: PostgreSQL servers, PgBouncer, HAProxy,
 * service instances and the provider simulator, each in a process group of
 * its own so a SIGKILL takes the whole "host" down at once. Every one is
 * registered here and killed by its group id at the end of the file (and at
 * exit, if the test runner dies first). Nothing is ever killed by name.
 */
import type { Subprocess } from 'bun'
import { chmodSync, chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

const groups = new Set<number>()
const temps = new Set<string>()
/** Killers of processes that live outside any group we started (Patroni's detached postmasters). */
const killers = new Set<() => void>()

/** `kill` runs at cleanup (and at exit): for processes this registry cannot reach by group. It must be synchronous. */
export function onCleanup(kill: () => void): void {
  killers.add(kill)
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

/**
 * SIGKILL to `root`'s group and to every descendant, at once: a host crash.
 * A group alone is not enough for PostgreSQL, whose backends each call
 * setsid(); killed with the postmaster only, they linger until they notice.
 */
export function killTree(root: number): void {
  const pids = descendants(root)
  killGroup(root)
  for (const pid of pids) try { process.kill(pid, 'SIGKILL') } catch { /* gone */ }
}

function killEverythingNow(): void {
  for (const kill of killers) try { kill() } catch { /* best effort */ }
  for (const pid of groups) killTree(pid)
  for (const dir of temps) try { rmSync(dir, { recursive: true, force: true }) } catch { /* best effort */ }
}
process.on('exit', killEverythingNow)
// Our servers run in groups of their own, so a Ctrl-C to the runner does not reach them: pass it on.
for (const signal of ['SIGINT', 'SIGTERM'] as const)
  process.once(signal, () => {
    killEverythingNow()
    process.exit(130)
  })

/** Everything started so far is killed and every temp dir removed; call from afterAll. */
export async function cleanupAll(): Promise<void> {
  for (const kill of killers) kill()
  killers.clear()
  for (const pid of groups) killTree(pid)
  groups.clear()
  await Bun.sleep(100)
  for (const dir of temps) rmSync(dir, { recursive: true, force: true })
  temps.clear()
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
  temps.add(dir)
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
  groups.add(pid)
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
