/**
 * A Citus cluster of our own for a test file: a coordinator and N workers,
 * each a PostgreSQL server with `shared_preload_libraries = 'citus'` on a free
 * port of its own, all data under one fresh temp directory, removed by stop.
 *
 *   const cluster = await startCitusCluster({ workers: 2 })
 *   const db = await cluster.createDatabase('purge')   // citus in it on every node, the workers added
 *   ... migrate db.url, test ...
 *   await cluster.stop()
 *
 * The PostgreSQL whose lib directory holds citus.so is used (CITUS_PG_BIN, else
 * /usr/lib/postgresql/N/bin, highest N first; test/citus/run.sh installs it with
 * ../shared/citus/build.sh when missing). As root the servers run as the
 * `postgres` user (initdb refuses root), as test/versions does.
 *
 * `wal_level = logical` everywhere, so a rebalance can move shards in logical
 * mode. Nodes talk without TLS (`citus.node_conninfo = 'sslmode=disable'`):
 * loopback only, and two cores are better spent on the tests.
 */
import { spawn, spawnSync } from 'node:child_process'
import { chmodSync, chownSync, closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { postgresUser, run, type Owner } from '../../src/store/embedded-user'
import { waitUntil } from './wait'

/** Temp directories of this harness are named so; a later start removes those of a process that died (sweepStale). */
const PREFIX = 'idempotent-post-citus-'
const START_TIMEOUT_MS = 60_000
/** Fast shutdown first; an immediate one, then SIGKILL, if a node hangs (a stop must end). */
const STOP_STEPS = [['SIGINT', 15_000], ['SIGQUIT', 5_000], ['SIGKILL', 5_000]] as const

export interface CitusNode {
  readonly name: string
  readonly port: number
  /** The node's `postgres` database. */
  readonly url: string
  /** The node's own URL for another database (e.g. one made by createDatabase). */
  urlOf(database: string): string
  /** Fast shutdown of this node's server (the cluster's other nodes stay up); resolves when its process is gone. */
  stop(): Promise<void>
  /** Starts it again on the same port and data; resolves when it serves. */
  start(): Promise<void>
  /** SIGKILL of its postmaster (a crash, not a shutdown); start() brings it back after crash recovery. */
  kill(): void
  readonly running: boolean
}

export interface CitusDatabase {
  readonly name: string
  /** The coordinator's URL for this database: what the service connects to. */
  readonly url: string
  drop(): Promise<void>
}

export interface CitusCluster {
  /** The coordinator's `postgres` database (citus in it, the workers added). */
  readonly coordinatorUrl: string
  readonly coordinator: CitusNode
  readonly workers: CitusNode[]
  /** The directory that holds every node's data and log, removed by stop. */
  readonly home: string
  /** A new worker, started, with citus in every database made so far, added to each but the `plain` ones (no shards move: that is a rebalance). */
  addWorker(): Promise<CitusNode>
  /**
   * A fresh database on every node (worker databases are not made by Citus),
   * `create extension citus` in each, the coordinator set and the workers
   * added in the coordinator's. `shardCount` sets citus.shard_count for it
   * (default 32, Citus's own; fewer make distributing faster in tests).
   * `plain`: the coordinator's database has no citus yet (a single-node
   * database, as before Citus): the test adds it (create extension citus,
   * citus_set_coordinator_host, citus_add_node for each of `workers`).
   */
  createDatabase(label: string, options?: { shardCount?: number; plain?: boolean }): Promise<CitusDatabase>
  /** Stops every node (bounded: SIGINT, then SIGQUIT, then SIGKILL) and removes the directory. Safe to call twice. */
  stop(): Promise<void>
}

export interface CitusClusterOptions {
  readonly workers?: number
  /** Extra server settings for every node (`-c name=value`), e.g. { 'citus.node_connection_timeout': '2000' }. */
  readonly settings?: Readonly<Record<string, string>>
  readonly log?: (line: string) => void
}

/** The bin directory of a PostgreSQL that can load citus, or undefined. */
export function citusBin(): string | undefined {
  const given = process.env.CITUS_PG_BIN
  if (given) return given
  let majors: string[] = []
  try { majors = readdirSync('/usr/lib/postgresql').filter((name) => /^\d+$/.test(name)).sort((a, b) => Number(b) - Number(a)) } catch { return undefined }
  const major = majors.find((name) => existsSync(`/usr/lib/postgresql/${name}/lib/citus.so`))
  return major ? `/usr/lib/postgresql/${major}/bin` : undefined
}

/** Every start of a cluster in this process, for the synchronous kill on exit. */
const live = new Set<{ kill(): void }>()
process.once('exit', () => { for (const cluster of live) cluster.kill() })

export async function startCitusCluster(options: CitusClusterOptions = {}): Promise<CitusCluster> {
  const bin = citusBin()
  if (!bin) throw new Error('no PostgreSQL with citus.so found (set CITUS_PG_BIN, or run bash ../shared/citus/build.sh)')
  const log = options.log ?? (() => undefined)
  await sweepStale(log)
  const owner = await postgresUser()
  if (process.getuid?.() === 0 && !owner) throw new Error('running as root, and no postgres user could be made to run PostgreSQL as')

  const home = mkdtempSync(join(tmpdir(), PREFIX))
  chmodSync(home, 0o755) // mkdtemp makes it 0700: the postgres user must enter it
  writeFileSync(join(home, 'runner.pid'), String(process.pid))
  const nodes: Node[] = []
  const databases: string[] = ['postgres']
  /** Databases whose coordinator has no citus yet (createDatabase's `plain`): their test adds the nodes itself. */
  const plainDatabases = new Set<string>()
  let stopped: Promise<void> | undefined
  const handle = {
    kill() {
      for (const node of nodes) node.kill()
      rmSync(home, { recursive: true, force: true })
    },
  }
  live.add(handle)
  const stop = () => (stopped ??= (async () => {
    await Promise.all(nodes.map((node) => node.stop()))
    rmSync(home, { recursive: true, force: true })
    live.delete(handle)
  })())

  const makeNode = async (name: string): Promise<Node> => {
    const node = new Node(name, bin, home, owner, options.settings ?? {})
    nodes.push(node)
    await node.init()
    await node.start()
    return node
  }

  try {
    const [coordinator, ...workers] = await Promise.all(
      ['coordinator', ...Array.from({ length: options.workers ?? 2 }, (_, i) => `worker${i + 1}`)].map(makeNode))
    await Promise.all([coordinator!, ...workers].map((node) => withSql(node.url, (sql) => sql`create extension citus`)))
    await join_(coordinator!, workers, 'postgres')
    log(`citus: coordinator on ${coordinator!.port}, workers on ${workers.map((w) => w.port).join(', ')} (${home})`)

    return {
      coordinatorUrl: coordinator!.url,
      coordinator: coordinator!,
      workers,
      home,
      async addWorker() {
        const worker = await makeNode(`worker${workers.length + 1}`)
        for (const database of databases) {
          if (database !== 'postgres') await withSql(worker.url, (sql) => sql.unsafe(`create database "${database}"`))
          await withSql(worker.urlOf(database), (sql) => sql`create extension citus`)
          if (!plainDatabases.has(database)) await withSql(coordinator!.urlOf(database), (sql) => sql`select citus_add_node('127.0.0.1', ${worker.port})`)
        }
        workers.push(worker)
        return worker
      },
      async createDatabase(label, databaseOptions = {}) {
        const made = await createClusterDatabase({ coordinator: coordinator!, workers }, label, databaseOptions)
        if (databaseOptions.plain) plainDatabases.add(made.name)
        databases.push(made.name)
        return {
          ...made,
          async drop() {
            databases.splice(databases.indexOf(made.name), 1)
            await made.drop()
          },
        }
      },
      stop,
    }
  } catch (error) {
    await stop()
    throw error
  }
}

/** Where a database of a cluster is made: its nodes' addresses (a running cluster's, or read back from its coordinator by clusterAt). */
export interface ClusterNodes {
  readonly coordinator: NodeAddress
  readonly workers: readonly NodeAddress[]
}

export interface NodeAddress {
  readonly port: number
  readonly url: string
  urlOf(database: string): string
  /** False for a node stopped by its test: a drop leaves it alone. */
  readonly running?: boolean
}

/**
 * CitusCluster.createDatabase's work, for a cluster known only by its nodes:
 * test/support/db.ts makes each test file's database so on a cluster another
 * process started (TEST_CITUS_URL, test/citus/suites.test.ts).
 */
export async function createClusterDatabase(nodes: ClusterNodes, label: string, options: { shardCount?: number; plain?: boolean } = {}): Promise<CitusDatabase> {
  const { coordinator, workers } = nodes
  const name = `idem_${label.replace(/\W/g, '_').slice(0, 30)}_${crypto.randomUUID().slice(0, 8)}`
  const all = [coordinator, ...workers]
  await Promise.all(all.map((node) => withSql(node.url, (sql) => sql.unsafe(`create database "${name}"`))))
  await Promise.all(all.filter((node) => !options.plain || node !== coordinator).map((node) => withSql(node.urlOf(name), (sql) => sql`create extension citus`)))
  if (options.shardCount !== undefined)
    await withSql(coordinator.url, (sql) => sql.unsafe(`alter database "${name}" set citus.shard_count = ${Number(options.shardCount)}`))
  if (!options.plain) await join_(coordinator, workers, name)
  return {
    name,
    url: coordinator.urlOf(name),
    async drop() {
      // The workers as they are now: a cluster's list grows with addWorker.
      await Promise.all([coordinator, ...workers].filter((node) => node.running !== false).map((node) =>
        withSql(node.url, (sql) => sql.unsafe(`drop database if exists "${name}" with (force)`))))
    },
  }
}

/** The nodes of the running cluster whose coordinator's `postgres` database is `coordinatorUrl`: its workers as its catalog lists them. */
export async function clusterAt(coordinatorUrl: string): Promise<ClusterNodes> {
  const address = (host: string, port: number): NodeAddress => {
    const urlOf = (database: string) => {
      const url = new URL(coordinatorUrl)
      url.hostname = host
      url.port = String(port)
      url.pathname = `/${database}`
      return url.toString()
    }
    return { port, url: urlOf('postgres'), urlOf }
  }
  const coordinator = new URL(coordinatorUrl)
  const workers = await withSql(coordinatorUrl, (sql) => sql<{ nodename: string; nodeport: number }[]>`
    select nodename, nodeport from pg_dist_node where groupid <> 0 and noderole = 'primary' and isactive order by nodeid`)
  return {
    coordinator: address(coordinator.hostname, Number(coordinator.port || 5432)),
    workers: workers.map((worker) => address(worker.nodename, Number(worker.nodeport))),
  }
}

/** The coordinator known as itself (group 0) and the workers added, in `database`. */
async function join_(coordinator: NodeAddress, workers: readonly NodeAddress[], database: string): Promise<void> {
  await withSql(coordinator.urlOf(database), async (sql) => {
    await sql`select citus_set_coordinator_host('127.0.0.1', ${coordinator.port})`
    for (const worker of workers) await sql`select citus_add_node('127.0.0.1', ${worker.port})`
  })
}

async function withSql<T>(url: string, use: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(url, { max: 1, connect_timeout: 10, fetch_types: false, onnotice: () => undefined })
  try {
    return await use(sql)
  } finally {
    await sql.end({ timeout: 1 })
  }
}

class Node implements CitusNode {
  readonly port = freePort()
  readonly url: string
  private readonly dir: string
  private readonly logFile: string
  private pid: number | undefined

  constructor(readonly name: string, private readonly bin: string, home: string, private readonly owner: Owner | undefined,
    private readonly settings: Readonly<Record<string, string>>) {
    this.dir = join(home, name)
    this.logFile = join(home, `${name}.log`)
    this.url = this.urlOf('postgres')
  }

  urlOf(database: string): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${database}`
  }

  get running(): boolean {
    return this.pid !== undefined && alive(this.pid)
  }

  async init(): Promise<void> {
    mkdirSync(this.dir, { mode: 0o700 })
    if (this.owner) chownSync(this.dir, this.owner.uid, this.owner.gid)
    const init = await run(join(this.bin, 'initdb'), [`--pgdata=${this.dir}`, '--username=postgres', '--auth=trust', '--encoding=UTF8', '--no-sync'], this.owner)
    if (init.code !== 0) throw new Error(`initdb of ${this.name} failed (${init.code ?? init.signal}): ${init.stderr}`)
  }

  async start(): Promise<void> {
    if (this.running) return
    const settings: Record<string, string> = {
      listen_addresses: '127.0.0.1',
      unix_socket_directories: '',
      shared_preload_libraries: 'citus',
      wal_level: 'logical',
      max_wal_senders: '20',
      max_replication_slots: '20',
      max_connections: '300',
      // A throwaway cluster need not survive a power cut (a crash of a node still loses nothing committed).
      fsync: 'off',
      'citus.node_conninfo': 'sslmode=disable',
      ...outputPlugins(this.bin),
      ...this.settings,
    }
    const logFd = openSync(this.logFile, 'a')
    const child = spawn(join(this.bin, 'postgres'), ['-D', this.dir, '-p', String(this.port), ...Object.entries(settings).flatMap(([name, value]) => ['-c', `${name}=${value}`])], {
      stdio: ['ignore', logFd, logFd],
      detached: true, // its own session: a Ctrl-C reaches the tests, which stop it themselves
      ...(this.owner ?? {}),
    })
    closeSync(logFd)
    child.unref()
    this.pid = child.pid
    if (this.pid === undefined) throw new Error(`could not start ${this.name}`)
    const pid = this.pid
    const up = await waitUntil(async () => {
      if (!alive(pid)) return true
      try {
        await withSql(this.url, (sql) => sql`select 1`)
        return true
      } catch {
        return false
      }
    }, START_TIMEOUT_MS, 50)
    if (!up || !alive(pid)) throw new Error(`${this.name} (port ${this.port}) did not start; last lines of its log:\n${tail(this.logFile)}`)
  }

  async stop(): Promise<void> {
    const pid = this.pid
    if (pid === undefined) return
    await stopPostmaster(pid)
  }

  kill(): void {
    if (this.pid !== undefined && alive(this.pid)) process.kill(this.pid, 'SIGKILL')
  }
}

/**
 * Debian's PostgreSQL 15.20 lists the logical decoding output plugins a
 * replication user may name (output_plugin_libraries: pgoutput and
 * test_decoding by default), and Citus names its own, `citus`, for a shard
 * move in logical mode and create_distributed_table_concurrently. Where the
 * server has that setting, citus joins the list; where it has not, there is
 * no such list.
 */
function outputPlugins(bin: string): Record<string, string> {
  const described = spawnSync(join(bin, 'postgres'), ['--describe-config'], { encoding: 'utf8' })
  return /^output_plugin_libraries\t/m.test(described.stdout ?? '') ? { output_plugin_libraries: 'pgoutput, test_decoding, citus' } : {}
}

/** SIGINT (fast shutdown), then SIGQUIT, then SIGKILL; waits for the postmaster to exit. */
async function stopPostmaster(pid: number): Promise<void> {
  for (const [signal, waitMs] of STOP_STEPS) {
    if (!alive(pid)) return
    try { process.kill(pid, signal) } catch { return }
    if (await waitUntil(() => !alive(pid), waitMs, 20)) return
  }
}

/** Removes the clusters of test processes that died without stopping them (SIGKILL): their postmasters stopped, their directories removed. */
async function sweepStale(log: (line: string) => void): Promise<void> {
  for (const name of readdirSync(tmpdir())) {
    if (!name.startsWith(PREFIX)) continue
    const home = join(tmpdir(), name)
    let runner = Number.NaN
    try { runner = Number(readFileSync(join(home, 'runner.pid'), 'utf8')) } catch { /* half made */ }
    if (Number.isInteger(runner) && runner > 0 && alive(runner)) continue
    let dirs: string[] = []
    try { dirs = readdirSync(home) } catch { /* removed meanwhile */ }
    for (const dir of dirs) {
      const pid = postmasterOf(join(home, dir))
      if (pid !== undefined) {
        log(`citus: stopping a node left by a test process that is gone (pid ${pid})`)
        await stopPostmaster(pid)
      }
    }
    rmSync(home, { recursive: true, force: true })
  }
}

function postmasterOf(dir: string): number | undefined {
  try {
    const pid = Number(readFileSync(join(dir, 'postmaster.pid'), 'utf8').split('\n')[0])
    if (!Number.isInteger(pid) || pid <= 0 || !alive(pid)) return undefined
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('postgres') ? pid : undefined
  } catch {
    return undefined
  }
}

function freePort(): number {
  for (;;) {
    const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
    const port = probe.port
    probe.stop(true)
    // 9800-9802: a hand-made cluster of another session's exploration; stay clear of it.
    if (port < 9790 || port > 9810) return port
  }
}

/** Whether `pid` runs; a zombie does not. */
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

function tail(file: string): string {
  try { return readFileSync(file, 'utf8').split('\n').slice(-15).join('\n') } catch { return '' }
}
