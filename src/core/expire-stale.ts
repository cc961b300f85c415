import { ALL_TENANTS, auditActor, insertAudit } from './audit'
import { requestPathForm } from './citus-form'
import { instant, stale, staleEntry, type Fragment } from './policy'
import type { Sql } from './types'

/**
 * Rows per statement. Each batch holds its row locks for one short statement
 * (~2 ms for 100 rows here), so claims of other keys never notice it, and a
 * retry of one of these very keys waits at most that long.
 */
export const EXPIRE_BATCH_SIZE = 100
/** Keys a result names one by one; the rest are counted. */
const MAX_LISTED = 50

export interface ExpireStaleOptions {
  /**
   * The instant the operator saw the list at: only keys already stale then are
   * expired, so a key reclaimed or re-claimed since (a newer locked_at) is left
   * alone. @default the database's now()
   */
  readonly asOf?: Date | undefined
  readonly tenant?: string | undefined
}

export interface ExpireStaleResult {
  readonly expired: number
  /** Stale keys whose completion was committing at that instant (skipped, like a single force-expire's worker_alive). */
  readonly workerAlive: number
  readonly expiredKeys: readonly { tenant: string; key: string }[]
  readonly aliveKeys: readonly { tenant: string; key: string }[]
  /** The summary entry in the audit trail (each expired key also has its own entry). */
  readonly auditId: string
}

/**
 * Expires (releases, as force-expire does) every key that was stale at
 * `asOf`, in batches of EXPIRE_BATCH_SIZE, each with its audit entries in the
 * same statement. A stale key is past its TTL, so its worker has stopped at
 * its deadline whether its process lives or not: all of them may go.
 *
 * Concurrency: FOR UPDATE SKIP LOCKED, the batch form of force-expire's
 * NOWAIT: a row locked by a completion committing at that instant is skipped,
 * not waited for, and reported. A row that changed since `asOf` (completed,
 * reclaimed: a newer locked_at) no longer matches and is left alone. Several
 * operators running this at once each release distinct rows.
 */
export async function expireStale(sql: Sql, options: ExpireStaleOptions, actor: string): Promise<ExpireStaleResult> {
  const asOf = options.asOf ?? null
  const who = auditActor(actor)
  // Never in the future: an "as of" ahead of the clock would expire keys not stale yet.
  const at = (): Fragment => sql`least(${instant(sql, asOf)}, now())` as Fragment
  const ofTenant = (): Fragment => (options.tenant ? sql`and k.tenant = ${options.tenant}` : sql``) as Fragment
  const expiredKeys: { tenant: string; key: string }[] = []
  let expired = 0
  // Distributed by tenant (Citus), the batch's FOR UPDATE is refused across shards: one tenant's keys at a
  // time, each statement routed to its shard (and there its CTEs share one snapshot, as on one PostgreSQL).
  // The tenants with stale entries come from the processing list, which holds nothing else.
  const tenants: (string | undefined)[] = options.tenant !== undefined || await requestPathForm(sql) === 'statements'
    ? [options.tenant]
    : (await sql<{ tenant: string }[]>`
        select pr.tenant from idempotency_processing pr where ${staleEntry(sql, at())} group by pr.tenant order by pr.tenant`).map((row) => row.tenant)
  for (const tenant of tenants) {
    const rows = await expireBatches(sql, at, tenant === undefined ? sql`` as Fragment : sql`and k.tenant = ${tenant}` as Fragment, who)
    expired += rows.length
    for (const row of rows) if (expiredKeys.length < MAX_LISTED) expiredKeys.push({ tenant: row.tenant, key: row.key })
  }
  // What is left stale is held by live workers (SKIP LOCKED passed over them).
  const alive = await sql<{ tenant: string; key: string; total: number }[]>`
    select k.tenant, k.key, count(*) over ()::int as total from idempotency_processing pr
      join idempotency_keys k on k.tenant = pr.tenant and k.key = pr.key
     where ${staleEntry(sql, at())} and (${stale(sql, at())} or ${apartEntry(sql)}) ${ofTenant()}
     order by pr.stale_at
     limit ${MAX_LISTED}`
  const workerAlive = alive[0]?.total ?? 0
  const aliveKeys = alive.map(({ tenant, key }) => ({ tenant, key }))
  const outcome = expired > 0 ? 'expired' : workerAlive > 0 ? 'worker_alive' : 'none_stale'
  const detail = { expired, worker_alive: workerAlive, as_of: asOf?.toISOString() ?? null, alive_keys: aliveKeys.slice(0, 10) }
  const [summary] = await sql<{ id: string }[]>`
    ${insertAudit(sql, sql`values (${who}, 'expire_all_stale', ${options.tenant ?? ALL_TENANTS}, null, ${outcome}, ${sql.json(detail)})`)}
    returning id`
  return { expired, workerAlive, expiredKeys, aliveKeys, auditId: summary!.id }
}

/**
 * A new-form key's entry (sql/engine/00020): it carries the key's lease and
 * deadline, so past its deadline (staleEntry) the key is stale. Both the entry
 * and the key's row are locked: a completion deletes the one, a take-over
 * updates both.
 */
const apartEntry = (sql: Sql): Fragment => sql`(k.digest is not null and pr.lease = k.lease)` as Fragment

/** Expires the stale keys `ofTenant` selects, batch by batch, each with its audit entries; returns them. */
async function expireBatches(sql: Sql, at: () => Fragment, ofTenant: Fragment, who: string): Promise<{ tenant: string; key: string }[]> {
  const all: { tenant: string; key: string }[] = []
  for (;;) {
    const rows = await sql<{ tenant: string; key: string }[]>`
      with target as (
        select k.tenant, k.key, pr.stale_at, pr.locked_at, pr.summary, pr.http_request_id from idempotency_processing pr
          join idempotency_keys k on k.tenant = pr.tenant and k.key = pr.key
         where ${staleEntry(sql, at())} and (${stale(sql, at())} or ${apartEntry(sql)}) ${ofTenant}
         order by pr.stale_at
         limit ${EXPIRE_BATCH_SIZE}
           for update of k, pr skip locked
      ),
      released as (
        update idempotency_keys k
           set status = 'released', owner = null, released_at = now(), stale_at = null, release_reason = 'force_expired',
               summary = case when k.digest is not null then t.summary else k.summary end,
               locked_at = coalesce(k.locked_at, t.locked_at), http_request_id = coalesce(k.http_request_id, t.http_request_id)
          from target t
         where k.tenant = t.tenant and k.key = t.key
        returning k.tenant, k.key, k.lease, k.attempts, coalesce(k.locked_at, t.locked_at) as locked_at
      ),
      unlisted as (
        delete from idempotency_processing pr using target t
         where pr.stale_at = t.stale_at and pr.tenant = t.tenant and pr.key = t.key
      ),
      audited as (
        ${insertAudit(sql, sql`
        select ${who}, 'force_expire', r.tenant, r.key, 'expired',
               jsonb_build_object('lease', r.lease::text, 'attempts', r.attempts, 'locked_at', r.locked_at, 'batch', true)
          from released r`)}
      )
      select tenant, key from released`
    all.push(...rows)
    if (rows.length < EXPIRE_BATCH_SIZE) return all
  }
}
