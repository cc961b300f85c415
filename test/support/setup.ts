/**
 * Preloaded by `bun test` (bunfig.toml): with DATABASE_URL unset, start an
 * embedded PostgreSQL for the whole run, so `npm test` needs nothing installed
 * (in any checkout: as root in a 0700 folder, the data moves where the
 * postgres user can reach it; see startEmbedded). Every test file then makes
 * a database of its own (see db.ts).
 *
 * Two runs at once in one checkout (two terminals, or several people in one
 * working tree) share that server: the second adopts the first's, and the
 * last one out stops it (startEmbedded counts the processes that use it).
 */
import { afterAll } from 'bun:test'
import { startTestServer } from './test-server'

if (!process.env.DATABASE_URL) {
  const embedded = await startTestServer()
  process.env.DATABASE_URL = embedded.url
  afterAll(async () => {
    await embedded.stop()
  })
}
