import type postgres from 'postgres'
import { Batcher } from './batcher'
import { COMPLETION_TIMEOUT_MS, type CompleteOptions } from './complete'
import { DatabaseUnavailableError, isDataError, isUnavailable, LeaseLostError } from './errors'
import { FEW_MEMBERS } from './batch-input'
import type { Lease, StoredResponse } from './types'

/** Rows to insert, by table: the business writes of a declarative recording step. */
export type RowWrites = Readonly<Record<string, readonly Readonly<Record<string, unknown>>[]>>

interface Member {
  readonly tenant: string
  readonly key: string
  readonly lease: string
  readonly response: StoredResponse
  readonly at: string | null
  readonly writes: RowWrites
}

/** Table and column names: route code chooses them, but they are spliced into SQL, so they are checked. */
const IDENTIFIER = /^[a-z_][a-z0-9_]{0,62}$/

/**
 * The completing phase in one autocommit statement: the fence (the key's
 * lease must still be current), the state change, the stored answer, the
 * key leaving the processing list, and the route's rows, together. A stored
 * answer exists only if its rows committed (invariant 2), and they commit
 * only if the lease held (invariant 4): one statement is one transaction.
 *
 * Against the transactional form (complete.ts: BEGIN, writes, fence, COMMIT)
 * it saves three statements and two round trips per request, and it batches:
 * completions queued while others run share one statement (batcher.ts), one
 * WAL flush for all (group commit). A member whose lease was lost is a row
 * missing from the answer, and its rows are not written (their INSERT reads
 * the fenced set); the others commit. A batch that fails on its data (a CHECK
 * of one member's row) is run again member by member, so only that one fails.
 *
 * Locks: the UPDATE holds the key rows for the statement only; a reclaim
 * racing it either commits first (the UPDATE then re-checks the lease and
 * skips the row: fenced) or finds the row locked (NOWAIT: 409) and then done.
 */
export async function completeRows(pool: postgres.Sql<Record<string, never>>, lease: Lease, response: StoredResponse, writes: RowWrites, options: CompleteOptions = {}): Promise<StoredResponse> {
  for (const [table, rows] of Object.entries(writes)) {
    if (!IDENTIFIER.test(table)) throw new TypeError(`not a table name: ${JSON.stringify(table)}`)
    for (const row of rows) for (const column of Object.keys(row)) if (!IDENTIFIER.test(column)) throw new TypeError(`not a column name: ${JSON.stringify(column)}`)
  }
  const member: Member = { tenant: lease.tenant, key: lease.key, lease: lease.lease, response, at: options.now?.toISOString() ?? null, writes }
  let timer: ReturnType<typeof setTimeout> | undefined
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DatabaseUnavailableError(new Error('the completing statement got no answer in time'))), options.timeoutMs ?? COMPLETION_TIMEOUT_MS)
  })
  try {
    const fenced = await Promise.race([completionsOf(pool).submit(member), timedOut])
    if (!fenced) throw new LeaseLostError()
    return response
  } catch (error) {
    if (error instanceof LeaseLostError || error instanceof DatabaseUnavailableError) throw error
    throw isUnavailable(error) ? new DatabaseUnavailableError(error) : error
  } finally {
    clearTimeout(timer)
  }
}

const batchers = new WeakMap<postgres.Sql<Record<string, never>>, Batcher<Member, boolean>>()

function completionsOf(pool: postgres.Sql<Record<string, never>>): Batcher<Member, boolean> {
  let batcher = batchers.get(pool)
  if (!batcher) {
    batcher = new Batcher({ run: (members) => runCompletions(pool, members), isolate: isDataError })
    batchers.set(pool, batcher)
  }
  return batcher
}

/** Statements and members of this pool's declarative completions so far. */
export function completionStats(pool: postgres.Sql<Record<string, never>>) {
  return completionsOf(pool).stats
}

/** One statement for `members`: true for each whose lease held (its answer stored, its rows written). */
async function runCompletions(pool: postgres.Sql<Record<string, never>>, members: readonly Member[]): Promise<boolean[]> {
  const { text, parameters } = completionStatement(members)
  // Prepared, as claim.ts's statement: one plan per shape (the tables and columns a route writes).
  const rows = await pool.unsafe<{ n: number }[]>(text, parameters, { prepare: true })
  const fenced = members.map(() => false)
  for (const row of rows) fenced[row.n] = true
  return fenced
}

/**
 * $1 the members' keys and answers; $2 their rows, each tagged with its
 * member and its group (one table and one set of columns: a group is one
 * INSERT, and a column a row does not give is not written, so its default
 * applies). `done` is the fence: the UPDATE matches a key only under its
 * current lease, and every INSERT takes only the rows of members in `done`.
 * `before` reads each key's deadline as the statement's snapshot saw it, to
 * delete its processing entry (sql/engine/00005); a key whose lease moved on is not
 * in `done`, so its entry, now the new owner's, is left alone.
 */
export function completionStatement(members: readonly Member[]): { text: string; parameters: string[] } {
  const groups = new Map<string, { table: string; columns: string[] }>()
  const rows: { n: number; g: number; r: Readonly<Record<string, unknown>> }[] = []
  members.forEach((member, n) => {
    for (const [table, tableRows] of Object.entries(member.writes)) {
      for (const row of tableRows) {
        const columns = Object.keys(row).sort()
        const id = `${table}(${columns.join(',')})`
        if (!groups.has(id)) groups.set(id, { table, columns })
        rows.push({ n, g: [...groups.keys()].indexOf(id), r: row })
      }
    }
  })
  const inserts = [...groups.values()].map(({ table, columns }, g) => {
    const list = columns.map((column) => `"${column}"`).join(', ')
    return `,
  w${g} as (
    insert into "${table}" (${list})
    select ${columns.map((column) => `r."${column}"`).join(', ')}
      from jsonb_array_elements($2::text::jsonb) e
     cross join lateral jsonb_populate_record(null::"${table}", e->'r') r
     where (e->>'g')::int = ${g} and (e->>'n')::int in (select n from done)
  )`
  }).join('')
  const text = `
  with input as (
    select * from jsonb_to_recordset($1::text::jsonb)
      as i(n int, tenant text, key text, lease bigint, status smallint, headers jsonb, body text, at timestamptz)
     where ${FEW_MEMBERS}
  ),
  before as (
    select k.tenant, k.key, k.stale_at from input i join idempotency_keys k on k.tenant = i.tenant and k.key = i.key
  ),
  done as (
    update idempotency_keys k
       set status = 'done', completed_at = coalesce(i.at, clock_timestamp()), owner = null, stale_at = null,
           response_status = i.status, response_headers = i.headers, response_body = i.body
      from input i
     where k.tenant = i.tenant and k.key = i.key and k.lease = i.lease and k.status = 'processing'
    returning i.n, k.tenant, k.key
  ),
  unlisted as (
    delete from idempotency_processing pr using done d join before b on b.tenant = d.tenant and b.key = d.key
     where pr.stale_at = b.stale_at and pr.tenant = d.tenant and pr.key = d.key
  )${inserts}
  select n from done`
  const input = members.map((member, n) => ({
    n, tenant: member.tenant, key: member.key, lease: member.lease,
    status: member.response.status, headers: member.response.headers, body: member.response.body, at: member.at,
  }))
  // $2 only when some INSERT reads it: PostgreSQL refuses a parameter it cannot type (42P18).
  return { text, parameters: groups.size > 0 ? [JSON.stringify(input), JSON.stringify(rows)] : [JSON.stringify(input)] }
}
