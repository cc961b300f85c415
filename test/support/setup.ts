/**
 * Preloaded by `bun test` (bunfig.toml): with DATABASE_URL unset, start an
 * embedded PostgreSQL for the whole run, so `npm test` needs nothing installed
 * (in any checkout: as root in a 0700 folder, the data moves where the
 * postgres user can reach it; see startEmbedded). Every test file then makes
 * a database of its own (see db.ts).
 *
 * Two runs at once in one checkout (two terminals, or several people in one
 * working tree) share that server: the second adopts the first's. So each run
 * signs in next to the data, and the last one out stops the server, not the
 * first one done.
 */
import { afterAll } from 'bun:test'
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { startEmbedded } from '../../src/store/embedded'

if (!process.env.DATABASE_URL) {
  const port = Number(process.env.TEST_EMBEDDED_PORT ?? 54339)
  const embedded = await startEmbedded({ dir: '.data/test-pg', port })
  process.env.DATABASE_URL = embedded.url
  const runs = `${embedded.dir}.runs`
  mkdirSync(runs, { recursive: true })
  writeFileSync(join(runs, String(process.pid)), '')
  afterAll(async () => {
    rmSync(join(runs, String(process.pid)), { force: true })
    const others = readdirSync(runs).map(Number).filter((pid) => {
      try {
        process.kill(pid, 0)
        return true
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === 'EPERM') return true // alive, another user's
        rmSync(join(runs, String(pid)), { force: true }) // a run that was killed
        return false
      }
    })
    if (others.length === 0) await embedded.stop()
  })
}
