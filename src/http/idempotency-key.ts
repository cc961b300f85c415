/**
 * The Idempotency-Key field, read as draft-ietf-httpapi-idempotency-key-header
 * defines it (an RFC 8941 sf-string: `Idempotency-Key: "k-1"`) and as most
 * clients send it (the bare value: `Idempotency-Key: k-1`). Both name the key
 * `k-1`, so a client that switches form on a retry still gets its first
 * answer instead of a second payment.
 *
 * The sf-string grammar (escapes, parameters, what may follow) comes from the
 * `structured-headers` package, which implements RFC 8941/9651 and is tested
 * against the httpwg's conformance suite: a hand-written parser would get the
 * corner cases (`"k" x`, `"k";x=1;y`, `\q`) wrong in ways clients then rely on.
 */
import { parseItem } from 'structured-headers'

/** 1..255 printable ASCII characters without space (0x21 to 0x7E): the key itself, once unescaped. */
export const KEY_PATTERN = /^[!-~]{1,255}$/

export type KeyField =
  | { readonly ok: true; readonly key: string }
  | { readonly ok: false; readonly reason: 'missing' | 'malformed' }

/**
 * The key named by the field's value (`Headers.get`, so several fields arrive
 * joined by ", " and are refused as malformed: a key is sent once).
 *
 * - starting with `"`: an sf-string item; `\"` and `\\` unescaped, its
 *   parameters (`"k";x=1`) ignored; anything that is not a valid sf-string
 *   item (unterminated, a bad escape, text after it, a second member) is
 *   malformed;
 * - otherwise: the value as sent.
 *
 * Either way the key must then be 1..255 printable ASCII without space, the
 * same rule the database's CHECK enforces.
 */
export function parseIdempotencyKey(field: string | null): KeyField {
  if (field === null) return { ok: false, reason: 'missing' }
  // Optional white space around a field value is not part of it (RFC 9110 §5.5); Headers.get already drops it.
  const value = field.replace(/^[ \t]+|[ \t]+$/g, '')
  let key = value
  if (value.startsWith('"')) {
    let item: ReturnType<typeof parseItem>
    try {
      item = parseItem(value)
    } catch {
      return { ok: false, reason: 'malformed' }
    }
    if (typeof item[0] !== 'string') return { ok: false, reason: 'malformed' }
    key = item[0]
  }
  return KEY_PATTERN.test(key) ? { ok: true, key } : { ok: false, reason: 'malformed' }
}
