/**
 * Tenants of a Citus test, placed: the fault tests need tenants whose shards
 * are on a known worker (the one stopped, or the one that stays up), and the
 * service needs an API key for each. Names are searched, not assumed: where a
 * tenant's shard lands depends on the hash of its name and the shard count.
 */
import type postgres from 'postgres'

/** The port of the worker that holds the tenant's shard of idempotency_keys (its payments are co-located). */
export async function workerOf(sql: postgres.Sql, tenant: string): Promise<number> {
  const [row] = await sql<{ port: number }[]>`
    select n.nodeport as port from pg_dist_placement pl join pg_dist_node n using (groupid)
     where pl.shardid = get_shard_id_for_distribution_column('idempotency_keys', ${tenant}::text)`
  return row!.port
}

/** The shard of idempotency_keys that holds the tenant. */
export async function shardOf(sql: postgres.Sql, tenant: string): Promise<number> {
  const [row] = await sql<{ shard: string }[]>`select get_shard_id_for_distribution_column('idempotency_keys', ${tenant}::text)::text as shard`
  return Number(row!.shard)
}

/**
 * `perWorker` tenants on each of `ports`, each on a shard of its own (so a
 * rebalance moving one shard moves one tenant): `${prefix}-${n}` for the
 * first n that fit.
 */
export async function tenantsOn(sql: postgres.Sql, ports: readonly number[], perWorker: number, prefix = 'tenant'): Promise<Map<number, string[]>> {
  const found = new Map<number, string[]>(ports.map((port) => [port, []]))
  const shards = new Set<number>()
  for (let n = 0; n < 1000 && [...found.values()].some((list) => list.length < perWorker); n++) {
    const tenant = `${prefix}-${n}`
    const shard = await shardOf(sql, tenant)
    if (shards.has(shard)) continue
    const list = found.get(await workerOf(sql, tenant))
    if (!list || list.length >= perWorker) continue
    shards.add(shard)
    list.push(tenant)
  }
  for (const [port, list] of found)
    if (list.length < perWorker) throw new Error(`only ${list.length} tenants with shards of their own found on the worker on port ${port}`)
  return found
}

/** Each tenant's API key, as the tests send it. */
export const apiKeyOf = (tenant: string) => `${tenant}-key`

/** The service's API_KEYS for these tenants (tenant:key,...). */
export const apiKeys = (tenants: readonly string[]) => tenants.map((tenant) => `${tenant}:${apiKeyOf(tenant)}`).join(',')
