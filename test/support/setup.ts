/**
 * Preloaded by `bun test` (bunfig.toml): with DATABASE_URL unset, start an
 * embedded PostgreSQL for the whole run, so `npm test` needs nothing installed.
 * Every test file then makes a database of its own (see db.ts).
 */
import { afterAll } from 'bun:test'
import { startEmbedded } from '../../src/store/embedded'

if (!process.env.DATABASE_URL) {
  const port = Number(process.env.TEST_EMBEDDED_PORT ?? 54339)
  const embedded = await startEmbedded({ dir: '.data/test-pg', port })
  process.env.DATABASE_URL = embedded.url
  afterAll(() => embedded.stop())
}
