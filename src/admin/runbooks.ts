/**
 * The alert runbooks, served by the service at /admin/runbooks/<alert>, so
 * that every alert's `runbook_url` is an absolute link an on-call can open
 * (dashboards/settings.ts builds it from the one ADMIN_URL setting).
 *
 * One source: the "Alert runbooks" section of docs/how-to/on-call.md, one `###
 * <AlertName>` heading per alert (test/dashboards/alert-links.test.ts keeps
 * every alert's section there). It is rendered with marked, escaped: raw
 * HTML in the Markdown is shown as text, links stay on this origin (a link to
 * another runbook becomes its /admin/runbooks page; links into the
 * repository's other documents are shown as plain text, since the service
 * does not serve them), and images are dropped (the page's CSP allows none).
 */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { escapeHtml } from '@kitajs/html'
import { Marked, type Tokens } from 'marked'

export const OPERATORS_GUIDE = join(import.meta.dir, '..', '..', 'docs', 'how-to', 'on-call.md')
const SECTION = '## Alert runbooks'

export interface Runbook {
  /** The alert's name, as the rules spell it (also the page's path). */
  readonly alert: string
  /** The section's Markdown, without its heading. */
  readonly markdown: string
  /** The section rendered, escaped. */
  readonly html: string
}

/** The runbook page of `alert`: the path every alert's runbook_url points at, under the service's URL. */
export const runbookPath = (alert: string): string => `/admin/runbooks/${encodeURIComponent(alert)}`

/** The alert names that have a runbook section (GitHub's anchors of those headings are their lower-case names). */
function sections(markdown: string): Map<string, string> {
  const lines = markdown.split('\n')
  const start = lines.findIndex((line) => line.trim() === SECTION)
  const found = new Map<string, string>()
  if (start === -1) return found
  let current: string | undefined
  let body: string[] = []
  const flush = () => { if (current) found.set(current, body.join('\n').trim()) }
  for (const line of lines.slice(start + 1)) {
    if (/^## /.test(line)) break
    const heading = /^### ([A-Za-z][A-Za-z0-9]*)\s*$/.exec(line)
    if (heading) {
      flush()
      current = heading[1]!
      body = []
    } else if (current) body.push(line)
  }
  flush()
  return found
}

function renderer(alerts: ReadonlySet<string>): Marked {
  const byAnchor = new Map([...alerts].map((alert) => [alert.toLowerCase(), alert]))
  const marked = new Marked({ gfm: true, async: false })
  marked.use({
    renderer: {
      // Raw HTML in the Markdown is shown, not run.
      html: ({ text }: Tokens.HTML | Tokens.Tag) => escapeHtml(text),
      image: ({ text }: Tokens.Image) => escapeHtml(text),
      // An admin path written as code (`/admin/released?reason=deadline`) opens it; one with a placeholder (`<tenant>`) stays text.
      // The text is the Markdown's, raw: escaped here like everything else.
      codespan: ({ text }: Tokens.Codespan) =>
        /^\/admin(?:[/?#][A-Za-z0-9/?#=&_.%-]*)?$/.test(text) ? `<a href="${escapeHtml(text)}"><code>${escapeHtml(text)}</code></a>` : `<code>${escapeHtml(text)}</code>`,
      link(this: { parser: { parseInline(tokens: Tokens.Generic[]): string } }, { href, tokens }: Tokens.Link) {
        const text = this.parser.parseInline(tokens)
        const anchor = /^(?:on-call\.md)?#([a-z0-9-]+)$/.exec(href)?.[1]
        const alert = anchor ? byAnchor.get(anchor) : undefined
        if (alert) return `<a href="${escapeHtml(runbookPath(alert))}">${text}</a>`
        // Our own admin pages stay links; anything else (another document, another origin) is text.
        if (/^\/admin(?:[/?#]|$)/.test(href) && !href.startsWith('//')) return `<a href="${escapeHtml(href)}">${text}</a>`
        return `<span class="ref">${text}</span>`
      },
    },
  })
  return marked
}

/** Every runbook of the guide, rendered. */
export function loadRunbooks(markdown: string): ReadonlyMap<string, Runbook> {
  const found = sections(markdown)
  const marked = renderer(new Set(found.keys()))
  return new Map([...found].map(([alert, section]) => [alert, { alert, markdown: section, html: marked.parse(section) as string }]))
}

let cached: ReadonlyMap<string, Runbook> | undefined

/** The runbooks of docs/how-to/on-call.md, read and rendered once per process. */
export function runbooks(): ReadonlyMap<string, Runbook> {
  cached ??= loadRunbooks(readFileSync(OPERATORS_GUIDE, 'utf8'))
  return cached
}
