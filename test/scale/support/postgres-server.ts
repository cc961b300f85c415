/**
 * A private PostgreSQL server made by the test: initdb in a temp dir, its own
 * free port. kill() is a host crash: SIGKILL to the postmaster and every
 * backend at once (killTree). Standbys are made
 * with pg_basebackup -R and promoted with pg_ctl promote.
 */
import { appendFileSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { asServiceUser, bounded, STOP_MS, findBinary, freePort, killGroup, killTree, run, start, tempDir, waitFor, type Started } from './processes'

function bin(name: string): string {
  const path = findBinary(name)
  if (!path) throw new Error(`${name} not found (apt-get install -y postgresql)`)
  return path
}

export interface ServerSettings {
  readonly [name: string]: string | number
}

export class PostgresServer {
  #running: Started | undefined

  private constructor(readonly name: string, readonly dir: string, readonly port: number) {}

  /** initdb with trust auth (loopback only), then `settings` appended to postgresql.conf. */
  static init(name: string, settings: ServerSettings = {}): PostgresServer {
    const root = tempDir(name)
    const dir = join(root, 'data')
    run(asServiceUser([bin('initdb'), '-D', dir, '--auth=trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8', '--locale=C']))
    const server = new PostgresServer(name, dir, freePort())
    server.configure({
      listen_addresses: "'127.0.0.1'",
      unix_socket_directories: "''",
      max_connections: 200,
      shared_buffers: "'128MB'",
      ...settings,
    })
    return server
  }

  /**
   * A streaming standby of `primary`, by pg_basebackup -R; `name` is its
   * application_name in synchronous_standby_names. It streams from
   * `upstreamPort` (a relay standing for the network), by default the primary's own.
   */
  static standbyOf(primary: PostgresServer, name: string, settings: ServerSettings = {}, upstreamPort = primary.port): PostgresServer {
    const root = tempDir(name)
    const dir = join(root, 'data')
    run(asServiceUser([bin('pg_basebackup'), '-h', '127.0.0.1', '-p', String(primary.port), '-U', 'postgres', '-D', dir, '-R', '-X', 'stream', '-c', 'fast', '--no-sync']))
    const server = new PostgresServer(name, dir, freePort())
    // -R wrote a primary_conninfo; ours comes later in the file and wins, and names the standby.
    server.configure({
      primary_conninfo: `'host=127.0.0.1 port=${upstreamPort} user=postgres application_name=${name}'`,
      ...settings,
    })
    return server
  }

  configure(settings: ServerSettings): void {
    const lines = Object.entries(settings).map(([key, value]) => `${key} = ${value}`).join('\n')
    appendFileSync(join(this.dir, 'postgresql.auto.conf'), `\n${lines}\n`)
  }

  url(database = 'postgres'): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${database}`
  }

  get pid(): number | undefined {
    return this.#running?.proc.pid
  }

  get output(): string {
    return this.#running?.output() ?? ''
  }

  /** Starts the postmaster in the foreground of its own group and waits until it accepts connections. */
  async start(): Promise<void> {
    this.#running = start(asServiceUser([bin('postgres'), '-D', this.dir, '-p', String(this.port)]))
    const running = this.#running
    await waitFor(`${this.name} to accept connections on ${this.port}`, async () => {
      if (running.proc.exitCode !== null) throw new Error(`${this.name} exited ${running.proc.exitCode}:\n${running.output()}`)
      const probe = postgres(this.url(), { max: 1, connect_timeout: 1, onnotice: () => undefined })
      try {
        await probe`select 1`
        return true
      } finally {
        await probe.end({ timeout: 0 })
      }
    }, 30_000, 100)
  }

  /** A host crash: SIGKILL to the postmaster and every backend at once. */
  async kill(): Promise<void> {
    const running = this.#running
    if (!running) return
    killTree(running.proc.pid)
    await bounded(`${this.name} (pid ${running.proc.pid}) to die after SIGKILL`, running.proc.exited, STOP_MS)
  }

  /** A fast shutdown (SIGINT): rolls back sessions, checkpoints, exits. */
  async stop(): Promise<void> {
    const running = this.#running
    if (!running || running.proc.exitCode !== null) return
    killGroup(running.proc.pid, 'SIGINT')
    await bounded(`${this.name} (pid ${running.proc.pid}) to exit after SIGINT (a fast shutdown)`, running.proc.exited, STOP_MS)
  }

  /** pg_ctl promote, waiting until the server accepts writes. */
  promote(): void {
    run(asServiceUser([bin('pg_ctl'), 'promote', '-D', this.dir, '-w', '-t', '60']))
  }
}
