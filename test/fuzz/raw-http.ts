/** A bare HTTP/1.1 client over a TCP socket: sends exactly the bytes given, so tests can send what fetch refuses to. */

export interface RawAnswer {
  readonly status: number
  readonly headers: Map<string, string>
  readonly body: Uint8Array
}

/** Sends `request` and reads until the server closes, or `timeoutMs`. Undefined when nothing parseable came back. */
export async function rawRequest(port: number, request: Uint8Array | string, timeoutMs = 5_000): Promise<RawAnswer | undefined> {
  const chunks: Uint8Array[] = []
  const bytes = typeof request === 'string' ? new TextEncoder().encode(request) : request
  await new Promise<void>((resolve) => {
    const timer = setTimeout(() => { socketRef?.end(); resolve() }, timeoutMs)
    let socketRef: { end(): void } | undefined
    void Bun.connect({
      hostname: '127.0.0.1',
      port,
      socket: {
        open(socket) { socketRef = socket; socket.write(bytes) },
        data(_socket, data) {
          chunks.push(new Uint8Array(data))
          const answer = parse(concat(chunks))
          if (answer?.complete) { clearTimeout(timer); socketRef?.end(); resolve() }
        },
        close() { clearTimeout(timer); resolve() },
        error() { clearTimeout(timer); resolve() },
      },
    }).catch(() => { clearTimeout(timer); resolve() })
  })
  const answer = parse(concat(chunks))
  return answer ? { status: answer.status, headers: answer.headers, body: answer.body } : undefined
}

function concat(chunks: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0))
  let at = 0
  for (const chunk of chunks) { out.set(chunk, at); at += chunk.length }
  return out
}

function parse(bytes: Uint8Array): (RawAnswer & { complete: boolean }) | undefined {
  const text = new TextDecoder('latin1').decode(bytes)
  const end = text.indexOf('\r\n\r\n')
  if (end < 0) return undefined
  const [statusLine, ...lines] = text.slice(0, end).split('\r\n')
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine ?? '')?.[1])
  if (!Number.isInteger(status)) return undefined
  const headers = new Map<string, string>()
  for (const line of lines) {
    const colon = line.indexOf(':')
    if (colon > 0) headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim())
  }
  const body = bytes.subarray(end + 4)
  const length = Number(headers.get('content-length') ?? NaN)
  const complete = Number.isInteger(length) ? body.length >= length : false
  return { status, headers, body: Number.isInteger(length) ? body.subarray(0, length) : body, complete }
}

/** A POST /api/payments with the given header lines (CRLF-joined) and body bytes. */
export function rawPost(headerLines: readonly (string | Uint8Array)[], body: Uint8Array | string): Uint8Array {
  const bodyBytes = typeof body === 'string' ? new TextEncoder().encode(body) : body
  const enc = new TextEncoder()
  const parts: Uint8Array[] = [enc.encode('POST /api/payments HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n')]
  for (const line of headerLines) {
    parts.push(typeof line === 'string' ? enc.encode(line) : line)
    parts.push(enc.encode('\r\n'))
  }
  parts.push(enc.encode(`Content-Length: ${bodyBytes.length}\r\n\r\n`))
  parts.push(bodyBytes)
  return concat(parts)
}
