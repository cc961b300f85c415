import { membersCondition } from './batch-input'
import { answerHeadersStored, LOCATION_DERIVED } from './key-states'
import type { StoredResponse } from './types'

/** Rows to insert, by table: the business writes of a declarative recording step. */
export type RowWrites = Readonly<Record<string, readonly Readonly<Record<string, unknown>>[]>>

/** One completion of a batch (complete-rows.ts). */
export interface CompletionMember {
  readonly tenant: string
  readonly key: string
  readonly lease: string
  readonly response: StoredResponse
  readonly at: string | null
  readonly writes: RowWrites
}

/**
 * $1 the members' keys and answers; $2 their rows, each tagged with its
 * member and its group (one table and one set of columns: a group is one
 * INSERT, and a column a row does not give is not written, so its default
 * applies). `completed` is the fence: the members whose lease held, and every
 * INSERT takes only the rows of members in `completed`. A key completes in its
 * form (sql/engine/00020, key-states.ts):
 *
 * - old: `done` matches its row only under its current lease and writes
 *   the answer into it; `before` reads its deadline as the statement's
 *   snapshot saw it, to delete its processing entry (sql/engine/00005); a key
 *   whose lease moved on is not updated, so its entry, now the new owner's,
 *   is left alone;
 * - new: `taken` deletes its processing entry only under its current lease
 *   (an old-form entry has none), and `answered` inserts the answer for each
 *   entry deleted. A take-over updates the entry under the lease it saw, so
 *   of the two whichever comes second finds nothing (reclaim.ts).
 */
export function completionStatement(members: readonly CompletionMember[]): { text: string; parameters: string[] } {
  const { ctes, done, parameters } = completionParts(members, { shared: members.length > 1 })
  return { text: `\n  with ${ctes}\n  select n from ${done}`, parameters }
}

/**
 * The completion's CTEs for completionStatement, or for a statement that
 * carries claims too (claim-sql.ts claimAndCompleteSql): there its names take
 * a prefix and its parameters start at $2. `shared`: the statement carries
 * more than one member, and waits on a lock SHARED_LOCK_WAIT_MS at most. `done` names the CTE of the
 * members whose lease held.
 */
export function completionParts(members: readonly CompletionMember[], { prefix = '', first = 1, shared = true } = {}): { ctes: string; done: string; parameters: string[] } {
  // `updated` keeps the name `done` it had before the new form: tests and operators find the completion by it.
  const [input, before, updated, unlisted, taken, answered, done] =
    [`${prefix}input`, `${prefix}before`, `${prefix}done`, `${prefix}unlisted`, `${prefix}taken`, `${prefix}answered`, `${prefix}completed`] as const
  const [$members, $rows] = [`$${first}`, `$${first + 1}`] as const
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
  ${prefix}w${g} as (
    insert into "${table}" (${list})
    select ${columns.map((column) => `r."${column}"`).join(', ')}
      from jsonb_array_elements(${$rows}::text::jsonb) e
     cross join lateral jsonb_populate_record(null::"${table}", e->'r') r
     where (e->>'g')::int = ${g} and (e->>'n')::int in (select n from ${done})
  )`
  }).join('')
  const ctes = `${input} as (
    select * from jsonb_to_recordset(${$members}::text::jsonb)
      as i(n int, tenant text, key text, lease bigint, status smallint, headers jsonb, body text, at timestamptz)
     where ${membersCondition(shared)}
  ),
  ${before} as (
    select k.tenant, k.key, k.stale_at from ${input} i join idempotency_keys k on k.tenant = i.tenant and k.key = i.key
  ),
  ${updated} as (
    update idempotency_keys k
       set status = 'done', completed_at = coalesce(i.at, clock_timestamp()), owner = null, stale_at = null, summary = null,
           response_status = i.status, response_headers = i.headers, response_body = i.body
      from ${input} i
     where k.tenant = i.tenant and k.key = i.key and k.lease = i.lease and k.status = 'processing'
    returning i.n, k.tenant, k.key
  ),
  ${unlisted} as (
    delete from idempotency_processing pr using ${updated} d join ${before} b on b.tenant = d.tenant and b.key = d.key
     where pr.stale_at = b.stale_at and pr.tenant = d.tenant and pr.key = d.key
  ),
  ${taken} as (
    delete from idempotency_processing pr using ${input} i
     where pr.tenant = i.tenant and pr.key = i.key and pr.lease = i.lease
    returning i.n, pr.tenant, pr.key
  ),
  ${answered} as (
    insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
    select t.tenant, k.request_id, coalesce(i.at, clock_timestamp()), i.status, ${answerHeadersStored('i.headers', { body: 'i.body', path: 'k.path', derive: LOCATION_DERIVED })}, i.body
      from ${taken} t join ${input} i on i.n = t.n join idempotency_keys k on k.tenant = t.tenant and k.key = t.key
  ),
  ${done} as (
    select n, tenant, key from ${updated} union all select n, tenant, key from ${taken}
  )${inserts}`
  const inputs = members.map((member, n) => ({
    n, tenant: member.tenant, key: member.key, lease: member.lease,
    status: member.response.status, headers: member.response.headers, body: member.response.body, at: member.at,
  }))
  // The rows' parameter only when some INSERT reads it: PostgreSQL refuses a parameter it cannot type (42P18).
  return { ctes, done, parameters: groups.size > 0 ? [JSON.stringify(inputs), JSON.stringify(rows)] : [JSON.stringify(inputs)] }
}
