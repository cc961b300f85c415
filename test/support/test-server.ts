import { join } from 'node:path'
import { startEmbedded, type EmbeddedPostgres } from '../../src/store/embedded'

/**
 * The embedded PostgreSQL the tests use when DATABASE_URL is unset: one per
 * checkout, under .data/test-pg, on TEST_EMBEDDED_PORT (54339). Started by
 * `npm test`'s runner (test/run.ts) for all its workers, or by the preload
 * (setup.ts) for a `bun test` of its own.
 */
export function startTestServer(): Promise<EmbeddedPostgres> {
  return startEmbedded({ dir: join(import.meta.dir, '..', '..', '.data', 'test-pg'), port: Number(process.env.TEST_EMBEDDED_PORT ?? 54339) })
}
