import postgres from 'postgres'
import { startEmbedded, type EmbeddedPostgres } from '../src/store/embedded'
import { migrateService } from '../src/store/migrate'

/** Port of the bench's own embedded PostgreSQL (tests use 54339, `npm start` 54329). */
const BENCH_EMBEDDED_PORT = 54349

export interface BenchDatabase {
  /** URL of the fresh, migrated database of this run. */
  readonly url: string
  /** Server version, e.g. "15.20". */
  readonly version: string
  drop(): Promise<void>
}

/**
 * A fresh database for one bench run: on DATABASE_URL's server when set, else
 * on an embedded PostgreSQL under .data/bench-pg. Dropped at the end.
 */
export async function freshDatabase(log: (line: string) => void): Promise<BenchDatabase> {
  let embedded: EmbeddedPostgres | undefined
  let base = process.env.DATABASE_URL
  if (!base) {
    embedded = await startEmbedded({ dir: '.data/bench-pg', port: BENCH_EMBEDDED_PORT, log })
    base = embedded.url
  }
  const name = `idem_bench_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  const [row] = await admin<{ version: string }[]>`select current_setting('server_version') as version`
  const version = row?.version ?? 'unknown'
  await admin.end()
  const url = new URL(base)
  url.pathname = `/${name}`
  await migrateService(url.toString())
  return {
    url: url.toString(),
    version,
    async drop() {
      const cleanup = postgres(base, { max: 1, onnotice: () => undefined })
      await cleanup.unsafe(`drop database if exists "${name}" with (force)`)
      await cleanup.end()
      await embedded?.stop()
    },
  }
}
