import { cpSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { MigrationLine } from '../../src/store/migrate'

/**
 * A migration line as an earlier release had it: its first `upTo` files,
 * copied to a folder of their own, so `migrate(url, { lines: [...] })` brings
 * a database to that release's schema. `remove()` deletes the folders made.
 */
export function releaseBefore(): { lineUpTo(line: MigrationLine, upTo: number): MigrationLine; remove(): void } {
  const dirs: string[] = []
  return {
    lineUpTo(line, upTo) {
      const dir = mkdtempSync(join(tmpdir(), `idem-${line.name}-${upTo}-`))
      dirs.push(dir)
      for (const file of readdirSync(line.dir).filter((name) => Number(name.slice(0, 5)) <= upTo)) cpSync(join(line.dir, file), join(dir, file))
      return { ...line, dir }
    },
    remove() {
      for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true })
    },
  }
}
