/**
 * The admin's one body reader, for the sign-in and action forms and the JSON
 * API alike: byte-bounded, and a body announced too large is refused before
 * a byte of it is read. Bun accepts bodies up to its own cap (1 GiB, see
 * server.ts) and hands them over as a stream, so a reader that waited for the
 * whole body would let anyone, unauthenticated, hold a connection open and
 * feed it half a gigabyte: `POST /admin/login` announcing 500 MB answered
 * nothing after 5 s before this.
 */

/** Admin forms and JSON carry a few short fields; anything bigger is not ours. */
export const MAX_ADMIN_BODY_BYTES = 8 * 1024

export class BodyTooLargeError extends Error {
  constructor(readonly limit: number) {
    super(`the body must be at most ${limit} bytes`)
    this.name = 'BodyTooLargeError'
  }
}

export class BadBodyError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'BadBodyError'
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true })

/**
 * The body as text, at most `maxBytes` of it: BodyTooLargeError at once when
 * Content-Length says more, or as soon as a chunked body passes the limit
 * (the rest is never read).
 */
export async function readBoundedText(request: Request, maxBytes = MAX_ADMIN_BODY_BYTES): Promise<string> {
  const declared = request.headers.get('content-length')
  if (declared !== null) {
    if (!/^\d{1,15}$/.test(declared.trim())) throw new BadBodyError('Content-Length is not a number')
    if (Number(declared) > maxBytes) throw new BodyTooLargeError(maxBytes)
  }
  if (!request.body) return ''
  const reader = request.body.getReader()
  const chunks: Uint8Array[] = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > maxBytes) {
      await reader.cancel().catch(() => undefined)
      throw new BodyTooLargeError(maxBytes)
    }
    chunks.push(value)
  }
  try {
    return utf8.decode(Buffer.concat(chunks, size))
  } catch {
    throw new BadBodyError('the body is not valid UTF-8')
  }
}

export class UnsupportedBodyError extends Error {
  constructor() {
    super('send application/x-www-form-urlencoded (forms) or application/json (the API)')
    this.name = 'UnsupportedBodyError'
  }
}

/**
 * The parser of every admin route (Elysia's parse phase, before validation
 * and before the handler): a form as a plain object of its fields (the last
 * of a repeated field wins), JSON as parsed; an empty body as {}.
 */
export async function parseAdminBody(request: Request, contentType: string): Promise<Record<string, unknown>> {
  const text = await readBoundedText(request)
  const type = contentType.split(';')[0]!.trim().toLowerCase()
  if (text.trim() === '') return {}
  if (type === 'application/x-www-form-urlencoded') return Object.fromEntries(new URLSearchParams(text))
  if (type === 'application/json') {
    let value: unknown
    try {
      value = JSON.parse(text)
    } catch {
      throw new BadBodyError('the body is not valid JSON')
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new BadBodyError('the body must be a JSON object')
    return value as Record<string, unknown>
  }
  throw new UnsupportedBodyError()
}
