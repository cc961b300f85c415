import { Batcher } from './batcher'
import { onShard, onShardCall, requestPathForm, type RequestPathForm } from './citus-form'
import { claimAndCompleteSql, claimBatchSql, sharedClaimBatchSql, type ClaimMember, type ClaimRow } from './claim-sql'
import { completionParts, completionStatement, type CompletionMember } from './completion-sql'
import { isDataError, isLockFailure, sqlState, SQLSTATE } from './errors'
import type { Sql } from './types'
import { workerPoolsOf, type WorkerPools } from './worker-pools'

/**
 * One lane of statements per pool for the two phases every fresh request
 * writes in: claims (claim.ts) and declarative completions (complete-rows.ts).
 * Whatever is queued when the lane is free goes out as one statement
 * (batcher.ts): claims alone, completions alone, or both in one statement
 * (claim-sql.ts claimAndCompleteSql), so one round trip and one commit (one
 * WAL flush) serve the claims of new requests and the completions of older
 * ones together.
 *
 * Why one lane and not one per phase: under load a statement spends most of
 * its time waiting (for its commit's flush, and for a core on a busy
 * machine), not executing. Two lanes wait twice per cycle and split the
 * requests into cohorts that move in step; one lane carries about twice the
 * members per statement at the same cost per statement. Measured at 32
 * concurrent fresh payments against the two lanes it replaces
 * (BENCHMARKS.md, issue 25): +15 % payments per second, less CPU per payment
 * in the process and in PostgreSQL.
 */
export class Lane {
  readonly #sql: Sql
  readonly #options: LaneOptions
  readonly #batcher: Batcher<Work, ClaimRow | boolean | undefined>
  /** The functions form's batchers, one per tenant and kind (see #batcherOf); the idle ones dropped past MAX_TENANT_BATCHERS. */
  readonly #groups = new Map<string, Batcher<Work, ClaimRow | boolean | undefined>>()
  /** Known after the pool's first claim or completion (citus-form.ts). */
  #form: RequestPathForm | undefined
  /** The functions form's pool per worker (worker-pools.ts); none for a pool not made by openPools. */
  #workers: WorkerPools | undefined
  readonly #counts = { claimStatements: 0, claims: 0, completionStatements: 0, completions: 0, shared: 0 }

