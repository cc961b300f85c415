/** What a command prints on stdout: lines, JSON, tables; never a control character of the data. */
import type { CliIo } from './io'

/** Control characters would move a terminal's cursor; keys cannot hold any (a table CHECK), other fields are cleaned anyway. */
export const printable = (text: string): string => text.replace(/[\u0000-\u001f\u007f]/g, '?')

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
    printJson: (value) => print(JSON.stringify(value, null, 2)),
    table(rows) {
      const cells = rows.map((row) => row.map(printable))
      const widths = cells[0]!.map((_, column) => Math.max(...cells.map((row) => row[column]!.length)))
      for (const row of cells) print(row.map((cell, column) => cell.padEnd(widths[column]!)).join('  ').trimEnd())
    },
  }
}
