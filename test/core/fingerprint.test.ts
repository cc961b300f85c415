import { expect, test } from 'bun:test'
import { canonicalJson, fingerprint } from '../../src/core/fingerprint'

test('key order and white space do not change the fingerprint', () => {
  const a = JSON.parse('{"amount": 10, "currency":"EUR", "meta": {"b": [1, {"y":1,"x":2}], "a": null}}')
  const b = JSON.parse('{"meta":{"a":null,"b":[1,{"x":2,"y":1}]},"currency":"EUR","amount":10}')
  expect(canonicalJson(a)).toBe(canonicalJson(b))
  expect(fingerprint('POST', '/p', a)).toBe(fingerprint('POST', '/p', b))
})

test('every value, the method and the path count', () => {
  const base = fingerprint('POST', '/p', { amount: 10 })
  expect(fingerprint('POST', '/p', { amount: 11 })).not.toBe(base)
  expect(fingerprint('POST', '/p', { amount: '10' })).not.toBe(base)
  expect(fingerprint('PUT', '/p', { amount: 10 })).not.toBe(base)
  expect(fingerprint('POST', '/q', { amount: 10 })).not.toBe(base)
  expect(fingerprint('POST', '/p', [10])).not.toBe(base)
  expect(fingerprint('POST', '/p', { a: [1, 2] })).not.toBe(fingerprint('POST', '/p', { a: [2, 1] }))
})
