/**
 * PgBouncer (Debian's 1.18) in transaction mode, started by the test on a free
 * port in front of one PostgreSQL database. 1.18 has no prepared statements in
 * transaction mode and rejects startup parameters it does not know, which is
 * what DATABASE_PGBOUNCER=1 is for.
 */
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { asServiceUser, bounded, STOP_MS, findBinary, freePort, giveToServiceUser, killGroup, start, tempDir, waitFor, type Started } from './processes'

export interface PgBouncerOptions {
  /** The server PgBouncer connects to. */
  readonly host: string
  readonly port: number
  readonly database: string
  /** Server connections per (user, database). @default 20 */
  readonly poolSize?: number
  /** More pgbouncer.ini settings, over the ones below. */
  readonly settings?: Readonly<Record<string, string | number>>
}

export class PgBouncer {
  private constructor(readonly port: number, readonly database: string, readonly running: Started) {}

  static async start(options: PgBouncerOptions): Promise<PgBouncer> {
    const binary = findBinary('pgbouncer')
    if (!binary) throw new Error('pgbouncer not found (apt-get install -y pgbouncer)')
    const dir = tempDir('pgbouncer')
    const port = freePort()
    const ini = join(dir, 'pgbouncer.ini')
    const users = join(dir, 'userlist.txt')
    writeFileSync(users, '"postgres" ""\n')
    writeFileSync(ini, [
      '[databases]',
      `${options.database} = host=${options.host} port=${options.port} dbname=${options.database}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      "unix_socket_dir =",
      'auth_type = trust',
      `auth_file = ${users}`,
      'admin_users = postgres',
      'pool_mode = transaction',
      `default_pool_size = ${options.poolSize ?? 20}`,
      'max_client_conn = 1000',
      // As docs/how-to/pgbouncer.md recommends: a server connection whose client sits
      // idle in a transaction is taken back after 5 s (the same bound as the
      // database's idle_in_transaction_session_timeout), and dead peers are
      // noticed by TCP keepalive on both sides.
      'idle_transaction_timeout = 5',
      'tcp_keepalive = 1',
      'tcp_keepidle = 5',
      'tcp_keepintvl = 2',
      'tcp_keepcnt = 3',
      'server_connect_timeout = 2',
      'server_login_retry = 1',
      // A client waits at most this long for a server connection, then gets
      // an error (the service answers 503), instead of the default 120 s.
      'query_wait_timeout = 5',
      'log_connections = 0',
      'log_disconnections = 0',
      ...Object.entries(options.settings ?? {}).map(([name, value]) => `${name} = ${value}`),
      '',
    ].join('\n'))
    giveToServiceUser(ini)
    giveToServiceUser(users)
    const running = start(asServiceUser([binary, ini]))
    const bouncer = new PgBouncer(port, options.database, running)
    await waitFor(`PgBouncer on ${port}`, async () => {
      if (running.proc.exitCode !== null) throw new Error(`pgbouncer exited ${running.proc.exitCode}:\n${running.output()}`)
      const probe = postgres(bouncer.url(), { max: 1, prepare: false, connect_timeout: 1, onnotice: () => undefined })
      try {
        await probe`select 1`
        return true
      } finally {
        await probe.end({ timeout: 0 })
      }
    }, 15_000, 100)
    return bouncer
  }

  url(): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${this.database}`
  }

  /** PgBouncer's admin console (SHOW POOLS, SHOW STATS): simple protocol only. */
  async show(what: 'POOLS' | 'STATS' | 'SERVERS' | 'CLIENTS'): Promise<Record<string, unknown>[]> {
    const admin = postgres(`postgres://postgres@127.0.0.1:${this.port}/pgbouncer`, { max: 1, prepare: false, fetch_types: false, onnotice: () => undefined })
    try {
      return [...(await admin.unsafe(`SHOW ${what}`).simple())] as Record<string, unknown>[]
    } finally {
      await admin.end({ timeout: 0 })
    }
  }

  async stop(): Promise<void> {
    killGroup(this.running.proc.pid, 'SIGINT')
    await bounded(`PgBouncer (pid ${this.running.proc.pid}) to exit after SIGINT`, this.running.proc.exited, STOP_MS)
  }
}
