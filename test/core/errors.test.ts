import { expect, test } from 'bun:test'
import { isDataError, isUnavailable } from '../../src/core/errors'

const error = (code: string) => Object.assign(new Error(code), { code })

// Catches: a failover's or a pooler's refusal answered as a 500 (test/scale/patroni saw both).
test('the database being away, a pooler refusing, a demoted node: unavailable (503), not internal', () => {
  for (const code of ['CONNECTION_CLOSED', 'ECONNRESET', '57P01', '08006', '08P01', '25006', '53300'])
    expect({ code, unavailable: isUnavailable(error(code)) }).toEqual({ code, unavailable: true })
  for (const code of ['23505', '42P01', 'IK409', '55P03'])
    expect({ code, unavailable: isUnavailable(error(code)) }).toEqual({ code, unavailable: false })
})

// Catches: a batch retried member by member for an error that is nobody's row (a lock timeout, a lost connection).
test('only a data exception or a constraint violation is one member\'s fault in a batch', () => {
  for (const code of ['22P02', '22001', '23514', '23505']) expect(isDataError(error(code))).toBe(true)
  for (const code of ['55P03', '57014', 'CONNECTION_CLOSED', '08P01', '40001']) expect(isDataError(error(code))).toBe(false)
})
