/**
 * One request to the upstream, and what came of it, in the three kinds the
 * key's fate depends on:
 *
 * - `answered`: a whole answer (status, fields, body) arrived;
 * - `not_sent`: the connection was refused (or the name did not resolve):
 *   the upstream never saw the request, so the key is released whatever the
 *   route says;
 * - `unknown`: the request may have reached the upstream and its answer did
 *   not come back whole (a reset, a close, the deadline, the body cut off):
 *   the route decides (hold or release).
 *
 * An answer whose body is over `maxStoredBytes` is `too_large`: its first
 * bytes and the rest of its stream, so the client still gets all of it.
 */
import { requestHeadersForUpstream, responseHeadersForClient, type ForwardedFor } from './headers'

export type ForwardResult =
  | { readonly kind: 'answered'; readonly status: number; readonly headers: Headers; readonly body: Uint8Array<ArrayBuffer>; readonly seconds: number }
  | { readonly kind: 'too_large'; readonly status: number; readonly headers: Headers; readonly body: ReadableStream<Uint8Array>; readonly seconds: number }
  | { readonly kind: 'not_sent'; readonly error: unknown; readonly seconds: number }
  | { readonly kind: 'unknown'; readonly error: unknown; readonly seconds: number }

export interface ForwardRequest {
  readonly upstream: string
  readonly method: string
  /** Path and query, as the client sent them. */
  readonly target: string
  readonly headers: Headers
  readonly body: Uint8Array<ArrayBuffer> | ReadableStream<Uint8Array> | null
  readonly forwarded: ForwardedFor
  /** The gateway's derived key, sent instead of the client's. */
  readonly idempotencyKey?: string
  readonly signal?: AbortSignal
}

/** Error codes of a connection that was never made: nothing was sent. */
const NOT_CONNECTED = new Set(['ECONNREFUSED', 'ConnectionRefused', 'ENOTFOUND', 'EAI_AGAIN', 'FailedToOpenSocket', 'UnableToConnect'])

export function neverSent(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code
  return typeof code === 'string' && NOT_CONNECTED.has(code)
}

/** The fetch of the request, as the upstream's raw answer (its body still streaming). */
export function send(request: ForwardRequest): Promise<Response> {
  const headers = requestHeadersForUpstream(request.headers, request.forwarded, request.idempotencyKey)
  const init = {
    method: request.method,
    headers,
    redirect: 'manual',
    // The body as the upstream sent it, compressed or not: replayed byte for byte, with its Content-Encoding.
    decompress: false,
    ...(request.signal ? { signal: request.signal } : {}),
    ...(request.body !== null ? { body: request.body, duplex: 'half' as const } : {}),
  } as RequestInit
  return fetch(`${request.upstream}${request.target}`, init)
}

/** Forwards a buffered request and reads the answer whole (up to `maxStoredBytes`). */
export async function forward(request: ForwardRequest & { readonly body: Uint8Array<ArrayBuffer> }, maxStoredBytes: number): Promise<ForwardResult> {
  const started = performance.now()
  const seconds = () => (performance.now() - started) / 1000
  let response: Response
  try {
    response = await send(request)
  } catch (error) {
    return neverSent(error) ? { kind: 'not_sent', error, seconds: seconds() } : { kind: 'unknown', error, seconds: seconds() }
  }
  const headers = responseHeadersForClient(response.headers)
  try {
    const read = await readAtMost(response, maxStoredBytes)
    if (read.whole) return { kind: 'answered', status: response.status, headers, body: read.bytes, seconds: seconds() }
    return { kind: 'too_large', status: response.status, headers, body: read.stream, seconds: seconds() }
  } catch (error) {
    // The answer began and was cut off: the upstream did act, what it said is lost.
    return { kind: 'unknown', error, seconds: seconds() }
  }
}

type Read = { whole: true; bytes: Uint8Array<ArrayBuffer> } | { whole: false; stream: ReadableStream<Uint8Array> }

async function readAtMost(response: Response, maxBytes: number): Promise<Read> {
  if (!response.body) return { whole: true, bytes: new Uint8Array(0) }
  const declared = Number(response.headers.get('content-length') ?? NaN)
  // Fast path: a declared length within the limit is read natively in one piece.
  if (Number.isSafeInteger(declared) && declared <= maxBytes && !response.headers.has('transfer-encoding'))
    return { whole: true, bytes: new Uint8Array(await response.arrayBuffer()) }
  const reader = response.body.getReader()
  const chunks: Uint8Array[] = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) return { whole: true, bytes: new Uint8Array(Buffer.concat(chunks, size)) }
    chunks.push(value)
    size += value.byteLength
    if (size > maxBytes) {
      // Over the limit: what was read, then the rest as it comes.
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          for (const chunk of chunks) controller.enqueue(chunk)
        },
        async pull(controller) {
          const next = await reader.read()
          if (next.done) controller.close()
          else controller.enqueue(next.value)
        },
        cancel(reason) {
          return reader.cancel(reason)
        },
      })
      return { whole: false, stream }
    }
  }
}
