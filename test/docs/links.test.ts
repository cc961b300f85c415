/**
 * The docs cannot rot quietly: in README.md, docs/**\/*.md and examples/**\/*.md,
 * every relative link resolves (to a file or folder of the repository), every
 * anchor (`#heading`, in the same page or another) is a heading of its page by
 * GitHub's slug rule, every repository path cited in backticks
 * (`src/http/failure.ts`, `test/scale/*.scale.ts`) or in prose
 * (docs/explanation/invariants.md) exists, and every block marked
 * `<!-- excerpt: <path> -->` is in that file word for word. No network: links
 * to other origins are left alone.
 */
import { expect, test } from 'bun:test'
import { Glob } from 'bun'
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join, normalize } from 'node:path'

const ROOT = join(import.meta.dir, '..', '..')
/** Top-level folders and files a cited path may start with. */
const REPO_PATH = /^(?:\.ci|bench|dashboards|docs|examples|sql|src|test)\/[\w.*@/-]*$|^(?:BENCHMARKS|CHANGELOG|README|LICENSE)(?:\.md)?$|^(?:package\.json|bunfig\.toml|tsconfig(?:\.build)?\.json)$/
/** A path in running text: a repository folder, then a file with an extension we keep docs about. */
const PROSE_PATH = /(?<![\w./`-])((?:bench|dashboards|docs|examples|sql|src|test)\/[\w./-]*\.(?:ts|tsx|md|yml|yaml|json|sql|sh|png|service))(?![\w/-])/g

function pages(): string[] {
  const found = ['README.md']
  for (const pattern of ['docs/**/*.md', 'examples/**/*.md'])
    for (const file of new Glob(pattern).scanSync({ cwd: ROOT })) found.push(file)
  return found.sort()
}

const read = (file: string) => readFileSync(join(ROOT, file), 'utf8')

/** The page without its fenced blocks (kept as empty lines, so line numbers hold). */
function prose(markdown: string): string {
  let fenced = false
  return markdown.split('\n').map((line) => {
    if (/^\s*(```|~~~)/.test(line)) {
      fenced = !fenced
      return ''
    }
    return fenced ? '' : line
  }).join('\n')
}

/** GitHub's heading anchor: the rendered text, lower-cased, punctuation dropped, spaces to hyphens; repeats get -1, -2. */
export function slugs(markdown: string): Set<string> {
  const seen = new Map<string, number>()
  const anchors = new Set<string>()
  for (const line of prose(markdown).split('\n')) {
    for (const [, id] of line.matchAll(/<a\s+(?:name|id)="([^"]+)"/g)) anchors.add(id!)
    const heading = /^#{1,6}\s+(.+?)\s*#*\s*$/.exec(line)?.[1]
    if (!heading) continue
    const text = heading
      .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // links and images: their text
      .replace(/<[^>]+>/g, '') // inline HTML
      .replace(/`([^`]*)`/g, '$1')
      .replace(/(\*\*|__|\*)(.+?)\1/g, '$2')
    const base = text.trim().toLowerCase().replace(/[^\p{L}\p{N}\p{M} _-]/gu, '').replace(/ /g, '-')
    const count = seen.get(base) ?? 0
    seen.set(base, count + 1)
    anchors.add(count === 0 ? base : `${base}-${count}`)
  }
  return anchors
}

const anchorsOf = new Map<string, Set<string>>()
function anchors(file: string): Set<string> {
  let found = anchorsOf.get(file)
  if (!found) anchorsOf.set(file, (found = slugs(read(file))))
  return found
}

/** Whether a repository path exists; a glob needs one match. */
function exists(path: string): boolean {
  if (path.includes('*')) {
    for (const _ of new Glob(path).scanSync({ cwd: ROOT, onlyFiles: false })) return true
    return false
  }
  return existsSync(join(ROOT, path))
}

/** Every broken reference of one page, as `page:line: what`. */
export function brokenIn(file: string, markdown = read(file)): string[] {
  const broken: string[] = []
  const lines = prose(markdown).split('\n')
  for (const [index, line] of lines.entries()) {
    const at = `${file}:${index + 1}`
    const withoutCode = line.replace(/`[^`]*`/g, '``')
    for (const [, target] of withoutCode.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target!) || target!.startsWith('//')) continue // another origin, mailto:
      const [pathPart = '', anchor] = target!.split('#', 2) as [string, string | undefined]
      const path = pathPart === '' ? file : normalize(join(dirname(file), decodeURIComponent(pathPart)))
      if (pathPart !== '' && (path.startsWith('..') || !existsSync(join(ROOT, path)))) {
        broken.push(`${at}: link to ${target} (${path} does not exist)`)
        continue
      }
      if (anchor === undefined || anchor === '') continue
      if (!path.endsWith('.md')) broken.push(`${at}: anchor #${anchor} into ${path}, which is not Markdown`)
      else if (!(path === file ? slugs(markdown) : anchors(path)).has(decodeURIComponent(anchor)))
        broken.push(`${at}: link to ${target} (no heading with the anchor #${anchor} in ${path})`)
    }
    for (const [, code] of line.matchAll(/`([^`\n]+)`/g)) {
      const path = code!.trim().replace(/[:,]$/, '')
      if (!REPO_PATH.test(path) || /[<>{}]|\.\.\./.test(path)) continue
      if (!exists(path.replace(/\/$/, ''))) broken.push(`${at}: \`${path}\` does not exist`)
    }
    const plain = withoutCode.replace(/\]\([^)]*\)/g, '](…)')
    for (const [, path] of plain.matchAll(PROSE_PATH))
      if (!exists(path!)) broken.push(`${at}: ${path} does not exist`)
  }
  // Excerpts: `<!-- excerpt: path -->` then a fenced block, which must be in that file as it is.
  for (const [, path, block] of markdown.matchAll(/<!-- excerpt: (\S+) -->\n```\w*\n([^]*?)\n```/g)) {
    if (!exists(path!)) broken.push(`${file}: excerpt of ${path}, which does not exist`)
    else if (!read(path!).includes(block!)) broken.push(`${file}: an excerpt of ${path} is no longer in it: ${block!.split('\n')[0]}`)
  }
  return broken
}

