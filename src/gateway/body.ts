/** A claimed request's body, read whole within its route's limit: it is fingerprinted, then forwarded as these bytes. */
export type Body = Uint8Array<ArrayBuffer> | 'too_large' | 'aborted'

/** The request's body, or 'too_large' as soon as it passes `maxBytes` (a chunked body is never buffered beyond it). */
export async function readBody(request: Request, maxBytes: number): Promise<Body> {
  if (!request.body) return new Uint8Array(0)
  const declared = Number(request.headers.get('content-length') ?? NaN)
  if (declared > maxBytes) return 'too_large'
  try {
    if (request.headers.has('content-length') && !request.headers.has('transfer-encoding')) {
      const bytes = new Uint8Array(await request.arrayBuffer())
      return bytes.byteLength > maxBytes ? 'too_large' : bytes
    }
    const chunks: Uint8Array[] = []
    let size = 0
    for await (const chunk of request.body as unknown as AsyncIterable<Uint8Array>) {
      size += chunk.byteLength
      if (size > maxBytes) return 'too_large'
      chunks.push(chunk)
    }
    return new Uint8Array(Buffer.concat(chunks, size))
  } catch {
    return 'aborted'
  }
}
