import { log, type Logger } from '../log'
import { problem, problems, type Problem } from './problem'

/** 64 KiB: a payment (or any JSON command) is under 1 KiB; anything far larger is abuse. */
export const DEFAULT_MAX_BODY_BYTES = 65_536

/**
 * JSON nesting deeper than this is refused before anything walks it: no
 * honest request body nests 32 levels, and walking a 100k-level one would
 * overflow the stack.
 */
export const MAX_JSON_DEPTH = 32

/** The parsed value, and the text it was parsed from (how numbers were written is only there). */
export type BodyResult = { ok: true; value: unknown; text: string } | { ok: false; problem: Problem }

/** The body as sent, decoded. */
export type TextResult = { ok: true; text: string } | { ok: false; problem: Problem }

const utf8 = new TextDecoder('utf-8', { fatal: true })

/**
 * A JSON request body's text, within `maxBytes`: 415 for another content
 * type, 413 over the limit, 400 for a body cut off or not UTF-8. Then
 * parseJsonText; a replay whose text is the stored request's own needs
 * nothing more (http/replay-cache.ts), so parsing is a step of its own.
 */
export async function readJsonText(request: Request, maxBytes: number): Promise<TextResult> {
  const contentType = request.headers.get('content-type') ?? ''
  if (!/^application\/json\s*(;|$)/i.test(contentType.trim())) return { ok: false, problem: problem('unsupported-media-type') }
  const declared = Number(request.headers.get('content-length') ?? NaN)
  if (declared > maxBytes) return { ok: false, problem: problems.tooLarge(maxBytes) }
  let bytes: Uint8Array | undefined
  try {
    bytes = await readAtMost(request, maxBytes)
  } catch (error) {
    // The client went away before sending its whole body (a timeout, a closed tab, an attack):
    // nothing was claimed or stored, and nobody reads this answer. Worth a line, not one per request.
    clientAborts.note(error)
    return { ok: false, problem: problem('invalid-request', 'The connection closed before the body was read.') }
  }
  if (bytes === undefined) return { ok: false, problem: problems.tooLarge(maxBytes) }
  try {
    return { ok: true, text: utf8.decode(bytes) }
  } catch {
    return { ok: false, problem: problem('invalid-json', 'The body is not valid UTF-8.') }
  }
}

/**
 * The JSON value of a body's text: 400 for anything that is not clean JSON
 * (too deep, a NUL, a lone surrogate, a member name twice in one object).
 */
export function parseJsonText(text: string): BodyResult {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return { ok: false, problem: problem('invalid-json') }
  }
  const walked = { members: 0 }
  const flaw = inspect(value, 0, walked) ?? (walked.members !== membersInText(text) ? REPEATED_NAME : undefined)
  return flaw ? { ok: false, problem: problem('invalid-json', flaw) } : { ok: true, value, text }
}

/**
 * JSON.parse keeps the last of a repeated name (`{"amount":100,"amount":200}`
 * charged 200) where another reader (a proxy, an audit log, the client's own
 * library) may take the first (RFC 8259 leaves it to each). A request that two
 * readers read two ways is refused, not fingerprinted as one of them.
 */
const REPEATED_NAME = 'An object names a member twice; send each name once.'

/**
 * The body's bytes, or undefined as soon as they pass `maxBytes`: a chunked
 * body without Content-Length is never buffered beyond the limit.
 */
async function readAtMost(request: Request, maxBytes: number): Promise<Uint8Array | undefined> {
  if (!request.body) return new Uint8Array(0)
  // Fast path: a Content-Length within the limit (the caller checked it) and no chunked
  // framing bound the body, so read it natively in one piece. Iterating the stream
  // instead cost ~20% of the service's CPU per replay or 409 (BENCHMARKS.md).
  if (request.headers.has('content-length') && !request.headers.has('transfer-encoding')) {
    const bytes = new Uint8Array(await request.arrayBuffer())
    return bytes.byteLength > maxBytes ? undefined : bytes
  }
  const chunks: Uint8Array[] = []
  let size = 0
  for await (const chunk of request.body as unknown as AsyncIterable<Uint8Array>) {
    size += chunk.byteLength
    if (size > maxBytes) return undefined
    chunks.push(chunk)
  }
  return Buffer.concat(chunks, size)
}

