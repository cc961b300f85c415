/** A section of `npm run bench:scale`'s output: one Markdown table. */
export interface Section {
  readonly title: string
  readonly columns: readonly string[]
  readonly rows: readonly (readonly string[])[]
}

const cell = (text: string) => text.replaceAll('|', '\\|').replaceAll('\n', ' ')

export function markdown(section: Section): string {
  return [
    `### ${section.title}`,
    '',
    `| ${section.columns.map(cell).join(' | ')} |`,
    `| ${section.columns.map(() => '---').join(' | ')} |`,
    ...section.rows.map((r) => `| ${r.map(cell).join(' | ')} |`),
    '',
  ].join('\n')
}
