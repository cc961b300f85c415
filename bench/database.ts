import { migrateService } from '../src/store/migrate'
import { openBenchServer } from './server'

export interface BenchDatabase {
  /** URL of the fresh, migrated database of this run. */
  readonly url: string
  /** Server version, e.g. "15.20". */
  readonly version: string
  drop(): Promise<void>
}

/**
 * One fresh, migrated database on the bench's server (bench/server.ts:
 * DATABASE_URL's, else the bench's own embedded cluster), for the scripts
 * that need one database for their whole run (bench/profile.ts,
 * bench/compare-engines.ts). Dropped, and the embedded server stopped, at the end.
 */
export async function freshDatabase(log: (line: string) => void): Promise<BenchDatabase> {
  const server = await openBenchServer(log)
  try {
    const url = await server.create(`idem_bench_${crypto.randomUUID().slice(0, 8)}`)
    await migrateService(url)
    return { url, version: server.version, drop: () => server.stop() }
  } catch (error) {
    await server.stop()
    throw error
  }
}
