import type postgres from 'postgres'
import type { Sql } from './types'

/**
 * On Citus, the pool each tenant's lane calls go through (lane.ts, the
 * functions form): one pool per worker, to the coordinator, which hands each
 * call on to the worker of the tenant's shard. A worker that stalls (frozen,
 * its disk full) holds only its own pool's connections: postgres.js sends a
 * query on a busy connection, behind whatever runs there, once none of the
 * pool is idle, so in one pool shared by every worker the calls of a healthy
 * worker's tenants queued behind calls waiting on the frozen one until their
 * statement timeout (issue 47, finding F2). Here they can wait only on calls
 * to their own worker.
 *
 * A tenant's worker is its shard's placement in the coordinator's catalog,
 * kept WORKER_OF_TTL_MS and then asked again while the known one goes on
 * being used (a rebalance moves a shard within seconds, and a call sent
 * through another worker's pool is still right, Citus routes it: only the
 * isolation is lost until then), and asked afresh at once after a call failed
 * with 40001, a shard not on the worker the call reached (a shard moved).
 *
 * Pools are opened on a worker's first call (store/db.ts openPools gives how),
 * so one PostgreSQL, where the lane never asks, has none, and no query more.
 */
export type WorkerPool = postgres.Sql<Record<string, never>>

/** Opens the pool for the calls of one worker's tenants; `worker` is its host:port. */
export type OpenWorkerPool = (worker: string) => WorkerPool

/** How long a tenant's worker is taken as known before it is asked again (in the background). */
export const WORKER_OF_TTL_MS = 10_000
/** Tenants whose worker is kept: past this the longest known is dropped (asked again on its next call). */
export const KNOWN_TENANTS_MAX = 10_000

export class WorkerPools {
  readonly #coordinator: Sql
  readonly #open: OpenWorkerPool
  readonly #pools = new Map<string, WorkerPool>()
  readonly #workerOf = new Map<string, { worker: Promise<string>; askedAt: number }>()
  #closed = false

  constructor(coordinator: Sql, open: OpenWorkerPool) {
    this.#coordinator = coordinator
    this.#open = open
  }

  /** The pool of the worker that holds the tenant's shard, opened on first use. */
  async poolOf(tenant: string): Promise<WorkerPool> {
    const worker = await this.#worker(tenant)
    let pool = this.#pools.get(worker)
    if (!pool) {
      if (this.#closed) throw new Error('the worker pools are closed')
      pool = this.#open(worker)
      this.#pools.set(worker, pool)
    }
    return pool
  }

  /** The tenant's worker is asked again on its next call (its shard was not where its call went). */
  forget(tenant: string): void {
    this.#workerOf.delete(tenant)
  }

  /** Workers whose pool is open. */
  get workers(): string[] {
    return [...this.#pools.keys()]
  }

  /** Ends every worker's pool (after its statements, within `timeoutSeconds`), with the process's other pools. */
  async close(timeoutSeconds: number): Promise<void> {
    this.#closed = true
    await Promise.all([...this.#pools.values()].map((pool) => pool.end({ timeout: timeoutSeconds })))
  }

  #worker(tenant: string): Promise<string> {
    const now = performance.now()
    const known = this.#workerOf.get(tenant)
    if (known) {
      if (now - known.askedAt >= WORKER_OF_TTL_MS) {
        // Asked again, the known worker used meanwhile: a call never waits on the catalog once its tenant was seen.
        known.askedAt = now
        this.#ask(tenant).then((worker) => {
          if (this.#workerOf.get(tenant) === known) known.worker = Promise.resolve(worker)
        }, () => undefined)
      }
      return known.worker
    }
    const entry = { worker: this.#ask(tenant), askedAt: now }
    this.#workerOf.set(tenant, entry)
    // A failed look is not kept: the next call asks again.
    entry.worker.catch(() => { if (this.#workerOf.get(tenant) === entry) this.#workerOf.delete(tenant) })
    if (this.#workerOf.size > KNOWN_TENANTS_MAX) this.#workerOf.delete(this.#workerOf.keys().next().value!)
    return entry.worker
  }

  async #ask(tenant: string): Promise<string> {
    const [row] = await this.#coordinator<{ worker: string }[]>`
      select n.nodename || ':' || n.nodeport as worker
        from pg_dist_placement p join pg_dist_node n using (groupid)
       where p.shardid = get_shard_id_for_distribution_column('idempotency_keys', ${tenant}::text) and n.noderole = 'primary'
       limit 1`
    if (!row) throw new Error(`no placement of tenant ${tenant}'s shard in the coordinator's catalog`)
    return row.worker
  }
}

const registered = new WeakMap<Sql, WorkerPools>()

/** Gives `sql` (a process's pool for single statements) its worker pools: its lane's calls on Citus go through them. */
export function provideWorkerPools(sql: Sql, pools: WorkerPools): void {
  registered.set(sql, pools)
}

/** The worker pools given to `sql`; none for a pool not made by openPools, whose lane's calls all go through it. */
export function workerPoolsOf(sql: Sql): WorkerPools | undefined {
  return registered.get(sql)
}
