/**
 * The README's first screen cannot go stale: its curl session is parsed out
 * of README.md and run, as written, with the real curl and bash against a
 * started service (`bun src/main.ts`, as `npm start` runs it); statuses,
 * the headers it shows and the bodies must match, up to ids and times. The
 * banner it shows must be what the service prints, label by label.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer, type ServerProcess } from '../support/server'
import { waitFor } from '../support/wait'

const README = readFileSync(join(import.meta.dir, '..', '..', 'README.md'), 'utf8')
/** The address the README shows; replaced by the test server's. */
const README_BASE = 'http://127.0.0.1:3000'

let db: TestDatabase
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('readme')
  // API_KEYS empty: the dev-only demo key, as on a first `npm start`.
  server = await startServer(db.url, { API_KEYS: '' })
})
afterAll(async () => {
  await server?.stop()
  await db?.drop()
})

/** The fenced block of `language` that follows `marker` in the README. */
function blockAfter(marker: string, language: string): string {
  const at = README.indexOf(marker)
  expect(at, `README.md has no "${marker}"`).toBeGreaterThanOrEqual(0)
  const open = README.indexOf('```' + language + '\n', at)
  const close = README.indexOf('\n```', open + 4)
  expect(open, `no \`\`\`${language} block after "${marker}"`).toBeGreaterThan(at)
  return README.slice(open + language.length + 4, close)
}

interface Step {
  readonly command: string
  readonly expected: string
}

/** `$ command` lines (with `\` continuations), each followed by what it prints. */
function parseSession(block: string): Step[] {
  const steps: { command: string; output: string[] }[] = []
  let continuing = false
  for (const line of block.split('\n')) {
    if (continuing) steps.at(-1)!.command += `\n${line}`
    else if (line.startsWith('$ ')) steps.push({ command: line.slice(2), output: [] })
    else steps.at(-1)?.output.push(line)
    continuing = (line.startsWith('$ ') || continuing) && line.endsWith('\\')
  }
  return steps.map((step) => ({ command: step.command, expected: step.output.join('\n').trim() }))
}

interface Answer {
  readonly status: string
  readonly headers: readonly [string, string][]
  readonly body: string
}

function parseAnswer(text: string): Answer | undefined {
  const normalized = text.replaceAll('\r\n', '\n').trim()
  if (normalized === '') return undefined
  const [head = '', ...rest] = normalized.split('\n\n')
  const [status = '', ...lines] = head.split('\n')
  return {
    status,
    headers: lines.map((line) => {
      const colon = line.indexOf(':')
      return [line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim()] as [string, string]
    }),
    body: rest.join('\n\n').trim(),
  }
}

/** Ids and times differ from run to run; everything else must be as shown. */
function normalize(text: string): string {
  return text
    .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, '<uuid>')
    .replace(/\bch_[0-9a-z]+/g, '<charge>')
    .replace(/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z/g, '<time>')
}

test('the banner shown is what npm start prints', async () => {
  const shown = blockAfter('`npm start` prints', 'text').split('\n').filter(Boolean)
  const labelOf = (line: string) => line.split(/\s{2,}/)[0]!
  expect(shown.length).toBeGreaterThan(5)
  const labels = shown.map(labelOf)
  // The banner follows the "listening" line that startServer waits for: wait for its last line too.
  await waitFor(() => server.output().split('\n').some((line) => line.startsWith(`${labels.at(-1)}  `)), `the banner's "${labels.at(-1)}" line`)
  const printed = server.output().split('\n')
  const printedLabels = printed.filter((line) => labels.some((label) => line.startsWith(`${label}  `))).map(labelOf)
  expect(printedLabels).toEqual(labels)
  // The one line that is the same on every first start.
  const demo = shown.find((line) => line.startsWith('API key '))!
  expect(printed).toContain(demo)
})

test('the curl session runs as shown', async () => {
  const steps = parseSession(blockAfter('## One curl', 'console'))
  expect(steps.filter((step) => step.command.includes('curl') || step.command.startsWith('pay ')).length).toBeGreaterThanOrEqual(3)
  // One bash runs the whole session in order (a function defined by one step is used by the next).
  const marker = (i: number) => `\u001eEND-OF-STEP-${i}\u001e`
  const script = steps.map((step, i) => `${step.command.replaceAll(README_BASE, server.url)}\nprintf '\\n${marker(i)}\\n'`).join('\n')
  const run = Bun.spawn(['bash', '-c', script], { stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(run.stdout).text(), new Response(run.stderr).text(), run.exited])
  expect(stderr).toBe('')
  expect(code).toBe(0)

  const bodies = new Map<string, string>()
  for (const [i, step] of steps.entries()) {
    const start = i === 0 ? 0 : stdout.indexOf(marker(i - 1)) + marker(i - 1).length
    const actual = parseAnswer(stdout.slice(start, stdout.indexOf(marker(i))))
    const expected = parseAnswer(step.expected)
    if (!expected) {
      expect(actual, `"${step.command}" prints nothing in the README`).toBeUndefined()
      continue
    }
    expect(actual, `"${step.command}" printed nothing`).toBeDefined()
    expect(actual!.status).toBe(expected.status)
    for (const [name, value] of expected.headers) {
      const got = actual!.headers.find(([actualName]) => actualName === name)
      expect(got, `${expected.status}: header ${name}`).toBeDefined()
      expect(normalize(got![1])).toBe(normalize(value))
    }
    expect(JSON.parse(normalize(actual!.body))).toEqual(JSON.parse(normalize(expected.body)))
    // Bodies the README shows identical (a replay) must be identical, byte for byte.
    const seen = bodies.get(expected.body)
    if (seen !== undefined) expect(actual!.body).toBe(seen)
    else bodies.set(expected.body, actual!.body)
  }
})

test('the docs it points to are there', async () => {
  for (const path of ['/docs', '/openapi.json']) expect((await fetch(`${server.url}${path}`)).status).toBe(200)
  for (const [, link] of README.matchAll(/\]\(((?:docs|examples)\/[^)#]*)\)/g))
    expect(Bun.file(join(import.meta.dir, '..', '..', link!)).size, link).toBeGreaterThan(0)
})