  constructor(sql: Sql, options: LaneOptions = {}) {
    this.#sql = sql
    this.#options = options
    // Three in flight at most: past overlapAfterMs, or with LANE_OVERLAP_DEPTH members waiting, a statement goes
    // beside the one running, and one sent beside another carries claims or completions, not both (batcher.ts kindOf).
    this.#batcher = new Batcher({
      // A statement of many members that met a locked row (it waits SHARED_LOCK_WAIT_MS at most, batch-input.ts)
      // is sent again member by member, like one that failed on a member's data: only that member waits on it.
      run: (work) => this.#run(sql, work), isolate: (error) => isDataError(error) || isLockFailure(error), maxInFlight: 3, overlapAtDepth: LANE_OVERLAP_DEPTH, ...options,
      kindOf: (item) => (item.claim ? 'claim' : 'completion'),
    })
  }

  /**
   * A claim's row, or undefined: see claim-sql.ts. `signal` takes it out while
   * still queued. `alone`: in a statement of its own, sent at once (a claim
   * whose key's row was found locked: it waits there, and no one else with it).
   */
  claim(member: ClaimMember, signal?: AbortSignal, alone = false): Promise<ClaimRow | undefined> {
    if (this.#form === undefined) return this.#knowForm().then(() => this.claim(member, signal, alone))
    const batcher = this.#batcherOf(member.tenant, 'claim')
    if (alone) return batcher.submitAlone({ claim: member }) as Promise<ClaimRow | undefined>
    return batcher.submit({ claim: member }, signal) as Promise<ClaimRow | undefined>
  }

  /** Whether the completion's lease held (its answer stored, its rows written). `alone` as for claims. */
  complete(member: CompletionMember, alone = false): Promise<boolean> {
    if (this.#form === undefined) return this.#knowForm().then(() => this.complete(member, alone))
    const batcher = this.#batcherOf(member.tenant, 'completion')
    if (alone) return batcher.submitAlone({ completion: member }) as Promise<boolean>
    return batcher.submit({ completion: member }) as Promise<boolean>
  }

  async #knowForm(): Promise<void> {
    const form = await requestPathForm(this.#sql)
    if (form === 'functions') this.#workers = workerPoolsOf(this.#sql)
    this.#form = form
  }

  /**
   * The statements form: the one batcher. The functions form (Citus): a
   * batcher per tenant and kind, since a call runs on the worker of one
   * tenant's shard. Each has its own statements in flight, so a worker that
   * stalls holds the calls of its own tenants only, and the others' go on
   * (issue 47: one worker stopped for 5 s had stopped every tenant for 11 s).
   * Claims and completions in calls of their own: a call that fails fails
   * only its kind, which each recovers its own way (claim.ts by its lease,
   * completion-recovery.ts by the key's state). And each call goes through
   * the pool of its tenant's worker (worker-pools.ts), so a stalled worker
   * holds its own pool's connections, never those of the others' calls.
   */
  #batcherOf(tenant: string, kind: 'claim' | 'completion'): Batcher<Work, ClaimRow | boolean | undefined> {
    if (this.#form !== 'functions') return this.#batcher
    const name = `${kind}\u0000${tenant}`
    let batcher = this.#groups.get(name)
    if (!batcher) {
      // Tenants come and go (the gateway's are digests of any Authorization a client sends): the idle are dropped past a bound.
      if (this.#groups.size >= MAX_TENANT_BATCHERS) for (const [other, idle] of this.#groups) if (idle.idle) this.#groups.delete(other)
      batcher = new Batcher({
        run: (work) => this.#call(tenant, work), isolate: (error) => isDataError(error) || isLockFailure(error), maxInFlight: 3, overlapAtDepth: LANE_OVERLAP_DEPTH, ...this.#options,
      })
      this.#groups.set(name, batcher)
    }
    return batcher
  }

  /** One call of the functions form: one tenant's claims, or its completions, as the statement of the other form run on its shard. */
  async #call(tenant: string, work: readonly Work[]): Promise<(ClaimRow | boolean | undefined)[]> {
    const workers = this.#workers
    if (!workers) return this.#send(this.#sql, tenant, work)
    try {
      return await this.#send(await workers.poolOf(tenant), tenant, work)
    } catch (error) {
      // The shard was not on the worker the call reached: it moved, and so may the tenant's pool.
      if (sqlState(error) === SQLSTATE.SERIALIZATION_FAILURE) workers.forget(tenant)
      throw error
    }
  }

  async #send(sql: Sql, tenant: string, work: readonly Work[]): Promise<(ClaimRow | boolean | undefined)[]> {
    if (work[0]!.claim) {
      const claims = work.map((item) => item.claim!)
      this.#counts.claimStatements++
      this.#counts.claims += claims.length
      const claimed: (ClaimRow | undefined)[] = new Array(claims.length)
      const input = JSON.stringify(claims.map((member, n) => ({ ...member, n })))
      const text = claims.length > 1 ? SHARED_CLAIM_ON_SHARD : CLAIM_ON_SHARD
      for (const row of await sql.unsafe<ClaimRow[]>(CLAIM_CALL, [tenant, text, input, null], { prepare: true })) claimed[row.n] = row
      return claimed
    }
    const completions = work.map((item) => item.completion!)
    this.#counts.completionStatements++
    this.#counts.completions += completions.length
    const fenced = completions.map(() => false)
    const { text, parameters } = completionStatement(completions)
    for (const row of await sql.unsafe<{ n: number }[]>(COMPLETION_CALL, [tenant, onShard(text), parameters[0]!, parameters[1] ?? null], { prepare: true })) fenced[row.n] = true
    return fenced
  }

  /** Statements that carried claims, and the claims they carried. */
  get claimStats(): PhaseStats {
    return { statements: this.#counts.claimStatements, members: this.#counts.claims }
  }

  /** Statements that carried claims and completions together. */
  get sharedStatements(): number {
    return this.#counts.shared
  }

  /** Statements that carried completions, and the completions they carried. */
  get completionStats(): PhaseStats {
    return { statements: this.#counts.completionStatements, members: this.#counts.completions }
  }

  async #run(sql: Sql, work: readonly Work[]): Promise<(ClaimRow | boolean | undefined)[]> {
    const claims: ClaimMember[] = []
    const completions: CompletionMember[] = []
    for (const item of work) {
      if (item.claim) claims.push(item.claim)
      else completions.push(item.completion)
    }
    if (claims.length > 0) {
      this.#counts.claimStatements++
      this.#counts.claims += claims.length
    }
    if (completions.length > 0) {
      this.#counts.completionStatements++
      this.#counts.completions += completions.length
    }
    if (claims.length > 0 && completions.length > 0) this.#counts.shared++
    const [claimed, fenced] = await runStatement(sql, claims, completions)
    let c = 0
    let d = 0
    return work.map((item) => (item.claim ? claimed[c++] : fenced[d++]))
  }
}

export interface LaneOptions {
  /**
   * Milliseconds a statement runs alone before the next goes beside it
   * (batcher.ts). Tests that need a shared statement raise it, so a slow
   * first statement (a new connection on a busy machine) cannot split the
   * queue behind it by kind. @default 20
   */
  readonly overlapAfterMs?: number
  /** Members waiting that go out beside a running statement at once (batcher.ts); raised as overlapAfterMs is. @default LANE_OVERLAP_DEPTH */
  readonly overlapAtDepth?: number
}

/**
 * 16: a burst no longer waits whole behind the statement in flight. With a
 * 200 ms provider and 256 clients, answers come back in bursts (a statement
 * carried 4 members at the median and 26 at the 90th percentile) and a
 * claim waited 6 ms at the median, 18 at the 90th; at 32 clients a statement
 * carries 12 at the median and this rarely applies. Measured with bench/ab.ts
 * against the lane without it (BENCHMARKS.md, issue 40): p50 at 200 ms 5 to
 * 8 ms lower in three runs, 1-4 % more payments a second; at the instant
 * provider no change beyond the rounds' own spread.
 */
export const LANE_OVERLAP_DEPTH = 16

export interface PhaseStats {
  /** Statements sent. */
  readonly statements: number
  /** Members carried by them. */
  readonly members: number
}

type Work = { readonly claim: ClaimMember; readonly completion?: undefined } | { readonly claim?: undefined; readonly completion: CompletionMember }

/** The rows of claimBatchSql and of completionStatement, as the functions form's call names them. */
const CLAIM_CALL = onShardCall(`n int, fresh boolean, lease text, attempts int, request_id text, status text, fingerprint text,
  age_seconds float8, ttl_left_seconds float8, stale boolean, completed_age_seconds float8,
  response_status int, response_headers jsonb, response_body text, worked_on boolean`)
const COMPLETION_CALL = onShardCall('n int')
const CLAIM_ON_SHARD = onShard(claimBatchSql)
const SHARED_CLAIM_ON_SHARD = onShard(sharedClaimBatchSql)

/** The functions form's batchers kept before the idle ones are dropped (each a few hundred bytes). */
const MAX_TENANT_BATCHERS = 10_000

const lanes = new WeakMap<Sql, Lane>()

/**
 * The lane of a pool (or a reserved connection): the claims and completions
 * of one process share its statements. `options` apply when the pool's lane
 * is made, on its first use; later calls get that lane as it is.
 */
export function laneOf(sql: Sql, options?: LaneOptions): Lane {
  let lane = lanes.get(sql)
  if (!lane) {
    lane = new Lane(sql, options)
    lanes.set(sql, lane)
  }
  return lane
}

/** One statement for both lists; either may be empty. Each claim's row or undefined, and each completion's fence. */
async function runStatement(sql: Sql, claims: readonly ClaimMember[], completions: readonly CompletionMember[]): Promise<[(ClaimRow | undefined)[], boolean[]]> {
  const claimInput = () => JSON.stringify(claims.map((member, n) => ({ ...member, n })))
  const claimed: (ClaimRow | undefined)[] = new Array(claims.length)
  const fenced = completions.map(() => false)
  // Prepared: planning these statements on every call cost the database more than running
  // them (BENCHMARKS.md); one plan per shape (the tables and columns a route writes). A pool
  // made for PgBouncer still prepares nothing (store/db.ts).
  if (completions.length === 0) {
    const text = claims.length > 1 ? sharedClaimBatchSql : claimBatchSql
    for (const row of await sql.unsafe<ClaimRow[]>(text, [claimInput()], { prepare: true })) claimed[row.n] = row
  } else if (claims.length === 0) {
    const { text, parameters } = completionStatement(completions)
    for (const row of await sql.unsafe<{ n: number }[]>(text, parameters, { prepare: true })) fenced[row.n] = true
  } else {
    const { ctes, done, parameters } = completionParts(completions, { prefix: 'completion_', first: 2 })
    const rows = await sql.unsafe<(ClaimRow & { completed: boolean })[]>(claimAndCompleteSql(ctes, done), [claimInput(), ...parameters], { prepare: true })
    for (const row of rows) {
      if (row.completed) fenced[row.n] = true
      else claimed[row.n] = row
    }
  }
  return [claimed, fenced]
}