/**
 * Finds what makes a parsed JSON value unstorable, walking at most
 * MAX_JSON_DEPTH levels, and counts its objects' members into `walked`.
 */
function inspect(value: unknown, depth: number, walked: { members: number }): string | undefined {
  if (depth > MAX_JSON_DEPTH) return `The body nests deeper than ${MAX_JSON_DEPTH} levels.`
  if (typeof value === 'string') return stringFlaw(value)
  if (value === null || typeof value !== 'object') return undefined
  if (Array.isArray(value)) {
    for (const item of value) {
      const flaw = inspect(item, depth + 1, walked)
      if (flaw) return flaw
    }
    return undefined
  }
  for (const [key, item] of Object.entries(value)) {
    walked.members++
    const keyFlaw = stringFlaw(key)
    if (keyFlaw) return keyFlaw
    const flaw = inspect(item, depth + 1, walked)
    if (flaw) return flaw
  }
  return undefined
}

/**
 * The object members a JSON text writes, repeated names included: in valid
 * JSON a colon outside strings occurs only between a member's name and its
 * value. Fewer members parsed than written means a name came twice.
 */
function membersInText(text: string): number {
  let members = 0
  outsideStrings(text, (c) => {
    if (c === 0x3a) members++
  })
  return members
}

/** Visits each character of a JSON text outside its strings (not their quotes), until `visit` returns false. */
function outsideStrings(text: string, visit: (c: number, i: number) => boolean | void): void {
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 0x5c) i++ // backslash: skip the escaped character
      else if (c === 0x22) inString = false
    } else if (c === 0x22) inString = true
    else if (visit(c, i) === false) return
  }
}

/**
 * NUL cannot be stored in PostgreSQL text; a lone surrogate (a "\ud800"
 * escape with no pair) is not Unicode, and would be stored as U+FFFD: a
 * different string than the client sent, silently.
 */
function stringFlaw(value: string): string | undefined {
  if (value.includes('\u0000')) return 'Strings must not contain the NUL character.'
  if (!value.isWellFormed()) return 'Strings must be well-formed Unicode (no lone surrogate escapes).'
  return undefined
}

/**
 * Whether every number in a JSON text is written as an integer: no fraction,
 * no exponent. JSON.parse rounds `999999999999.99999` to 10^12 and `1e3` to
 * 1000, so an integer field cannot be checked on the parsed value alone.
 * Outside strings, "." and an "e"/"E" after a digit occur only in numbers.
 */
export function integerLiteralsOnly(text: string): boolean {
  let integers = true
  outsideStrings(text, (c, i) => {
    if (c === 0x2e || ((c === 0x65 || c === 0x45) && isDigit(text.charCodeAt(i - 1)))) integers = false
    return integers
  })
  return integers
}

const isDigit = (c: number): boolean => c >= 0x30 && c <= 0x39

/**
 * 10 s: an abandoned body is logged at once, then at most one line per
 * interval, saying how many more there were: 50 clients walking away from
 * slow uploads are two lines, not 50 (an attack must not flood the log).
 */
export const CLIENT_ABORT_LOG_INTERVAL_MS = 10_000

/** Logs the first event of an interval at info, and one summary line for the rest when the interval ends. */
export class SampledLog {
  #suppressed = 0
  #timer: ReturnType<typeof setTimeout> | undefined

  constructor(private readonly message: string, private readonly intervalMs: number, private readonly logger: () => Logger) {}

  note(error: unknown): void {
    if (this.#timer) {
      this.#suppressed++
      return
    }
    this.logger().info(this.message, { error: error instanceof Error ? error.message : String(error) })
    this.#timer = setTimeout(() => {
      this.#timer = undefined
      if (this.#suppressed > 0) this.logger().info(`${this.message} (repeated)`, { more: this.#suppressed, interval_seconds: this.intervalMs / 1000 })
      this.#suppressed = 0
    }, this.intervalMs)
    this.#timer.unref?.()
  }
}

const clientAborts = new SampledLog('client closed the connection before its request body was read', CLIENT_ABORT_LOG_INTERVAL_MS, () => log)
