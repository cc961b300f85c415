import { describe, expect, test } from 'bun:test'
import { createLogger, formatLine } from '../../src/log'

function capture(level?: 'debug' | 'info' | 'warn' | 'error') {
  const lines: string[] = []
  const logger = createLogger({ sink: (line) => lines.push(line), now: () => new Date('2026-12-01T00:00:00.000Z'), ...(level ? { level } : {}) })
  return { logger, lines }
}

describe('logger', () => {
  test('one JSON object per line, with time, level, msg and the bound fields of a child', () => {
    const { logger, lines } = capture()
    logger.child({ request_id: 'r-1', tenant: 't' }).warn('provider failed', { route: '/api/payments' })
    expect(lines).toHaveLength(1)
    expect(JSON.parse(lines[0]!)).toEqual({ time: '2026-12-01T00:00:00.000Z', level: 'warn', msg: 'provider failed', request_id: 'r-1', tenant: 't', route: '/api/payments' })
  })

  test('below the level nothing is written', () => {
    const { logger, lines } = capture('warn')
    logger.info('quiet')
    logger.debug('quieter')
    logger.error('loud')
    expect(lines.map((line) => JSON.parse(line).msg)).toEqual(['loud'])
  })

  test('hostile strings cannot break a line, forge a field or reach the terminal raw', () => {
    const key = 'k"\n{"level":"error"}\u001b[31m\u2028é'
    const line = formatLine({ msg: 'x', key })
    expect(line).not.toContain('\n')
    expect(line).not.toContain('\u001b')
    expect(line).not.toContain('\u2028')
    expect(/^[\x20-\x7e]*$/.test(line)).toBe(true)
    expect(JSON.parse(line).key).toBe(key)
  })

  test('errors log name, message and code only', () => {
    const error = Object.assign(new Error('boom'), { code: '57P01', query: 'secret' })
    expect(JSON.parse(formatLine({ msg: 'x', error })).error).toEqual({ name: 'Error', message: 'boom', code: '57P01' })
  })
})
