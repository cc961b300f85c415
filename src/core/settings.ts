import { sqlState } from './errors'
import type { Sql } from './types'

export interface ServerSettings {
  readonly ttlSeconds: number
  readonly retentionSeconds: number
  readonly updatedAt: Date
}

/**
 * Records the TTL and retention the server runs with. Written by a server's
 * start when they changed (recordServerSettings); operator commands read it (readServerSettings), so they
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

/**
 * At a server's start: the record of the TTL and retention, written when they
 * differ from it (a start with the same ones writes nothing); the record as it
 * was, for the warning about a change rolling through.
 *
 * On Citus the record is a reference table, a copy on every node, and a write
 * needs them all: with one worker down every start failed, those serving the
 * other workers' tenants too. A write refused for a node the coordinator cannot
 * reach (a connection failure, class 08, in the server's answer: our own
 * connection just worked) is left to a later start and said in `warn`;
 * operator commands apply the record as it was until then.
 */
export async function recordServerSettings(sql: Sql, settings: { ttlSeconds: number; retentionSeconds: number }, warn: (line: string) => void): Promise<ServerSettings | undefined> {
  const previous = await readServerSettings(sql)
  if (previous?.ttlSeconds === settings.ttlSeconds && previous.retentionSeconds === settings.retentionSeconds) return previous
  try {
    await writeServerSettings(sql, settings)
  } catch (error) {
    if (!sqlState(error)?.startsWith('08')) throw error
    warn(`the TTL and retention (${settings.ttlSeconds} s, ${settings.retentionSeconds} s) could not be recorded: a node is unreachable (${error instanceof Error ? error.message : String(error)}); ` +
      'operator commands apply the recorded ones until a start with every node reachable records these')
  }
  return previous
}
