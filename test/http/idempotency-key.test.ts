/**
 * The Idempotency-Key field's two forms (the HTTP contract: the bare value, or an RFC 8941
 * sf-string as draft-ietf-httpapi-idempotency-key-header defines it), read
 * into one key. Over HTTP, with payments counted: test/http/contract.test.ts.
 */
import { expect, test } from 'bun:test'
import { parseIdempotencyKey } from '../../src/http/idempotency-key'

const key = (field: string | null) => {
  const parsed = parseIdempotencyKey(field)
  return parsed.ok ? parsed.key : parsed.reason
}

test('the bare value and the sf-string name the same key', () => {
  expect(key('k-1')).toBe('k-1')
  expect(key('"k-1"')).toBe('k-1')
  // White space around the field is not part of it (Headers.get drops it too).
  expect(key(' "k-1"\t')).toBe('k-1')
  expect(key(' k-1 ')).toBe('k-1')
})

test('parameters after the string are ignored', () => {
  expect(key('"k-1";x=1')).toBe('k-1')
  expect(key('"k-1";a;b=?0;c="v";d=1.5;e=:AQI=:')).toBe('k-1')
  expect(key('"k-1"; x=1')).toBe('k-1')
})

test('\\" and \\\\ are unescaped', () => {
  expect(key('"a\\"b"')).toBe('a"b')
  expect(key('"a\\\\b"')).toBe('a\\b')
  expect(key('"\\"\\\\"')).toBe('"\\')
})

test('a bare value is taken as sent, quotes and semicolons included', () => {
  expect(key('a"b')).toBe('a"b')
  expect(key('k;x=1')).toBe('k;x=1')
  expect(key('k"')).toBe('k"')
  expect(key('!~'.repeat(127) + 'x')).toBe('!~'.repeat(127) + 'x')
})

test('a field starting with " that is not a valid sf-string is malformed', () => {
  for (const field of [
    '"', '"open', '"k" x', '"k"x', '"k\\q"', '"k\\"', '"k", "k"', '"k";', '"k";X=1', '"k";x=', '"k" ;x=1', '"\u00e9"', '"k\u0001"',
  ]) expect(key(field), field).toBe('malformed')
})

test('the key, once unescaped, is still 1 to 255 printable ASCII characters without space', () => {
  expect(key('""')).toBe('malformed')
  expect(key('" "')).toBe('malformed')
  expect(key('"a b"')).toBe('malformed')
  expect(key(`"${'k'.repeat(255)}"`)).toBe('k'.repeat(255))
  expect(key(`"${'k'.repeat(256)}"`)).toBe('malformed')
  // 255 characters once unescaped, 510 as sent: the key counts, not the field.
  expect(key(`"${'\\"'.repeat(255)}"`)).toBe('"'.repeat(255))
  for (const field of ['', 'a b', 'tab\there', 'ключ', 'k'.repeat(256), 'k, k']) expect(key(field), JSON.stringify(field)).toBe('malformed')
  expect(key(null)).toBe('missing')
})
