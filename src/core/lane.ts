import { Batcher } from './batcher'
import { claimAndCompleteSql, claimBatchSql, sharedClaimBatchSql, type ClaimMember, type ClaimRow } from './claim-sql'
import { completionParts, completionStatement, type CompletionMember } from './completion-sql'
import { isDataError, isLockFailure } from './errors'
import type { Sql } from './types'

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
  readonly #batcher: Batcher<Work, ClaimRow | boolean | undefined>
  readonly #counts = { claimStatements: 0, claims: 0, completionStatements: 0, completions: 0, shared: 0 }

  constructor(sql: Sql, options: LaneOptions = {}) {
    // Three in flight at most: past overlapAfterMs a statement goes beside the one running, and one
    // sent beside another carries claims or completions, not both (batcher.ts kindOf).
    this.#batcher = new Batcher({
      // A statement of many members that met a locked row (it waits SHARED_LOCK_WAIT_MS at most, batch-input.ts)
      // is sent again member by member, like one that failed on a member's data: only that member waits on it.
      run: (work) => this.#run(sql, work), isolate: (error) => isDataError(error) || isLockFailure(error), maxInFlight: 3, ...options,
      kindOf: (item) => (item.claim ? 'claim' : 'completion'),
    })
  }

  /**
   * A claim's row, or undefined: see claim-sql.ts. `signal` takes it out while
   * still queued. `alone`: in a statement of its own, sent at once (a claim
   * whose key's row was found locked: it waits there, and no one else with it).
   */
  claim(member: ClaimMember, signal?: AbortSignal, alone = false): Promise<ClaimRow | undefined> {
    if (alone) return this.#batcher.submitAlone({ claim: member }) as Promise<ClaimRow | undefined>
    return this.#batcher.submit({ claim: member }, signal) as Promise<ClaimRow | undefined>
  }

  /** Whether the completion's lease held (its answer stored, its rows written). `alone` as for claims. */
  complete(member: CompletionMember, alone = false): Promise<boolean> {
    if (alone) return this.#batcher.submitAlone({ completion: member }) as Promise<boolean>
    return this.#batcher.submit({ completion: member }) as Promise<boolean>
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
}

export interface PhaseStats {
  /** Statements sent. */
  readonly statements: number
  /** Members carried by them. */
  readonly members: number
}

type Work = { readonly claim: ClaimMember; readonly completion?: undefined } | { readonly claim?: undefined; readonly completion: CompletionMember }

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
