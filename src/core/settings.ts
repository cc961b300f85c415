import type { Sql } from './types'

export interface ServerSettings {
  readonly ttlSeconds: number
  readonly retentionSeconds: number
  readonly updatedAt: Date
}

/**
 * Records the TTL and retention the server runs with. Written by every
 * server at start; operator commands read it (readServerSettings), so they
 * never apply their own shell's values: `IDEMPOTENCY_RETENTION_SECONDS=1 idem
 * purge` once deleted live keys, and the next retry paid again.
 */
export async function writeServerSettings(sql: Sql, settings: { ttlSeconds: number; retentionSeconds: number }): Promise<void> {
  await sql`
    insert into idempotency_settings (id, ttl_seconds, retention_seconds, updated_at)
    values (1, ${settings.ttlSeconds}, ${settings.retentionSeconds}, now())
    on conflict (id) do update set ttl_seconds = excluded.ttl_seconds, retention_seconds = excluded.retention_seconds, updated_at = excluded.updated_at`
}

/** The settings the server last started with, or undefined if no server has run on this database. */
export async function readServerSettings(sql: Sql): Promise<ServerSettings | undefined> {
  const [row] = await sql<{ ttl_seconds: number; retention_seconds: number; updated_at: Date }[]>`
    select ttl_seconds, retention_seconds, updated_at from idempotency_settings where id = 1`
  return row ? { ttlSeconds: row.ttl_seconds, retentionSeconds: row.retention_seconds, updatedAt: row.updated_at } : undefined
}
