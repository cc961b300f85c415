/**
 * What a command prints on stdout: lines, JSON, tables; never a control,
 * invisible or reordering character of the data. Client-chosen text is shown
 * by the one rule of the admin page (characters.ts): `cus_A\u200bC`, never
 * `cus_AC`; a C1 control (U+009B, a terminal's CSI) can move no cursor.
 */
import { visibleJson, visibleText } from '../characters'
import type { CliIo } from './io'

/** A line or cell with client-chosen text in it, as operators are shown it (characters.ts visibleText). */
export const printable = visibleText

export interface Output {
  print(line?: string): void
  printJson(value: unknown): void
  /** Columns padded to their widest cell. */
  table(rows: string[][]): void
}

export function output(io: Pick<CliIo, 'out'>): Output {
  const print = (line = ''): void => io.out(`${line}\n`)
  return {
    print,
    // The same JSON value, its invisible characters written as JSON escapes (`jq` reads the same strings).
    printJson: (value) => print(visibleJson(JSON.stringify(value, null, 2))),
    table(rows) {
      const cells = rows.map((row) => row.map(printable))
      const widths = cells[0]!.map((_, column) => Math.max(...cells.map((row) => row[column]!.length)))
      for (const row of cells) print(row.map((cell, column) => cell.padEnd(widths[column]!)).join('  ').trimEnd())
    },
  }
}
