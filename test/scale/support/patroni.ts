/**
 * A Patroni cluster (Debian's patroni 3.0) of three PostgreSQL 15 nodes and
 * one etcd, on loopback ports chosen free at run time, with every data
 * directory under a temp dir: started and torn down by the suite, scoped to
 * its own processes and ports (nothing is killed by name).
 *
 * Configured as Patroni's postgres0.yml example, with what HA needs here:
 * - `synchronous_mode: on`: Patroni names one replica in
 *   synchronous_standby_names, so a commit is acknowledged only once a standby
 *   has it, and only that standby may be promoted;
 * - `use_pg_rewind` on a cluster initialised with data checksums (which
 *   pg_rewind needs, as wal_log_hints would do): a former primary rejoins as
 *   a replica after its timeline is rewound;
 * - ttl 10 s, loop_wait 2 s, retry_timeout 4 s (loop_wait + 2 × retry_timeout
 *   ≤ ttl, as Patroni's docs ask): a dead leader's lock expires within 10 s of
 *   its last renewal, and a replica notices within one loop. These set the
 *   detection part of the failover time the scenarios measure.
 *
 * Patroni starts the postmaster through a helper that detaches it (setsid),
 * so the postmaster is not Patroni's child: a host crash (kill) SIGKILLs
 * Patroni's tree and the postmaster's tree, found from postmaster.pid.
 */