test('every link, anchor, cited path and excerpt in the README and the docs resolves', () => {
  const files = pages()
  expect(files).toContain('docs/explanation/invariants.md')
  expect(files.flatMap((file) => brokenIn(file))).toEqual([])
})

test('the checker catches what it should', () => {
  const page = 'docs/how-to/example.md'
  const markdown = [
    '# A page',
    '## `WORKERS>1`: one port, several processes',
    '## The 3 a.m. walk-through: from the alert to the clear',
    '[ok](#workers1-one-port-several-processes) [ok](#the-3-am-walk-through-from-the-alert-to-the-clear)',
    '[ok](../explanation/invariants.md#exactly-once) [ok](../../README.md) [ok](https://example.com/x.md)',
    '`src/http/failure.ts` `test/scale/*.scale.ts` `/var/lib/idempotent-post` `.data/pg`',
    '```sh',
    'cat docs/nothing-here.md   # inside a fenced block: not checked',
    '```',
    '[gone](../operators.md) [no anchor](#nowhere) [no heading](../explanation/invariants.md#exactly-twice)',
    '`test/dashboards/forced-expirations.test.ts` and docs/observability.md',
  ].join('\n')
  const broken = brokenIn(page, markdown)
  const expected = ['../operators.md', '#nowhere', '#exactly-twice', 'forced-expirations', 'docs/observability.md']
  expect(broken).toHaveLength(expected.length)
  for (const [i, what] of expected.entries()) {
    expect(broken[i]).toStartWith(`${page}:${i < 3 ? 10 : 11}: `)
    expect(broken[i]).toContain(what)
  }
})

test('the README is a door: under 15 KB, and every page of docs/ is listed in docs/README.md', () => {
  expect(Bun.file(join(ROOT, 'README.md')).size).toBeLessThan(15 * 1024)
  const index = read('docs/README.md')
  const listed = new Set([...index.matchAll(/\]\(([^)#]+\.md)(?:#[^)]*)?\)/g)].map(([, link]) => normalize(join('docs', link!))))
  const unlisted = pages().filter((file) => file.startsWith('docs/') && file !== 'docs/README.md' && !listed.has(file))
  expect(unlisted).toEqual([])
})

test('every docs page the code, tests, dashboards and SQL notes name exists', () => {
  const missing: string[] = []
  for (const pattern of ['{src,test,bench,dashboards,examples,sql,.ci}/**/*.{ts,tsx,md,sh,yml,yaml,service}', 'BENCHMARKS.md'])
    for (const file of new Glob(pattern).scanSync({ cwd: ROOT, dot: true })) {
      if (file.startsWith('test/docs/')) continue // this file's own examples of broken paths
      for (const [index, line] of read(file).split('\n').entries())
        for (const [, path] of line.matchAll(/(?<![\w/.-])(docs\/[\w./-]*\.(?:md|png))/g))
          if (!existsSync(join(ROOT, path!))) missing.push(`${file}:${index + 1}: ${path}`)
    }
  expect(missing).toEqual([])
})
