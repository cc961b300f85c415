import type { StoredResponse } from '../core/types'
import { STORED_ENCODING_HEADER, storedHeaders } from './headers'

const utf8 = new TextDecoder('utf-8', { fatal: true })

/**
 * The answer as the engine stores it: its status, the fields a replay
 * repeats, and its body as text. A body that is not UTF-8, or has a NUL
 * (which PostgreSQL text cannot hold), is stored as base64, marked in a
 * field the replay removes: replayed byte for byte either way.
 */
export function toStored(status: number, headers: Headers, body: Uint8Array, unreplayed: ReadonlySet<string>): StoredResponse {
  const fields = storedHeaders(headers, unreplayed)
  let text: string | undefined
  try {
    text = utf8.decode(body)
  } catch {
    text = undefined
  }
  if (text !== undefined && !text.includes('\u0000')) return { status, headers: fields, body: text }
  return { status, headers: { ...fields, [STORED_ENCODING_HEADER]: 'base64' }, body: Buffer.from(body).toString('base64') }
}

/** A stored answer again, with `Idempotent-Replayed: true`. */
export function replay(stored: StoredResponse): Response {
  const { [STORED_ENCODING_HEADER]: encoding, ...headers } = stored.headers
  const body = encoding === 'base64' ? Buffer.from(stored.body, 'base64') : stored.body
  return new Response(body, { status: stored.status, headers: { ...headers, 'idempotent-replayed': 'true' } })
}