import { existsSync, readFileSync, realpathSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import postgres from 'postgres'
import { Etcd } from './etcd'
import { asServiceUser, bounded, findBinary, freePort, giveToServiceUser, killTree, onCleanup, run, start, tempDir, waitFor, type Started } from './processes'

export interface PatroniTiming {
  /** Seconds the leader lock lives without a renewal. @default 10 */
  readonly ttl: number
  /** Seconds between two runs of Patroni's HA loop. @default 2 */
  readonly loopWait: number
  /** Seconds Patroni retries the DCS and PostgreSQL before giving up a loop. @default 4 */
  readonly retryTimeout: number
}

export const DEFAULT_TIMING: PatroniTiming = { ttl: 10, loopWait: 2, retryTimeout: 4 }

export interface PatroniOptions {
  readonly nodes?: number
  /** synchronous_mode (on unless told). */
  readonly synchronous?: boolean
  readonly timing?: Partial<PatroniTiming>
  /** Extra postgresql.conf parameters, managed by Patroni (bootstrap.dcs). */
  readonly parameters?: Record<string, string | number>
}

/** A member as Patroni's REST API lists it (GET /cluster). */
export interface Member {
  readonly name: string
  /** 'leader', 'sync_standby' or 'replica'. */
  readonly role: string
  /** 'running', 'streaming', 'stopped', 'starting', ... */
  readonly state: string
  readonly timeline?: number
  readonly lag?: number | string
}

/** What a node's Patroni says of itself (GET /patroni). */
export interface NodeStatus {
  readonly state: string
  readonly role: string
  readonly timeline?: number
}

/** Debian's server binaries (/usr/lib/postgresql/15/bin): the folder itself, not a symlink to one of them elsewhere. */
function pgBinDir(): string {
  const path = findBinary('pg_controldata')
  if (!path) throw new Error('PostgreSQL server binaries not found (apt-get install -y postgresql)')
  return dirname(realpathSync(path))
}

export class PatroniNode {
  #patroni: Started | undefined

  constructor(readonly cluster: PatroniCluster, readonly name: string, readonly dir: string, readonly pgPort: number, readonly restPort: number) {}

  get dataDir(): string {
    return join(this.dir, 'data')
  }

  get configFile(): string {
    return join(this.dir, 'patroni.yml')
  }

  get restUrl(): string {
    return `http://127.0.0.1:${this.restPort}`
  }

  url(database = 'postgres'): string {
    return `postgres://postgres@127.0.0.1:${this.pgPort}/${database}`
  }

  /** Everything this node's Patroni printed, over all its runs. */
  #log = ''
  get log(): string {
    return this.#log + (this.#patroni?.output() ?? '')
  }

  /** Starts this node's Patroni, which starts (or bootstraps, or clones, or rewinds) its PostgreSQL. */
  start(): void {
    if (this.patroniPid !== undefined) throw new Error(`${this.name}: Patroni already runs`)
    if (this.#patroni) this.#log += this.#patroni.output()
    this.#patroni = start(asServiceUser([findBinary('patroni')!, this.configFile]))
  }

  get patroniPid(): number | undefined {
    const proc = this.#patroni?.proc
    return proc && proc.exitCode === null && proc.signalCode === null ? proc.pid : undefined
  }

  /** The running postmaster's pid, from postmaster.pid (Patroni detaches it). */
  postmasterPid(): number | undefined {
    const file = join(this.dataDir, 'postmaster.pid')
    if (!existsSync(file)) return undefined
    const pid = Number(readFileSync(file, 'utf8').split('\n')[0])
    return Number.isInteger(pid) && pid > 0 && existsSync(`/proc/${pid}`) ? pid : undefined
  }

  /** A host crash: SIGKILL to this node's Patroni and to its postmaster and every backend, at once. */
  async kill(): Promise<void> {
    const postmaster = this.postmasterPid()
    const patroni = this.#patroni
    if (patroni) killTree(patroni.proc.pid)
    if (postmaster) killTree(postmaster)
    if (patroni) await bounded(`${this.name}'s Patroni (pid ${patroni.proc.pid}) to die after SIGKILL`, patroni.proc.exited, 10_000)
    if (postmaster) await waitFor(`${this.name}'s postmaster ${postmaster} to die`, () => !existsSync(`/proc/${postmaster}`) || isZombie(postmaster), 10_000, 20)
  }

  /** Patroni's view of this node, or undefined when its REST API does not answer. */
  async status(): Promise<NodeStatus | undefined> {
    const response = await fetch(`${this.restUrl}/patroni`, { signal: AbortSignal.timeout(2_000) }).catch(() => undefined)
    if (!response) return undefined
    return await response.json() as NodeStatus
  }

  /** HAProxy's question: 200 from the leader only. */
  async isPrimary(): Promise<boolean> {
    const response = await fetch(`${this.restUrl}/primary`, { signal: AbortSignal.timeout(2_000) }).catch(() => undefined)
    await response?.text().catch(() => undefined) // read whole: a cut answer shows up in Patroni's log as a reset
    return response?.status === 200
  }

  /** One connection to this node (not through any proxy). */
  connect(database = 'postgres'): postgres.Sql {
    return postgres(this.url(database), { max: 1, connect_timeout: 2, onnotice: () => undefined, idle_timeout: 5 })
  }

  /** The pids of this node's PostgreSQL processes whose command line matches (e.g. /walreceiver/). */
  postgresProcesses(match: RegExp): number[] {
    const root = this.postmasterPid()
    if (!root) return []
    return descendantsOf(root).filter((pid) => {
      try {
        return match.test(readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\u0000', ' '))
      } catch {
        return false
      }
    })
  }
}

function descendantsOf(root: number): number[] {
  const out = Bun.spawnSync(['ps', '-e', '-o', 'pid=,ppid=']).stdout.toString()
  const children = new Map<number, number[]>()
  for (const line of out.split('\n')) {
    const [pid, ppid] = line.trim().split(/\s+/).map(Number)
    if (pid && ppid !== undefined) children.set(ppid, [...(children.get(ppid) ?? []), pid])
  }
  const all: number[] = []
  const walk = (pid: number) => { all.push(pid); for (const c of children.get(pid) ?? []) walk(c) }
  walk(root)
  return all
}

function isZombie(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')
  } catch {
    return true
  }
}

export class PatroniCluster {
  readonly nodes: PatroniNode[] = []
  readonly scope = `idem-${crypto.randomUUID().slice(0, 8)}`

  private constructor(readonly etcd: Etcd, readonly timing: PatroniTiming, readonly synchronous: boolean) {}

  /**
   * etcd, then the first node (it bootstraps: initdb, leader lock), then the
   * others (each clones the leader with pg_basebackup); resolves when every
   * member streams and, in synchronous mode, one is the synchronous standby.
   */
  static async start(options: PatroniOptions = {}): Promise<PatroniCluster> {
    if (!findBinary('patroni')) throw new Error('patroni not found (apt-get install -y patroni)')
    const etcd = await Etcd.start()
    const timing = { ...DEFAULT_TIMING, ...options.timing }
    const cluster = new PatroniCluster(etcd, timing, options.synchronous ?? true)
    onCleanup(() => cluster.killAll())
    const count = options.nodes ?? 3
    for (let i = 1; i <= count; i++) {
      const node = new PatroniNode(cluster, `node${i}`, tempDir(`patroni-node${i}`), freePort(), freePort())
      writeFileSync(node.configFile, cluster.config(node, options.parameters ?? {}))
      giveToServiceUser(node.configFile)
      cluster.nodes.push(node)
    }
    try {
      cluster.nodes[0]!.start()
      await waitFor('node1 to bootstrap and lead', () => cluster.nodes[0]!.isPrimary(), 90_000, 200)
      for (const node of cluster.nodes.slice(1)) node.start()
      await cluster.waitHealthy()
    } catch (error) {
      throw new Error(`${String(error)}\n${cluster.nodes.map((n) => `--- ${n.name}\n${n.log.slice(-8_000)}`).join('\n')}\n--- etcd\n${etcd.running.output().slice(-2_000)}`)
    }
    return cluster
  }

  /** A node's patroni.yml: the bootstrap (written to the DCS once) and the node's own part. */
  config(node: PatroniNode, parameters: Record<string, string | number>): string {
    const { ttl, loopWait, retryTimeout } = this.timing
    const params = {
      max_connections: 200,
      shared_buffers: '64MB',
      max_wal_senders: 10,
      max_replication_slots: 10,
      wal_keep_size: '128MB',
      // With the 5 s default, recovery sleeps between two tries to reach a
      // primary that is gone, and a promotion waits it out.
      wal_retrieve_retry_interval: '500ms',
      ...parameters,
    }
    const yaml = (value: string | number) => typeof value === 'number' ? String(value) : JSON.stringify(value)
    return [
      `scope: ${this.scope}`,
      'namespace: /idem-scale/',
      `name: ${node.name}`,
      'log:',
      '  level: INFO',
      '  format: "%(asctime)s %(levelname)s: %(message)s"',
      'restapi:',
      `  listen: 127.0.0.1:${node.restPort}`,
      `  connect_address: 127.0.0.1:${node.restPort}`,
      'etcd3:',
      `  hosts: 127.0.0.1:${this.etcd.clientPort}`,
      'bootstrap:',
      '  dcs:',
      `    ttl: ${ttl}`,
      `    loop_wait: ${loopWait}`,
      `    retry_timeout: ${retryTimeout}`,
      '    maximum_lag_on_failover: 1048576',
      `    synchronous_mode: ${this.synchronous ? 'true' : 'false'}`,
      '    postgresql:',
      '      use_pg_rewind: true',
      '      use_slots: true',
      '      parameters:',
      ...Object.entries(params).map(([k, v]) => `        ${k}: ${yaml(v)}`),
      '  initdb:',
      '  - encoding: UTF8',
      '  - locale: C',
      // pg_rewind needs checksums or wal_log_hints: a former primary can then be rewound and rejoin.
      '  - data-checksums',
      '  pg_hba:',
      '  - host replication all 127.0.0.1/32 trust',
      '  - host all all 127.0.0.1/32 trust',
      'postgresql:',
      `  listen: 127.0.0.1:${node.pgPort}`,
      `  connect_address: 127.0.0.1:${node.pgPort}`,
      `  data_dir: ${node.dataDir}`,
      `  bin_dir: ${pgBinDir()}`,
      `  pgpass: ${join(node.dir, 'pgpass')}`,
      '  authentication:',
      '    superuser:',
      '      username: postgres',
      '    replication:',
      '      username: postgres',
      '    rewind:',
      '      username: postgres',
      '  parameters:',
      `    unix_socket_directories: ${JSON.stringify(node.dir)}`,
      'tags:',
      '  nofailover: false',
      '  noloadbalance: false',
      '  clonefrom: false',
      '  nosync: false',
      '',
    ].join('\n')
  }

  node(name: string): PatroniNode {
    const node = this.nodes.find((n) => n.name === name)
    if (!node) throw new Error(`no node ${name}`)
    return node
  }

  /** The members as any answering node's Patroni lists them (GET /cluster). */
  async members(): Promise<Member[]> {
    for (const node of this.nodes) {
      const response = await fetch(`${node.restUrl}/cluster`, { signal: AbortSignal.timeout(2_000) }).catch(() => undefined)
      if (response?.ok) return ((await response.json()) as { members: Member[] }).members
    }
    throw new Error('no Patroni REST API answers')
  }

  /** The node holding the leader lock and running as primary, or undefined during a failover. */
  async leader(): Promise<PatroniNode | undefined> {
    for (const node of this.nodes) if (await node.isPrimary()) return node
    return undefined
  }

  /** Waits until there is one primary, every other listed node streams, and (synchronous mode) one is the sync standby. */
  async waitHealthy(expected = this.nodes.length, timeoutMs = 120_000): Promise<Member[]> {
    let seen = 'nothing yet'
    return waitFor(`the Patroni cluster healthy (${expected} members)`, async () => {
      const members = await this.members()
      seen = JSON.stringify(members.map((m) => [m.name, m.role, m.state, m.lag]))
      const leaders = members.filter((m) => m.role === 'leader' && m.state === 'running')
      const replicas = members.filter((m) => m.role !== 'leader' && (m.state === 'streaming' || m.state === 'running'))
      const sync = members.filter((m) => m.role === 'sync_standby')
      if (leaders.length !== 1 || replicas.length !== expected - 1) return false
      if (this.synchronous && sync.length !== 1) return false
      // Replicas listed as running before they stream: ask each one's PostgreSQL.
      for (const m of replicas) {
        const sql = this.node(m.name).connect()
        try {
          const [row] = await sql<{ status: string | null }[]>`select status from pg_stat_wal_receiver`
          if (row?.status !== 'streaming') { seen += `; ${m.name}'s walreceiver: ${row?.status ?? 'none'}`; return false }
        } finally {
          await sql.end({ timeout: 1 })
        }
      }
      return members
    }, timeoutMs, 250).catch((error: unknown) => {
      throw new Error(`${String(error)}; last seen: ${seen}\n${this.nodes.map((n) => `--- ${n.name}\n${n.log.slice(-3_000)}`).join('\n')}`)
    })
  }

  /**
   * A multi-host URL naming every node, as an application is given it:
   * `target_session_attrs=read-write` is what most drivers (and libpq)
   * understand, and the service maps it to `primary` (src/store/db.ts).
   */
  multiHostUrl(database: string, attrs: 'read-write' | 'primary' = 'read-write'): string {
    return `postgres://postgres@${this.nodes.map((n) => `127.0.0.1:${n.pgPort}`).join(',')}/${database}?target_session_attrs=${attrs}`
  }

  /** patronictl against this cluster (its DCS, from node1's config), returning its output. */
  patronictl(args: string[]): string {
    return run(asServiceUser([findBinary('patronictl')!, '-c', this.nodes[0]!.configFile, ...args]))
  }

  /** A planned switchover from the current leader to `candidate` (`patronictl switchover --force`). */
  switchover(leader: string, candidate: string): string {
    return this.patronictl(['switchover', this.scope, '--leader', leader, '--candidate', candidate, '--force'])
  }

  /** SIGKILL of every Patroni and postmaster of the cluster, then etcd (cleanup: synchronous, for exit handlers too). */
  killAll(): void {
    for (const node of this.nodes) {
      const postmaster = node.postmasterPid()
      if (node.patroniPid) killTree(node.patroniPid)
      if (postmaster) killTree(postmaster)
    }
    killTree(this.etcd.running.proc.pid)
  }
}
